"""A scheduler's warning (USR2): checkpoint where every process stops, requeue, end identical.

What the batch script of ``theseus submit`` does on a cluster, done here by hand:
``theseus run ... --scheduler-job ID`` with ``THESEUS_PREEMPTION=USR2`` is warned a few
steps in, exits 140 with its last step checkpointed and ``job/status = preempted``,
``slurm/state = requeued`` recorded, and the same command started again as the
requeued job (``SLURM_RESTART_COUNT=1``) resumes that lineage from the store and ends
with parameters equal, bit for bit, to those of a run never warned. On two
jax.distributed processes the warning reaches one of them only, and both stop after
the same step (their vote) and checkpoint it together. What ran is read back against
git and hashlib themselves.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from test_multihost_cli import (  # noqa: E402
    JOB,
    JOBS,
    SETTINGS,
    _env,
    _free_port,
    _ok,
    _params,
    _theseus,
    tokens,
)

from theseus.data.datasets import Synthetic  # noqa: E402
from theseus.job import store_root  # noqa: E402
from theseus.store import Store  # noqa: E402

STEPS = 10
PREEMPTED = 128 + signal.SIGUSR2  # 140


def _settings() -> list[str]:
    chosen = {**SETTINGS, "logging/report_interval": 1, "logging/checkpoint_interval": 1000}
    return [f"{k}={v}" for k, v in chosen.items()] + [tokens(STEPS)]


def _git(folder: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(folder), *args], check=True, capture_output=True, text=True
    ).stdout


def _project(tmp_path: Path) -> Path:
    """A user's project folder: a git repository with an uncommitted change and a uv.lock."""
    project = tmp_path / "project"
    project.mkdir()
    _git(project, "init", "-q")
    (project / "train.py").write_text("lr = 1\n")
    (project / "uv.lock").write_text("version = 1\n")
    _git(project, "add", ".")
    _git(project, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "first")
    (project / "train.py").write_text("lr = 2\n")  # uncommitted
    (project / "notes.txt").write_text("new\n")  # untracked
    return project


def _warned_at(command: list[str], env: dict[str, str], cwd: Path, step: int,
               send_to: int = 0, others: list[list[str]] | None = None) -> list[subprocess.Popen[str]]:  # fmt: skip
    """Start ``command`` (and ``others``), send USR2 to process ``send_to`` once the primary
    reports ``step``; return the processes, finished."""
    procs = [
        subprocess.Popen(c, env=env, cwd=cwd, stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        for c in [command, *(others or [])]
    ]  # fmt: skip
    lines: list[str] = []
    try:
        stream = procs[0].stderr
        assert stream is not None
        for line in stream:
            lines.append(line)
            if f" step {step}/{STEPS} " in line:
                procs[send_to].send_signal(signal.SIGUSR2)
                break
        deadline = time.monotonic() + 300
        for proc in procs:
            out, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
            proc.output = "".join(lines) + err + out if proc is procs[0] else err + out  # type: ignore[attr-defined]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return procs


def _nodes(root: Path, run: str) -> tuple[list[dict], list[tuple[int, int]], Store]:
    store = Store(store_root(root))
    nodes = sorted(store.query().spec(run=run).all(), key=lambda n: n.seq)
    assert len({n.nonce for n in nodes}) == 1, nodes
    saved = sorted((c.node.seq, c.step) for c in store.query().spec(run=run).checkpoints())
    return [store.values(n) for n in nodes], saved, store


def _shown(root: Path, run: str, line: str) -> None:
    """``line`` is what `theseus-store show` and `lineage` and the browser's lineage page
    (and its live poll) say of the run's scheduler job."""
    from starlette.testclient import TestClient

    from theseus.store.cli import main as store_main
    from theseus.store.ui import create_app

    with Store(store_root(root), readonly=True) as store:
        last = max(store.query().spec(run=run).all(), key=lambda n: n.seq)
        lineage = f"{last.name}~{last.nonce}"
        for verb in ("show", "lineage"):
            printed = io.StringIO()
            with contextlib.redirect_stdout(printed):
                assert store_main([verb, str(store_root(root)), last.serialize()]) == 0
            assert f"  {line}\n" in printed.getvalue(), printed.getvalue()
        with TestClient(create_app(store)) as browser:
            page = browser.get(f"/lineage/{lineage}")
            assert f'<b data-field="scheduled">{line}</b>' in page.text
            polled = browser.get("/api/lineage", params={"l": lineage}).json()
            assert polled["scheduled"] == line


@pytest.mark.slow  # the default suite's budget: nox -s slow runs it
def test_a_warned_run_checkpoints_and_its_requeued_run_ends_bit_identical(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root, reference, config = tmp_path / "root", tmp_path / "reference", tmp_path / "tiny.yaml"
    for folder in (root, reference):
        Synthetic.prepare(folder, tokens=40_000, val_tokens=6_000)
    _ok("--import", JOBS, "configure", JOB, str(config))
    project = _project(tmp_path)
    run = [*_theseus(), "--import", JOBS, "run", "warned", str(config), str(root), *_settings(),
           "--scheduler-job", "4242", "--scheduler-lineage", "general.default.warned~0badcafe"]  # fmt: skip
    env = {**_env(4), "THESEUS_PREEMPTION": "USR2", "THESEUS_REQUEUES": "1"}

    (first,) = _warned_at(run, env, project, step=3)
    assert first.returncode == PREEMPTED, first.output  # type: ignore[attr-defined]
    values, saved, store = _nodes(root, "warned")
    assert store.query().spec(run="warned").first().nonce == "0badcafe"  # the job's lineage
    stopped = values[-1]["train/step"]
    assert 3 <= stopped < STEPS and saved == [(stopped - 1, stopped)]  # only the stop saved
    assert values[-1]["job/status"] == "preempted"
    assert values[-1]["slurm/state"] == "requeued"  # one requeue allowed, none used
    assert (values[-1]["slurm/job"], values[-1]["slurm/restarts"]) == ("4242", 0)

    # what ran, against git and hashlib themselves
    ran = values[0]
    assert ran["ran/git_head"] == _git(project, "rev-parse", "HEAD").strip()
    assert ran["ran/git_dirty"] is True
    diff = store.get(store.query().spec(run="warned").seq(0).first())["ran/diff"].content
    assert b"-lr = 1\n+lr = 2\n" in diff
    notes = hashlib.sha256(b"new\n").hexdigest()
    assert f"untracked notes.txt sha256 {notes}\n".encode() in diff
    assert ran["ran/diff_sha256"] == hashlib.sha256(diff).hexdigest()
    assert ran["ran/uv_lock_sha256"] == hashlib.sha256(b"version = 1\n").hexdigest()
    assert ran["ran/python"] == ".".join(map(str, sys.version_info[:3]))
    store.close()
    _shown(root, "warned", f"SLURM job 4242: requeued (at seq {stopped - 1})")

    # the requeued job: the same command, SLURM_RESTART_COUNT=1
    monkeypatch.chdir(project)  # in this process: the rerun needs no signal
    for key, value in {"THESEUS_PREEMPTION": "USR2", "THESEUS_REQUEUES": "1",
                       "SLURM_RESTART_COUNT": "1"}.items():  # fmt: skip
        monkeypatch.setenv(key, value)
    _ok(*run[run.index("--import") :])
    values, saved, store = _nodes(root, "warned")
    store.close()
    assert [v["train/step"] for v in values] == list(range(1, STEPS + 1))
    assert values[-1]["job/status"] == "finished" and values[-1]["slurm/state"] == "finished"
    assert values[-1]["slurm/restarts"] == 1
    assert values[stopped - 1]["ran/git_head"] == ran["ran/git_head"]  # where the rerun began
    _shown(root, "warned", f"SLURM job 4242: finished, requeued 1x (at seq {STEPS - 1})")

    _ok("--import", JOBS, "run", "plain", str(config), str(reference), *_settings())
    mine, plain = _params(root, "warned", STEPS), _params(reference, "plain", STEPS)
    assert sorted(mine) == sorted(plain)
    for key, value in plain.items():
        assert np.array_equal(mine[key], value), key  # bit for bit

    # SLURM reuses job ids (a new cluster, a wrap): a new job 4242 is a new lineage's run
    monkeypatch.delenv("SLURM_RESTART_COUNT")
    again = [*run[run.index("--import") : -1], "general.default.warned~feedf00d"]
    _ok(*again, tokens(2))
    with Store(store_root(root), readonly=True) as store:
        new = sorted(store.query().nonce("feedf00d").all(), key=lambda n: n.seq)
        assert [store.values(n)["train/step"] for n in new] == [1, 2]  # from the start
        assert len(store.query().nonce("0badcafe").all()) == STEPS  # the old one untouched


@pytest.mark.multiprocess
@pytest.mark.slow  # two jax.distributed processes and a resume (~30 s)
def test_two_processes_warned_one_at_a_time_stop_after_the_same_step(tmp_path: Path) -> None:
    root, config = tmp_path / "root", tmp_path / "tiny.yaml"
    Synthetic.prepare(root, tokens=40_000, val_tokens=6_000)
    _ok("--import", JOBS, "configure", JOB, str(config))
    port = _free_port()
    hosts = [
        [*_theseus(), "--import", JOBS, "run", "two", str(config), str(root), *_settings(),
         "--scheduler-job", "77", "--scheduler-lineage", "general.default.two~0badcafe", "--coordinator", f"127.0.0.1:{port}", "--num-processes", "2",
         "--process-id", str(i)]
        for i in range(2)
    ]  # fmt: skip
    env = {**_env(2), "THESEUS_PREEMPTION": "USR2", "THESEUS_REQUEUES": "0"}
    procs = _warned_at(hosts[0], env, tmp_path, step=3, send_to=1, others=hosts[1:])
    outputs = [p.output for p in procs]  # type: ignore[attr-defined]
    assert [p.returncode for p in procs] == [PREEMPTED, PREEMPTED], "\n---\n".join(outputs)
    values, saved, store = _nodes(root, "two")
    store.close()
    stopped = values[-1]["train/step"]
    assert saved == [(stopped - 1, stopped)]  # both processes saved it, together
    assert values[-1]["slurm/state"] == "preempted"  # no requeue allowed

    resumed = subprocess.run(
        [*hosts[0][: hosts[0].index("--coordinator")]],
        env={**_env(2), "THESEUS_PREEMPTION": "USR2", "SLURM_RESTART_COUNT": "1"},
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    values, saved, store = _nodes(root, "two")
    store.close()
    assert [v["train/step"] for v in values] == list(range(1, STEPS + 1))
    assert values[-1]["job/status"] == "finished"
