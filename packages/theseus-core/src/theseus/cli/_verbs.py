"""The verbs ``jobs``, ``configure`` and ``run``: text in, the same Python calls a user makes."""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from theseus.cli._app import common_options, main
from theseus.cli._cluster import cluster_options
from theseus.cli._next import resume_command
from theseus.cli._root import root_argument
from theseus.config import ConfigError, dump, load, parse_overrides
from theseus.job import (
    BasicJob,
    CheckpointWalker,
    Interrupted,
    Terminated,
    from_host_zero,
    is_primary,
)
from theseus.job._slurm import ScheduledJob, scheduled_here
from theseus.quick import quick
from theseus.registry import JOBS, resolve_job
from theseus.store import Node, Store

if TYPE_CHECKING:  # the reader imports JAX; `theseus --help` must not
    pass


def _job_class(name: str) -> type[BasicJob]:
    cls = resolve_job(name)
    if not (isinstance(cls, type) and issubclass(cls, BasicJob)):
        raise ConfigError(
            f"{name!r} is registered to {cls!r}, which is not a job (a theseus.job.BasicJob "
            "subclass); it cannot be configured or run."
        )
    return cls


def _job_file(config_file: Path) -> tuple[dict[str, Any], str]:
    """The values of a configuration file and the job its top-level ``job:`` names."""
    values = load(config_file)
    job_name = values.get("job")
    if not isinstance(job_name, str):
        raise ConfigError(
            f"{str(config_file)!r} does not name its job: expected a top-level `job: NAME` "
            f"key, got {job_name!r}. Write the file with `theseus configure JOB {config_file}`."
        )
    return values, job_name


def _base_node(store: Store, text: str) -> Node:
    """The node `--resume`/`--branch` name; a lineage (`name~nonce`, or a run alone with one
    lineage) means its last checkpoint.

    A run killed between checkpoints has later nodes than its last checkpoint, and
    training can only go on from a checkpoint. Without any checkpoint the lineage's
    last node is returned, and setting up explains what to do.
    """
    node = store.resolve(text)
    if text.count("~") == 2:  # one node, as written
        return node
    saved = [
        c.node for c in store.query().nonce(node.nonce).checkpoints() if c.node.name == node.name
    ]
    return max(saved, key=lambda n: n.seq) if saved else node


def _check_resumed_name(
    node: Node, text: str, run: str, project: str | None, group: str | None
) -> None:
    """Refuse `--resume` of a node whose run is not the one RUN (and --project, --group) name.

    A resumed lineage keeps its name; a RUN that names another run would be silently
    ignored, so it is an error that says which to pass.
    """
    have = dict(zip(("project", "group", "run"), node.name.split(".", 2), strict=True))
    asked = {"project": project, "group": group, "run": run}
    wrong = [key for key, value in asked.items() if value is not None and value != have[key]]
    if wrong:
        flag = {"project": "--project ", "group": "--group ", "run": "RUN "}
        said = ", ".join(f"{flag[key]}{asked[key]}" for key in wrong)
        keep = " and ".join(f"{flag[key]}{have[key]}" for key in wrong)
        raise click.UsageError(
            f"--resume {text} continues {node.name}, but this command names {said}. "
            f"Pass {keep} to continue it, or --branch {text} to start a new lineage "
            f"named by RUN, --project and --group from that node."
        )


def _note_saved(
    tree: Any,
    from_file: dict[str, Any],
    settings: dict[str, Any],
    config_file: Path,
    where: object,
    job: type[BasicJob],
) -> None:
    """Say which settings of the file the configuration saved at `where` replaced.

    A value the file holds at its default (as `theseus configure` wrote it, untouched) is
    not named: the note is for what someone chose.
    """
    defaults = job.schema().flat()
    changed = [
        k
        for k, v in tree.flat().items()
        if v != from_file[k] and k not in settings and from_file[k] != defaults.get(k, v)
    ]
    if changed:
        click.echo(
            f"Note: {len(changed)} setting(s) of {config_file} differ from the "
            f"configuration saved at {where}; the saved values are used (override "
            f"with KEY=VALUE): {', '.join(changed)}.",
            err=True,
        )


def _summary(cls: type) -> str:
    doc = (cls.__doc__ or "").strip()
    return doc.splitlines()[0] if doc else "(no description)"


@main.command("jobs")
@click.argument("prefix", required=False, default="")
@common_options
def jobs_command(prefix: str) -> None:
    """List the registered jobs (whose names start with PREFIX) and what they do."""
    names = [n for n in JOBS if n.startswith(prefix)]
    if not names:
        where = f" starting with {prefix!r}" if prefix else ""
        click.echo(
            f"No jobs registered{where}. Register yours with @job(...) and --import FILE.py."
        )
        return
    width = max(len(n) for n in names)
    for name in names:
        click.echo(f"{name.ljust(width)}  {_summary(JOBS[name])}")


@main.command("configure")
@click.argument("job_name", metavar="JOB")
@click.argument("out", metavar="OUT.yaml", type=click.Path(dir_okay=False, path_type=Path))
@click.argument("overrides", nargs=-1, metavar="[KEY=VALUE]...")
@click.option("--force", is_flag=True, help="Replace OUT.yaml even where it holds other settings.")
@common_options
def configure_command(job_name: str, out: Path, overrides: tuple[str, ...], force: bool) -> None:
    """Write JOB's full configuration (defaults, then KEY=VALUE overrides) to OUT.yaml.

    An OUT.yaml that already holds something else (edited by hand, another job's) is
    kept unless --force is given.
    """
    tree = _job_class(job_name).schema()
    tree.update(parse_overrides(overrides))
    tree.check()  # the rules across settings, before the file is written
    text = dump(tree)
    if not force and out.exists() and _text_of(out) != text:
        raise FileExistsError(
            f"{out} exists and holds other settings than {tree.job}'s with these "
            "overrides (edited by hand?); nothing was written. Pass --force to replace "
            "it, or name another OUT.yaml."
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    dump(tree, out)
    click.echo(f"Wrote {len(tree)} settings of {tree.job} to {out}.")
    missing = tree.missing()
    if missing:
        click.echo(f"Fill in before running (required, no default): {', '.join(missing)}.")


def _text_of(path: Path) -> str | None:
    """The text of file `path`, or None where it is not a readable text file."""
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError):
        return None


@main.command("run")
@click.argument("run_name", metavar="RUN")
@click.argument(
    "config_file", metavar="CONFIG.yaml", type=click.Path(dir_okay=False, path_type=Path)
)
@root_argument()
@click.argument("overrides", nargs=-1, metavar="[KEY=VALUE]...")
@click.option("--project", default=None, help="Project name (default: general).")
@click.option("--group", default=None, help="Group name (default: default).")
@click.option(
    "--resume",
    "resume_node",
    default=None,
    metavar="NODE",
    help=(
        "Continue this node: `name~nonce~seq` (as `theseus-store show` prints it), a "
        "lineage `name~nonce` (as `theseus-store runs ROOT` prints it) or a run name "
        "with one lineage, for its last checkpoint. Training goes on only from its "
        "lineage's last checkpoint (else use --branch); an analysis takes any node."
    ),
)
@click.option(
    "--branch",
    "branch_node",
    default=None,
    metavar="NODE",
    help=(
        "Start a new lineage whose first node's parent is NODE (`name~nonce~seq`, or "
        "`name~nonce` or a run name with one lineage, for that lineage's last checkpoint)."
    ),
)
@click.option(
    "--over",
    "over_lineage",
    default=None,
    metavar="LINEAGE",
    help=(
        "Run an analysis over every checkpoint of a lineage (`name~nonce`, or a run name "
        "with one lineage), in seq order, compiled once; each result attaches to its own "
        "node as --resume would. Nodes that already hold the result for this "
        "configuration are skipped."
    ),
)
@click.option(
    "--force", is_flag=True, help="With --over: recompute the nodes it would skip (a new version)."
)
@click.option(
    "--scheduler-job",
    default=None,
    metavar="ID",
    help=(
        "The SLURM job this run is (the script of `theseus submit` passes it): recorded "
        "beside the run's status (slurm/job, slurm/state), with what ran (git, uv.lock, "
        "versions). When a lineage of ROOT already carries the job (a requeued job), the "
        "run resumes that lineage's latest checkpoint."
    ),
)
@click.option(
    "--scheduler-lineage",
    default=None,
    metavar="LINEAGE",
    help=(
        "With --scheduler-job: the lineage the job runs (`name~nonce`, made by `theseus "
        "submit`): resumed from its latest checkpoint when it has one (a requeued job), "
        "else started on (a first run)."
    ),
)
@cluster_options
@common_options
def run_command(
    run_name: str,
    config_file: Path,
    root: Path,
    overrides: tuple[str, ...],
    project: str | None,
    group: str | None,
    resume_node: str | None,
    branch_node: str | None,
    over_lineage: str | None,
    force: bool,
    scheduler_job: str | None,
    scheduler_lineage: str | None,
) -> None:
    """Run the job CONFIG.yaml names (its top-level `job:` key) as run RUN under ROOT.

    With --resume or --branch, the configuration saved at NODE's lineage wins over
    the file; KEY=VALUE overrides win over both. --over LINEAGE runs an analysis over
    every checkpoint of LINEAGE (the configuration saved at its last checkpoint wins
    over the file, as with --resume).

    On several hosts, start the same command on every host. It joins a cluster when
    --coordinator, --num-processes and --process-id (or THESEUS_COORDINATOR,
    THESEUS_NUM_PROCESSES, THESEUS_PROCESS_ID) say so, under srun or mpirun with
    several tasks, or with --cluster auto (TPU pods, Kubernetes). All hosts train one
    model; process 0 alone writes the store. --cluster off runs alone.
    """
    if resume_node and branch_node:
        raise click.UsageError("Pass at most one of --resume NODE and --branch NODE.")
    if scheduler_job is not None and (resume_node or branch_node or over_lineage):
        raise click.UsageError(
            "--scheduler-job starts a run or resumes the lineage that carries the job; it "
            "takes no --resume, --branch or --over."
        )
    if scheduler_lineage is not None and (
        scheduler_job is None or scheduler_lineage.count("~") != 1
    ):
        raise click.UsageError(
            f"--scheduler-lineage {scheduler_lineage} needs --scheduler-job and a lineage "
            "written name~nonce."
        )
    if over_lineage is not None:
        _check_over(over_lineage, resume_node, branch_node)
    elif force:
        raise click.UsageError(
            "--force recomputes the nodes --over would skip; pass it with --over LINEAGE."
        )
    values, job_name = _job_file(config_file)
    settings = parse_overrides(overrides)
    if over_lineage is not None:
        cls = _job_class(job_name)
        if not issubclass(cls, CheckpointWalker):  # before the root is opened
            raise click.UsageError(
                f"--over runs an analysis over every checkpoint of a lineage, and {job_name} "
                f"({cls.__name__}) is not an analysis; pass an analysis job's configuration "
                "(`theseus jobs` lists them), or --resume to train on from one checkpoint."
            )
        _run_over(
            run_name, config_file, root, values, settings, project, group, over_lineage, force
        )
        return
    from theseus.data.prepared import DataNotPreparedError  # numpy: only when running

    made = _first_missing(Path(root))  # a misspelled ROOT: nothing is left there on failure
    try:
        _run(run_name, config_file, root, job_name, values, settings, project, group,
             resume_node, branch_node, scheduler_job, scheduler_lineage)  # fmt: skip
    except DataNotPreparedError:
        if made is not None and is_primary():
            _remove_new_root(Path(root), made)
        raise


def _first_missing(root: Path) -> Path | None:
    """The outermost folder of `root`'s path that does not exist yet (None: `root` exists)."""
    root = root.absolute()
    if root.exists():
        return None
    while not root.parent.exists():
        root = root.parent
    return root


def _remove_new_root(root: Path, made: Path) -> None:
    """Remove the store this command made under `root` to record a run that never
    started (a misspelled ROOT: its data is not there), then `root` and the folders up to
    `made` that this command created, each only where it is empty (another process may
    have written there since)."""
    chain = [root.absolute(), *root.absolute().parents]
    if made not in chain:
        return
    shutil.rmtree(root / "store", ignore_errors=True)
    for folder in chain[: chain.index(made) + 1]:
        with contextlib.suppress(OSError):
            folder.rmdir()


def _run(
    run_name: str,
    config_file: Path,
    root: Path,
    job_name: str,
    values: dict[str, Any],
    settings: dict[str, Any],
    project: str | None,
    group: str | None,
    resume_node: str | None,
    branch_node: str | None,
    scheduler_job: str | None,
    scheduler_lineage: str | None,
) -> None:
    """`theseus run` without --over: build the job, set it up and run it."""
    with quick(root) as q:
        cls = _job_class(job_name)
        scheduled = None
        if scheduler_job is not None:
            nonce = None
            if scheduler_lineage is not None:  # a requeued job goes on where it stopped
                lineage = scheduler_lineage
                if from_host_zero(lambda: _holds_checkpoint(q.store, lineage)):
                    resume_node = lineage
                else:  # its first run starts on the lineage `theseus submit` made
                    nonce = lineage.split("~")[1]
            scheduled = ScheduledJob.from_environment(scheduler_job, nonce=nonce)
        base = resume_node or branch_node
        node = None
        if base is not None:
            node = from_host_zero(lambda: _base_node(q.store, base))  # host zero reads the store
            if resume_node and not cls.RESUME_ATTACHES:  # the job continues the node's run
                _check_resumed_name(node, base, run_name, project, group)
                project, group, _ = node.name.split(".", 2)
        tree = q.build(cls, run_name, project=project, group=group)
        tree.load(values)
        if node is not None:
            finder = q.find().node(node)
            from_file = tree.flat()
            finder.resume() if resume_node else finder.branch()
            _note_saved(tree, from_file, settings, config_file, base, cls)
        tree.update(settings)
        with scheduled_here(scheduled) if scheduled else contextlib.nullcontext():
            job = q.create()
            try:
                result = job()
            except (
                Terminated,
                Interrupted,
            ):  # SIGTERM, SIGHUP or Ctrl-C: the exact command that goes on
                # (a requeued job resumes itself)
                if is_primary() and scheduled is None:
                    lineage = f"{job.node.name}~{job.node.nonce}"
                    click.echo(
                        f"Continue: {resume_command(run_name, config_file, root, lineage)}",
                        err=True,
                    )
                raise
        click.echo(
            f"{tree.job}: {job.mode.value if job.mode else 'run'} run finished at node {job.node}."
        )
        if is_primary():
            for line in job.outcome(result):
                click.echo(line)


def _holds_checkpoint(store: Store, lineage: str) -> bool:
    """Whether the lineage ``name~nonce`` holds a registered checkpoint (False: no such
    lineage yet, or none saved)."""
    name, nonce = lineage.split("~")
    return store.query().name(name).nonce(nonce).latest_checkpoint() is not None


def _check_over(text: str, resume_node: str | None, branch_node: str | None) -> None:
    """Refuse --over with --resume/--branch, or with one node (`name~nonce~seq`)."""
    if resume_node or branch_node:
        other = "--resume" if resume_node else "--branch"
        raise click.UsageError(
            f"--over walks every checkpoint of a lineage and {other} picks one node; pass "
            "one of them."
        )
    if text.count("~") >= 2:
        lineage = "~".join(text.split("~")[:2])
        raise click.UsageError(
            f"--over takes a lineage, and {text} is one node: use --resume {text} to analyze "
            f"that node, or --over {lineage} for every checkpoint of its lineage."
        )


def _run_over(
    run_name: str,
    config_file: Path,
    root: Path,
    values: dict[str, Any],
    settings: dict[str, Any],
    project: str | None,
    group: str | None,
    lineage: str,
    force: bool,
) -> None:
    """`theseus run ... --over LINEAGE`: `q.find()...over()`, then `q.create()()`."""
    with quick(root) as q:
        tree = q.build(_job_class(values["job"]), run_name, project=project, group=group)
        tree.load(values)
        from_file = tree.flat()
        node = from_host_zero(lambda: q.store.resolve(lineage))  # host zero reads the store
        nodes = q.find().name(node.name).nonce(node.nonce).over(force=force)
        _note_saved(tree, from_file, settings, config_file, lineage, _job_class(values["job"]))
        tree.update(settings)
        job = q.create()
        result = job()
        click.echo(
            f"{tree.job}: over run finished; it walked the {len(nodes)} "
            f"{'checkpoint' if len(nodes) == 1 else 'checkpoints'} of "
            f"{node.name}~{node.nonce} (each analyzed or skipped, as listed above)."
        )
        if is_primary():
            for line in job.outcome(result):
                click.echo(line)
