"""One analysis over every checkpoint of a lineage: compiled once, reads overlapped.

`q.find()...over()` (or `theseus run ... --over LINEAGE`) sets an analysis up at the
lineage's first checkpoint and plans the walk (`AnalysisBase.over`); calling the job
runs `walk` here:

    skip the nodes that already hold this result -> for each other node, in seq order:
        move the instance there (`BaseTrainer.restore_node`) -> run it as `--resume`
        would (status records, compute, plot, file, artifact) while a background
        thread reads the next node's checkpoint

One instance walks them all, so the compiled analysis is traced once for a lineage of
one shape. Every result attaches to its own node exactly as a `--resume` run of that
node would, and records the digest of the configuration that made it
(`analysis/NAME/config`, with the artifact version it belongs to), so a later walk
with the same configuration skips it unless forced.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import shlex
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from theseus.analysis._result import AnalysisResult
from theseus.cli._next import program
from theseus.job import from_host_zero, is_primary, process_count, store_root
from theseus.store import Artifact, Node, Store
from theseus.training.reporting import Reporter, format_duration

if TYPE_CHECKING:
    from theseus.config import Tree

#: The analysis a walk moves (an `AnalysisBase`; typed loosely so that `_base`, which
#: calls this module, is not imported back).
Job = Any

__all__ = ["OverResult", "configuration_digest", "stamp", "walk"]


def counted(n: int, noun: str) -> str:
    """`"1 checkpoint"`, `"2 checkpoints"`: `n` and the noun in the number it takes."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


@dataclass(frozen=True)
class OverResult:
    """What one walk over a lineage's checkpoints produced.

    Attributes:
        nodes: every checkpointed node of the lineage, in seq order.
        results: an `AnalysisResult` for each node analyzed now, in seq order.
        skipped: the nodes that already held this analysis's result for this
            configuration (none with `force`).
        seconds: the walk's wall time.
        read_seconds: time spent reading checkpoints after the first (summed over
            the reads, wherever they ran).
        waited_seconds: the part of `read_seconds` the walk waited for; the rest ran
            while the previous node was analyzed.
    """

    nodes: list[Node]
    results: list[AnalysisResult]
    skipped: list[Node]
    seconds: float
    read_seconds: float
    waited_seconds: float

    @property
    def hidden(self) -> float:
        """The fraction of checkpoint reading that overlapped analysis (0 without reads)."""
        if self.read_seconds <= 0:
            return 0.0
        return max(0.0, 1.0 - self.waited_seconds / self.read_seconds)


def configuration_digest(configuration: Tree) -> str:
    """The SHA-256 of a job's settings and job key: what "the same configuration" means.

    Only the settings count (not the YAML's comments, nor the run name, which is the
    spec's), so a result made by `--resume` and one made by `--over` with the same
    settings have the same digest.
    """
    settings = {"job": configuration.job, "settings": configuration.flat()}
    text = json.dumps(settings, sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()


def _keys(name: str) -> tuple[str, str]:
    return f"analysis/{name}/config", f"analysis/{name}/config_version"


def stamp(store: Store, node: Node, digest: str, artifact: Artifact) -> None:
    """Record on `node` which configuration made `artifact` (`digest`: the job's
    `result_digest()`; host zero, after the put).

    One record, written in the put's transaction (`AnalysisBase` publishes both inside
    one `store.batch()`): the artifact and its stamp become durable together. Written
    apart, a crash between the two leaves an artifact without a matching stamp, which
    the next walk recomputes.
    """
    config, version = _keys(artifact.name)
    store.log(node, {config: digest, version: artifact.version})


def _done(store: Store, node: Node, name: str, digest: str) -> bool:
    """Whether `node`'s latest `name` artifact was made with the configuration `digest`."""
    artifact = store.get(node).get(name)
    if artifact is None:
        return False
    values = store.values(node)
    config, version = _keys(name)
    return values.get(config) == digest and values.get(version) == artifact.version


def check_plan(job: Job, nodes: Sequence[Node]) -> list[Node]:
    """The nodes of `job.over(nodes)`, checked: one lineage, seq order, set up at the first.

    Raises:
        AnalysisError: the job is not resumed at `nodes[0]`, or the nodes are not one
            lineage's in increasing seq order.
    """
    from theseus.analysis._errors import AnalysisError
    from theseus.job import Mode

    owner = type(job).__name__
    walked = list(nodes)
    if not walked:
        raise AnalysisError(f"{owner}.over() got no nodes; pass a lineage's checkpointed nodes")
    if job.mode is not Mode.RESUME or job.node != walked[0]:
        raise AnalysisError(
            f"{owner}.over() walks from the node the job is resumed at, but it is at "
            f"{job.node} ({job.mode}) and the walk starts at {walked[0]}; select the lineage "
            "with q.find()...over() and create the job with q.create()"
        )
    first = walked[0]
    if any((n.name, n.nonce) != (first.name, first.nonce) for n in walked) or any(
        b.seq <= a.seq for a, b in itertools.pairwise(walked)
    ):
        raise AnalysisError(
            f"{owner}.over() walks one lineage in seq order; got {', '.join(map(str, walked))}"
        )
    return walked


def walk(
    job: Job,
    nodes: Sequence[Node],
    force: bool,
    run_one: Callable[[], AnalysisResult],
) -> OverResult:
    """Run `job` over `nodes` (see the module docstring); every host walks the same nodes.

    Args:
        job: the analysis, resumed at `nodes[0]` (its instance is moved node by node).
        nodes: the lineage's checkpointed nodes, in seq order (checked by `check_plan`).
        force: recompute nodes that already hold the result for this configuration.
        run_one: runs the job on its live node as `--resume` does (`BasicJob.__call__`).

    Returns:
        An `OverResult`.

    Raises:
        Exception: whatever a node's analysis raised, after recording it on that node
            (nodes analyzed before it keep their results).
    """
    started = time.perf_counter()
    name, lineage = job.NAME, f"{nodes[0].name}~{nodes[0].nonce}"
    digest = job.result_digest()
    store = job.store
    done = from_host_zero(lambda: [not force and _done(store, n, name, digest) for n in nodes])
    todo = [n for n, skip in zip(nodes, done, strict=True) if not skip]
    skipped = [n for n, skip in zip(nodes, done, strict=True) if skip]
    paths = [None if n == job.node else job.checkpoint_path(n) for n in todo]  # host zero reads
    label = f"{name} over {lineage}"
    reporter = Reporter(
        len(todo), 0, 0, label, enabled=None if is_primary() else False, unit="checkpoint"
    )

    def say(line: str) -> None:
        if is_primary():
            reporter.say(line)

    if skipped:
        say(
            f"{label}: {len(skipped)} of {counted(len(nodes), 'checkpoint')} already "
            f"{'holds' if len(skipped) == 1 else 'hold'} {name!r} for this configuration and "
            f"{'is' if len(skipped) == 1 else 'are'} skipped (recompute with --force, in "
            "Python .over(force=True))"
        )
    # Reads overlap only on one process: orbax's restore across hosts synchronizes
    # them, and those collectives must stay in one order with the analysis's own.
    ahead = process_count() == 1
    results: list[AnalysisResult] = []
    read = waited = 0.0

    def timed(path: str) -> tuple[Any, float]:
        begun = time.perf_counter()
        return job.read_checkpoint(path), time.perf_counter() - begun

    try:
        with ThreadPoolExecutor(1, thread_name_prefix="theseus-over-read") as pool:
            pending: Future[tuple[Any, float]] | None = None
            for index, (node, path) in enumerate(zip(todo, paths, strict=True)):
                if path is not None:
                    begun = time.perf_counter()
                    saved, took = pending.result() if pending is not None else timed(path)
                    waited += time.perf_counter() - begun
                    read += took
                    job.restore_node(node, saved)
                following = paths[index + 1] if index + 1 < len(todo) else None
                pending = pool.submit(timed, following) if ahead and following else None
                results.append(run_one())
                elapsed = time.perf_counter() - started
                eta = elapsed / (index + 1) * (len(todo) - index - 1)
                reporter.advance(index + 1)
                say(
                    f"{label}: checkpoint {index + 1}/{len(todo)} (seq {node.seq}) done, "
                    f"elapsed {format_duration(elapsed)}, ETA {format_duration(eta)}"
                )
    finally:
        reporter.close()
    if todo and todo[-1] != nodes[-1] and is_primary():
        _files_of(job, store, nodes[-1])
    seconds = time.perf_counter() - started
    outcome = OverResult(list(nodes), results, skipped, seconds, read, waited)
    if todo:
        say(
            f"{label}: {len(results)} analyzed, {len(skipped)} skipped in "
            f"{format_duration(seconds)}; reading checkpoints took {read:.2f} s, "
            f"{outcome.hidden:.0%} of it while the previous one was analyzed"
        )
    return outcome


def _files_of(job: Job, store: Store, last: Node) -> None:
    """Put the last node's results back in the job's files (host zero).

    The walk wrote each analyzed node's files over the previous one's; where the
    lineage's last node was skipped (it held its result already), that left an earlier
    node's result in the files. Each file of the job's result folder that `last` holds
    an artifact of is rewritten with that artifact's bytes.
    """
    from theseus.analysis._publish import write_atomic

    for artifact in store.get(last).values():
        path = job.spec.result() / artifact.filename
        if path.is_file() and path.read_bytes() != artifact.content:
            write_atomic(path, artifact.content)


def read_back(root: Any, node: Node, artifact: str, written: Any) -> str:
    """The command that writes `artifact` of `node` to a file in the current folder,
    named after the artifact and the written file's suffix, as the user's shell calls it
    (`uv run` where this process was started by it)."""
    target = artifact.replace("/", "-") + Path(str(written)).suffix
    store = shlex.quote(str(store_root(root)))
    words = f"{store} {shlex.quote(str(node))} {shlex.quote(artifact)} -o {shlex.quote(target)}"
    return f"{program('theseus-store')} get {words}"


def outcome_lines(job: Job, result: OverResult) -> list[str]:
    """What `theseus run --over` prints after a walk."""
    name = job.NAME
    first = result.nodes[0]
    lineage = f"{first.name}~{first.nonce}"
    span = (
        f"seq {first.seq}"
        if len(result.nodes) == 1
        else f"seq {first.seq} to {result.nodes[-1].seq}"
    )
    lines = [
        f"{name}: analyzed {len(result.results)} of {counted(len(result.nodes), 'checkpoint')} "
        f"of {lineage} ({span})"
    ]
    if result.skipped:
        one = len(result.skipped) == 1
        lines.append(
            f"  {len(result.skipped)} skipped: {'it' if one else 'they'} already "
            f"{'holds' if one else 'hold'} {name!r} for this configuration (--force "
            f"recomputes {'it' if one else 'them'} as a new version)"
        )
    written = [r for r in result.results if r.artifact is not None]
    for r in written:
        assert r.artifact is not None
        lines.append(f"  artifact {name!r} version {r.artifact.version} on node {r.node}")
    if written:
        last = written[-1]
        final = result.nodes[-1]
        if final in result.skipped:  # `walk` put the final node's result back in the file
            lines.append(
                f"  file {last.path} holds the result of the lineage's last checkpoint, "
                f"{final} (skipped: it held it already); each node keeps its own as its "
                f"artifact (read one back: {read_back(job.spec.root, final, name, last.path)})"
            )
        elif len(written) == 1:
            lines.append(
                f"  file {last.path} holds its result (read it back: "
                f"{read_back(job.spec.root, last.node, name, last.path)})"
            )
        else:
            lines.append(
                f"  file {last.path} holds the result of the last node analyzed, "
                f"{last.node}; each node keeps its own as the artifact above (read one back: "
                f"{read_back(job.spec.root, last.node, name, last.path)})"
            )
    elif result.results:
        lines.append("  plot() returned None, so no file and no artifact were written")
    return lines
