"""Register, SIGKILL, resume, fsck, fsck --repair: no registered checkpoint ever moves.

Each trial is planned by one seed (printed; rerun it with THESEUS_KILL_SEED=SEED): the
run name (digits and dashes included), the checkpoint interval, where each stage is
killed (just after an asynchronous save started, or after a tick), how long after, and
the spelling of the root each stage and fsck use (a symlink, a relative path from
another folder, `..`, `./`, a trailing slash), and whether the root is moved (`mv`) or
copied (`cp -a`, the stage then runs in the copy) before a stage. After every stage: every checkpoint
registered before it still exists with the same bytes, fsck finds no problem, and
fsck --repair sets every stray aside (the same files under `unregistered/`, none
deleted) and leaves the store clean. The last stage trains to the end.
"""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from theseus.data.datasets import Synthetic
from theseus.job import store_root
from theseus.store import Store

WORKER = Path(__file__).with_name("kill_cycle_worker.py")
STEPS = 8
SPELLINGS = ("plain", "slash", "dot", "dotdot", "symlink", "relative")
RUN_NAMES = ("2024", "12345678", "r-1", "0-0", "run", "7_x")
RELOCATIONS = ("stay", "move", "copy")


@dataclass(frozen=True)
class Stage:
    spelling: str
    pause: str  # "save:K", "tick:K" or "none"
    delay: float  # seconds between the pause and SIGKILL
    relocate: str = "stay"  # before the stage: "stay", "move" (mv) or "copy" (cp -a)


@dataclass(frozen=True)
class Plan:
    seed: int
    run: str
    interval: int
    stages: tuple[Stage, ...]
    fsck_spelling: str


def plan(seed: int) -> Plan:
    """Everything a trial does, drawn from `seed` alone."""
    rng = random.Random(seed)
    interval = rng.choice((1, 2, 3))
    stages = []
    last = 0  # a stage resumes at or before the step where the one before was killed,
    for _ in range(rng.choice((1, 2))):  # so each pause comes later than the last one
        where = rng.choice(("save", "tick"))
        later = [s for s in range(last + 1, STEPS) if where == "tick" or s % interval == 0]
        if not later:
            break
        last = rng.choice(later[: max(1, len(later) - 1)])  # leave room for one more
        stages.append(Stage(rng.choice(SPELLINGS), f"{where}:{last}", rng.choice((0, 0.02, 0.2))))
    stages.append(Stage(rng.choice(SPELLINGS), "none", 0.0))
    # every stage but the first (which makes the root) may find it moved or copied
    stages[1:] = [replace(s, relocate=rng.choice(RELOCATIONS)) for s in stages[1:]]
    return Plan(seed, rng.choice(RUN_NAMES), interval, tuple(stages), rng.choice(SPELLINGS))


def spell(root: Path, how: str) -> tuple[str, Path | None]:
    """`root` written another way, and the folder to run in (None: this one)."""
    if how == "slash":
        return f"{root}/", None
    if how == "dot":
        return f"{root}/./", None
    if how == "dotdot":
        (root / "sub").mkdir(exist_ok=True)
        return f"{root}/sub/..", None
    if how == "symlink":
        link = root.parent / f"link-to-{root.name}"
        if not link.exists():
            link.symlink_to(root, target_is_directory=True)
        return str(link), None
    if how == "relative":
        elsewhere = root.parent / "elsewhere"
        elsewhere.mkdir(exist_ok=True)
        return f"../{root.name}", elsewhere
    return str(root), None


def contents(folder: Path) -> dict[str, str]:
    """Every file under `folder` by relative path, with its SHA-256."""
    return {
        p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def registered(root: Path) -> dict[Path, dict[str, str]]:
    with Store(store_root(root)) as store:
        return {Path(c.path): contents(Path(c.path)) for c in store.query().checkpoints()}


def lineage_with_checkpoints(root: Path, run: str) -> str | None:
    with Store(store_root(root)) as store:
        last = store.query().spec(run=run).checkpoint().latest().first()
        return None if last is None else last.nonce


def run_stage(root: Path, plan_: Plan, stage: Stage, nonce: str | None) -> str:
    """Run one stage; kill it at its pause. Returns its output."""
    spelled, cwd = spell(root, stage.spelling)
    args = [sys.executable, str(WORKER), spelled, plan_.run, str(STEPS), str(plan_.interval)]
    args += [stage.pause, *([nonce] if nonce else [])]
    with subprocess.Popen(
        args,
        cwd=cwd,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    ) as proc:
        assert proc.stdout is not None
        lines = []
        deadline = time.monotonic() + 240
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("PAUSED"):
                time.sleep(stage.delay)
                os.kill(proc.pid, signal.SIGKILL)
                break
            if time.monotonic() > deadline:
                proc.kill()
                break
        proc.wait(timeout=60)
        output = "".join(lines) + (proc.stdout.read() or "")
    if stage.pause == "none":
        assert proc.returncode == 0, f"seed {plan_.seed}: the last stage failed:\n{output}"
    else:
        assert proc.returncode == -signal.SIGKILL, f"seed {plan_.seed}: never paused:\n{output}"
    return output


def check_nothing_registered_moved(before: dict[Path, dict[str, str]], seed: int) -> None:
    for path, files in before.items():
        assert path.is_dir(), f"seed {seed}: registered checkpoint {path} disappeared"
        assert contents(path) == files, f"seed {seed}: registered checkpoint {path} changed"


def fsck_and_repair(root: Path, spelling: str, seed: int) -> None:
    spelled, cwd = spell(root, spelling)
    store_path = Path(cwd or Path.cwd(), spelled, "store")
    before = registered(root)
    with Store(store_path) as store:
        found = store.fsck()
        assert found.problems == [], f"seed {seed}: {found.problems}"
        strays = {p: contents(p) for p in found.unregistered_checkpoints}
        strays.update({p: contents(p) for p in found.interrupted_checkpoints})
        repaired = store.fsck(repair=True)
        assert repaired.problems == [], f"seed {seed}: {repaired.problems}"
    check_nothing_registered_moved(before, seed)
    assert len(repaired.set_aside) == len(strays), (seed, strays, repaired.set_aside)
    moved = sorted(sorted(contents(p).items()) for p in repaired.set_aside)
    assert moved == sorted(sorted(files.items()) for files in strays.values()), f"seed {seed}"
    for path in repaired.set_aside:
        assert "unregistered" in path.parts, (seed, path)
    with Store(store_path) as store:
        again = store.fsck()
    assert again.problems == [] and again.unregistered_checkpoints == [], f"seed {seed}"
    assert again.interrupted_checkpoints == [], f"seed {seed}"


def relocate(root: Path, how: str, seed: int) -> Path:
    """Move or copy the whole root to a new folder beside it; return where to go on.

    Every registered checkpoint is then read at the new place, with the same bytes;
    a copied root's original stays as it was.
    """
    if how == "stay":
        return root
    before = {p.relative_to(root): files for p, files in registered(root).items()}
    target = root.with_name(f"{root.name}-{how}d")
    if how == "move":
        root.rename(target)
    else:
        shutil.copytree(root, target, symlinks=True)
    after = registered(target)
    assert all(target in p.parents for p in after), (
        f"seed {seed}: {how}d root reads {sorted(after)}"
    )
    assert {p.relative_to(target): files for p, files in after.items()} == before, f"seed {seed}"
    if how == "copy":
        assert {p.relative_to(root): f for p, f in registered(root).items()} == before
    return target


def trial(seed: int, base: Path) -> None:
    chosen = plan(seed)
    print(f"kill cycle: seed {seed} (rerun with THESEUS_KILL_SEED={seed}): {chosen}")
    root = base / "root"
    Synthetic.prepare(root, tokens=20_000, val_tokens=4_000)
    for index, stage in enumerate(chosen.stages):
        root = relocate(root, stage.relocate, seed)
        before = registered(root) if (store_root(root)).exists() else {}
        nonce = lineage_with_checkpoints(root, chosen.run) if index else None
        output = run_stage(root, chosen, stage, nonce)
        check_nothing_registered_moved(before, seed)
        fsck_and_repair(root, chosen.fsck_spelling, seed)
        if stage.pause == "none":
            done = output.split("DONE", 1)[1].split()
            assert int(done[0]) == STEPS, f"seed {seed}: {output}"
    last = registered(root)
    assert any(path.name == str(STEPS) for path in last), f"seed {seed}: {sorted(last)}"


_given = os.environ.get("THESEUS_KILL_SEED")
SEEDS = st.just(int(_given)) if _given else st.integers(0, 2**31 - 1)


def trials(count: int) -> settings:
    """`count` seeds drawn by hypothesis (or the one THESEUS_KILL_SEED names), each a trial."""
    return settings(
        max_examples=count,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow],
    )


@trials(1)  # one random trial in the default suite; 25 in the slow set
@given(seed=SEEDS)
def test_killed_and_resumed_runs_never_lose_a_registered_checkpoint(
    seed: int, tmp_path_factory: pytest.TempPathFactory
) -> None:
    trial(seed, Path(tempfile.mkdtemp(dir=tmp_path_factory.getbasetemp())))


@pytest.mark.slow
@trials(25)
@given(seed=SEEDS)
def test_killed_and_resumed_runs_never_lose_a_registered_checkpoint_many(
    seed: int, tmp_path_factory: pytest.TempPathFactory
) -> None:
    trial(seed, Path(tempfile.mkdtemp(dir=tmp_path_factory.getbasetemp())))
