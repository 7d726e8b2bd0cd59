"""The fused attention kernels on the accelerator against the reference.

On a TPU: JAX's Pallas splash and flash kernels, compiled, forward and gradient, in
bfloat16 against the float32 reference (the `fused` tolerance: 2 eps of bfloat16 of the
values' scale) and in float32 under `precise()`
against float64 NumPy (the `reference` tolerance). Then a GPT trained a few steps with
`architecture/attention = splash`: its logits equal the reference model's on the same
parameters, and the pattern an analysis reads (`weights(x)`) is the same array under
either setting. Rows that pack sequences (`segments`) attend within each, as each would
alone. On a CPU (THESEUS_ACCELERATOR_ALLOW_CPU=1) the Pallas kernels run in
interpret mode; cuDNN is checked on a GPU only.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from _tolerances import assert_close, platform, precise

from theseus.model import GPT
from theseus.model.attention.kernels import attend

pytestmark = pytest.mark.accelerator

BATCH, SEQ, HEADS, HEAD_DIM = 2, 512, 4, 64


@pytest.fixture(autouse=True)
def _kernels_run_here(monkeypatch: pytest.MonkeyPatch) -> None:
    if platform() == "cpu":
        monkeypatch.setenv("THESEUS_ATTENTION_INTERPRET", "1")


def _kernels() -> list[str]:
    if platform() == "gpu":
        return ["cudnn"]
    return ["splash", "flash"] if platform() == "tpu" else ["splash"]


def _numpy_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    group = q.shape[2] // k.shape[2]
    k, v = np.repeat(k, group, axis=2), np.repeat(v, group, axis=2)
    scores = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(q.shape[-1])
    scores = np.where(np.tril(np.ones((q.shape[1],) * 2, bool)), scores, -np.inf)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    return np.einsum("bhqk,bkhd->bqhd", weights, v)


def _inputs(kv_heads: int, dtype: Any) -> tuple[jax.Array, ...]:
    rng = np.random.default_rng(0)
    shapes = [(BATCH, SEQ, HEADS, HEAD_DIM)] + [(BATCH, SEQ, kv_heads, HEAD_DIM)] * 2
    shapes.append(shapes[0])  # the probe the gradient is taken along
    return tuple(jnp.asarray(rng.normal(size=s), dtype) for s in shapes)


def _grads(name: str, q: jax.Array, k: jax.Array, v: jax.Array, probe: jax.Array) -> Any:
    def loss(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        out = attend(q, k, v, implementation=name).astype(jnp.float32)
        return jnp.sum(out * probe.astype(jnp.float32))

    return jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v)


@pytest.mark.parametrize("kv_heads", [HEADS, 2])
@pytest.mark.parametrize("name", _kernels())
def test_kernel_in_bfloat16_against_the_float32_reference(name: str, kv_heads: int) -> None:
    q, k, v, probe = _inputs(kv_heads, jnp.bfloat16)
    out = jax.jit(lambda *a: attend(*a, implementation=name))(q, k, v)
    with precise():
        wide = tuple(a.astype(jnp.float32) for a in (q, k, v, probe))
        want = jax.jit(lambda *a: attend(*a, implementation="reference"))(*wide[:3])
        want_grads = _grads("reference", *wide)
    assert_close(out, want, "fused", jnp.bfloat16, what=f"{name} forward")
    for got, ref, which in zip(_grads(name, q, k, v, probe), want_grads, "qkv", strict=True):
        assert_close(got, ref, "fused", jnp.bfloat16, what=f"{name} d/d{which}")


@pytest.mark.parametrize("name", _kernels())
def test_kernel_in_float32_against_numpy(name: str) -> None:
    if name == "cudnn":
        pytest.skip("cuDNN attention takes bfloat16 or float16 only")
    q, k, v, _ = _inputs(2, jnp.float32)
    with precise():
        out = jax.jit(lambda *a: attend(*a, implementation=name))(q, k, v)
    assert_close(out, _numpy_attention(q, k, v), "reference", what=f"{name} forward")


@pytest.mark.parametrize("name", _kernels())
def test_kernel_with_packed_segments_in_float32_against_numpy(name: str) -> None:
    """Rows packing sequences (`segments`, as evaluations pack short requests): each
    sequence's output is NumPy's attention over it alone; cuDNN falls back to the
    reference, which must hold the same bound."""
    q, k, v, _ = _inputs(2, jnp.float32)
    lengths = [[200, 56, 256], [500, 12]]
    segments = np.stack([np.repeat(np.arange(1, len(row) + 1), row) for row in lengths])
    with precise():
        out = jax.jit(lambda *a: attend(*a[:3], implementation=name, segments=a[3]))(
            q, k, v, jnp.asarray(segments, jnp.int32)
        )
    for b, row in enumerate(lengths):
        at = 0
        for n in row:
            part = (slice(b, b + 1), slice(at, at + n))
            want = _numpy_attention(q[part], k[part], v[part])
            assert_close(out[part], want, "reference", what=f"{name} segment of {n}")
            at += n


def test_a_model_trained_on_the_kernel_shows_the_reference_pattern() -> None:
    """Twenty AdamW steps of a GQA GPT with the platform's kernel; then its logits on the
    reference path are within the bfloat16 bound, and `weights(x)` is bit-identical."""
    name = _kernels()[0]
    settings = dict(n_layers=2, n_embd=HEADS * HEAD_DIM, n_head=HEADS, n_kv_head=2,
                    block_size=SEQ, vocab_size=128, dtype="bfloat16")  # fmt: skip
    fused, plain = (
        GPT.build(attention=name, **settings),
        GPT.build(attention="reference", **settings),
    )
    x = jnp.asarray(np.random.default_rng(1).integers(0, 128, (BATCH, SEQ)), jnp.int32)
    y = jnp.roll(x, -1, axis=1)
    params = plain.init(jax.random.key(0), x)["params"]
    tx = optax.adamw(1e-3)

    @jax.jit
    def step(params: Any, opt: Any) -> Any:
        loss, grads = jax.value_and_grad(lambda p: fused.apply({"params": p}, x, y)[1])(params)
        updates, opt = tx.update(grads, opt, params)
        return optax.apply_updates(params, updates), opt, loss

    opt = tx.init(params)
    losses = []
    for _ in range(20):
        params, opt, loss = step(params, opt)
        losses.append(float(loss))
    assert losses[-1] < losses[0], losses
    got = jax.jit(lambda p: fused.apply({"params": p}, x)[0])(params)
    want = jax.jit(lambda p: plain.apply({"params": p}, x)[0])(params)
    assert_close(got, want, "fused_model", jnp.bfloat16, what="logits of the trained model")

    def pattern(model: GPT) -> jax.Array:
        def read(module: GPT) -> jax.Array:  # the first layer's: the same input on either
            block = module.blocks[0]
            return block.attn.weights(block.ln_1(module.wte(x)))

        return jax.jit(lambda p: nn.apply(read, model)({"params": p}))(params)

    np.testing.assert_array_equal(pattern(fused), pattern(plain))
