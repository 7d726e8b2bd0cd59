"""A private one-node SLURM cluster for the tests: Debian's slurm-wlm, a folder under /tmp, free ports.

:func:`running_cluster` starts ``slurmctld`` and ``slurmd`` (in the foreground, as
children of this process) on a configuration written into a new folder
``/tmp/theseus-slurm-*`` that holds everything the cluster writes: state, spool, pid
files, logs and the job-completion file (``jobcomp/filetxt``, one line per finished
job: there is no ``sacct`` without an accounting database). Both daemons listen on ports
that were free when the cluster started, so a daemon left behind by a crashed run never
answers for this one; a left-behind cluster is removed by the next start (its folder's
``lock`` is no longer held). Client commands find the cluster through ``SLURM_CONF``:
merge :attr:`SlurmCluster.env` into a subprocess's environment (or use
:meth:`SlurmCluster.environment`).

The node declares :data:`CPUS` CPUs, more than most test machines have
(``SlurmdParameters=config_overrides`` makes slurmd report the configured layout instead
of the hardware's), so a 2-task job and a second job run side by side; nothing pins
tasks to CPUs (``TaskPlugin=task/none``), they share the real cores.

The daemons run as root (``SlurmUser=root``); MUNGE authenticates them. ``munged`` is
system-wide: it is started as the munge user when it does not answer, and left running
at :meth:`SlurmCluster.stop`, since any other cluster on the machine (a second pytest
run) uses the same daemon.

A requeued job waits ``cred_expire + 1`` seconds before it may start again (the default
is 120 s); the configuration sets the smallest value Slurm 22.05 accepts (5: a smaller
one is rejected and the default used) and runs the scheduler's main loop every second
(``sched_interval=1``), so a requeued job starts again about 7 s after ``scontrol
requeue``. :meth:`SlurmCluster.start_now` lets it start at once.
"""

from __future__ import annotations

import contextlib
import fcntl
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

__all__ = ["CPUS", "SlurmCluster", "SlurmError", "find_slurm", "running_cluster"]

CPUS = 8
PREFIX = "theseus-slurm-"
CRED_EXPIRE = 5  # the smallest AuthInfo=cred_expire Slurm 22.05 accepts
# States after which a job never runs again (scontrol's and the jobcomp file's names).
FINISHED = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "BOOT_FAIL",
        "DEADLINE",
        "PREEMPTED",
    }
)
_SBIN = ("/usr/sbin", "/usr/local/sbin", "/sbin")
_COMMANDS = (
    "slurmctld",
    "slurmd",
    "munged",
    "munge",
    "sbatch",
    "srun",
    "scontrol",
    "scancel",
    "squeue",
)
# slurmd's complaint at every start that Debian's mpi/pmix plugins find no PMIx library.
_NOISE = re.compile(r"pmix|MPI: Cannot create context", re.IGNORECASE)
# Variables a SLURM job (or an outer cluster) sets, which would steer this cluster's clients.
_INHERITED = re.compile(r"^(SLURM_|SBATCH_|SRUN_|SALLOC_|SQUEUE_|SCONTROL_)")


class SlurmError(RuntimeError):
    """A daemon did not start or stop, or a client command failed."""


def find_slurm() -> dict[str, str] | None:
    """The paths of the daemons and clients this module runs, or None when one is missing."""
    path = os.pathsep.join([os.environ.get("PATH", ""), *_SBIN])
    found = {name: shutil.which(name, path=path) for name in _COMMANDS}
    if not all(found.values()):
        return None
    return {name: str(where) for name, where in found.items()}


def _free_ports(count: int) -> list[int]:
    """`count` distinct TCP ports that nothing listens on now (on any address)."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.bind(("", 0))
            sockets.append(sock)
        return [int(sock.getsockname()[1]) for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _tail(path: Path, lines: int = 5) -> str:
    """The last `lines` non-empty lines of `path`, joined by ' | ' (one line of text)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"({path} is missing)"
    kept = [line.strip() for line in text.splitlines() if line.strip() and not _NOISE.search(line)]
    kept = kept[-lines:]
    return " | ".join(kept) or f"({path} is empty)"


def _processes_with(variable: bytes) -> list[int]:
    """Processes (other than this one) whose environment holds `variable` (b"NAME=value")."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if stat.rsplit(")", 1)[-1].split()[:1] == ["Z"]:
            continue  # a zombie has exited; its parent has yet to reap it
        if variable in environ.split(b"\0"):
            found.append(int(entry.name))
    return found


def _kill_and_wait(pids: Iterable[int], variable: bytes, timeout: float) -> list[int]:
    """SIGKILL `pids`, then wait until no process with `variable` is left; the survivors."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while (left := _processes_with(variable)) and time.monotonic() < deadline:
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)
    return left


def remove_stale(tmp: Path = Path("/tmp")) -> list[Path]:
    """Stop what a crashed run left behind and remove its folder; the folders removed.

    A live cluster holds an exclusive lock on its folder's ``lock`` file; a folder whose
    lock can be taken belongs to a run that has ended without :meth:`SlurmCluster.stop`.
    Its daemons and jobs are recognized by ``SLURM_CONF=<its slurm.conf>`` in their
    environment (the daemons are started with it, and jobs inherit it from sbatch).
    """
    removed = []
    for folder in sorted(tmp.glob(f"{PREFIX}*")):
        lock_path = folder / "lock"
        if not lock_path.exists():
            continue  # not ours, or a cluster in its first microseconds
        with open(lock_path, "a") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # a running cluster
            variable = f"SLURM_CONF={folder / 'slurm.conf'}".encode()
            _kill_and_wait(_processes_with(variable), variable, timeout=10)
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


class SlurmCluster:
    """One controller and one node: :meth:`start` writes the configuration and starts both
    daemons, :meth:`stop` ends every job, stops both and removes the folder."""

    def __init__(
        self,
        *,
        cpus: int = CPUS,
        partition: str = "theseus",
        min_job_age: int = 300,
        kill_wait: int = 10,
    ) -> None:
        commands = find_slurm()
        if commands is None:
            raise SlurmError(
                "slurm-wlm and munge are not installed (apt-get install slurm-wlm munge)"
            )
        if os.geteuid() != 0:
            raise SlurmError("the test cluster runs slurmd and munged, which needs root")
        self.commands = commands
        self.cpus = cpus
        self.partition = partition
        self.min_job_age = min_job_age
        self.kill_wait = kill_wait
        self.node = socket.gethostname().split(".")[0]
        self.folder = Path(tempfile.mkdtemp(prefix=PREFIX, dir="/tmp"))
        self._lock = open(self.folder / "lock", "w")  # noqa: SIM115 (held until stop)
        fcntl.flock(self._lock, fcntl.LOCK_EX)
        self.conf = self.folder / "slurm.conf"
        self.jobcomp = self.folder / "jobcomp.txt"
        self.logs = self.folder / "log"
        self.ctld_port, self.slurmd_port = _free_ports(2)
        self.env: dict[str, str] = {"SLURM_CONF": str(self.conf)}
        self.started_munged = False
        self.start_seconds: float | None = None
        self._daemons: dict[str, subprocess.Popen[bytes]] = {}

    # -- lifecycle ---------------------------------------------------------------------------

    def __enter__(self) -> SlurmCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, timeout: float = 60.0) -> None:
        """Start munged (when it does not answer), slurmctld and slurmd; return once the
        node is idle, or raise :class:`SlurmError` naming the daemon that failed."""
        began = time.monotonic()
        try:
            self._start(timeout)
        except BaseException:
            with contextlib.suppress(Exception):
                self.stop()
            raise
        self.start_seconds = time.monotonic() - began

    def _start(self, timeout: float) -> None:
        remove_stale()
        self._ensure_munged()
        for sub in ("state", "spool", "log"):
            (self.folder / sub).mkdir()
        (self.folder / "plugstack.conf").write_text("")  # no SPANK plugins from /etc/slurm
        self.conf.write_text(self.config())
        deadline = time.monotonic() + timeout
        self._launch("slurmctld", "-D", "-f", str(self.conf))
        while " is UP" not in self.run("scontrol", "ping", check=False).stdout:
            self._check_alive("slurmctld", deadline, "does not answer scontrol ping")
            time.sleep(0.1)
        self._launch("slurmd", "-D", "-f", str(self.conf), "-N", self.node)
        while self._node_state() != "IDLE":
            self._check_alive("slurmd", deadline, f"node {self.node} is {self._node_state()}")
            time.sleep(0.1)

    def stop(self, timeout: float = 30.0) -> None:
        """End every job, stop both daemons (SIGTERM by pid file, then SIGKILL), check that no
        process of this cluster is left, and remove the folder. munged keeps running."""
        variable = f"SLURM_CONF={self.conf}".encode()
        try:
            if self._daemons.get("slurmctld") and self._daemons["slurmctld"].poll() is None:
                self._end_jobs(timeout=min(timeout, 15.0))
            for name in ("slurmd", "slurmctld"):
                self._stop_daemon(name, timeout)
            left = _kill_and_wait(_processes_with(variable), variable, timeout=10)
            if left:
                raise SlurmError(
                    f"processes of the cluster in {self.folder} survive SIGKILL: {left}"
                )
        finally:
            self._lock.close()
            shutil.rmtree(self.folder, ignore_errors=True)

    def config(self) -> str:
        """The slurm.conf this cluster runs on."""
        f = self.folder
        real_memory = self._real_memory()
        return "\n".join(
            [
                "ClusterName=theseus-tests",
                f"SlurmctldHost={self.node}(127.0.0.1)",
                f"SlurmctldPort={self.ctld_port}",
                f"SlurmdPort={self.slurmd_port}",
                "SlurmUser=root",
                "SlurmdUser=root",
                "AuthType=auth/munge",
                "CredType=cred/munge",
                # A requeued job may start again cred_expire + 1 s after it ended.
                f"AuthInfo=cred_expire={CRED_EXPIRE}",
                f"StateSaveLocation={f / 'state'}",
                f"SlurmdSpoolDir={f / 'spool'}",
                f"SlurmctldPidFile={f / 'slurmctld.pid'}",
                f"SlurmdPidFile={f / 'slurmd.pid'}",
                f"SlurmctldLogFile={self.logs / 'slurmctld.log'}",
                f"SlurmdLogFile={self.logs / 'slurmd.log'}",
                "SlurmctldDebug=info",
                "SlurmdDebug=info",
                f"PlugStackConfig={f / 'plugstack.conf'}",
                "MailProg=/bin/true",
                # A container: no cgroups, no task binding, no accounting database.
                "ProctrackType=proctrack/linuxproc",
                "TaskPlugin=task/none",
                "MpiDefault=none",
                "AccountingStorageType=accounting_storage/none",
                "JobAcctGatherType=jobacct_gather/none",
                "JobCompType=jobcomp/filetxt",
                f"JobCompLoc={self.jobcomp}",
                "SchedulerType=sched/builtin",
                # The main loop (which starts a requeued job once its delay is over) every
                # second instead of every minute.
                "SchedulerParameters=sched_interval=1",
                "SelectType=select/cons_tres",
                "SelectTypeParameters=CR_Core",
                "JobRequeue=1",
                "ReturnToService=2",
                f"MinJobAge={self.min_job_age}",
                f"KillWait={self.kill_wait}",
                "InactiveLimit=0",
                # Declare more CPUs than the machine may have: slurmd reports these.
                "SlurmdParameters=config_overrides",
                f"NodeName={self.node} NodeHostname={self.node} NodeAddr=127.0.0.1 "
                f"CPUs={self.cpus} Boards=1 SocketsPerBoard=1 CoresPerSocket={self.cpus} "
                f"ThreadsPerCore=1 RealMemory={real_memory} State=UNKNOWN",
                f"PartitionName={self.partition} Nodes={self.node} Default=YES "
                "MaxTime=INFINITE State=UP",
                "",
            ]
        )

    # -- clients -----------------------------------------------------------------------------

    def environment(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        """This process's environment without inherited SLURM_* variables, plus :attr:`env`."""
        base = {k: v for k, v in os.environ.items() if not _INHERITED.match(k)}
        return {**base, **self.env, **(extra or {})}

    def run(
        self, *command: str, check: bool = True, timeout: float = 60.0, cwd: Path | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client command (its name, then arguments) against this cluster."""
        args = [self.commands.get(command[0], command[0]), *command[1:]]
        done = subprocess.run(
            args,
            env=self.environment(),
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=cwd,
            check=False,
        )
        if check and done.returncode != 0:
            raise SlurmError(f"{' '.join(command)} exited {done.returncode}: {done.stderr.strip()}")
        return done

    def submit(self, script_path: str | Path, *sbatch_args: str, cwd: Path | None = None) -> int:
        """``sbatch --parsable [sbatch_args] script_path``, from `cwd` (by default the
        script's folder, where slurm-<id>.out lands unless ``-o`` says otherwise); the id."""
        script = Path(script_path).resolve()
        done = self.run("sbatch", "--parsable", *sbatch_args, str(script), cwd=cwd or script.parent)
        return int(done.stdout.strip().split(";")[0])

    def job(self, job_id: int) -> dict[str, str] | None:
        """``scontrol show job`` as a dict (values up to the next space), or None once the
        controller has forgotten the job (MinJobAge after it finished)."""
        done = self.run("scontrol", "show", "job", "-o", str(job_id), check=False)
        if done.returncode != 0:
            if "Invalid job id" in done.stderr:
                return None
            raise SlurmError(f"scontrol show job {job_id}: {done.stderr.strip()}")
        return dict(re.findall(r"(?:^|\s)([A-Za-z][\w:/]*)=(\S*)", done.stdout))

    def state(self, job_id: int) -> str:
        """PENDING, RUNNING, COMPLETING, COMPLETED, FAILED, CANCELLED, ...: from the controller,
        or from the last line of the jobcomp file once the controller has forgotten the job."""
        shown = self.job(job_id)
        if shown is not None:
            return shown["JobState"]
        for line in reversed(self.jobcomp_lines()):
            fields = _fields(line)
            if fields.get("JobId") == str(job_id):
                return fields["JobState"]
        raise SlurmError(f"job {job_id} is unknown to the controller and to {self.jobcomp}")

    def wait(
        self, job_id: int, states: str | Iterable[str] = FINISHED, timeout: float = 30.0
    ) -> str:
        """Poll until the job's state is one of `states` (by default any finished state);
        the state, or :class:`SlurmError` after `timeout` seconds with the last one seen."""
        wanted = {states} if isinstance(states, str) else set(states)
        deadline = time.monotonic() + timeout
        while (state := self.state(job_id)) not in wanted:
            if time.monotonic() > deadline:
                raise SlurmError(
                    f"job {job_id} is {state} after {timeout} s, not {'/'.join(sorted(wanted))}"
                )
            time.sleep(0.1)
        return state

    def jobcomp_lines(self) -> list[str]:
        """The job-completion file's lines: one each time a job ended (a requeued run's line
        says JobState=PENDING, the state it went back to)."""
        try:
            return [line.strip() for line in self.jobcomp.read_text().splitlines() if line.strip()]
        except FileNotFoundError:
            return []

    def jobcomp_records(self, job_id: int | None = None) -> list[dict[str, str]]:
        """:meth:`jobcomp_lines` as dicts (``JobId``, ``JobState``, ``ExitCode``, ...)."""
        records = [_fields(line) for line in self.jobcomp_lines()]
        return [r for r in records if job_id is None or r.get("JobId") == str(job_id)]

    def start_now(self, job_id: int) -> None:
        """Let a pending job (a requeued one waits cred_expire + 1 s) start as soon as it may.

        When a run ends, slurmd revokes the job's credential, and it refuses a launch whose
        credential was made in the same whole second as the revocation (``ctime <= revoked``
        in slurmd's cred_context.c): the launch fails and the job is held. So this first waits
        for the job to be back in the queue (the revocation came before that) and for the
        clock's next second, then moves its start time to now.
        """
        self.wait(job_id, "PENDING", timeout=30)
        back = time.time()
        time.sleep(max(0.0, math.floor(back) + 1.05 - time.time()))
        self.run("scontrol", "update", f"JobId={job_id}", "StartTime=now")

    def cancel_all(self) -> None:
        """Cancel every job of the cluster (pending or running)."""
        self.run("scancel", f"--partition={self.partition}", check=False)

    # -- internals ---------------------------------------------------------------------------

    def _real_memory(self) -> int:
        """RealMemory (MiB) as ``slurmd -C`` reports it for this machine, 1000 if it cannot."""
        done = subprocess.run(
            [self.commands["slurmd"], "-C"], capture_output=True, text=True, timeout=60, check=False
        )
        found = re.search(r"RealMemory=(\d+)", done.stdout)
        return int(found.group(1)) if found else 1000

    def _ensure_munged(self) -> None:
        if self._munge_answers():
            return
        key = Path("/etc/munge/munge.key")
        if not key.exists():
            raise SlurmError(f"munged is not running and {key} is missing (apt-get install munge)")
        run_dir = Path("/run/munge")
        run_dir.mkdir(mode=0o755, exist_ok=True)
        shutil.chown(run_dir, "munge", "munge")
        done = subprocess.run(
            ["runuser", "-u", "munge", "--", self.commands["munged"]],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        deadline = time.monotonic() + 10
        while not self._munge_answers():
            if time.monotonic() > deadline:
                raise SlurmError(
                    f"munged did not start (exit {done.returncode}): "
                    f"{(done.stderr or done.stdout).strip()} | {_tail(Path('/var/log/munge/munged.log'))}"
                )
            time.sleep(0.1)
        self.started_munged = True

    def _munge_answers(self) -> bool:
        done = subprocess.run(
            [self.commands["munge"], "-n"], capture_output=True, timeout=30, check=False
        )
        return done.returncode == 0

    def _launch(self, name: str, *args: str) -> None:
        with open(self.logs / f"{name}.out", "wb") as out:  # the daemon's stdout and stderr
            self._daemons[name] = subprocess.Popen(
                [self.commands[name], *args],
                env=self.environment(),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a Ctrl-C at the terminal reaches pytest, not them
            )

    def _check_alive(self, name: str, deadline: float, waiting_for: str) -> None:
        """Raise a one-line :class:`SlurmError` when `name` has exited or time is up."""
        code = self._daemons[name].poll()
        if code is None and time.monotonic() < deadline:
            return
        log = self.logs / f"{name}.log"  # where the daemon logs once it has read slurm.conf
        if not log.exists() or not log.stat().st_size:
            log = self.logs / f"{name}.out"  # its stderr: errors in reading slurm.conf
        tail = _tail(log)
        what = f"exited with {code}" if code is not None else f"{waiting_for} after the timeout"
        raise SlurmError(f"{name} {what}; {log.name}: {tail}")

    def _node_state(self) -> str:
        done = self.run("scontrol", "show", "node", "-o", self.node, check=False)
        found = re.search(r"\bState=(\S+)", done.stdout)
        return found.group(1) if found else "unknown to slurmctld"

    def _end_jobs(self, timeout: float) -> None:
        """SIGKILL every running job, cancel the pending ones, wait until the queue is empty."""
        self.run("scancel", "--full", "--signal=KILL", f"--partition={self.partition}", check=False)
        self.cancel_all()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            queue = self.run("squeue", "-h", "-o", "%i %T", check=False)
            if queue.returncode != 0 or not queue.stdout.strip():
                return
            time.sleep(0.1)

    def _stop_daemon(self, name: str, timeout: float) -> None:
        """SIGTERM the pid in the daemon's pid file (and the child we started), wait for it."""
        process = self._daemons.pop(name, None)
        pids = set()
        with contextlib.suppress(OSError, ValueError):
            pids.add(int((self.folder / f"{name}.pid").read_text().strip()))
        if process is not None and process.poll() is None:
            pids.add(process.pid)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        if process is None:
            return
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


def _fields(line: str) -> dict[str, str]:
    """``Key=value`` pairs of a jobcomp line (values up to the next space)."""
    return dict(re.findall(r"(?:^|\s)([A-Za-z][\w:/]*)=(\S*)", line))


@contextlib.contextmanager
def running_cluster(**options: Any) -> Iterator[SlurmCluster]:
    """A started cluster for the block; every job ended, the daemons stopped after it."""
    cluster = SlurmCluster(**options)
    with cluster:
        yield cluster
