"""One attention function, `attend`, with a reference path and fused kernels.

`attend(q, k, v)` computes causal (or masked) scaled dot-product attention of queries
`[batch, q_len, n_head, head_dim]` over keys and values `[batch, kv_len, n_kv_head,
head_dim]`, where each key/value head serves `n_head // n_kv_head` consecutive query
heads (grouped-query attention). With `segments` (`[batch, seq]` ids: rows that pack
several sequences, each a run of one id) it is causal within each segment: a query reads
the keys of its own segment up to itself, as that sequence would alone. With `prefixes`
as well (`[batch, seq]`: for each token, the id of a segment before its own that it also
reads, or its own id), segments that continue one shared prefix read it whole and not
each other (the choices of a question after its one context). Which computation runs is
`implementation`:

- `reference`: scores in float32, the causal mask, softmax, then the weighted sum of
  the values; the one path that can also give the probabilities (`probabilities`),
  apply dropout to them, and take any mask. What every analysis reads.
- `splash`: JAX's own Pallas TPU splash attention (`jax.experimental.pallas.ops.tpu`),
  causal (segments as its segment ids), grouped-query heads served without repeating
  keys, the backward fused;
  measured on a TPU v5e (12 heads of 64, 1,024 tokens, bf16) at 1.6 ms for forward and
  backward against the reference's 4.6 ms.
- `flash`: JAX's Pallas TPU flash attention (keys repeated for grouped-query heads;
  segments as its segment ids).
- `cudnn`: `jax.nn.dot_product_attention(..., implementation="cudnn")` on an NVIDIA GPU
  (causal only: packed segments take the reference).

Shared prefixes are the reference's alone: a kernel falls back for them.
- `auto`: the fastest the platform has: `splash` on a TPU, `cudnn` on a GPU (for
  bfloat16 or float16 activations), the reference on a CPU.

A kernel the platform lacks, or a call it cannot serve (a mask other than causal,
segments for cuDNN, dropout on the probabilities while training, a sequence that does
not split into the kernel's blocks, float32 for cuDNN), falls back to the reference and
says why once per reason (logger `theseus.model.attention`). Pallas kernels run in interpret mode on a CPU
when `THESEUS_ATTENTION_INTERPRET=1` (how the tests check them without a TPU).

Under a mesh of several devices (the trainer's `training/shard` and data parallelism)
the Pallas kernels run per device through `shard_map`, batch and heads split as the
logical axis rules say (`batch`, `heads`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Literal

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

__all__ = [
    "IMPLEMENTATIONS",
    "Implementation",
    "attend",
    "attend_heads_first",
    "choose",
    "probabilities",
    "repeat_kv",
    "segment_mask",
    "splash",
    "splash_heads_first",
]

Implementation = Literal["auto", "reference", "splash", "flash", "cudnn"]
IMPLEMENTATIONS: tuple[str, ...] = ("auto", "reference", "splash", "flash", "cudnn")

logger = logging.getLogger("theseus.model.attention")
_SAID: set[str] = set()

# Pallas TPU kernels tile the sequence in blocks of this many tokens at most (the
# fastest measured on a v5e at 1,024 tokens); a sequence is split into blocks of
# min(this, seq), which must be a multiple of the TPU's 128 lanes.
BLOCK = 512
LANES = 128


def repeat_kv(kv: jax.Array, n_head: int) -> jax.Array:
    """Keys or values `[batch, seq, n_kv_head, head_dim]` repeated to `n_head` heads.

    Query head `h` reads key/value head `h // (n_head // n_kv_head)`.
    """
    group = n_head // kv.shape[2]
    return kv if group == 1 else jnp.repeat(kv, group, axis=2)


def segment_mask(segments: jax.Array, prefixes: jax.Array | None = None) -> jax.Array:
    """`[batch, seq, seq]`, true where query `i` may read key `j`: `j <= i`, and `j` in
    `i`'s segment or in the segment `prefixes[i]` names (`segments [batch, seq]`, each
    segment a run of one id; `prefixes` None: its own segment only)."""
    seq = segments.shape[-1]
    causal = jnp.tril(jnp.ones((seq, seq), dtype=bool))[None]
    same = segments[:, :, None] == segments[:, None, :]
    if prefixes is not None:
        same = same | (prefixes[:, :, None] == segments[:, None, :])
    return causal & same


def probabilities(q: jax.Array, k: jax.Array, mask: jax.Array | None = None) -> jax.Array:
    """Attention probabilities `[batch, n_head, q_len, kv_len]` in float32.

    Args:
        q: queries `[batch, q_len, n_head, head_dim]`.
        k: keys `[batch, kv_len, n_kv_head, head_dim]` (repeated to the query heads).
        mask: `[batch, q_len, kv_len]`, true where a query may read a key; None: causal
            (`q_len == kv_len`).
    """
    k = repeat_kv(k, q.shape[2])
    head_dim = q.shape[-1]
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(jnp.float32) / jnp.sqrt(head_dim)
    if mask is None:
        seq = q.shape[1]
        visible = jnp.tril(jnp.ones((seq, seq), dtype=bool))[None, None]
    else:
        visible = mask[:, None]
    scores = jnp.where(visible, scores, jnp.finfo(jnp.float32).min)
    return jax.nn.softmax(scores, axis=-1)


def reference(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    mask: jax.Array | None = None,
    dropout: Callable[[jax.Array], jax.Array] | None = None,
) -> jax.Array:
    """The reference attention, `[batch, q_len, n_head, head_dim]` (see `attend`)."""
    weights = probabilities(q, k, mask).astype(v.dtype)
    if dropout is not None:
        weights = dropout(weights)
    return jnp.einsum("bhqk,bkhd->bqhd", weights, repeat_kv(v, q.shape[2]))


def _say_once(reason: str) -> None:
    if reason not in _SAID:
        _SAID.add(reason)
        logger.warning("attention: %s", reason)


def _interpret() -> bool:
    return os.environ.get("THESEUS_ATTENTION_INTERPRET", "") == "1"


def choose(
    implementation: str,
    *,
    q_len: int,
    kv_len: int,
    dtype: jnp.dtype,
    masked: bool = False,
    segmented: bool = False,
    prefixed: bool = False,
    dropout: bool = False,
    platform: str | None = None,
) -> tuple[str, str | None]:
    """The computation `attend` runs for a call, and why the one asked for cannot (or None).

    Args:
        implementation: one of `IMPLEMENTATIONS`.
        q_len, kv_len: the queries' and keys' lengths.
        dtype: the activations' dtype.
        masked: the call passes a mask other than causal.
        segmented: the call packs segments (causal within each; the Pallas kernels take
            them as segment ids, cuDNN does not).
        prefixed: packed segments also read a shared prefix (the reference alone).
        dropout: the call drops attention probabilities (training with dropout).
        platform: `cpu`, `gpu` or `tpu`; None: JAX's default backend.
    """
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(
            f"architecture/attention must be one of {', '.join(IMPLEMENTATIONS)}; "
            f"got {implementation!r}"
        )
    if implementation == "reference":
        return "reference", None
    platform = platform or jax.default_backend()
    if implementation == "auto":
        if platform == "tpu":
            implementation = "splash"
        elif platform == "gpu" and jnp.dtype(dtype) in (jnp.bfloat16, jnp.float16):
            implementation = "cudnn"
        else:
            return "reference", None
    wants = "cuDNN" if implementation == "cudnn" else f"Pallas {implementation}"
    if implementation in ("splash", "flash") and platform != "tpu" and not _interpret():
        return "reference", f"{wants} attention needs a TPU (this is a {platform}): reference"
    if implementation == "cudnn" and platform != "gpu":
        return "reference", f"cuDNN attention needs an NVIDIA GPU (this is a {platform}): reference"
    if masked:
        return (
            "reference",
            f"{wants} attention serves the causal mask only: reference for this call",
        )
    if segmented and implementation == "cudnn":
        return "reference", "cuDNN attention takes no packed segments: reference for this call"
    if prefixed:
        return "reference", f"{wants} attention takes no shared prefixes: reference for this call"
    if dropout:
        return "reference", (
            f"{wants} attention has no dropout on the probabilities "
            "(architecture/dropout > 0 while training): reference"
        )
    if q_len != kv_len:
        return "reference", f"{wants} attention needs as many queries as keys: reference"
    if implementation in ("splash", "flash") and min(q_len, BLOCK) % LANES:
        return "reference", (
            f"{wants} attention needs a sequence that splits into blocks of a multiple of "
            f"{LANES} tokens; got {q_len}: reference"
        )
    if implementation in ("splash", "flash") and q_len % min(q_len, BLOCK):
        return "reference", (
            f"{wants} attention needs a sequence that splits into blocks of {BLOCK} tokens; "
            f"got {q_len}: reference"
        )
    if implementation == "cudnn" and jnp.dtype(dtype) not in (jnp.bfloat16, jnp.float16):
        return "reference", (
            f"cuDNN attention needs bfloat16 or float16 activations; got {jnp.dtype(dtype)}: "
            "reference"
        )
    return implementation, None


def attend(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    implementation: str = "auto",
    mask: jax.Array | None = None,
    segments: jax.Array | None = None,
    prefixes: jax.Array | None = None,
    dropout: Callable[[jax.Array], jax.Array] | None = None,
) -> jax.Array:
    """Scaled dot-product attention, `[batch, q_len, n_head, head_dim]`.

    Args:
        q: queries `[batch, q_len, n_head, head_dim]`.
        k: keys `[batch, kv_len, n_kv_head, head_dim]`, `n_kv_head` dividing `n_head`.
        v: values, shaped as `k`.
        implementation: one of `IMPLEMENTATIONS` (see the module's docstring).
        mask: `[batch, q_len, kv_len]`, true where a query may read a key; None: causal.
        segments: `[batch, seq]` ids of the sequences packed in each row (each a run of
            one id; `q_len == kv_len`): causal within each. None: one sequence a row.
            Not with `mask`.
        prefixes: with `segments`, `[batch, seq]`: for each token the id of an earlier
            segment it reads whole as well (a prefix its segment continues), or its own.
        dropout: applied to the probabilities (reference only); None when not training.
    """
    if mask is not None and segments is not None:
        raise ValueError("attend takes a mask or segments, not both; fold the segments in")
    if prefixes is not None and segments is None:
        raise ValueError("attend takes prefixes only with segments")
    name, reason = choose(
        implementation,
        q_len=q.shape[1],
        kv_len=k.shape[1],
        dtype=q.dtype,
        masked=mask is not None,
        segmented=segments is not None,
        prefixed=prefixes is not None,
        dropout=dropout is not None,
    )
    if reason is not None:
        _say_once(reason)
    if name == "reference":
        if segments is not None:
            mask = segment_mask(segments, prefixes)
        return reference(q, k, v, mask, dropout)
    if name == "cudnn":
        return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="cudnn")
    kernel = splash if name == "splash" else _flash
    return _per_device(kernel, q, k, v, segments)


def _per_device(
    kernel: Callable[[jax.Array, jax.Array, jax.Array, jax.Array | None], jax.Array],
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    segments: jax.Array | None,
    heads_first: bool = False,
) -> jax.Array:
    """`kernel` on each device's rows and heads: a Pallas call is not split by XLA itself.

    Arrays are `[batch, seq, heads, head_dim]`, or `[batch, heads, seq, head_dim]` with
    `heads_first`.
    """
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or mesh.size == 1:
        return kernel(q, k, v, segments)
    axes = nn.logical_to_mesh_axes(("batch", "length", "heads", None))
    batch, _, heads, _ = (None,) * 4 if axes is None else tuple(axes)
    if heads_first:
        spec = PartitionSpec(batch, heads, None, None)
    else:
        spec = PartitionSpec(batch, None, heads, None)
    if segments is None:
        plain = jax.shard_map(
            lambda q, k, v: kernel(q, k, v, None),
            mesh=mesh,
            in_specs=(spec, spec, spec),
            out_specs=spec,
            check_vma=False,
        )
        return plain(q, k, v)
    rows = PartitionSpec(batch, None)
    packed = jax.shard_map(
        kernel, mesh=mesh, in_specs=(spec, spec, spec, rows), out_specs=spec, check_vma=False
    )
    return packed(q, k, v, segments)


def _splash_kernel(
    heads: int, seq: int, interpret: bool, block: int = BLOCK, fused_backward: bool = True
) -> Callable[..., jax.Array]:
    """The causal splash kernel for `heads` heads of `seq` tokens, mapped over the batch,
    in blocks of `min(seq, block)` tokens (`block` and `fused_backward` other than the
    defaults: benchmarks/kernels.py's sweep).

    Made anew in each trace: its mask tables become constants of the program being traced.
    """
    from jax.experimental.pallas.ops.tpu import splash_attention as splash

    block = min(seq, block)
    blocks = splash.BlockSizes(
        block_q=block,
        block_kv=block,
        block_kv_compute=block,
        block_q_dkv=block,
        block_kv_dkv=block,
        block_kv_dkv_compute=block,
        use_fused_bwd_kernel=fused_backward,
        block_q_dq=None if fused_backward else block,
        block_kv_dq=None if fused_backward else block,
    )
    mask = splash.MultiHeadMask([splash.CausalMask((seq, seq)) for _ in range(heads)])
    kernel = splash.make_splash_mha(
        mask, block_sizes=blocks, head_shards=1, q_seq_shards=1, interpret=interpret
    )
    return jax.vmap(kernel)


def splash(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    segments: jax.Array | None = None,
    block: int = BLOCK,
    fused_backward: bool = True,
) -> jax.Array:
    """Causal splash attention on `[batch, seq, heads, head_dim]` (grouped keys as they are),
    on one device (`attend` maps it over a mesh), in blocks of `min(seq, block)` tokens,
    within each segment of `segments [batch, seq]` when given.

    `attend(..., implementation="splash")` is the way in; this takes the kernel's own
    settings too (`benchmarks/kernels.py` sweeps them).
    """
    q, k, v = q.swapaxes(1, 2), k.swapaxes(1, 2), v.swapaxes(1, 2)
    return splash_heads_first(q, k, v, segments, block, fused_backward).swapaxes(1, 2)


def splash_heads_first(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    segments: jax.Array | None = None,
    block: int = BLOCK,
    fused_backward: bool = True,
) -> jax.Array:
    """`splash` on the kernel's own layout, `[batch, heads, seq, head_dim]` in and out, so
    a caller that projects straight into it moves no queries, keys or values around the
    kernel (on a TPU v5e, 124M GPT, such copies took about 12 of a step's 74 ms)."""
    from jax.experimental.pallas.ops.tpu import splash_attention as pallas_splash

    kernel = _splash_kernel(q.shape[1], q.shape[2], _interpret(), block, fused_backward)
    q = q * jnp.asarray(1 / q.shape[-1] ** 0.5, q.dtype)
    if segments is None:
        return kernel(q, k, v)
    ids = segments.astype(jnp.int32)
    return kernel(q, k, v, pallas_splash.SegmentIds(q=ids, kv=ids))


def attend_heads_first(
    q: jax.Array, k: jax.Array, v: jax.Array, segments: jax.Array | None = None
) -> jax.Array:
    """Causal splash attention on `[batch, heads, seq, head_dim]` (keys and values with
    `n_kv_head` heads), per device under a mesh, within each segment of `segments`.

    For a caller that has checked `choose(...)` gives `splash` for the call; `attend` is
    the way in for every other.
    """
    return _per_device(splash_heads_first, q, k, v, segments, heads_first=True)


def _flash(q: jax.Array, k: jax.Array, v: jax.Array, segments: jax.Array | None) -> jax.Array:
    """Causal flash attention on `[batch, seq, heads, head_dim]` (grouped keys repeated),
    within each segment of `segments [batch, seq]` when given."""
    from jax.experimental.pallas.ops.tpu import flash_attention as flash

    block = min(q.shape[1], BLOCK)
    blocks = flash.BlockSizes(
        block_q=block,
        block_k_major=block,
        block_k=block,
        block_b=1,
        block_q_major_dkv=block,
        block_k_major_dkv=block,
        block_k_dkv=block,
        block_q_dkv=block,
        block_k_major_dq=block,
        block_k_dq=block,
        block_q_dq=block,
    )
    heads = q.shape[2]
    ids = None
    if segments is not None:
        ids = flash.SegmentIds(q=segments.astype(jnp.int32), kv=segments.astype(jnp.int32))
    out = flash.flash_attention(
        q.swapaxes(1, 2),
        repeat_kv(k, heads).swapaxes(1, 2),
        repeat_kv(v, heads).swapaxes(1, 2),
        segment_ids=ids,
        causal=True,
        sm_scale=1 / q.shape[-1] ** 0.5,
        block_sizes=blocks,
    )
    return out.swapaxes(1, 2)
