"""Where `DriftBase` gets residual streams: the compiled program, and an earlier node's.

`residual_program` compiles `trace` once per instance, with every selected block's
output recorded (the intervention engine's `forward`, changing nothing) and cut to the
same `picks` of the fixed batch's token positions: `fn(state, batch, key) -> [layers,
tokens, d]`, replicated on every device.

`earlier_source` decides, on host zero, what an earlier node's residuals are read from
(the instance's memory, the node's stored artifact, or its checkpoint) for the previous
node of the lineage or the reference node; `DriftBase` acts on the decision on every
host (a checkpoint is read by all of them, in the same order).
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from theseus.analysis._engine import compile_program
from theseus.analysis._forward import forward, unchanged
from theseus.store import Node, Store
from theseus.training.sharding import ParameterShardingContext

__all__ = [
    "Source",
    "at_positions",
    "earlier_source",
    "from_bytes",
    "node_source",
    "picks",
    "residual_program",
    "to_bytes",
    "tokens_digest",
]


def picks(rows: int, length: int, tokens: int, seed: int) -> np.ndarray:
    """The flat positions `[min(tokens, rows * length)]` (sorted) of a `[rows, length]`
    batch that are compared: drawn once without replacement from `seed`."""
    total = rows * length
    chosen = np.random.default_rng(seed).choice(total, size=min(tokens, total), replace=False)
    return np.sort(chosen).astype(np.int32)


def tokens_digest(x: np.ndarray, chosen: np.ndarray, layers: int) -> str:
    """What residuals are comparable across nodes by: the fixed batch's token ids
    (`x [rows, length]`), the positions compared and the number of layers."""
    text = hashlib.sha256()
    text.update(np.ascontiguousarray(x, dtype=np.int64).tobytes())
    text.update(repr(tuple(x.shape)).encode())
    text.update(np.ascontiguousarray(chosen, dtype=np.int64).tobytes())
    text.update(str(layers).encode())
    return text.hexdigest()


def residual_program(
    trace: Callable[..., Any],
    paths: tuple[str, ...],
    chosen: np.ndarray,
    sharding: ParameterShardingContext,
    owner: str,
    on_trace: Callable[[], None],
) -> Any:
    """`jit(fn(state, batch, key))`: each path's output `[rows, length, d]` at the flat
    positions `chosen`, stacked `[len(paths), len(chosen), d]` in float32 (see the module
    docstring)."""

    def body(state: Any, batch: dict[str, Any], key: jax.Array | None) -> Any:
        _, calls = forward(
            lambda: trace(state, batch, key, sharding=sharding), paths, unchanged, owner
        )
        return at_positions(calls, paths, chosen)

    return compile_program(body, sharding, owner, on_trace)


def at_positions(calls: dict[str, Any], paths: tuple[str, ...], chosen: np.ndarray) -> jax.Array:
    """Under jit: each path's recorded output `[rows, length, d]` at the flat positions
    `chosen`, stacked `[len(paths), len(chosen), d]` in float32 (what `residual_program`
    returns, and what a set's program computes for a drift beside it)."""
    where = jnp.asarray(chosen)
    layers = []
    for path in paths:
        out = calls[path].output
        h = out[0] if isinstance(out, tuple) else out  # a block called with a cache
        layers.append(h.reshape(-1, h.shape[-1])[where].astype(jnp.float32))
    return jnp.stack(layers)


def to_bytes(residuals: np.ndarray) -> bytes:
    """`[layers, tokens, d]` float16 as the bytes of a `.npy` file."""
    buffer = io.BytesIO()
    np.save(buffer, np.ascontiguousarray(residuals), allow_pickle=False)
    return buffer.getvalue()


def from_bytes(content: bytes) -> np.ndarray:
    """The array `to_bytes` wrote."""
    return np.load(io.BytesIO(content), allow_pickle=False)


@dataclass(frozen=True)
class Source:
    """Where an earlier node's residuals come from.

    Attributes:
        node: the node.
        kind: `"memory"` (the instance computed them), `"store"` (its artifact) or
            `"checkpoint"` (recompute from its checkpoint).
        content: the artifact's bytes (`"store"` only).
    """

    node: Node
    kind: str
    content: bytes | None = None


def _rank(chain: list[tuple[str, str, int]], node: Node) -> tuple[int, int] | None:
    """`(stretch, seq)`: where `node` lies along the stitched lineage, None off it."""
    for index, (name, nonce, upto) in enumerate(chain):
        if (node.name, node.nonce) == (name, nonce) and node.seq <= upto:
            return index, node.seq
    return None


def earlier_source(
    store: Store,
    node: Node,
    artifact: str,
    marker: str,
    digest: str,
    memory: Node | None,
    checkpoints: bool,
) -> Source | None:
    """The latest node before `node` along its stitched lineage (through branch points)
    whose residuals this analysis can read, or None (host zero).

    Candidates: `memory` (residuals the instance holds for `digest`), nodes holding
    `artifact` whose value `marker` is `digest`, and, with `checkpoints`, every
    checkpointed node (its residuals recomputed). On one node, memory wins over the
    store and the store over a checkpoint.
    """
    chain = store.lineage_chain(node.name, node.nonce)
    here = _rank(chain, node)
    if here is None:
        return None
    found: list[tuple[tuple[int, int, int], Source]] = []
    if memory is not None:
        at = _rank(chain, memory)
        if at is not None and at < here:
            found.append(((*at, 2), Source(memory, "memory")))
    for frame in store.artifact_frames(node.name, node.nonce, artifact):
        held = Node.deserialize(frame["node"])
        at = _rank(chain, held)
        if at is not None and at < here and store.values(held).get(marker) == digest:
            found.append(((*at, 1), Source(held, "store")))
    if checkpoints:
        for name, nonce, upto in chain:
            for saved in store.query().name(name).nonce(nonce).checkpoints():
                at = _rank(chain, saved.node)
                if saved.node.seq <= upto and at is not None and at < here:
                    found.append(((*at, 0), Source(saved.node, "checkpoint")))
    if not found:
        return None
    _, best = max(found, key=lambda pair: pair[0])
    if best.kind == "store":
        best = Source(best.node, "store", store.get(best.node)[artifact].content)
    return best


def node_source(store: Store, node: Node, artifact: str, marker: str, digest: str) -> Source | None:
    """Where the residuals of one named node (the reference) come from: its artifact
    when made for `digest`, else its checkpoint; None when it has neither (host zero).

    Raises:
        UnknownNodeError: the store never recorded `node`.
    """
    held = store.get(node).get(artifact)
    if held is not None and store.values(node).get(marker) == digest:
        return Source(node, "store", held.content)
    if store.checkpoints(node):
        return Source(node, "checkpoint")
    return None
