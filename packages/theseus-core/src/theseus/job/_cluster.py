"""Joining a multi-host JAX cluster (``jax.distributed``) before the first computation.

:func:`plan_cluster` decides from explicit values, ``THESEUS_*`` environment variables
and the scheduler's environment (SLURM, Open MPI) whether this process joins a
cluster and how; :func:`join_cluster` joins it with a deadline and turns a cluster
that never forms into a readable :class:`JobError`. Nothing here imports JAX
until a process actually joins, and one machine with nothing set joins nothing.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import re
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from theseus.errors import TheseusError
from theseus.job._errors import JobError

logger = logging.getLogger(__name__)

ENV_CLUSTER = "THESEUS_CLUSTER"
ENV_COORDINATOR = "THESEUS_COORDINATOR"
ENV_NUM_PROCESSES = "THESEUS_NUM_PROCESSES"
ENV_PROCESS_ID = "THESEUS_PROCESS_ID"
ENV_JOIN_TIMEOUT = "THESEUS_JOIN_TIMEOUT"
JAX_COORDINATOR = "JAX_COORDINATOR_ADDRESS"  # JAX's own name, honoured after ours
DEFAULT_JOIN_TIMEOUT = 300
CLUSTER_MODES = ("auto", "off")

# JAX's own deadline comes this much later than ours: when a process never arrives, the
# ones that did wait `timeout` seconds and raise JobError (JAX would instead end
# the process with a fatal log line that names no process).
_JAX_GRACE_S = 60

_HOST_PORT = re.compile(r"(?:\[[0-9A-Fa-f:.]+\]|[^\s:\[\]/]+):(\d{1,5})")


class ClusterUsageError(TheseusError, ValueError):
    """The settings to join a cluster are incomplete or contradict each other."""


@dataclass(frozen=True)
class ClusterPlan:
    """How this process joins its cluster.

    Attributes:
        source: what asked for it: ``"options"`` (coordinator, number of processes and
            process id), ``"slurm"``, ``"openmpi"`` or ``"auto"`` (JAX detects it).
        coordinator: process 0's ``HOST:PORT`` (``None``: JAX finds it).
        num_processes: the number of processes (``None``: JAX finds it).
        process_id: this process's id (``None``: JAX finds it).
        timeout: seconds to wait until every process has joined.
        detection: the ``cluster_detection_method`` JAX gets (``None``: its own choice).
    """

    source: str
    coordinator: str | None = None
    num_processes: int | None = None
    process_id: int | None = None
    timeout: int = DEFAULT_JOIN_TIMEOUT
    detection: str | None = None

    def describe(self) -> str:
        """Which process of how many, e.g. ``process 1 of 2 (coordinator 10.0.0.1:8476)``."""
        who = (
            f"process {self.process_id} of {self.num_processes}"
            if self.process_id is not None and self.num_processes is not None
            else "this process"
        )
        details = [f"coordinator {self.coordinator}"] if self.coordinator else []
        found = {"slurm": "SLURM", "openmpi": "Open MPI", "auto": "found by JAX"}
        if self.source in found:
            details.append(found[self.source])
        return f"{who} ({', '.join(details)})" if details else who


@dataclass(frozen=True)
class _Value:
    value: Any
    label: str  # how the message names it: "--process-id 1" or "THESEUS_PROCESS_ID=1"


def _pick(
    explicit: Any, flag: str, env: Mapping[str, str], names: tuple[str, ...]
) -> tuple[Any, str, bool] | None:
    """(raw value, label, came from the command line) of the first source that has it."""
    if explicit is not None:
        return explicit, f"{flag} {explicit}", True
    for name in names:
        raw = env.get(name, "").strip()
        if raw:
            return raw, f"{name}={raw}", False
    return None


def _integer(picked: tuple[Any, str, bool] | None, what: str, minimum: int) -> _Value | None:
    if picked is None:
        return None
    raw, label, _ = picked
    try:
        value = int(raw)
    except (TypeError, ValueError):
        raise ClusterUsageError(
            f"{label} is not a whole number: expected {what}, {minimum} or more."
        ) from None
    if value < minimum:
        raise ClusterUsageError(f"{label} is too small: expected {what}, {minimum} or more.")
    return _Value(value, label)


def _detect(env: Mapping[str, str]) -> ClusterPlan | None:
    """A SLURM step or Open MPI run with more than one task, as JAX would detect it."""

    def count(name: str) -> int | None:
        try:
            return int(env[name])
        except (KeyError, ValueError):
            return None

    slurm = ("SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID")
    tasks = count("SLURM_NTASKS")
    if all(name in env for name in slurm) and tasks is not None and tasks > 1:
        return ClusterPlan(
            "slurm", num_processes=tasks, process_id=count("SLURM_PROCID"), detection="slurm"
        )
    size = count("OMPI_COMM_WORLD_SIZE")
    if "OMPI_MCA_orte_hnp_uri" in env and size is not None and size > 1:
        return ClusterPlan(
            "openmpi",
            num_processes=size,
            process_id=count("OMPI_COMM_WORLD_RANK"),
            detection="ompi",
        )
    return None


def plan_cluster(
    cluster: str | None = None,
    coordinator: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    timeout: int | None = None,
    environ: Mapping[str, str] | None = None,
) -> ClusterPlan | None:
    """Decide whether and how this process joins a cluster; ``None`` when it runs alone.

    Every argument left ``None`` falls back on its environment variable
    (``THESEUS_CLUSTER``, ``THESEUS_COORDINATOR`` then ``JAX_COORDINATOR_ADDRESS``,
    ``THESEUS_NUM_PROCESSES``, ``THESEUS_PROCESS_ID``, ``THESEUS_JOIN_TIMEOUT``). The
    arguments mirror the command-line options (``--cluster``, ``--coordinator``, ...).

    - ``cluster="off"``: never join (the scheduler's environment and the variables are
      ignored; explicit arguments contradict it).
    - ``cluster="auto"``: always join, leaving to ``jax.distributed.initialize`` what
      is not given (TPU pods, Kubernetes, SLURM, Open MPI).
    - otherwise join when coordinator, number of processes and process id are all
      given, or when this is one of several SLURM tasks (``srun``) or Open MPI ranks.

    Args:
        cluster: ``"auto"``, ``"off"`` or ``None``.
        coordinator: process 0's ``HOST:PORT``, the same on every process.
        num_processes: how many processes join.
        process_id: this process's id, from 0 to ``num_processes - 1``.
        timeout: seconds to wait for every process (default 300).
        environ: the environment to read (default ``os.environ``).

    Returns:
        The plan, or ``None`` to run as one process.

    Raises:
        ClusterUsageError: a malformed value, a process id out of range, a partial set
            of coordinator, number and id outside a detected cluster, or ``off`` with
            explicit values; the message says what arrived and what was expected.
    """
    env = os.environ if environ is None else environ
    picked_mode = _pick(cluster, "--cluster", env, (ENV_CLUSTER,))
    mode = None
    if picked_mode is not None:
        mode = str(picked_mode[0]).strip().lower()
        if mode not in CLUSTER_MODES:
            raise ClusterUsageError(
                f"{picked_mode[1]} is not a cluster mode: expected 'auto' (let JAX find the "
                "cluster) or 'off' (run alone)."
            )
    coord = _pick(coordinator, "--coordinator", env, (ENV_COORDINATOR, JAX_COORDINATOR))
    count = _pick(num_processes, "--num-processes", env, (ENV_NUM_PROCESSES,))
    ident = _pick(process_id, "--process-id", env, (ENV_PROCESS_ID,))
    given = [p for p in (coord, count, ident) if p is not None]

    if mode == "off":
        flags = [label for _, label, from_flag in given if from_flag]
        if flags:
            assert picked_mode is not None
            fix = "drop one of them" if picked_mode[2] else f"unset {ENV_CLUSTER} or drop them"
            raise ClusterUsageError(
                f"{picked_mode[1]} runs this process alone, but {' and '.join(flags)} asked "
                f"to join a cluster: {fix}."
            )
        return None

    wait = _integer(
        _pick(timeout, "--join-timeout", env, (ENV_JOIN_TIMEOUT,)), "seconds to wait", 1
    )
    n = _integer(count, "the number of processes", 1)
    i = _integer(ident, "this process's id", 0)
    address = None
    if coord is not None:
        address = str(coord[0]).strip()
        match = _HOST_PORT.fullmatch(address)
        if match is None or not 1 <= int(match.group(1)) <= 65535:
            raise ClusterUsageError(
                f"{coord[1]} is not HOST:PORT: expected process 0's host name or address "
                "and a free port, the same on every process, e.g. 10.0.0.1:8476 or "
                "[fd00::1]:8476."
            )
    if n is not None and i is not None and i.value >= n.value:
        raise ClusterUsageError(
            f"{i.label} is not a process of this cluster: with {n.label} the ids are 0 to "
            f"{n.value - 1}. Give each process its own id in that range (0 is the "
            "coordinator and the one that writes the store)."
        )
    seconds = DEFAULT_JOIN_TIMEOUT if wait is None else wait.value
    number = None if n is None else int(n.value)
    own = None if i is None else int(i.value)
    if mode == "auto":
        return ClusterPlan("auto", address, number, own, seconds)
    if len(given) == 3:
        return ClusterPlan("options", address, number, own, seconds)
    detected = _detect(env)
    if detected is not None:  # JAX fills what is not given from the scheduler
        return ClusterPlan(
            detected.source,
            address,
            detected.num_processes if number is None else number,
            detected.process_id if own is None else own,
            seconds,
            detected.detection,
        )
    if given:
        names = {"--coordinator": coord, "--num-processes": count, "--process-id": ident}
        missing = [name for name, value in names.items() if value is None]
        arrived = " and ".join(label for _, label, _ in given)
        raise ClusterUsageError(
            f"Joining a cluster needs --coordinator HOST:PORT, --num-processes N and "
            f"--process-id I together; got {arrived} but no {' or '.join(missing)}. Pass "
            "all three on every process (the same coordinator and number, each its own id "
            f"from 0), or set {ENV_COORDINATOR}, {ENV_NUM_PROCESSES} and {ENV_PROCESS_ID}; "
            "--cluster auto lets JAX find the rest on a TPU pod or Kubernetes, and "
            "--cluster off runs alone."
        )
    return None


def _others(plan: ClusterPlan) -> str:
    assert plan.num_processes is not None and plan.process_id is not None
    rest = [p for p in range(plan.num_processes) if p != plan.process_id]
    if len(rest) == 1:
        return f"process {rest[0]} never joined"
    listed = ", ".join(str(p) for p in rest[:-1]) + f" and {rest[-1]}"
    return f"not all of processes {listed} joined (the coordinator does not say which)"


def _never_joined(plan: ClusterPlan) -> str:
    """The message for a cluster that did not form within the plan's timeout."""
    fix = (
        "Check that every host runs the same command, each with its own --process-id "
        f"(0 to {plan.num_processes - 1}), the same --coordinator and --num-processes, "
        "and that the coordinator's port is reachable from every host; raise "
        "--join-timeout if some hosts start late."
        if plan.num_processes is not None
        else "Check that every host runs the same command; raise --join-timeout if some "
        "hosts start late."
    )
    if plan.num_processes is None or plan.process_id is None:
        return (
            f"This process ({plan.describe()}) waited {plan.timeout} s for its cluster to "
            f"form, but not every process joined. {fix}"
        )
    where = plan.coordinator or "the coordinator"
    if plan.process_id == 0:
        what = (
            f"Process 0 of {plan.num_processes} waited {plan.timeout} s as the coordinator "
            f"({where}), but {_others(plan)}."
        )
    else:
        what = (
            f"Process {plan.process_id} of {plan.num_processes} waited {plan.timeout} s to "
            f"join the coordinator ({where}), but {_others(plan)} (or {where} is not "
            "reachable from this host)."
        )
    return f"{what} {fix}"


def _silence_teardown() -> None:
    """At the exit of a process whose join timed out: send file descriptor 2 to /dev/null.

    The join left behind (its thread, and process 0's coordination service) fails as the
    process exits, and JAX's C++ logs that straight to file descriptor 2: lines that say
    the registration failed and that "the timeout is currently set to: 1h" (the
    service's own deadline, not this one). After the one-line `JobError` they
    only mislead, so they are dropped; what Python printed before exit (the error, a
    traceback with --debug) is already out.
    """
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.flush()
        sys.stdout.flush()
        quiet = os.open(os.devnull, os.O_WRONLY)
        os.dup2(quiet, 2)
        os.close(quiet)


def join_cluster(plan: ClusterPlan) -> None:
    """Join the cluster ``plan`` describes (``jax.distributed.initialize``).

    Call it before anything touches JAX devices. On CPU, cross-process collectives use
    gloo unless ``jax_cpu_collectives_implementation`` was chosen already. When the
    cluster does not form within ``plan.timeout`` seconds, every process that arrived
    raises :class:`JobError` naming the processes that did not (JAX's own
    deadline, a minute later, would end the process with a fatal log line instead), and
    what JAX logs as the abandoned join is torn down at exit is silenced
    (`_silence_teardown`). Joining a second time does nothing.

    Raises:
        JobError: the cluster did not form in time, or JAX refused to join
            (e.g. devices were used already, or ``auto`` found no cluster).
    """
    import jax

    if jax.distributed.is_initialized():
        return
    if getattr(jax.config, "jax_cpu_collectives_implementation", None) in (None, "none"):
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    arguments: dict[str, Any] = {
        "coordinator_address": plan.coordinator,
        "num_processes": plan.num_processes,
        "process_id": plan.process_id,
        "initialization_timeout": plan.timeout + _JAX_GRACE_S,
    }
    if plan.detection is not None:
        arguments["cluster_detection_method"] = plan.detection
    outcome: list[BaseException] = []

    def initialize() -> None:
        try:
            jax.distributed.initialize(**arguments)
        except BaseException as exc:  # handed to the waiting thread
            outcome.append(exc)

    logger.info(
        "Joining a cluster as %s; waiting up to %d s for every process ...",
        plan.describe(),
        plan.timeout,
    )
    # JAX blocks until every process has registered; a thread lets this one give up
    # after `timeout` with a message (the daemon thread is left behind as the process
    # exits).
    worker = threading.Thread(target=initialize, name="theseus-join-cluster", daemon=True)
    worker.start()
    worker.join(plan.timeout)
    if worker.is_alive():
        atexit.register(_silence_teardown)  # runs before JAX's own exit handlers
        raise JobError(_never_joined(plan))
    if outcome:
        exc = outcome[0]
        hint = (
            " Something used JAX devices before this process joined (e.g. a module given "
            "to --import that computes at import time); join first."
            if "must be called before" in str(exc)
            else " --cluster auto needs a TPU pod, a Kubernetes job, a SLURM step or an "
            "Open MPI run; elsewhere pass --coordinator, --num-processes and --process-id."
            if plan.source == "auto"
            else ""
        )
        said = str(exc).strip().rstrip(".")
        raise JobError(
            f"Could not join the cluster as {plan.describe()}: {type(exc).__name__}: {said}.{hint}"
        ) from exc
    logger.info(
        "Joined the cluster: process %d of %d, %d of %d devices on this host.",
        jax.process_index(),
        jax.process_count(),
        jax.local_device_count(),
        jax.device_count(),
    )
