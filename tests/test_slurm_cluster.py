"""The private SLURM cluster (``_slurm_cluster``) behaves as the `theseus submit` tests need.

A 2-task batch job's ``srun`` starts one process per task with SLURM_PROCID and
SLURM_NTASKS; under ``srun``, ``jax.distributed.initialize()`` with no arguments joins
the two tasks (CPU, gloo collectives) and a ``psum`` spans both; ``scancel --signal=USR2
--batch`` reaches only the batch script, whose trap forwards it to the tasks through
``kill -USR2 <srun's pid>``; ``scontrol requeue`` reruns the batch script under the
same job id with SLURM_RESTART_COUNT set, a few seconds later (sooner with
``start_now``). Runs in ``nox -s slurm`` (``pytest --slurm``) only.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))
from _slurm_cluster import SlurmCluster, SlurmError, _processes_with  # noqa: E402

pytestmark = pytest.mark.slurm

PYTHON = sys.executable


def _script(path: Path, body: str, *directives: str) -> Path:
    """A batch script: bash, the #SBATCH lines, then `body`."""
    lines = ["#!/bin/bash", *(f"#SBATCH {d}" for d in directives), body.strip(), ""]
    path.write_text("\n".join(lines))
    return path


def _until(check: Callable[[], Any], timeout: float, what: str) -> Any:
    """Poll `check` until it returns something true; fail with `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    while not (result := check()):
        if time.monotonic() > deadline:
            pytest.fail(f"{what} within {timeout} s")
        time.sleep(0.05)
    return result


def _read(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def test_two_tasks_get_their_rank_and_jobs_end_in_the_jobcomp_file(
    slurm_cluster: SlurmCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "ranks.out"
    show = "import os; print(os.environ['SLURM_PROCID'], os.environ['SLURM_NTASKS'])"
    script = _script(tmp_path / "ranks.sh", f'srun {PYTHON} -c "{show}"', "-n 2", f"-o {out}")
    job = slurm_cluster.submit(script)
    assert slurm_cluster.wait(job, timeout=30) == "COMPLETED", _read(out)
    assert sorted(_read(out).split("\n")) == ["", "0 2", "1 2"]

    failing = _script(tmp_path / "fails.sh", "exit 3", "-n 1", f"-o {tmp_path / 'fails.out'}")
    failed = slurm_cluster.submit(failing)
    assert slurm_cluster.wait(failed, timeout=30) == "FAILED"
    (record,) = slurm_cluster.jobcomp_records(failed)
    assert record["ExitCode"] == "3:0" and record["Partition"] == slurm_cluster.partition
    assert slurm_cluster.jobcomp_records(job)[-1]["JobState"] == "COMPLETED"
    # Once the controller has forgotten a job (MinJobAge), its state comes from the file.
    monkeypatch.setattr(slurm_cluster, "job", lambda job_id: None)
    assert (slurm_cluster.state(job), slurm_cluster.state(failed)) == ("COMPLETED", "FAILED")
    with pytest.raises(SlurmError, match="unknown"):
        slurm_cluster.state(failed + 1000)


JAX_TASK = """
import os
os.environ["JAX_PLATFORMS"] = "cpu"
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize()
mesh = jax.make_mesh((jax.device_count(),), ("i",))
rank = jax.process_index()
local = np.array([2.0 * rank + 1, 2.0 * rank + 2], dtype=np.float32)
x = jax.make_array_from_process_local_data(NamedSharding(mesh, PartitionSpec("i")), local)
total = jax.jit(
    jax.shard_map(
        lambda a: jax.lax.psum(a, "i"),
        mesh=mesh,
        in_specs=PartitionSpec("i"),
        out_specs=PartitionSpec(),
    )
)(x)
value = float(np.asarray(total.addressable_data(0))[0])
print(f"rank={rank} processes={jax.process_count()} devices={jax.device_count()} psum={value}")
jax.distributed.shutdown()
"""


def test_jax_distributed_initializes_under_srun_and_psums_across_tasks(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    task = tmp_path / "psum.py"
    task.write_text(JAX_TASK)
    out = tmp_path / "psum.out"
    script = _script(tmp_path / "psum.sh", f"srun {PYTHON} {task}", "-n 2", f"-o {out}")
    job = slurm_cluster.submit(script)
    assert slurm_cluster.wait(job, timeout=90) == "COMPLETED", _read(out)
    lines = sorted(line for line in _read(out).splitlines() if line.startswith("rank="))
    # Four devices (two per task) hold 1, 2, 3, 4: every device's psum is 10.
    assert lines == [f"rank={r} processes=2 devices=4 psum=10.0" for r in (0, 1)], _read(out)


SIGNAL_TASK = """
import os, signal, sys, time
from pathlib import Path

folder, rank = Path(sys.argv[1]), os.environ["SLURM_PROCID"]
got = []
signal.signal(signal.SIGUSR2, lambda number, frame: got.append(number))
(folder / f"ready-{rank}").write_text(str(os.getpid()))
deadline = time.monotonic() + 30
while not got and time.monotonic() < deadline:
    time.sleep(0.05)
(folder / f"task-{rank}").write_text("USR2" if got else "no signal")
"""

# The batch shell runs srun in the background so that its trap runs while srun does (bash
# defers traps until a foreground command ends). The first USR2 is only logged, so the
# test can see that it reached no task; the second is forwarded to srun.
SIGNAL_BATCH = """
count=0
on_usr2() {
    count=$((count + 1))
    echo "batch got USR2 $count"
    if [ "$count" -ge 2 ]; then kill -USR2 "$SRUN"; fi
}
trap on_usr2 USR2
srun %(python)s %(task)s %(folder)s &
SRUN=$!
while kill -0 "$SRUN" 2>/dev/null; do wait "$SRUN"; code=$?; done
echo "srun exited $code"
"""


def test_usr2_reaches_the_batch_script_whose_trap_forwards_it_to_the_tasks_through_srun(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    task = tmp_path / "task.py"
    task.write_text(SIGNAL_TASK)
    out = tmp_path / "batch.out"
    body = SIGNAL_BATCH % {"python": PYTHON, "task": task, "folder": tmp_path}
    job = slurm_cluster.submit(_script(tmp_path / "batch.sh", body, "-n 2", f"-o {out}"))
    _until(lambda: all((tmp_path / f"ready-{r}").exists() for r in (0, 1)), 30, "tasks ready")

    # The node has room for a second job beside the 2-task one.
    other = _script(tmp_path / "other.sh", "echo other", "-n 1", f"-o {tmp_path / 'other.out'}")
    assert slurm_cluster.wait(slurm_cluster.submit(other), timeout=30) == "COMPLETED"
    assert slurm_cluster.state(job) == "RUNNING"

    slurm_cluster.run("scancel", "--signal=USR2", "--batch", str(job))
    _until(lambda: "batch got USR2 1" in _read(out), 10, "the batch script's trap")
    time.sleep(0.5)
    assert not list(tmp_path.glob("task-*")), "scancel --batch signalled a task"

    slurm_cluster.run("scancel", "--signal=USR2", "--batch", str(job))
    assert slurm_cluster.wait(job, timeout=30) == "COMPLETED", _read(out)
    assert [_read(tmp_path / f"task-{r}") for r in (0, 1)] == ["USR2", "USR2"]
    assert _read(out).splitlines()[-2:] == ["batch got USR2 2", "srun exited 0"]


REQUEUE_BATCH = """
echo "stdout of run ${SLURM_RESTART_COUNT-0}"
echo "run job=$SLURM_JOB_ID restart=${SLURM_RESTART_COUNT-unset}" >> %(log)s
trap 'echo TERM >> %(log)s; exit 143' TERM
sleep 120 &
wait
"""


def test_requeue_reruns_the_batch_script_with_slurm_restart_count(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    log = tmp_path / "runs.log"
    body = REQUEUE_BATCH % {"log": log}
    out = tmp_path / "requeue.out"
    script = _script(tmp_path / "requeue.sh", body, "-n 1", f"-o {out}")
    job = slurm_cluster.submit(script)
    _until(lambda: "restart=unset" in _read(log), 30, "the first run")

    began = time.monotonic()
    slurm_cluster.run("scontrol", "requeue", str(job))
    _until(lambda: "restart=1" in _read(log), 30, "the rerun after scontrol requeue")
    delay = time.monotonic() - began
    # cred_expire (5 s) + 1 s, then the next pass of the scheduler's main loop (1 s).
    assert 5.0 < delay < 10.0, delay

    began = time.monotonic()
    slurm_cluster.run("scontrol", "requeue", str(job))
    slurm_cluster.wait(job, "PENDING", timeout=10)
    slurm_cluster.start_now(job)
    try:
        _until(lambda: "restart=2" in _read(log), 10, "the rerun after start_now")
    except pytest.fail.Exception:
        shown = slurm_cluster.job(job) or {}
        logs = slurm_cluster.logs
        tails = {n: _read(logs / f"{n}.log").splitlines()[-15:] for n in ("slurmctld", "slurmd")}
        raise AssertionError(
            f"no rerun 10 s after start_now: JobState={shown.get('JobState')} "
            f"Reason={shown.get('Reason')} StartTime={shown.get('StartTime')}\n"
            + "\n".join(f"{n}: {line}" for n, lines in tails.items() for line in lines)
        ) from None
    hurried = time.monotonic() - began
    assert hurried < 4.0, hurried
    print(f"requeue: rerun after {delay:.1f} s; with start_now after {hurried:.1f} s")

    assert _read(log).splitlines() == [
        f"run job={job} restart=unset",
        "TERM",
        f"run job={job} restart=1",
        "TERM",
        f"run job={job} restart=2",
    ]
    # Each run truncates the -o file (sbatch --open-mode=append keeps the earlier runs').
    assert _read(out) == "stdout of run 2\n"
    # Each end of a run leaves a jobcomp line; a requeued run's says PENDING.
    assert [r["JobState"] for r in slurm_cluster.jobcomp_records(job)] == ["PENDING", "PENDING"]
    slurm_cluster.run("scancel", str(job))
    assert slurm_cluster.wait(job, timeout=30) == "CANCELLED"


def test_a_second_cluster_stops_its_jobs_and_daemons_and_leaves_munged(tmp_path: Path) -> None:
    cluster = SlurmCluster(partition="second")
    with cluster:
        assert cluster.start_seconds is not None and cluster.start_seconds < 30
        script = _script(tmp_path / "long.sh", "sleep 120", "-n 2", f"-o {tmp_path / 'long.out'}")
        job = cluster.submit(script)
        cluster.wait(job, "RUNNING", timeout=30)
        ours = f"SLURM_CONF={cluster.conf}".encode()
        assert len(_processes_with(ours)) >= 4  # slurmctld, slurmd, the job's processes
    assert _processes_with(ours) == []
    assert not cluster.folder.exists()
    assert cluster._munge_answers()


class _Broken(SlurmCluster):
    def config(self) -> str:
        return super().config() + "NoSuchParameter=1\n"


def test_a_failing_start_names_the_daemon_and_its_log(tmp_path: Path) -> None:
    cluster = _Broken()
    with pytest.raises(
        SlurmError, match=r"^slurmctld exited with \d+; slurmctld\.(log|out): "
    ) as e:
        cluster.start()
    assert "\n" not in str(e.value) and "NoSuchParameter" in str(e.value), e.value
    assert not cluster.folder.exists()
    assert _processes_with(f"SLURM_CONF={cluster.conf}".encode()) == []


def test_the_cluster_stays_out_of_this_process(slurm_cluster: SlurmCluster) -> None:
    # Clients get SLURM_CONF through cluster.env / cluster.environment() only.
    assert os.environ.get("SLURM_CONF") is None
    assert slurm_cluster.environment()["SLURM_CONF"] == str(slurm_cluster.conf)
