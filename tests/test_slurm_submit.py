"""`theseus submit --slurm` on a real one-node SLURM (``pytest --slurm``; nox -s slurm).

A 2-task job: two `theseus run` processes that join one JAX cluster through SLURM's
variables (2 CPU devices each) train one lineage, which records the job. The same job
warned mid-way (USR2 to the batch script, as ``--signal=B:USR2@N`` sends it) checkpoints
where both processes stop, requeues itself, and its second run resumes from the store
and ends with parameters equal, bit for bit, to those of the same job never warned.
``sbatch`` refusing the job is one line.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from test_multihost_cli import JOB, JOBS, SETTINGS, _env, _ok, _params, _theseus, tokens  # noqa: E402

from theseus.data.datasets import Synthetic  # noqa: E402
from theseus.job import store_root  # noqa: E402
from theseus.store import Store  # noqa: E402
from theseus.store._scheduler import scheduler_state  # noqa: E402

pytestmark = [pytest.mark.slurm]

STEPS = 12
TIMEOUT = 300.0


def _settings() -> list[str]:
    chosen = {**SETTINGS, "logging/report_interval": 1, "logging/checkpoint_interval": 5}
    return [f"{k}={v}" for k, v in chosen.items()] + [tokens(STEPS)]


def _submit(cluster: Any, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = cluster.environment(_env(2))  # each task: 2 CPU devices
    return subprocess.run(
        [*_theseus(), "--import", JOBS, "submit", *args, "--slurm"],
        env=_plain({**env, **cluster.env}), cwd=cwd, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip


def _plain(env: dict[str, str]) -> dict[str, str]:
    """`env` as a shell that did not start through `uv run` has it (the commands printed
    for it call the programs by name or path, not `uv run`)."""
    return {k: v for k, v in env.items() if k != "UV_RUN_RECURSION_DEPTH"}


def _submitted(cluster: Any, cwd: Path, run: str, root: Path, config: Path,
               *more: str) -> tuple[int, Path]:  # fmt: skip
    done = _submit(cluster, cwd, run, str(config), str(root), *_settings(),
                   "--tasks-per-node", "2", *more)  # fmt: skip
    assert done.returncode == 0, done.stderr + done.stdout
    said = re.search(
        r"Submitted SLURM job (\d+): 1 node\(s\) x 2 task\(s\), lineage (\S+)\.", done.stdout
    )
    job, lineage = int(said[1]), said[2]
    log = Path(re.search(r"  log      (\S+)", done.stdout)[1])
    assert f"  squeue -j {job}\n" in done.stdout
    # the printed follow-up, pasted into a shell in the same folder, shows the lineage
    (follow,) = [
        ln for ln in done.stdout.splitlines() if ln.endswith(f" lineage {root}/store {lineage}")
    ]
    pasted = subprocess.run(follow.strip(), shell=True, cwd=cwd, capture_output=True, text=True,
                            env=_plain(dict(os.environ)), timeout=120)  # fmt: skip
    assert pasted.returncode == 0 and lineage in pasted.stdout, pasted.stderr + pasted.stdout
    return job, log


def _lineage(root: Path, run: str) -> tuple[list[dict], list[int]]:
    with Store(store_root(root), readonly=True) as store:
        nodes = sorted(store.query().spec(run=run).all(), key=lambda n: n.seq)
        assert len({n.nonce for n in nodes}) == 1, nodes
        steps = sorted(c.step for n in nodes for c in store.checkpoints(n))
        return [store.values(n) for n in nodes], steps


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A working folder with a configuration, and a root with prepared data."""
    folder = tmp_path_factory.mktemp("slurm")
    config = folder / "tiny.yaml"
    _ok("--import", JOBS, "configure", JOB, str(config))
    return folder, config


def _root(folder: Path, name: str) -> Path:
    root = folder / name
    Synthetic.prepare(root, tokens=40_000, val_tokens=6_000)
    return root


def test_two_tasks_join_through_slurm_and_train_one_lineage(slurm_cluster: Any, prepared) -> None:
    folder, config = prepared
    root = _root(folder, "plain")
    job, log = _submitted(slurm_cluster, folder, "plain", root, config, "--sbatch=--begin=now+600")
    # queued: its lineage is in the store already, one node that says so
    assert slurm_cluster.state(job) == "PENDING"
    shown = subprocess.run(
        [str(Path(sys.executable).with_name("theseus-store")), "runs", str(root / "store")],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    (lineage,) = re.findall(r"(general\.default\.plain~\w+)\s+1\s+0\s+0\s+0", shown)
    with Store(store_root(root), readonly=True) as store:
        state = scheduler_state(store, *lineage.split("~"))
        assert str(state) == f"SLURM job {job}: pending (at seq 0)"
    slurm_cluster.start_now(job)
    assert slurm_cluster.wait(job, timeout=TIMEOUT) == "COMPLETED", log.read_text()[-3000:]
    text = log.read_text()
    assert f"theseus submit: job {job}, run 1 of at most 4, on " in text
    assert "2 device(s)" in text or "4 device(s)" in text, text[-2000:]
    values, steps = _lineage(root, "plain")  # one lineage: the one made at submission
    assert [v["train/step"] for v in values] == list(range(1, STEPS + 1))
    assert steps == [5, 10, 12]
    assert values[-1]["job/status"] == "finished" and values[-1]["slurm/state"] == "finished"
    assert (values[0]["slurm/job"], values[0]["slurm/restarts"]) == (str(job), 0)
    assert "ran/python" in values[0] and "ran/jax" in values[0]
    # the script, the configuration it ran and the job's record sit under ROOT/slurm/
    (submission,) = (root / "slurm").iterdir()
    assert sorted(p.name for p in submission.iterdir()) == [
        "config.yaml", "job.json", f"slurm-{job}.out", "submit.sh"
    ]  # fmt: skip


def test_a_warned_job_requeues_and_ends_bit_identical(slurm_cluster: Any, prepared) -> None:
    folder, config = prepared
    root = _root(folder, "warned")
    reference = folder / "plain"  # the job above, never warned
    if not (reference / "store").exists():
        reference = _root(folder, "plain")
        job, _ = _submitted(slurm_cluster, folder, "plain", reference, config)
        assert slurm_cluster.wait(job, timeout=TIMEOUT) == "COMPLETED"
    job, log = _submitted(slurm_cluster, folder, "warned", root, config, "--requeues", "1")
    deadline = time.monotonic() + TIMEOUT
    while f" step 3/{STEPS} " not in (log.read_text() if log.exists() else ""):
        assert time.monotonic() < deadline, log.read_text() if log.exists() else "no log"
        assert slurm_cluster.state(job) in ("PENDING", "RUNNING", "CONFIGURING"), log.read_text()
        time.sleep(0.2)
    # what --signal=B:USR2@N does before the time limit, sent now
    slurm_cluster.run("scancel", "--signal=USR2", "--batch", str(job))
    deadline = time.monotonic() + TIMEOUT
    while "run 2 of at most 2" not in log.read_text():
        assert time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.5)
    assert slurm_cluster.wait(job, timeout=TIMEOUT) == "COMPLETED", log.read_text()[-3000:]
    text = log.read_text()
    assert "theseus submit: USR2 before the time limit; checkpointing" in text
    assert "theseus submit: requeued; the next run resumes from the latest checkpoint" in text

    values, steps = _lineage(root, "warned")
    assert [v["train/step"] for v in values] == list(range(1, STEPS + 1))
    stopped = int(re.search(rf"stopped by SIGUSR2 after step (\d+) of {STEPS}", text)[1])
    assert 3 <= stopped < STEPS and stopped in steps  # checkpointed where both stopped
    assert steps == sorted({stopped, 5, 10, 12})  # besides the due ones
    # the first run's record stays where it started; the second began at the stopped node
    assert (values[0]["slurm/state"], values[0]["slurm/restarts"]) == ("requeued", 0)
    assert values[0]["job/status"] == "preempted"
    assert values[stopped - 1]["slurm/restarts"] == 1
    assert values[-1]["slurm/state"] == "finished" and values[-1]["slurm/restarts"] == 1
    mine, plain = _params(root, "warned", STEPS), _params(reference, "plain", STEPS)
    assert sorted(mine) == sorted(plain)
    for key, value in plain.items():
        assert np.array_equal(mine[key], value), key  # bit for bit


def test_sbatch_refusing_the_job_is_one_line(slurm_cluster: Any, prepared) -> None:
    folder, config = prepared
    done = _submit(slurm_cluster, folder, "x", str(config), str(folder / "refused"),
                   "--partition", "nope")  # fmt: skip
    assert done.returncode == 1, done.stdout
    assert done.stderr.startswith("Error (SubmitError): sbatch refused the job (exit 1): ")
    assert "nope" in done.stderr.lower() or "partition" in done.stderr.lower(), done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert not (folder / "refused").exists()  # no ROOT/slurm/RUN-DATE/ left behind
