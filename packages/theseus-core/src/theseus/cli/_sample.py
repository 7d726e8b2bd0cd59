"""The verb `theseus sample`: a checkpoint's continuation of a prompt, streamed.

Everything that can be checked without the checkpoint is checked first: the options
(each in its range, finite), the prompt (not empty, and leaving the model's context
room for a new token, measured with the tokenizer the saved configuration names) and
`--max-new-tokens` against that context. Left out, `--max-new-tokens` is 64 or what
the context leaves after the prompt, whichever is smaller, and a cut is said on
stderr. A job class the environment does not know is named with the module its run
recorded (`job/module`), so the message says what to `--import`.
"""

from __future__ import annotations

import math
import os
import shlex
from pathlib import Path
from typing import Any

import click

from theseus.cli._app import common_options, main
from theseus.cli._root import root_argument
from theseus.cli._verbs import _base_node, _job_class
from theseus.config import ConfigError, load
from theseus.job import BasicJob, from_host_zero
from theseus.quick import Quick, quick
from theseus.registry import UnknownNameError
from theseus.store import Node, Store, StoreError, locate

DEFAULT_NEW_TOKENS = 64


class FiniteFloatRange(click.FloatRange):
    """`click.FloatRange` that also refuses `nan` and `inf` (which every bound lets by)."""

    name = "finite float range"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(
                f"{value} is not a finite number in the range {self._describe_range()}.", param, ctx
            )
        return number


def _setting(values: dict[str, Any], key: str) -> Any:
    """`values[a][b]` for the key `a/b` of a nested saved configuration; None if absent."""
    for part in key.split("/"):
        if not isinstance(values, dict) or part not in values:
            return None
        values = values[part]
    return values


def recorded_module(store: Store, node: Node) -> str | None:
    """The `job/module` the job of `node`'s lineage recorded last at or before `node`."""
    lineage = store.query().name(node.name).nonce(node.nonce).has("job/module")
    if not lineage.count():  # (select() refuses a key the store has never held)
        return None
    rows = lineage.select(["job/module"], return_nodes=True)
    before = [(n.seq, values["job/module"]) for n, values in rows if n.seq <= node.seq]
    return str(max(before)[1]) if before else None


def job_class(store: Store, node: Node, name: str) -> type[BasicJob]:
    """The job class recorded for `node`, or a one-line error naming the module to import."""
    try:
        return _job_class(name)
    except UnknownNameError:
        module = from_host_zero(lambda: recorded_module(store, node))
        if module is None:
            raise
        raise ConfigError(
            f"{node} was written by job {name!r}, which this environment has not registered; "
            f"its run recorded module {module!r}: pass --import {module} (before the verb or "
            "after it)"
        ) from None


def _recorded(q: Quick, target: str) -> tuple[Node, dict[str, Any], type[BasicJob]]:
    """TARGET's node (a lineage or run: its latest checkpoint), its saved configuration
    and the job class that wrote it, read from the store (host zero's answer)."""
    node = from_host_zero(lambda: target_node(q.store, target))
    saved = from_host_zero(lambda: q.store.job_config(node))
    values = load(saved) if saved else {}
    job_name = values.get("job")
    if not isinstance(job_name, str):
        raise ConfigError(
            f"{target} ({node}) has no recorded job configuration, so its model is unknown; "
            "pass a node a theseus training job or import wrote."
        )
    return node, values, job_class(q.store, node, job_name)


def _restored(q: Quick, node: Node, cls: type[BasicJob]) -> BasicJob:
    """A job of `cls` resumed at `node` (its checkpoint loaded), set up, without the tandem
    analyses of its `ANALYSIS` (reading a checkpoint needs no analysis, nor the prepared
    data where an analysis looks for its site)."""
    project, group, run = node.name.split(".", 2)
    q.build(cls, run, project=project, group=group)
    q.find().node(node).resume()
    if "training/analyze" in q.config:
        q.config["training/analyze"] = False
    return q.create()


def require_store(root: str | os.PathLike[str]) -> Path:
    """The Theseus root of a ROOT that holds a store (refused before `quick` would make an
    empty one there).

    Args:
        root: a Theseus root, its store folder or a `postgresql://` URL (`locate`).

    Returns:
        The Theseus root (the folder that holds `store/`, `data/`, `checkpoints/`).

    Raises:
        ConfigError: no store is there, or a store of its own (one line, from
            `theseus.store.locate`).
    """
    try:
        return locate(root, create=False).theseus_root()
    except StoreError as err:
        raise ConfigError(str(err)) from None


def target_node(store: Store, target: str) -> Node:
    """The checkpointed node TARGET names: a node as written; a lineage (`name~nonce`) or a
    run's name with one lineage: its latest checkpoint.

    Raises:
        UnknownNodeError: TARGET is not in the store (the message says how to list nodes).
        ConfigError: the node holds no checkpoint, so no weights to read (the message
            names the checkpoints of its lineage and how to list them).
    """
    node = _base_node(store, target)
    if store.checkpoints(node):
        return node
    lineage = f"{node.name}~{node.nonce}"
    saved = sorted(
        {
            c.node.seq
            for c in store.query().nonce(node.nonce).checkpoints()
            if c.node.name == node.name
        }
    )
    listing = (
        f"`theseus-store lineage {shlex.quote(str(store.root))} {node.serialize()}` lists its "
        "nodes and their checkpoints"
    )
    if not saved:
        raise ConfigError(
            f"{node} holds no checkpoint, and no node of its lineage {lineage} does, so there "
            f"are no weights to read; pass a node that holds a checkpoint ({listing})."
        )
    earlier = [seq for seq in saved if seq < node.seq]
    shown = ", ".join(map(str, saved[:8])) + (", ..." if len(saved) > 8 else "")
    closest = f"{lineage}~{earlier[-1]} (the closest before it), " if earlier else ""
    raise ConfigError(
        f"{node} holds no checkpoint, so there are no weights to read; its lineage's "
        f"checkpoints are at seq {shown}. Pass {closest}{lineage} (its latest), or another "
        f"checkpointed node ({listing})."
    )


def open_trainer(q: Quick, target: str) -> BasicJob:
    """The job that wrote TARGET, set up at its checkpoint under `q`'s root.

    Args:
        q: an open `quick` session.
        target: a node (`name~nonce~seq`), a lineage (`name~nonce`: its latest
            checkpoint) or a run's name with one lineage.

    Raises:
        ConfigError: the node has no recorded job, or its job is not registered here
            (the message names the module to import).
    """
    node, _, cls = _recorded(q, target)
    return _restored(q, node, cls)


def _room(prompt: str, values: dict[str, Any], root: Path, max_new_tokens: int | None) -> int:
    """Check PROMPT and --max-new-tokens against the saved context; the tokens to draw.

    A saved configuration without `architecture/block_size` (another model) leaves
    the checks to generation, after the load.
    """
    from theseus.data.tokenizer import get_tokenizer

    block, name = (
        _setting(values, "architecture/block_size"),
        _setting(values, "architecture/tokenizer"),
    )
    if not isinstance(block, int):
        return max_new_tokens if max_new_tokens is not None else DEFAULT_NEW_TOKENS
    length = len(get_tokenizer(name or "bytes", root=root).encode(prompt))
    if not length:
        raise click.BadParameter(
            f"{prompt!r} encodes to no tokens; give at least one character to continue",
            param_hint="PROMPT",
        )
    if length >= block:
        raise click.BadParameter(
            f"the prompt is {length} tokens and the model's context (architecture/block_size) "
            f"is {block}, which leaves no room for a new token; keep it under {block} tokens",
            param_hint="PROMPT",
        )
    if max_new_tokens is None:
        if length + DEFAULT_NEW_TOKENS <= block:
            return DEFAULT_NEW_TOKENS
        click.echo(
            f"--max-new-tokens {block - length}: what the model's context "
            f"(architecture/block_size = {block}) leaves after the {length}-token prompt",
            err=True,
        )
        return block - length
    if length + max_new_tokens > block:
        raise click.BadParameter(
            f"the prompt ({length} tokens) plus {max_new_tokens} new tokens exceeds the model's "
            f"context, architecture/block_size = {block}; ask for at most {block - length}",
            param_hint="--max-new-tokens",
        )
    return max_new_tokens


@main.command("sample")
@root_argument(create=False)
@click.argument("target")
@click.argument("prompt")
@click.option(
    "--max-new-tokens",
    default=None,
    type=click.IntRange(1),
    help=f"Tokens to add [default: {DEFAULT_NEW_TOKENS}, or what the context leaves].",
)
@click.option(
    "--temperature",
    default=1.0,
    show_default=True,
    type=FiniteFloatRange(0),
    help="0: greedy.",
)
@click.option("--top-k", default=None, type=click.IntRange(1), help="Sample among the K likeliest.")
@click.option(
    "--top-p",
    default=None,
    type=FiniteFloatRange(0, 1, min_open=True),
    help="Sample among the likeliest tokens whose probability reaches P.",
)
@click.option(
    "--seed",
    default=0,
    show_default=True,
    type=click.IntRange(-(2**63), 2**63 - 1),
    help="The sampling key's seed.",
)
@common_options
def sample_command(
    root: Path,
    target: str,
    prompt: str,
    max_new_tokens: int | None,
    temperature: float,
    top_k: int | None,
    top_p: float | None,
    seed: int,
) -> None:
    """Continue PROMPT with the model of TARGET's checkpoint under ROOT, streaming the text.

    TARGET is a node (`name~nonce~seq`), a lineage (`name~nonce`) or a run name with one
    lineage; a lineage means its latest checkpoint. Nothing is written to the store.
    """
    import jax

    if not prompt:
        raise click.BadParameter(
            "is empty; give at least one character to continue", param_hint="PROMPT"
        )
    require_store(root)
    with quick(root) as q:
        node, values, cls = _recorded(q, target)
        new_tokens = _room(prompt, values, root, max_new_tokens)  # before the checkpoint loads
        job = _restored(q, node, cls)
        generate = getattr(job, "generate", None)
        if generate is None:
            raise ConfigError(
                f"{values['job']} ({type(job).__name__}) is not a trainer; it cannot sample."
            )
        # the step of the checkpoint restored (an imported revision's is its training step;
        # its state counts optimizer steps from 0)
        restored = from_host_zero(lambda: q.store.checkpoints(node))
        click.echo(f"{node} (step {restored[-1].step}):", err=True)
        started: list[bool] = []

        def show(piece: str) -> None:
            if not started:  # the prompt once generation has begun (bad settings: nothing)
                click.echo(prompt, nl=False)
                started.append(True)
            click.echo(piece, nl=False)

        generate(
            prompt, new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
            key=jax.random.key(seed), stream=show,
        )  # fmt: skip
        click.echo("" if started else prompt)
