"""`attend`: the reference path against NumPy, the fused kernels against the reference.

The Pallas TPU kernels run here in interpret mode (`THESEUS_ATTENTION_INTERPRET=1`):
the same kernel code, executed by the CPU. The accelerator set (`pytest --accelerator`)
runs them compiled on a TPU.
"""

from __future__ import annotations

import logging
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from theseus.model import GPT, hooks
from theseus.model.attention import kernels
from theseus.model.attention.base import SelfAttention
from theseus.model.attention.kernels import attend, choose, probabilities
from theseus.training.sharding import DEFAULT_RULES

BATCH, SEQ, HEADS, HEAD_DIM = 2, 128, 4, 32


def _numpy_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Causal attention in float64, each query head reading key head h // group."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    group = q.shape[2] // k.shape[2]
    out = np.zeros_like(q)
    seq = q.shape[1]
    for b in range(q.shape[0]):
        for h in range(q.shape[2]):
            scores = q[b, :, h] @ k[b, :, h // group].T / np.sqrt(q.shape[-1])
            scores[np.triu_indices(seq, 1)] = -np.inf
            weights = np.exp(scores - scores.max(-1, keepdims=True))
            weights /= weights.sum(-1, keepdims=True)
            out[b, :, h] = weights @ v[b, :, h // group]
    return out


def _qkv(kv_heads: int, seed: int = 0) -> tuple[jax.Array, jax.Array, jax.Array]:
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(BATCH, SEQ, HEADS, HEAD_DIM)).astype(np.float32)
    k = rng.normal(size=(BATCH, SEQ, kv_heads, HEAD_DIM)).astype(np.float32)
    v = rng.normal(size=(BATCH, SEQ, kv_heads, HEAD_DIM)).astype(np.float32)
    return jnp.asarray(q), jnp.asarray(k), jnp.asarray(v)


@pytest.fixture
def interpret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("THESEUS_ATTENTION_INTERPRET", "1")


@pytest.mark.parametrize("kv_heads", [HEADS, 2, 1])
def test_reference_equals_numpy(kv_heads: int) -> None:
    q, k, v = _qkv(kv_heads)
    with jax.default_matmul_precision("highest"):
        out = attend(q, k, v, implementation="reference")
    np.testing.assert_allclose(out, _numpy_attention(q, k, v), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kv_heads", [HEADS, 2])
def test_splash_equals_the_reference_forward_and_gradient(interpret: None, kv_heads: int) -> None:
    """Forward within 2e-5 of NumPy's float64 attention; gradients of a random projection
    of the output within 1e-4 of the reference path's (float32, highest precision). (The
    Pallas flash kernel has no interpret switch: the accelerator set checks it on a TPU.)"""
    name = "splash"
    q, k, v = _qkv(kv_heads, seed=1)
    probe = jnp.asarray(np.random.default_rng(2).normal(size=q.shape), jnp.float32)

    def loss(implementation: str, q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        return jnp.sum(attend(q, k, v, implementation=implementation) * probe)

    with jax.default_matmul_precision("highest"):
        out = jax.jit(lambda q, k, v: attend(q, k, v, implementation=name))(q, k, v)
        fused = jax.jit(jax.grad(lambda *a: loss(name, *a), argnums=(0, 1, 2)))(q, k, v)
        plain = jax.jit(jax.grad(lambda *a: loss("reference", *a), argnums=(0, 1, 2)))(q, k, v)
    np.testing.assert_allclose(out, _numpy_attention(q, k, v), rtol=2e-5, atol=2e-5)
    for got, want in zip(fused, plain, strict=True):
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("implementation", ["reference", "splash"])
def test_packed_segments_read_only_their_own_sequence(interpret: None, implementation: str) -> None:
    """Rows packing sequences of 50, 14 and 64 tokens (the second row: one of 100 and
    padding): each sequence's output is NumPy's causal attention over it alone, within
    2e-5 (float32, highest precision); splash takes the segments as its segment ids."""
    q, k, v = _qkv(2, seed=6)
    lengths = [[50, 14, 64], [100, 28]]
    segments = np.stack([np.repeat(np.arange(1, len(row) + 1), row) for row in lengths])
    with jax.default_matmul_precision("highest"):
        out = jax.jit(
            lambda q, k, v, s: attend(q, k, v, implementation=implementation, segments=s)
        )(q, k, v, jnp.asarray(segments, jnp.int32))  # fmt: skip
    for b, row in enumerate(lengths):
        at = 0
        for n in row:
            part = slice(at, at + n)
            want = _numpy_attention(q[b : b + 1, part], k[b : b + 1, part], v[b : b + 1, part])
            np.testing.assert_allclose(out[b : b + 1, part], want, rtol=2e-5, atol=2e-5)
            at += n
    with pytest.raises(ValueError, match="a mask or segments, not both"):
        attend(q, k, v, mask=jnp.ones((BATCH, SEQ, SEQ), bool), segments=jnp.asarray(segments))


@pytest.mark.parametrize("fused_backward", [True, False])
def test_splash_in_several_blocks_equals_the_reference(
    interpret: None, fused_backward: bool
) -> None:
    """The kernel's settings that benchmarks/kernels.py sweeps: 256 tokens in blocks of
    128 (queries reading earlier blocks), with the fused or the separate dq/dkv backward;
    the same tolerances as above against NumPy and the reference path."""
    rng = np.random.default_rng(3)
    q, k, v = (jnp.asarray(rng.normal(size=(1, 256, 2, 32)), jnp.float32) for _ in range(3))
    probe = jnp.asarray(rng.normal(size=q.shape), jnp.float32)

    def splash(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        return kernels.splash(q, k, v, block=128, fused_backward=fused_backward)

    def reference(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        return attend(q, k, v, implementation="reference")

    with jax.default_matmul_precision("highest"):
        out = jax.jit(splash)(q, k, v)
        grads = [
            jax.jit(jax.grad(lambda *a, f=f: jnp.sum(f(*a) * probe), argnums=(0, 1, 2)))(q, k, v)
            for f in (splash, reference)
        ]
    np.testing.assert_allclose(out, _numpy_attention(q, k, v), rtol=2e-5, atol=2e-5)
    for got, want in zip(*grads, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_the_kernel_runs_per_device_under_a_mesh(interpret: None) -> None:
    """Batch over `batch`, heads over `shard` (4 virtual devices): the splash kernel runs
    per device through shard_map and equals the reference on the whole arrays."""
    devices = np.asarray(jax.devices()[:4]).reshape(2, 2)
    mesh = Mesh(devices, ("batch", "shard"))
    q, k, v = _qkv(2, seed=3)
    spec = NamedSharding(mesh, PartitionSpec("batch", None, "shard", None))
    q, k, v = (jax.device_put(a, spec) for a in (q, k, v))

    @jax.jit
    def run(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        with (
            jax.sharding.use_abstract_mesh(mesh.abstract_mesh),
            nn.logical_axis_rules(list(DEFAULT_RULES)),
        ):
            return attend(q, k, v, implementation="splash")

    with jax.default_matmul_precision("highest"):
        out = run(q, k, v)
    assert "shard_map" in str(jax.make_jaxpr(run)(q, k, v))
    np.testing.assert_allclose(out, _numpy_attention(q, k, v), rtol=2e-5, atol=2e-5)


def test_choose_takes_the_fastest_the_platform_has() -> None:
    f32, bf16 = jnp.float32, jnp.bfloat16
    assert choose("auto", q_len=1024, kv_len=1024, dtype=bf16, platform="tpu") == ("splash", None)
    assert choose("auto", q_len=1024, kv_len=1024, dtype=bf16, platform="gpu") == ("cudnn", None)
    assert choose("auto", q_len=1024, kv_len=1024, dtype=f32, platform="gpu") == (
        "reference",
        None,
    )
    assert choose("auto", q_len=1024, kv_len=1024, dtype=f32, platform="cpu") == (
        "reference",
        None,
    )
    assert choose("reference", q_len=8, kv_len=8, dtype=f32, platform="tpu") == (
        "reference",
        None,
    )


@pytest.mark.parametrize(
    ("settings", "said"),
    [
        ({"platform": "cpu"}, "needs a TPU (this is a cpu)"),
        ({"masked": True}, "serves the causal mask only"),
        ({"dropout": True}, "no dropout on the probabilities"),
        ({"q_len": 1, "kv_len": 1024}, "as many queries as keys"),
        ({"q_len": 100, "kv_len": 100}, "multiple of 128 tokens; got 100"),
        ({"q_len": 640, "kv_len": 640}, "blocks of 512 tokens; got 640"),
    ],
)
def test_a_call_the_kernel_cannot_serve_falls_back_and_says_why(settings: dict, said: str) -> None:
    call = {"q_len": 1024, "kv_len": 1024, "dtype": jnp.bfloat16, "platform": "tpu", **settings}
    name, reason = choose("splash", **call)
    assert name == "reference" and reason is not None and said in reason


def test_cudnn_needs_a_gpu_and_half_precision() -> None:
    name, reason = choose("cudnn", q_len=64, kv_len=64, dtype=jnp.float32, platform="gpu")
    assert name == "reference" and "bfloat16 or float16" in reason
    name, reason = choose("splash", q_len=512, kv_len=512, dtype=jnp.bfloat16, platform="tpu",
                          segmented=True, prefixed=True)  # fmt: skip
    assert name == "reference" and "no shared prefixes" in reason
    call = {"q_len": 64, "kv_len": 64, "dtype": jnp.bfloat16, "platform": "gpu"}
    name, reason = choose("cudnn", segmented=True, **call)
    assert name == "reference" and "no packed segments" in reason
    assert choose("splash", segmented=True, **{**call, "q_len": 512, "kv_len": 512,
                                               "platform": "tpu"}) == ("splash", None)  # fmt: skip
    name, reason = choose("cudnn", q_len=64, kv_len=64, dtype=jnp.bfloat16, platform="tpu")
    assert name == "reference" and "NVIDIA GPU" in reason


def test_an_unknown_implementation_is_one_line() -> None:
    with pytest.raises(ValueError, match="must be one of auto, reference, splash, flash, cudnn"):
        choose("fastest", q_len=8, kv_len=8, dtype=jnp.float32)


def test_the_fallback_is_said_once(caplog: pytest.LogCaptureFixture) -> None:
    kernels._SAID.clear()
    q, k, v = _qkv(HEADS)
    with caplog.at_level(logging.WARNING, logger="theseus.model.attention"):
        for _ in range(3):
            attend(q, k, v, implementation="splash")
    said = [r.getMessage() for r in caplog.records if r.name == "theseus.model.attention"]
    assert said == ["attention: Pallas splash attention needs a TPU (this is a cpu): reference"]


def _model(attention: str, kv_heads: int = 2) -> GPT:
    return GPT.build(
        n_layers=1,
        n_embd=HEADS * HEAD_DIM,
        n_head=HEADS,
        n_kv_head=kv_heads,
        block_size=SEQ,
        vocab_size=64,
        attention=attention,
    )


@pytest.mark.slow  # the kernel interpreted through a whole model's backward (~8 s)
def test_a_model_on_the_kernel_trains_as_on_the_reference(interpret: None) -> None:
    """Loss and every parameter's gradient of a GQA rotary GPT: splash within 1e-4 of the
    reference; `weights()` (what analyses read) is the reference's on either."""
    fused, plain = _model("splash"), _model("reference")
    x = jnp.asarray(np.random.default_rng(4).integers(0, 64, (BATCH, SEQ)), jnp.int32)
    params = plain.init(jax.random.key(0), x)["params"]

    def loss(model: GPT, params: dict) -> jax.Array:
        return model.apply({"params": params}, x, jnp.roll(x, -1, axis=1))[1]

    with jax.default_matmul_precision("highest"):
        got = jax.jit(jax.value_and_grad(lambda p: loss(fused, p)))(params)
        want = jax.jit(jax.value_and_grad(lambda p: loss(plain, p)))(params)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5)
    for a, b in zip(jax.tree.leaves(got[1]), jax.tree.leaves(want[1]), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)

    def pattern(model: GPT) -> jax.Array:
        def read(module: GPT) -> jax.Array:
            h = module.wte(x)
            return module.blocks[0].attn.weights(module.blocks[0].ln_1(h))

        return nn.apply(read, model)({"params": params})

    np.testing.assert_array_equal(pattern(fused), pattern(plain))
    q = jnp.ones((1, 4, HEADS, HEAD_DIM))
    assert probabilities(q, q[:, :, :2]).shape == (1, HEADS, 4, 4)


def test_the_default_is_auto_and_bit_identical_to_the_reference_on_a_cpu() -> None:
    auto, plain = _model("auto"), _model("reference")
    assert auto.attention.attention == "auto"
    x = jnp.asarray(np.random.default_rng(5).integers(0, 64, (BATCH, SEQ)), jnp.int32)
    params = jax.jit(plain.init)(jax.random.key(1), x)["params"]
    got = jax.jit(auto.apply)({"params": params}, x)[0]
    want = jax.jit(plain.apply)({"params": params}, x)[0]
    np.testing.assert_array_equal(got, want)


def _layer(attention: str, kv_heads: int, positions: str, bias: bool) -> SelfAttention:
    """A layer of 4 heads of 32; `positions` rotary (all features), partial (half), learned."""
    config = GPT.build(
        n_embd=HEADS * HEAD_DIM,
        n_head=HEADS,
        n_kv_head=kv_heads,
        block_size=SEQ,
        positions="learned" if positions == "learned" else "rotary",
        rotary_fraction=0.5 if positions == "partial" else 1.0,
        bias=bias,
        attention=attention,
    ).config
    return SelfAttention(config)


def _passing(call: hooks.ModuleCall) -> Any:
    return call.proceed()


@pytest.mark.parametrize(
    ("kv_heads", "positions", "bias", "packed"),
    [(2, "rotary", False, False), (HEADS, "learned", True, True), (2, "partial", True, True)],
    ids=["gqa-rotary", "mha-learned-bias-packed", "gqa-partial-rotary-bias-packed"],
)
def test_the_fused_layer_equals_the_reference_and_listeners_see_its_projections(
    interpret: None, kv_heads: int, positions: str, bias: bool, packed: bool
) -> None:
    """Where splash serves a call and nothing listens, the layer projects straight into
    the kernel's layout (`_fused`); its output and the gradients of a random projection of
    it (parameters and input) equal the reference layer's within 2e-5 and 1e-4 (float32,
    highest precision), packed rows with their own rotary positions included. Under a
    listener it takes the module path, whose `c_attn` and `c_proj` calls the listener
    sees, and which gives the same output."""
    fused = _layer("splash", kv_heads, positions, bias)
    plain = _layer("reference", kv_heads, positions, bias)
    rng = np.random.default_rng(7)
    x = jnp.asarray(rng.normal(size=(BATCH, SEQ, HEADS * HEAD_DIM)), jnp.float32)
    probe = jnp.asarray(rng.normal(size=x.shape), jnp.float32)
    segments = None
    if packed:
        lengths = [[50, 14, 64], [100, 28]]
        rows = [np.repeat(np.arange(1, len(row) + 1), row) for row in lengths]
        segments = jnp.asarray(np.stack(rows), jnp.int32)
    params = plain.init(jax.random.key(0), x)["params"]
    if bias:  # the initial biases are zeros: give them values the test can see
        params = jax.tree_util.tree_map_with_path(
            lambda path, p: p + 0.1 if "bias" in jax.tree_util.keystr(path) else p, params
        )

    def loss(layer: SelfAttention, params: dict, x: jax.Array) -> jax.Array:
        return jnp.sum(layer.apply({"params": params}, x, segments=segments) * probe)

    takes = nn.apply(lambda m: m._heads_first(x, segments, None, False), fused)
    assert takes({"params": params})
    with jax.default_matmul_precision("highest"):
        got = jax.jit(jax.value_and_grad(lambda p, x: loss(fused, p, x), argnums=(0, 1)))(params, x)
        want = jax.jit(jax.value_and_grad(lambda p, x: loss(plain, p, x), argnums=(0, 1)))(
            params, x
        )
        out = jax.jit(lambda p: fused.apply({"params": p}, x, segments=segments))(params)
        reference = jax.jit(lambda p: plain.apply({"params": p}, x, segments=segments))(params)
        seen: list[str] = []

        def listener(call: hooks.ModuleCall) -> Any:
            seen.append(call.path)
            return call.proceed()

        with hooks.intercept(listener):
            assert not takes({"params": params})
            listened = fused.apply({"params": params}, x, segments=segments)
    np.testing.assert_allclose(out, reference, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(listened, reference, rtol=2e-5, atol=2e-5)
    assert {"c_attn", "c_proj"} <= set(seen), seen
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5)
    for a, b in zip(jax.tree.leaves(got[1]), jax.tree.leaves(want[1]), strict=True):
        assert a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


def test_the_fused_layer_runs_per_device_under_a_mesh(interpret: None) -> None:
    """Rows over `batch` and heads over `shard` (4 virtual devices): the fused layer's
    kernel runs per device on the heads-first layout and the layer equals the reference."""
    fused, plain = _layer("splash", 2, "rotary", False), _layer("reference", 2, "rotary", False)
    mesh = Mesh(np.asarray(jax.devices()[:4]).reshape(2, 2), ("batch", "shard"))
    x = jnp.asarray(np.random.default_rng(8).normal(size=(BATCH, SEQ, HEADS * HEAD_DIM)))
    x = jax.device_put(x.astype(jnp.float32), NamedSharding(mesh, PartitionSpec("batch")))
    params = plain.init(jax.random.key(1), x)["params"]

    def run(layer: SelfAttention) -> Any:
        @jax.jit
        def apply(params: dict, x: jax.Array) -> jax.Array:
            with (
                jax.sharding.use_abstract_mesh(mesh.abstract_mesh),
                nn.logical_axis_rules(list(DEFAULT_RULES)),
            ):
                return layer.apply({"params": params}, x)

        return apply

    with jax.default_matmul_precision("highest"):
        got, want = run(fused)(params, x), run(plain)(params, x)
    assert "shard_map" in str(jax.make_jaxpr(run(fused))(params, x))
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)
