"""``theseus submit RUN CONFIG ROOT --slurm``: the batch script, ``sbatch``, what to run next.

The script (``theseus.job._slurm.batch_script``) goes under ROOT, in
``slurm/RUN-DATE-TIME/``, beside a copy of the configuration it runs and the job's
output (``slurm-JOBID.out``). ``--dry-run`` prints it and submits nothing.
"""

from __future__ import annotations

import datetime
import itertools
import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import click

from theseus.cli._app import IMPORTS, common_options, main
from theseus.cli._next import program
from theseus.cli._root import root_argument
from theseus.cli._verbs import _job_class, _job_file
from theseus.config import parse_overrides
from theseus.job import store_root
from theseus.job._slurm import (
    SubmitError,
    batch_script,
    check_sbatch,
    load_profiles,
    profiles_file,
)
from theseus.job._slurm_time import check_time
from theseus.store import MARKER, Node, Store, locate

__all__ = ["submit_command"]


def _positive(ctx: click.Context, param: click.Parameter, value: int | None) -> int | None:
    least = 0 if param.name == "requeues" else 1
    if value is not None and value < least:
        raise click.BadParameter(f"expected a whole number >= {least}; got {value}.")
    return value


@main.command("submit")
@click.argument("run_name", metavar="RUN")
@click.argument(
    "config_file",
    metavar="CONFIG.yaml",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
)
@root_argument()
@click.argument("overrides", nargs=-1, metavar="[KEY=VALUE]...")
@click.option(
    "--slurm", is_flag=True, help="Submit to SLURM with sbatch (the one scheduler for now)."
)
@click.option("--project", default=None, help="Project name (default: general).")
@click.option("--group", default=None, help="Group name (default: default).")
@click.option("--nodes", type=int, default=None, callback=_positive, help="Nodes (default 1).")
@click.option(
    "--gpus-per-node", type=int, default=None, callback=_positive, help="GPUs on each node."
)
@click.option(
    "--tasks-per-node",
    type=int,
    default=None,
    callback=_positive,
    help="Processes on each node (default: one per GPU, else one).",
)
@click.option(
    "--cpus-per-task", type=int, default=None, callback=_positive, help="CPUs per process."
)
@click.option(
    "--time",
    "time_limit",
    default=None,
    metavar="T",
    help="Time limit (SLURM's form, e.g. 12:00:00).",
)
@click.option("--partition", default=None, help="The partition.")
@click.option("--account", default=None, help="The account charged.")
@click.option(
    "--sbatch",
    "sbatch_options",
    multiple=True,
    metavar="OPTION",
    help="Another #SBATCH line, e.g. --sbatch=--qos=high (repeatable).",
)
@click.option(
    "--requeues",
    type=int,
    default=None,
    callback=_positive,
    help="How many times a warned job requeues itself (default 3).",
)
@click.option(
    "--signal-seconds",
    type=int,
    default=None,
    callback=_positive,
    help="Seconds before the time limit at which SLURM warns the job (default 300).",
)
@click.option(
    "--profile",
    default=None,
    metavar="NAME",
    help="A cluster's defaults from ~/.config/theseus/clusters.yaml (default: its `default:`).",
)
@click.option(
    "--resume",
    default=None,
    metavar="LINEAGE",
    help=(
        "Go on with this lineage of ROOT (`name~nonce`, or a run with one lineage) from its "
        "latest checkpoint, e.g. one whose requeues ran out."
    ),
)
@click.option("--dry-run", is_flag=True, help="Print the script; write and submit nothing.")
@common_options
def submit_command(
    run_name: str,
    config_file: Path,
    root: Path,
    overrides: tuple[str, ...],
    slurm: bool,
    project: str | None,
    group: str | None,
    nodes: int | None,
    gpus_per_node: int | None,
    tasks_per_node: int | None,
    cpus_per_task: int | None,
    time_limit: str | None,
    partition: str | None,
    account: str | None,
    sbatch_options: tuple[str, ...],
    requeues: int | None,
    signal_seconds: int | None,
    profile: str | None,
    resume: str | None,
    dry_run: bool,
) -> None:
    """Send `theseus run RUN CONFIG.yaml ROOT` to SLURM: one task per GPU, requeued on preemption.

    Writes a batch script under ROOT/slurm/, submits it with sbatch and prints the job
    id, its log and how to follow it. Each task runs `theseus run` with the same
    arguments; they join one cluster through SLURM's variables. Before the time limit
    (--signal-seconds) SLURM warns the job: every process checkpoints after the same
    step, and the job requeues itself (at most --requeues times) to resume from the
    lineage's latest checkpoint in the store.
    """
    if not slurm:
        raise click.UsageError(
            "theseus submit needs a scheduler: pass --slurm (SLURM is the one it knows)."
        )
    drawn = Node.new(run_name, project=project, group=group)  # a bad name fails here
    values, job_name = _job_file(config_file)
    tree = _job_class(job_name).schema()  # an unknown job, key or value fails here too
    tree.load(values)
    tree.update(parse_overrides(overrides))
    tree.check()
    check_sbatch(sbatch_options)
    options = load_profiles(profiles_file(), profile).merged(
        {
            "nodes": nodes,
            "gpus_per_node": gpus_per_node,
            "tasks_per_node": tasks_per_node,
            "cpus_per_task": cpus_per_task,
            "time": time_limit,
            "partition": partition,
            "account": account,
            "sbatch": list(sbatch_options) or None,
            "requeues": requeues,
            "signal_seconds": signal_seconds,
        }
    )
    if options.time is not None:  # sbatch would refuse it only after the folder is written
        check_time(options.time, "--time" if time_limit is not None else f"{profiles_file()}: time")
    root = root.resolve()
    if resume is not None:  # go on with a lineage of ROOT: its latest checkpoint
        drawn = _lineage_to_resume(root, resume, drawn)
    lineage = f"{drawn.name}~{drawn.nonce}"
    sbatch = shutil.which("sbatch")
    if sbatch is None and not dry_run:
        raise SubmitError(
            "sbatch is not on PATH: submit from a machine with SLURM's commands (a login "
            "node), or pass --dry-run to print the script."
        )
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    made = _missing_folders(root / "slurm")  # removed again if nothing is submitted
    folder = (
        root / "slurm" / f"{run_name}-{stamp}" if dry_run else _new_folder(root / "slurm", run_name)
    )
    imports = [
        str(Path(target).resolve()) if Path(target).is_file() else target
        for target in click.get_current_context().meta.get(IMPORTS, [])
    ]
    command = [
        *_theseus(),
        "run",
        run_name,
        str(folder / "config.yaml"),
        str(root),
        *overrides,
        *(["--project", project] if project else []),
        *(["--group", group] if group else []),
        *(arg for target in imports for arg in ("--import", target)),
        "--scheduler-lineage",
        lineage,
    ]
    script = batch_script(
        command=command, options=options, job_name=run_name, folder=folder, workdir=Path.cwd()
    )
    if dry_run:
        click.echo(script, nl=False)
        return
    assert sbatch is not None
    try:
        shutil.copyfile(config_file, folder / "config.yaml")
        (folder / "submit.sh").write_text(script)
        # Held until its lineage says so in the store; the job runs on that lineage.
        done = subprocess.run(
            [sbatch, "--parsable", "--hold", str(folder / "submit.sh")],
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
        )
    except BaseException:
        _remove(folder, made)
        raise
    if done.returncode != 0:
        _remove(folder, made)  # nothing was submitted: nothing is left behind
        said = (done.stderr.strip() or done.stdout.strip() or "no message").splitlines()
        raise SubmitError(
            f"sbatch refused the job (exit {done.returncode}): {said[-1].rstrip('.')}. Nothing "
            "was submitted."
        )
    job_id = done.stdout.strip().split(";")[0]
    try:
        _record_pending(root, drawn, job_id)
        _release(job_id)
    except BaseException:
        subprocess.run(["scancel", job_id], capture_output=True, check=False, timeout=60)
        raise
    record = {
        "job": job_id,
        "lineage": lineage,
        "run": run_name,
        "script": str(folder / "submit.sh"),
        "options": vars(options),
    }
    (folder / "job.json").write_text(json.dumps(record, indent=2) + "\n")
    log = folder / f"slurm-{job_id}.out"
    store = store_root(root)
    q = shlex.quote
    click.echo(
        f"Submitted SLURM job {job_id}: {options.nodes} node(s) x {options.tasks} task(s), "
        f"lineage {lineage}."
    )
    click.echo(f"  script   {folder / 'submit.sh'}")
    click.echo(f"  log      {log}")
    click.echo("Follow it:")
    click.echo(f"  squeue -j {job_id}")
    click.echo(f"  tail -f {q(str(log))}")
    click.echo(f"  {program('theseus-store')} lineage {q(str(store))} {lineage}")
    click.echo(f"  {program('theseus-store')} ui {q(str(store))}")


def _new_folder(parent: Path, run: str) -> Path:
    """A new folder ``parent/RUN-DATE-TIME`` (``-2``, ``-3``, ... when another submission
    made that one first)."""
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    parent.mkdir(parents=True, exist_ok=True)
    for count in itertools.count(1):
        folder = parent / (f"{run}-{stamp}" if count == 1 else f"{run}-{stamp}-{count}")
        try:
            folder.mkdir()
        except FileExistsError:
            continue
        return folder
    raise AssertionError("unreachable")  # pragma: no cover


def _missing_folders(folder: Path) -> list[Path]:
    """``folder`` and those of its parents that do not exist yet, deepest first."""
    missing = []
    while not folder.exists() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    return missing


def _remove(folder: Path, made: list[Path]) -> None:
    """Remove a submission's ``folder``, then the folders above it this submission made
    (``ROOT/slurm``, ``ROOT``) where they are still empty."""
    shutil.rmtree(folder, ignore_errors=True)
    for parent in made:
        try:
            parent.rmdir()
        except OSError:  # another submission wrote there meanwhile
            break


def _lineage_to_resume(root: Path, text: str, drawn: Node) -> Node:
    """The last node of the lineage ``--resume`` names, which must be RUN's (one line if not)."""
    if not locate(root, create=True).exists:
        raise SubmitError(
            f"--resume {text} goes on with a lineage of ROOT, and {root} holds no store yet "
            f"({store_root(root) / MARKER} is missing). Pass the ROOT that holds the lineage "
            "(`theseus-store runs ROOT` lists them), or leave out --resume to start a new one."
        )
    with Store(store_root(root), readonly=True) as store:
        node = store.resolve(text)
        last = store.lineage_end(node.name, node.nonce)
    if node.name != drawn.name:
        raise SubmitError(
            f"--resume {text} continues {node.name}, and this submission names "
            f"{drawn.name}; pass the RUN, --project and --group of that lineage."
        )
    return Node(node.name, node.nonce, last if last is not None else node.seq)


def _record_pending(root: Path, node: Node, job_id: str) -> None:
    """Record on ``node`` (the new lineage's first, or the last of a resumed one) that the
    job ``job_id`` waits in the queue."""
    with Store(store_root(root)) as store:
        store.log(node, {"slurm/job": job_id, "slurm/state": "pending", "slurm/restarts": 0})


def _release(job_id: str) -> None:
    """Let the held job start (``scontrol release``)."""
    scontrol = shutil.which("scontrol")
    if scontrol is None:
        raise SubmitError(
            f"scontrol is not on PATH, so the held job {job_id} cannot be released; it is "
            "cancelled. Submit from a machine with all of SLURM's commands."
        )
    done = subprocess.run(
        [scontrol, "release", job_id], capture_output=True, text=True, check=False, timeout=60
    )
    if done.returncode != 0:
        said = (done.stderr.strip() or "no message").splitlines()[-1]
        raise SubmitError(
            f"scontrol release {job_id} failed (exit {done.returncode}): {said}; the job is "
            "cancelled."
        )


def _theseus() -> list[str]:
    """The command that starts this installation's `theseus` (the same environment)."""
    script = Path(sys.executable).with_name("theseus")
    if script.is_file():
        return [str(script)]
    return [sys.executable, "-c", "from theseus.cli import main; main()"]
