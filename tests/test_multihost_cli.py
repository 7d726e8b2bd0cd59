"""`theseus run` joins a multi-host cluster: options, environment, detection, errors.

The subprocess tests start `theseus run` processes on 127.0.0.1, each with its own
CPU devices (collectives through gloo), on a configuration written by
`theseus configure`. They compare the parameters of the checkpoints on disk with an
uninterrupted one-process run with four devices (this process, through the same
command line). The other tests check how the options and the environment decide
whether and how a process joins, without starting any.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from click.testing import CliRunner, Result

import theseus.cli._cluster as cli_cluster
from theseus.cli import main
from theseus.data.datasets import Synthetic
from theseus.job import ClusterPlan, ClusterUsageError, JobError, plan_cluster, store_root
from theseus.job._cluster import _never_joined
from theseus.registry import import_module_or_file
from theseus.store import Store

HERE = Path(__file__).resolve().parent
JOBS = str(HERE.parent / "packages" / "theseus-core" / "tests" / "trainer_jobs.py")
CORE_JOBS = str(HERE.parent / "packages" / "theseus-core" / "tests" / "core_jobs.py")
JOB = "test/synthetic/train"
# trainer_jobs.TINY with validation and a checkpoint every 3 steps; `training/tokens`
# sets the steps.
SETTINGS = {
    **import_module_or_file(JOBS).TINY,
    "logging/validation_interval": 3,
    "logging/checkpoint_interval": 3,
}
STEPS, MORE = 6, 12  # the two-process run, then resumed to 12 steps
TOKENS_PER_STEP = 8 * 32
TIMEOUT = 400  # seconds for a group of processes; the machine may be slow and loaded
ENVIRONMENT = ("THESEUS_", "SLURM_", "OMPI_", "JAX_COORDINATOR_ADDRESS", "JAX_PLATFORMS")


def tokens(steps: int) -> str:
    return f"training/tokens={steps * TOKENS_PER_STEP}"


def _theseus() -> list[str]:
    script = Path(sys.executable).with_name("theseus")  # the console script of this venv
    return (
        [str(script)]
        if script.exists()
        else [sys.executable, "-c", "from theseus.cli import main; main()"]
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env(devices: int) -> dict[str, str]:
    """This environment without cluster variables, with `devices` CPU devices."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(ENVIRONMENT)}
    flags = re.sub(r"--xla_force_host_platform_device_count=\d+", "", env.get("XLA_FLAGS", ""))
    env["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={devices}".strip()
    env["JAX_PLATFORMS"] = "cpu"
    return env


@dataclass
class Proc:
    popen: subprocess.Popen[bytes]
    log: Path

    def text(self) -> str:
        return self.log.read_text(errors="replace")


def _start(
    args: list[str], devices: int, log: Path, watch: tuple[Path, Path] | None = None
) -> Proc:
    """Start `theseus ARGS`; `watch=(database, file)` logs the process's opens of `database`."""
    env = _env(devices)
    if watch is not None:
        env["PYTHONPATH"] = os.pathsep.join(
            [str(HERE / "watch_database"), *filter(None, [env.get("PYTHONPATH")])]
        )
        env["THESEUS_WATCH_DATABASE"], env["THESEUS_WATCH_LOG"] = map(str, watch)
    with open(log, "wb") as out:
        popen = subprocess.Popen(
            [*_theseus(), *args], stdout=out, stderr=subprocess.STDOUT, env=env
        )
    return Proc(popen, log)


def _finish(procs: list[Proc], timeout: float = TIMEOUT) -> list[str]:
    """Wait for every process (killing what is left in the end); their output."""
    deadline = time.monotonic() + timeout
    try:
        for proc in procs:
            proc.popen.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        pytest.fail(
            f"timed out after {timeout} s:\n" + "\n---\n".join(p.text()[-3000:] for p in procs)
        )
    finally:
        for proc in procs:
            if proc.popen.poll() is None:
                proc.popen.kill()
                proc.popen.wait()
    return [p.text() for p in procs]


def _ok(*args: str) -> Result:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result


def _params(root: Path, run: str, step: int) -> dict[str, np.ndarray]:
    """The parameters of `run`'s checkpoint at `step`, read from disk onto one device."""
    [directory] = (root / "checkpoints" / "general" / "default" / run).iterdir()
    handlers = {"state": ocp.StandardCheckpointHandler(), "meta": ocp.JsonCheckpointHandler()}
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    with ocp.CheckpointManager(directory.absolute(), item_handlers=handlers) as manager:
        saved = manager.item_metadata(step)["state"]
        target = jax.tree.map(
            lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device), saved
        )
        restored = manager.restore(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardRestore(target), meta=ocp.args.JsonRestore()
            ),
        )
    params = restored["state"]["params"]
    return {
        jax.tree_util.keystr(p): np.asarray(v)
        for p, v in jax.tree_util.tree_flatten_with_path(params)[0]
    }


def _assert_same(mine: dict[str, np.ndarray], reference: dict[str, np.ndarray]) -> None:
    assert sorted(mine) == sorted(reference)
    for key, value in reference.items():
        np.testing.assert_allclose(mine[key], value, rtol=1e-5, atol=1e-6, err_msg=key)


def _lineage(root: Path, run: str) -> tuple[list[int], list[int], dict[str, object]]:
    """(node seqs, checkpoint steps, last node's values) of `run`'s only lineage."""
    with Store(store_root(root)) as store:
        nodes = sorted(store.query().spec(run=run).all(), key=lambda n: n.seq)
        assert len({n.nonce for n in nodes}) == 1, nodes  # the lineage, once
        steps = sorted(c.step for n in nodes for c in store.checkpoints(n))
        return [n.seq for n in nodes], steps, store.values(nodes[-1])


@dataclass
class TwoHosts:
    root: Path  # the two-process run `two` (6 steps)
    reference: Path  # the one-process run `one` (12 steps, four devices)
    config: Path
    logs: list[str]
    lineage: str  # name~nonce of `two`


@pytest.fixture(scope="module")
def two_hosts(tmp_path_factory: pytest.TempPathFactory) -> TwoHosts:
    """`two`: two `theseus run` processes x 2 CPU devices; `one`: this process, 4 devices."""
    base = tmp_path_factory.mktemp("multihost-cli")
    root, reference = base / "two", base / "one"
    for folder in (root, reference):
        Synthetic.prepare(folder, tokens=40_000, val_tokens=6_000)
    config = base / "tiny.yaml"
    settings = [f"{key}={value}" for key, value in SETTINGS.items()]
    _ok("--import", JOBS, "configure", JOB, str(config), *settings, tokens(STEPS))

    port = _free_port()
    procs = [
        _start(
            [
                "run",
                "two",
                str(config),
                str(root),
                "--import",
                JOBS,
                "--coordinator",
                f"127.0.0.1:{port}",
                "--num-processes",
                "2",
                "--process-id",
                str(i),
                "--join-timeout",
                "300",
            ],
            devices=2,
            log=base / f"host{i}.log",
            watch=(store_root(root) / "store.sqlite", base / f"host{i}.opens"),
        )
        for i in range(2)
    ]
    try:  # meanwhile, the uninterrupted reference on this process's four devices
        assert jax.device_count() == 4
        _ok("--import", JOBS, "run", "one", str(config), str(reference), tokens(MORE))
    finally:
        logs = _finish(procs)
    assert [p.popen.returncode for p in procs] == [0, 0], "\n---\n".join(logs)
    # Host zero alone opened the database; host one had every answer by broadcast.
    assert (base / "host0.opens").read_text().strip()  # the watch sees opens
    assert not (base / "host1.opens").exists(), (base / "host1.opens").read_text()
    with Store(store_root(root)) as store:
        last = store.query().spec(run="two").latest().first()
        assert last is not None
    return TwoHosts(root, reference, config, logs, f"{last.name}~{last.nonce}")


@pytest.mark.slow  # ~25 s; two processes training through the API stay in the default suite
@pytest.mark.multiprocess
def test_two_theseus_run_processes_train_like_one(two_hosts: TwoHosts) -> None:
    for i, log in enumerate(two_hosts.logs):
        assert f"Joined the cluster: process {i} of 2, 2 of 4 devices on this host." in log, log
        assert f"fresh run finished at node {two_hosts.lineage}~{STEPS - 1}." in log

    _assert_same(_params(two_hosts.root, "two", STEPS), _params(two_hosts.reference, "one", STEPS))

    # One store, written by host zero: the lineage once, finished, both checkpoints, and
    # the throughput host zero measured (each host prints its own).
    seqs, steps, values = _lineage(two_hosts.root, "two")
    assert seqs == list(range(STEPS)) and steps == [3, 6]
    assert values["job/status"] == "finished" and values["train/step"] == STEPS
    rate = f"{values['train/tokens_per_second']:,.0f} tok/s"
    assert f"step {STEPS}/{STEPS} " in two_hosts.logs[0] and rate in two_hosts.logs[0]


@pytest.mark.slow  # ~9 s; restore across layouts stays in the default suite (test_strategies)
@pytest.mark.multiprocess
def test_a_two_host_checkpoint_resumes_on_other_device_counts(
    two_hosts: TwoHosts, tmp_path: Path
) -> None:
    """2 processes x 2 devices, then 1 x 4 and 1 x 1: as if one process never stopped.

    The one-device run is a new `theseus run` process; the four-device one runs the same
    command line in this process (four devices, no cluster variables), meanwhile.
    """
    roots = {devices: tmp_path / f"resumed-on-{devices}" for devices in (4, 1)}
    for copy in roots.values():
        shutil.copytree(two_hosts.root, copy)

    def resume(devices: int) -> list[str]:
        return [
            *("run", "two", str(two_hosts.config), str(roots[devices]), "--import", JOBS),
            *("--resume", two_hosts.lineage, tokens(MORE)),
        ]

    one = _start(resume(1), devices=1, log=tmp_path / "resume-1.log")
    try:
        assert jax.device_count() == 4 and jax.process_count() == 1
        here = _ok(*resume(4)).output
    finally:
        logs = _finish([one])
    assert one.popen.returncode == 0, logs[0]

    assert not any("Joining" in log for log in (*logs, here))  # nothing set: no cluster
    uninterrupted = _params(two_hosts.reference, "one", MORE)
    for devices, copy in roots.items():
        _assert_same(_params(copy, "two", MORE), uninterrupted)
        seqs, steps, values = _lineage(copy, "two")
        assert seqs == list(range(MORE)) and steps == [3, 6, 9, 12], devices
        assert values["job/status"] == "finished" and values["train/step"] == MORE


@pytest.mark.multiprocess
@pytest.mark.slow  # ~9 s for one error message
def test_a_process_that_never_joins_is_named(tmp_path: Path) -> None:
    config = tmp_path / "counter.yaml"
    _ok("--import", CORE_JOBS, "configure", "tests/counter", str(config))
    port = _free_port()
    began = time.monotonic()
    lone = _start(
        [
            *("run", "r", str(config), str(tmp_path / "root"), "--import", CORE_JOBS),
            *f"--coordinator 127.0.0.1:{port} --num-processes 2 --process-id 0".split(),
            *("--join-timeout", "2"),
        ],
        devices=2,
        log=tmp_path / "lone.log",
    )
    [log] = _finish([lone], timeout=200)
    assert lone.popen.returncode == 1, log  # JAX alone would abort (134) a minute later
    assert time.monotonic() - began < 2 + 50, log
    [error] = [line for line in log.splitlines() if line.startswith("Error (")]
    assert error.startswith(
        f"Error (JobError): Process 0 of 2 waited 2 s as the coordinator "
        f"(127.0.0.1:{port}), but process 1 never joined."
    ), error
    assert "its own --process-id (0 to 1)" in error and "--join-timeout" in error
    # the error is the last word: not JAX's log of its abandoned join ("... timeout ... 1h")
    assert log.rstrip().endswith("(Run with --debug for the traceback.)"), log
    assert "coordination_service" not in log and "1h" not in log, log
    assert not (tmp_path / "root" / "store").exists()  # nothing ran


# ------------------------------------------------------------- without processes


def test_nothing_set_joins_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert plan_cluster(environ={}) is None
    assert plan_cluster(environ={"SLURM_JOB_ID": "7", "HOSTNAME": "node1"}) is None

    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("jax.distributed.initialize was called")

    monkeypatch.setattr(jax.distributed, "initialize", never)
    for name in [k for k in os.environ if k.startswith(ENVIRONMENT[:3])]:
        monkeypatch.delenv(name)
    config = tmp_path / "counter.yaml"
    _ok("--import", CORE_JOBS, "configure", "tests/counter", str(config))
    result = _ok("run", "r", str(config), str(tmp_path / "root"), "--import", CORE_JOBS)
    assert "fresh run finished" in result.output


def test_options_and_variables() -> None:
    explicit = plan_cluster(coordinator="10.0.0.1:8476", num_processes=4, process_id=3, environ={})
    assert explicit == ClusterPlan("options", "10.0.0.1:8476", 4, 3, 300)
    env = {
        "THESEUS_COORDINATOR": "[fd00::1]:8476",
        "THESEUS_NUM_PROCESSES": "2",
        "THESEUS_PROCESS_ID": "1",
        "THESEUS_JOIN_TIMEOUT": "30",
    }
    assert plan_cluster(environ=env) == ClusterPlan("options", "[fd00::1]:8476", 2, 1, 30)
    # an option wins over its variable; JAX's own coordinator variable comes after ours
    assert plan_cluster(process_id=0, timeout=9, environ=env) == ClusterPlan(
        "options", "[fd00::1]:8476", 2, 0, 9
    )
    jax_env = {"JAX_COORDINATOR_ADDRESS": "head:1234", "THESEUS_NUM_PROCESSES": "2"}
    assert plan_cluster(process_id=1, environ=jax_env) == ClusterPlan("options", "head:1234", 2, 1)
    assert plan_cluster(cluster="auto", environ={}) == ClusterPlan("auto")
    assert plan_cluster(environ={"THESEUS_CLUSTER": "AUTO", "THESEUS_PROCESS_ID": "2"}) == (
        ClusterPlan("auto", process_id=2)
    )
    assert plan_cluster(cluster="off", environ=env) is None  # off ignores the variables


SLURM = {
    "SLURM_JOB_ID": "4242",
    "SLURM_STEP_NODELIST": "node[01-02]",
    "SLURM_NTASKS": "4",
    "SLURM_PROCID": "2",
    "SLURM_LOCALID": "0",
}
OPEN_MPI = {
    "OMPI_MCA_orte_hnp_uri": "1234.0;tcp://10.0.0.1:5678",
    "OMPI_COMM_WORLD_SIZE": "2",
    "OMPI_COMM_WORLD_RANK": "1",
}


def test_slurm_and_open_mpi_are_detected() -> None:
    assert plan_cluster(environ=SLURM) == ClusterPlan("slurm", None, 4, 2, detection="slurm")
    assert plan_cluster(environ=OPEN_MPI) == ClusterPlan("openmpi", None, 2, 1, detection="ompi")
    # one task, or a batch script outside srun (no step), is one process
    assert plan_cluster(environ={**SLURM, "SLURM_NTASKS": "1"}) is None
    assert plan_cluster(environ={k: v for k, v in SLURM.items() if "STEP" not in k}) is None
    assert plan_cluster(environ={**OPEN_MPI, "OMPI_COMM_WORLD_SIZE": "1"}) is None
    # explicit values win; missing ones come from the scheduler; off runs alone
    assert plan_cluster(coordinator="node01:9000", environ=SLURM) == ClusterPlan(
        "slurm", "node01:9000", 4, 2, detection="slurm"
    )
    assert plan_cluster(environ={**SLURM, "THESEUS_CLUSTER": "off"}) is None
    assert plan_cluster(cluster="off", environ=OPEN_MPI) is None


@pytest.mark.parametrize(
    ("arguments", "env", "expected"),
    [
        (
            {"num_processes": 2},
            {},
            "got --num-processes 2 but no --coordinator or --process-id",
        ),
        (
            {},
            {"THESEUS_PROCESS_ID": "1", "THESEUS_COORDINATOR": "h:1"},
            "got THESEUS_COORDINATOR=h:1 and THESEUS_PROCESS_ID=1 but no --num-processes",
        ),
        (
            {"coordinator": "h:1", "num_processes": 2, "process_id": 2},
            {},
            "--process-id 2 is not a process of this cluster: with --num-processes 2 the ids "
            "are 0 to 1",
        ),
        ({"coordinator": "10.0.0.1"}, {}, "--coordinator 10.0.0.1 is not HOST:PORT"),
        ({"coordinator": "h:99999"}, {}, "--coordinator h:99999 is not HOST:PORT"),
        ({"coordinator": "http://h:1"}, {}, "is not HOST:PORT"),
        ({}, {"THESEUS_NUM_PROCESSES": "two"}, "THESEUS_NUM_PROCESSES=two is not a whole number"),
        ({}, {"THESEUS_NUM_PROCESSES": "0"}, "THESEUS_NUM_PROCESSES=0 is too small"),
        ({}, {"THESEUS_CLUSTER": "maybe"}, "THESEUS_CLUSTER=maybe is not a cluster mode"),
        (
            {"cluster": "off", "process_id": 1},
            {},
            "--cluster off runs this process alone, but --process-id 1 asked to join a "
            "cluster: drop one of them",
        ),
        (
            {"coordinator": "h:1"},
            {"THESEUS_CLUSTER": "off"},
            "THESEUS_CLUSTER=off runs this process alone, but --coordinator h:1",
        ),
    ],
)
def test_incomplete_or_contradictory_settings(
    arguments: dict[str, object], env: dict[str, str], expected: str
) -> None:
    with pytest.raises(ClusterUsageError) as raised:
        plan_cluster(**arguments, environ=env)  # type: ignore[arg-type]
    assert expected in str(raised.value)


def test_usage_errors_on_the_command_line(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [k for k in os.environ if k.startswith(ENVIRONMENT[:3])]:
        monkeypatch.delenv(name)
    result = CliRunner().invoke(main, ["run", "r", "c.yaml", "root", "--num-processes", "2"])
    assert result.exit_code == 2
    assert "Error: Joining a cluster needs --coordinator HOST:PORT" in result.stderr
    assert "got --num-processes 2 but no --coordinator or --process-id" in result.stderr
    result = CliRunner().invoke(main, ["demo", "root", "--cluster", "off", "--process-id", "1"])
    assert result.exit_code == 2
    assert "--cluster off runs this process alone" in result.stderr


def test_the_verb_joins_before_its_imports_run(monkeypatch: pytest.MonkeyPatch) -> None:
    joined: list[ClusterPlan] = []

    def join(plan: ClusterPlan) -> None:
        joined.append(plan)
        raise JobError("stopped before anything else")

    monkeypatch.setattr(cli_cluster, "join_cluster", join)
    result = CliRunner().invoke(
        main,
        [
            *("run", "r", "c.yaml", "root", "--import", "does/not/exist.py"),
            *["--coordinator", "127.0.0.1:1234", "--num-processes", "2", "--process-id", "1"],
        ],
    )
    assert result.exit_code == 1
    assert result.stderr.startswith(
        "Error (JobError): stopped before anything else (Run with --debug"
    )
    assert joined == [ClusterPlan("options", "127.0.0.1:1234", 2, 1, 300)]


def test_the_missing_process_is_named() -> None:
    two = ClusterPlan("options", "h:1", 2, 1, 7)
    assert _never_joined(two).startswith(
        "Process 1 of 2 waited 7 s to join the coordinator (h:1), but process 0 never joined "
        "(or h:1 is not reachable from this host)."
    )
    four = ClusterPlan("options", "h:1", 4, 0, 7)
    assert "but not all of processes 1, 2 and 3 joined" in _never_joined(four)
    assert "waited 7 s for its cluster to form" in _never_joined(ClusterPlan("auto", timeout=7))
