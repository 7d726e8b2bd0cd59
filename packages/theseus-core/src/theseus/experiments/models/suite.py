"""A published training suite as one lineage: `import_suite` (`theseus import hf --revisions`).

`import_suite(src, root, run, revisions)` finds the suite's revisions (a Hugging Face
cache folder or one subfolder per revision, `_revisions.py`), reads each chosen one
whole and hashes its tensors (`_integrity.py`) before anything is written, then writes
each revision as one node of the run's one lineage, ordered by step: the node's seq is
the revision's step (a name without a step goes after the last step), so a revision
imported later falls into its place. Each node holds its checkpoint and the values
`import/revision`, `import/step`, `import/tokens` (where the name gives them),
`import/sha256` (weights digest), `import/shards` (the shard digests) and
`import/source`, plus what the integrity check found (`import/duplicate_of`,
`import/shared_shards_with`, `import/missing_before`), which the returned table prints.
Importing again into a root that has the run's lineage adds only the missing revisions.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from theseus.config import load
from theseus.data.tokenizer import install_tokenizer, tokenizer_name
from theseus.experiments.models import _integrity
from theseus.experiments.models._revisions import Revision, RevisionError, discover, select
from theseus.experiments.models._suite_job import Planned, RevisionWriter
from theseus.experiments.models.hf import HF, check_settings, compose
from theseus.job import JobSpec, agree_on_nonce, store_root
from theseus.model.hf import HFFolder, load_state, read_hf
from theseus.registry import job, job_key
from theseus.store import MARKER, Node, Store
from theseus.training.base import TrainerError

__all__ = ["HFSuite", "SuiteImport", "import_suite"]

logger = logging.getLogger(__name__)

# The values a revision's node holds that the integrity check may change later.
_FINDINGS = ("import/duplicate_of", "import/shared_shards_with", "import/missing_before")


@job("hf/suite")
class HFSuite(RevisionWriter, HF):
    """A training suite's revisions as one lineage (`hf` per node); resume or branch fine-tunes."""


@dataclass(frozen=True)
class SuiteImport:
    """What `import_suite` did.

    Attributes:
        lineage: `name~nonce`.
        nodes: the nodes written now, in step order.
        kept: revisions the lineage held already (not written again).
        findings: the integrity check over the whole lineage.
        table: the printed table (revision, step, tokens, sha256, flags).
    """

    lineage: str
    nodes: list[Node]
    kept: list[str]
    findings: _integrity.Findings
    table: str


@dataclass(frozen=True)
class _Lineage:
    """The run's lineage as the root holds it (none yet: `nonce` None)."""

    nonce: str | None
    held: dict[str, tuple[Node, dict[str, Any]]]  # revision -> (node, values)
    config: str | None  # the configuration saved at its last revision


def _existing(root: Path, name: str) -> _Lineage:
    """The run's lineage and the revisions it holds."""
    if not (store_root(root) / MARKER).is_file():
        return _Lineage(None, {}, None)
    with Store(store_root(root)) as store:
        nodes = store.query().name(name).all()
        nonces = sorted({n.nonce for n in nodes})
        if len(nonces) > 1:
            raise RevisionError(
                f"run {name} has {len(nonces)} lineages under {root} "
                f"({', '.join(f'{name}~{n}' for n in nonces)}); a suite is one lineage: import "
                "under another --run"
            )
        held: dict[str, tuple[Node, dict[str, Any]]] = {}
        for node in nodes:
            values = store.values(node)
            revision = values.get("import/revision")
            if isinstance(revision, str):
                held[revision] = (node, values)
        if nodes and not held:
            raise RevisionError(
                f"run {name} under {root} is not an imported suite (no node holds "
                "import/revision); import under another --run"
            )
        config = store.job_config(max(n for n, _ in held.values())) if held else None
    return _Lineage(nonces[0] if nonces else None, held, config)


def import_suite(
    src: str | os.PathLike[str],
    root: str | os.PathLike[str],
    run: str,
    revisions: str = "all",
    *,
    project: str | None = None,
    group: str | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> SuiteImport:
    """Import the revisions `revisions` of the suite at `src` as one lineage of `run`.

    Everything is checked and hashed before the root is touched: the revisions named,
    each folder (`read_hf`: configuration, every tensor, tokenizer), one architecture
    and one tokenizer for all (the lineage's own when it exists), the composed job
    configuration with `overrides`.

    Args:
        src: a Hugging Face cache folder (`models--ORG--NAME`) or a folder with one
            subfolder per revision.
        root: the Theseus root.
        run: the run; its one lineage is the suite (made, or added to).
        revisions: `all` (every revision whose name carries a step) or `R1,R2,...`.
        overrides: configuration values for the import (`training/strategy`,
            `training/shard`: the layout the weights stream into), as `import_hf` takes.

    Returns:
        A `SuiteImport` (its `table` says what the integrity check found).

    Raises:
        RevisionError: a revision, folder or choice that cannot be imported.
        HFFolderError: a revision's folder is not a model the import loads.
        ConfigError: an override names no setting or does not fit it.
        TrainerError: an override changes the architecture.
    """
    root = Path(root)
    found = discover(Path(src))
    chosen = select(found, revisions)
    name = Node.new(run, project=project, group=group).name
    lineage = _existing(root, name)
    nonce, held = lineage.nonce, lineage.held
    todo = [r for r in chosen if r.name not in held]
    folders = {r.name: read_hf(r.folder) for r in todo}
    tree = _configuration(todo, folders, lineage.config, overrides) if todo else None
    prints = {r.name: _integrity.fingerprint(r.name, r.step, folders[r.name].files) for r in todo}
    for revision, (_node, values) in held.items():
        shards = tuple(str(values.get("import/shards", "")).split(","))
        prints[revision] = _integrity.Fingerprint(
            revision, values.get("import/step"), str(values.get("import/sha256")), shards
        )
    seqs = _seqs(todo, held)
    order = sorted(prints, key=lambda r: seqs[r])
    schedule = sorted(
        {(r.step, r.name) for r in found if r.step is not None}
        | {(p.step, p.name) for p in prints.values() if p.step is not None}
    )
    findings = _integrity.check([prints[r] for r in order], schedule)
    steps = {r.name: (r.step, r.tokens) for r in todo} | {
        r: (v.get("import/step"), v.get("import/tokens")) for r, (_, v) in held.items()
    }
    table = _integrity.table(
        [(r, *steps[r], prints[r].sha256) for r in order], findings, {r.name for r in todo}
    )
    for revision in order:
        if findings.flags(revision):
            logger.warning(
                "Warning: suite %s, revision %s: %s.", name, revision, findings.flags(revision)
            )
    if tree is None:
        assert nonce is not None
        _update_held(root, held, [], findings)  # and a chain an interrupted import left
        return SuiteImport(f"{name}~{nonce}", [], list(held), findings, table)
    spec = JobSpec(run, root, project, group)
    nodes = _write(spec, tree, nonce, todo, folders, seqs, prints, findings, held)
    _update_held(root, held, nodes, findings)
    return SuiteImport(f"{name}~{nodes[0].nonce}", nodes, list(held), findings, table)


def _configuration(
    todo: list[Revision],
    folders: dict[str, HFFolder],
    saved: str | None,
    overrides: Mapping[str, Any] | None,
) -> Any:
    """The import job's configuration, checked before any write: every revision has the
    first's architecture and tokenizer, and the lineage's when it exists (its saved
    configuration is the base, so added nodes keep its layout); then `overrides`."""
    first = folders[todo[0].name]
    for revision in todo[1:]:
        folder = folders[revision.name]
        for key, value in first.settings.items():
            if folder.settings.get(key) != value:
                raise RevisionError(
                    f"revision {revision.name} has {key} = {folder.settings.get(key)!r} and "
                    f"{todo[0].name} {value!r}; a suite is one model: import them as two runs"
                )
        if (folder.tokenizer, folder.eot) != (first.tokenizer, first.eot):
            raise RevisionError(
                f"revisions {todo[0].name} and {revision.name} have different tokenizers; a "
                "suite is one model: import them as two runs"
            )
    name = tokenizer_name(first.tokenizer, first.model_type, first.eot)
    tree = HFSuite.schema()
    if saved is None:
        compose(tree, first, name)
    else:  # the lineage's configuration, which must fit this folder
        tree.load(load(saved), strict=False)
        tree.job = job_key(HFSuite)
        try:
            check_settings(tree, first)
        except TrainerError as error:
            raise RevisionError(
                f"revision {todo[0].name} does not fit the lineage: "
                f"{str(error).split('; ')[0]}; a suite is one model: import it under another --run"
            ) from None
        if tree["architecture/tokenizer"] != name:
            raise RevisionError(
                f"revision {todo[0].name}'s tokenizer is {name}, but the lineage's is "
                f"{tree['architecture/tokenizer']}; a suite is one model: import it under "
                "another --run"
            )
        tree.update({"hf/source": str(first.path)})
    tree.update(dict(overrides or {}))
    tree.check()
    check_settings(tree, first)
    return tree


def _seqs(todo: list[Revision], held: dict[str, tuple[Node, dict[str, Any]]]) -> dict[str, int]:
    """Each revision's seq: its step; names without one after the last step, in order."""
    seqs = {revision: node.seq for revision, (node, _) in held.items()}
    taken = {seq: revision for revision, seq in seqs.items()}
    last = max([*seqs.values(), *(r.step for r in todo if r.step is not None)], default=-1)
    for revision in todo:
        seq = revision.step if revision.step is not None else last + 1
        if seq in taken:
            raise RevisionError(
                f"revision {revision.name} goes at seq {seq}, which the lineage's "
                f"{taken[seq]} holds; import it under another --run"
            )
        if revision.step is None:
            last = seq
        seqs[revision.name] = seq
        taken[seq] = revision.name
    return seqs


def _write(
    spec: JobSpec,
    tree: Any,
    nonce: str | None,
    todo: list[Revision],
    folders: dict[str, HFFolder],
    seqs: dict[str, int],
    prints: dict[str, _integrity.Fingerprint],
    findings: _integrity.Findings,
    held: dict[str, tuple[Node, dict[str, Any]]],
) -> list[Node]:
    """Write `todo` as nodes of the lineage (`nonce`, or a new one), each the child of
    the imported revision before it."""
    from theseus.quick import quick

    first = folders[todo[0].name]
    name = Node.new(spec.name, project=spec.project, group=spec.group).name
    with quick(spec.root) as q:
        tree["architecture/tokenizer"] = install_tokenizer(
            spec.root, first.tokenizer, first.model_type, first.eot
        )
        nonce = nonce or agree_on_nonce(Node.new(spec.name).nonce)  # one on every host
        occupied = sorted(node.seq for node, _ in held.values())
        plan = []
        for revision in sorted(todo, key=lambda r: seqs[r.name]):
            seq = seqs[revision.name]
            before = [s for s in occupied if s < seq]
            parent = Node(name, nonce, before[-1]) if before else None
            values: dict[str, Any] = {
                "import/revision": revision.name,
                "import/sha256": prints[revision.name].sha256,
                "import/shards": ",".join(prints[revision.name].shards),
                "import/source": str(revision.folder),
            }
            if revision.step is not None:
                values["import/step"] = revision.step
            if revision.tokens is not None:
                values["import/tokens"] = revision.tokens
            if revision.commit is not None:
                values["import/commit"] = revision.commit
            values.update(findings.values(revision.name))
            folder = folders[revision.name]
            plan.append(
                Planned(
                    Node(name, nonce, seq, parent=parent),
                    seq,
                    functools.partial(_stream, folder),
                    values,
                )
            )
            occupied = sorted([*occupied, seq])
        writer = HFSuite(spec, config=tree, store=q.store)
        writer.plan = plan
        writer()
    return [p.node for p in plan]


def _stream(folder: HFFolder, layout: Any) -> Any:
    """`folder`'s weights streamed into a train state laid out as `layout`."""
    return load_state(layout, folder)


def _update_held(
    root: Path,
    held: dict[str, tuple[Node, dict[str, Any]]],
    written: list[Node],
    findings: _integrity.Findings,
) -> None:
    """Bring the revisions imported before up to date with those `written` now.

    Each imported revision's node becomes the child of the one before it by step (a
    revision written now between two held ones takes its place: the later one's parent
    moves to it), and the findings on held revisions are renewed (a key that no longer
    applies is set to None). Nodes of the lineage that are not imports (a resumed
    revision's training) keep their edges.
    """
    if not held:
        return  # the lineage's every node was written now, each after the one before
    with Store(store_root(root)) as store:
        for revision, (node, values) in held.items():
            now: dict[str, Any] = dict(findings.values(revision))
            for key in _FINDINGS:
                if key in values and values[key] is not None and key not in now:
                    now[key] = None
            if now:  # the node alone: its parent as read before may be about to move
                store.log(Node(node.name, node.nonce, node.seq), now)
        chain = sorted([*(node for node, _ in held.values()), *written], key=lambda n: n.seq)
        for before, node in zip([None, *chain], chain, strict=False):
            store.reparent(node, before)
