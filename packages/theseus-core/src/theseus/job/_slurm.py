"""A run sent to SLURM: its batch script, the user's cluster profiles, what ran, its state.

``theseus submit`` (``theseus.cli._submit``) writes one batch script with
:func:`batch_script` and hands it to ``sbatch``. The script starts ``theseus run`` once
per task with ``srun`` (the cluster join that exists finds SLURM's variables), asks
SLURM for a warning signal before the time limit (``--signal=B:USR2@SECONDS``: to the
batch shell, which passes it to the tasks), and requeues the job when the run stopped
on that warning (exit code 128 + the signal's number) and requeues are left.

Inside the tasks, ``theseus run --scheduler-job ID`` makes a :class:`ScheduledJob`:
the job records ``slurm/job``, ``slurm/state`` and ``slurm/restarts`` beside each
``job/status``, and what ran (:func:`what_ran`) on the node it starts from. A requeued
job finds its lineage by ``slurm/job`` in the store and resumes its latest registered
checkpoint (``theseus.cli._verbs``).

Profiles (:func:`load_profiles`) keep per-cluster defaults in
``~/.config/theseus/clusters.yaml``::

    default: mycluster
    clusters:
      mycluster:
        partition: gpu
        account: my-project
        time: "12:00:00"
        modules: [cuda/12.4]
        environment: {XLA_PYTHON_CLIENT_MEM_FRACTION: "0.9"}
        setup: ["source ~/venvs/theseus/bin/activate"]
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import hashlib
import os
import platform
import re
import shlex
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from theseus.errors import TheseusError

__all__ = [
    "ENV_REQUEUES",
    "PROFILE_KEYS",
    "ScheduledJob",
    "SlurmOptions",
    "SubmitError",
    "batch_script",
    "check_sbatch",
    "current_scheduled",
    "load_profiles",
    "profiles_file",
    "scheduled_here",
    "what_ran",
]

#: Set by the batch script: how many times the job may requeue itself.
ENV_REQUEUES = "THESEUS_REQUEUES"
#: The exit code of a run stopped by the warning (128 + SIGUSR2 on Linux).
PREEMPTED_EXIT = 128 + 12


class SubmitError(TheseusError):
    """A submission that cannot be made (a bad profile, a missing or failing ``sbatch``)."""


# -- the state a scheduled run records ------------------------------------------------------


@dataclass(frozen=True)
class ScheduledJob:
    """The SLURM job a ``theseus run`` process runs in.

    Attributes:
        job_id: SLURM's job id (kept across requeues).
        restarts: how many times the job was requeued before this run (0 on the first).
        requeues: how many requeues the submission allows.
        nonce: the lineage ``theseus submit`` made for the job (its first node holds
            ``slurm/state = pending``): a fresh run starts there, not on a new lineage.
    """

    job_id: str
    restarts: int = 0
    requeues: int = 0
    nonce: str | None = None

    @classmethod
    def from_environment(cls, job_id: str, nonce: str | None = None) -> ScheduledJob:
        """The job ``job_id``, with its restarts and allowed requeues from the environment."""
        return cls(
            job_id=job_id,
            restarts=_count("SLURM_RESTART_COUNT"),
            requeues=_count(ENV_REQUEUES),
            nonce=nonce,
        )

    def state(self, status: str) -> str:
        """The job's state beside a ``job/status``: a preempted run that will requeue
        itself is ``requeued``; one out of requeues stays ``preempted``."""
        if status == "preempted":
            return "requeued" if self.restarts < self.requeues else "preempted"
        return status

    def values(self, status: str) -> dict[str, Any]:
        """The ``slurm/*`` values recorded beside ``job/status = status``."""
        return {
            "slurm/job": self.job_id,
            "slurm/state": self.state(status),
            "slurm/restarts": self.restarts,
        }

    def record_start(self, store: Any, node: Any, folder: Path | None = None) -> None:
        """Record what ran (:func:`what_ran`) on ``node``, where this run starts."""
        values, diff = what_ran(Path.cwd() if folder is None else folder)
        store.log(node, values)
        if diff:
            store.put(node, "ran/diff", "uncommitted.diff", diff)


_CURRENT: list[ScheduledJob] = []


def current_scheduled() -> ScheduledJob | None:
    """The scheduler job the jobs made now belong to (see :func:`scheduled_here`), or None."""
    return _CURRENT[-1] if _CURRENT else None


@contextlib.contextmanager
def scheduled_here(job: ScheduledJob) -> Iterator[ScheduledJob]:
    """Inside the block, every job made (``BasicJob.__init__``) runs as ``job``.

    ``theseus run --scheduler-job`` wraps its run in it, so the job knows the lineage
    it starts on before it is set up (``quick``'s ``create`` sets up).
    """
    _CURRENT.append(job)
    try:
        yield job
    finally:
        _CURRENT.pop()


def _count(variable: str) -> int:
    text = os.environ.get(variable, "").strip()
    try:
        return max(0, int(text)) if text else 0
    except ValueError:
        return 0


def what_ran(folder: Path) -> tuple[dict[str, Any], bytes]:
    """The code a run starts with, as values, and the uncommitted changes' diff.

    Values: ``ran/python``, ``ran/jax``, ``ran/theseus`` (versions); in a git
    repository ``ran/git_head``, ``ran/git_dirty`` and, when dirty, ``ran/diff_sha256``
    (of the returned diff: ``git diff HEAD`` with binary changes, then each untracked
    file's name and SHA-256); ``ran/uv_lock_sha256`` and ``ran/uv_lock`` for the first
    ``uv.lock`` in ``folder`` or a folder above it (up to the repository's top).
    """
    from importlib import metadata

    import jax

    values: dict[str, Any] = {"ran/python": platform.python_version(), "ran/jax": jax.__version__}
    with contextlib.suppress(metadata.PackageNotFoundError):  # a source tree: no version
        values["ran/theseus"] = metadata.version("theseus-core")
    diff, top = b"", None
    head = _git(folder, "rev-parse", "HEAD")
    if head is not None:
        values["ran/git_head"] = head.decode().strip()
        top_text = _git(folder, "rev-parse", "--show-toplevel")
        top = Path(top_text.decode().strip()) if top_text else None
        changes = _git(folder, "diff", "HEAD", "--binary") or b""
        untracked = _git(folder, "ls-files", "--others", "--exclude-standard", "-z") or b""
        listed = []
        for name in sorted(n for n in untracked.decode(errors="replace").split("\0") if n):
            path = (top or folder) / name
            try:
                digest = hashlib.sha256(path.read_bytes()).hexdigest()
            except OSError:
                digest = "unreadable"
            listed.append(f"untracked {name} sha256 {digest}\n")
        diff = changes + "".join(listed).encode()
        values["ran/git_dirty"] = bool(diff)
        if diff:
            values["ran/diff_sha256"] = hashlib.sha256(diff).hexdigest()
    here = folder.resolve()
    for place in (here, *here.parents):
        lock = place / "uv.lock"
        if lock.is_file():
            values["ran/uv_lock_sha256"] = hashlib.sha256(lock.read_bytes()).hexdigest()
            values["ran/uv_lock"] = str(lock)
            break
        if top is not None and place == top:
            break
    return values, diff


def _git(folder: Path, *args: str) -> bytes | None:
    try:
        done = subprocess.run(
            ["git", "-C", str(folder), *args], capture_output=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


# -- options and the user's profiles -----------------------------------------------------------


@dataclass
class SlurmOptions:
    """What the batch script asks SLURM for, and what it sets up before the run.

    ``None`` leaves a setting to the cluster's own default (no ``#SBATCH`` line).
    """

    nodes: int = 1
    gpus_per_node: int | None = None
    tasks_per_node: int | None = None  # default: one per GPU, else one
    cpus_per_task: int | None = None
    time: str | None = None
    partition: str | None = None
    account: str | None = None
    sbatch: list[str] = field(default_factory=list)
    requeues: int = 3
    signal_seconds: int = 300
    modules: list[str] = field(default_factory=list)
    environment: dict[str, str] = field(default_factory=dict)
    setup: list[str] = field(default_factory=list)

    @property
    def tasks(self) -> int:
        """Tasks on each node: ``tasks_per_node``, else one per GPU, else one."""
        if self.tasks_per_node is not None:
            return self.tasks_per_node
        return self.gpus_per_node or 1

    def merged(self, overrides: Mapping[str, Any]) -> SlurmOptions:
        """These options with ``overrides``' settings that are not None (lists add up)."""
        changes: dict[str, Any] = {}
        for key, value in overrides.items():
            if value is None:
                continue
            current = getattr(self, key)
            if isinstance(current, list):
                changes[key] = [*current, *value]
            elif isinstance(current, dict):
                changes[key] = {**current, **value}
            else:
                changes[key] = value
        return dataclasses.replace(self, **changes)


#: What a profile in ``clusters.yaml`` may set (the fields of :class:`SlurmOptions`).
PROFILE_KEYS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(SlurmOptions))


def profiles_file() -> Path:
    """``$XDG_CONFIG_HOME/theseus/clusters.yaml`` (``~/.config/theseus/clusters.yaml``)."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "theseus" / "clusters.yaml"


def load_profiles(path: Path, chosen: str | None) -> SlurmOptions:
    """The options of profile ``chosen`` (None: the file's ``default``, if any) in ``path``.

    A missing file gives the plain defaults (unless a profile was asked for).

    Raises:
        SubmitError: the file is not the expected shape, names a setting
            :class:`SlurmOptions` does not have, or lacks the profile asked for (one line).
    """
    if not path.is_file():
        if chosen is not None:
            raise SubmitError(
                f"--profile {chosen}: there is no profiles file at {path}; write one with a "
                f"`clusters: {{{chosen}: {{partition: ...}}}}` mapping, or leave --profile out."
            )
        return SlurmOptions()
    import yaml

    try:
        data = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as err:
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise SubmitError(f"{path} is not readable YAML ({first}); fix or remove it.") from None
    if not isinstance(data, dict) or set(data) - {"default", "clusters"}:
        extra = sorted(set(data) - {"default", "clusters"}) if isinstance(data, dict) else data
        raise SubmitError(
            f"{path}: expected a mapping with `clusters:` (and optionally `default:`); found "
            f"{extra!r}. Put each cluster's settings under `clusters: NAME:`."
        )
    clusters = data.get("clusters") or {}
    if not isinstance(clusters, dict):
        raise SubmitError(f"{path}: `clusters:` must map names to settings; got {clusters!r}.")
    name = chosen if chosen is not None else data.get("default")
    if name is None:
        return SlurmOptions()
    if name not in clusters:
        where = "--profile" if chosen is not None else "`default:`"
        raise SubmitError(
            f"{where} names the cluster {name!r}, which {path} does not have; it has "
            f"{sorted(map(str, clusters)) or 'none'}."
        )
    settings = clusters[name] or {}
    if not isinstance(settings, dict):
        raise SubmitError(
            f"{path}: cluster {name!r} must map settings to values; got {settings!r}."
        )
    unknown = sorted(
        str(k).replace("-", "_") for k in settings if str(k).replace("-", "_") not in PROFILE_KEYS
    )
    if unknown:
        raise SubmitError(
            f"{path}: cluster {name!r} sets {', '.join(unknown)}, which theseus submit does not "
            f"know; the settings are {', '.join(PROFILE_KEYS)}."
        )
    options = SlurmOptions()
    for key, value in settings.items():
        key = str(key).replace("-", "_")
        options = dataclasses.replace(options, **{key: _checked(path, name, key, value)})
    return options


def _checked(path: Path, name: str, key: str, value: Any) -> Any:
    """``value`` as :class:`SlurmOptions` keeps ``key``, or a one-line error."""
    kind = str({f.name: f.type for f in dataclasses.fields(SlurmOptions)}[key])
    where = f"{path}: cluster {name!r} sets {key} to {value!r}"
    if kind.startswith("int"):
        least = 0 if key == "requeues" else 1
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise SubmitError(f"{where}; expected a whole number >= {least}.")
        return value
    if key == "time" and isinstance(value, int):  # YAML 1.1 reads 12:00:00 as 43200
        raise SubmitError(
            f"{where}, a number: YAML reads an unquoted H:MM:SS as seconds; quote it "
            '(time: "12:00:00").'
        )
    if kind.startswith("str"):
        if not isinstance(value, str | int):
            raise SubmitError(f"{where}; expected text.")
        return str(value)
    if kind.startswith("list"):
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not all(isinstance(v, str | int) for v in value):
            raise SubmitError(f"{where}; expected a list of text.")
        listed = [str(v) for v in value]
        if key == "sbatch":
            check_sbatch(listed, where=f"{path}: cluster {name!r} sets sbatch")
        return listed
    if not isinstance(value, dict):
        raise SubmitError(f"{where}; expected a mapping NAME: VALUE.")
    if key == "environment":
        bad = [str(k) for k in value if not _SHELL_NAME.fullmatch(str(k))]
        if bad:
            raise SubmitError(
                f"{path}: cluster {name!r} sets environment variables named {bad!r}; a name is "
                "letters, digits and _, not starting with a digit."
            )
    return {str(k): str(v) for k, v in value.items()}


_SHELL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


#: ``#SBATCH`` options the script sets itself, and what to pass instead of each.
_MANAGED = {
    "--nodes": "--nodes", "-N": "--nodes", "--ntasks-per-node": "--tasks-per-node",
    "--ntasks": "--nodes and --tasks-per-node", "-n": "--nodes and --tasks-per-node",
    "--gpus-per-node": "--gpus-per-node", "--cpus-per-task": "--cpus-per-task",
    "-c": "--cpus-per-task", "--time": "--time", "-t": "--time",
    "--partition": "--partition", "-p": "--partition", "--account": "--account",
    "-A": "--account", "--job-name": "RUN", "-J": "RUN",
    "--output": "nothing (the log is ROOT/slurm/RUN-DATE/slurm-JOBID.out)",
    "-o": "nothing (the log is ROOT/slurm/RUN-DATE/slurm-JOBID.out)",
    "--open-mode": "nothing", "--requeue": "--requeues",
    "--no-requeue": "--requeues 0", "--signal": "--signal-seconds",
}  # fmt: skip


def check_sbatch(options: Sequence[str], where: str = "--sbatch") -> None:
    """Refuse an ``#SBATCH`` option that is not one line starting with ``-`` (a newline
    would end SLURM's directives and run the rest as a command), or one the script sets
    itself (a second ``--nodes`` or ``--signal`` would silently change what was printed,
    or stop the requeue).

    Raises:
        SubmitError: one line naming the option.
    """
    for option in options:
        if "\n" in option or "\r" in option or not option.startswith("-"):
            raise SubmitError(
                f"{where}: {option!r} is not one sbatch option; give each as one line starting "
                "with - (e.g. --sbatch=--qos=high)."
            )
        flag = option.split("=", 1)[0].split(" ", 1)[0]
        if flag in _MANAGED or (flag[:2] in _MANAGED and len(flag) > 2 and flag[1] != "-"):
            instead = _MANAGED.get(flag, _MANAGED.get(flag[:2], ""))
            raise SubmitError(
                f"{where}: {option!r} sets what the script sets itself; pass {instead} to "
                "theseus submit instead."
            )


# -- the batch script ---------------------------------------------------------------------------


def batch_script(
    *,
    command: Sequence[str],
    options: SlurmOptions,
    job_name: str,
    folder: Path,
    workdir: Path,
    signal: str = "USR2",
) -> str:
    """The batch script that runs ``command`` (a ``theseus run ...``) once per task.

    Args:
        command: the task's command line, without ``--scheduler-job`` (added here).
        options: what to ask SLURM for and what to set up first.
        job_name: SLURM's name of the job.
        folder: where the job's output goes (``slurm-JOBID.out``).
        workdir: the folder the tasks start in (the submitter's).
        signal: the warning signal's name, without ``SIG``.
    """
    q = shlex.quote
    lines = [
        "#!/bin/bash",
        f"# Written by theseus submit on {datetime.datetime.now().isoformat(timespec='seconds')}.",
        f"#SBATCH --job-name={q(job_name)}",
        f"#SBATCH --nodes={options.nodes}",
        f"#SBATCH --ntasks-per-node={options.tasks}",
    ]
    if options.gpus_per_node:
        lines.append(f"#SBATCH --gpus-per-node={options.gpus_per_node}")
    if options.cpus_per_task:
        lines.append(f"#SBATCH --cpus-per-task={options.cpus_per_task}")
    for flag, value in (
        ("time", options.time),
        ("partition", options.partition),
        ("account", options.account),
    ):
        if value:
            lines.append(f"#SBATCH --{flag}={q(value)}")
    lines += [
        f"#SBATCH --output={q(str(folder / 'slurm-%j.out'))}",
        "#SBATCH --open-mode=append",
        "#SBATCH --requeue",
        f"#SBATCH --signal=B:{signal}@{options.signal_seconds}",
        *(f"#SBATCH {option}" for option in options.sbatch),
        "",
        "set -u",
        f"cd {q(str(workdir))}",
        *(f"module load {q(module)}" for module in options.modules),
        *(f"export {key}={q(value)}" for key, value in options.environment.items()),
        *options.setup,
        f"export THESEUS_PREEMPTION={signal} {ENV_REQUEUES}={options.requeues}",
        "restarts=${SLURM_RESTART_COUNT:-0}",
        f'echo "theseus submit: job $SLURM_JOB_ID, run $((restarts + 1)) of at most '
        f'{options.requeues + 1}, on $SLURM_JOB_NODELIST"',
        "# one task per GPU (or as asked), each a `theseus run` that joins the others; no",
        "# --kill-on-bad-exit: a warned run exits 140 on every task, each when it is done",
        "srun --label " + " ".join(map(q, command)) + ' --scheduler-job "$SLURM_JOB_ID" &',
        "tasks=$!",
        "# SLURM warns this shell (--signal=B:...); the tasks checkpoint where all of them stop",
        f'trap \'echo "theseus submit: {signal} before the time limit; checkpointing"; '
        f"kill -{signal} $tasks 2>/dev/null' {signal}",
        "trap 'kill -TERM $tasks 2>/dev/null' TERM",
        "while :; do",
        "  wait $tasks; code=$?",
        "  kill -0 $tasks 2>/dev/null || break  # a trapped signal ended the wait, not the tasks",
        "done",
        f"if [ $code -eq {PREEMPTED_EXIT} ] && [ $restarts -lt {options.requeues} ]; then",
        '  echo "theseus submit: requeued; the next run resumes from the latest checkpoint"',
        '  scontrol requeue "$SLURM_JOB_ID"',
        "fi",
        "exit $code",
        "",
    ]
    return "\n".join(lines)
