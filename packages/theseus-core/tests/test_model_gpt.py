"""The GPT against a NumPy re-implementation, plus its structural promises."""

from __future__ import annotations

import dataclasses
import math
import re
from functools import partial
from pathlib import Path

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import theseus.model
from theseus.config import ConfigTypeError, Tree, UnknownKeyError, using
from theseus.config._field import PATH_KEY
from theseus.model.attention.base import SelfAttention
from theseus.model.config import AttentionConfig, ModelConfig
from theseus.model.models import GPT, MLP, GPTConfig, MLPConfig, cross_entropy

WIDTH, HEADS, LAYERS, BLOCK, VOCAB = 32, 4, 2, 12, 40


def _model(tie: bool = True, bias: bool = False) -> GPT:
    return GPT(
        GPTConfig(
            n_layers=LAYERS,
            n_embd=WIDTH,
            block_size=BLOCK,
            vocab_size=VOCAB,
            bias=bias,
            tie_embeddings=tie,
        ),
        AttentionConfig(n_embd=WIDTH, n_head=HEADS, block_size=BLOCK, bias=bias),
        MLPConfig(n_embd=WIDTH, bias=bias),
    )


def _params(model: GPT, seed: int = 0) -> dict:
    x = jnp.zeros((1, BLOCK), jnp.int32)
    return jax.jit(lambda key: nn.unbox(model.init(key, x))["params"])(jax.random.key(seed))


@partial(jax.jit, static_argnums=0)
def _apply(model: GPT, params: dict, *inputs: jax.Array) -> tuple[jax.Array, jax.Array | None]:
    """The forward pass as one compiled program: run eagerly, every operation would be
    compiled on its own (test_jit_matches_eager, in the slow set, covers eager)."""
    return model.apply({"params": params}, *inputs)


# ---- NumPy reference, written from the definitions, float64 ----


def _np_layernorm(x: np.ndarray, p: dict) -> np.ndarray:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    out = (x - mean) / np.sqrt(var + 1e-5) * p["scale"]
    return out + p["bias"] if "bias" in p else out


def _np_dense(x: np.ndarray, p: dict) -> np.ndarray:
    out = x @ p["kernel"]
    return out + p["bias"] if "bias" in p else out


def _np_rotary(x: np.ndarray, base: float = 10000.0) -> np.ndarray:
    seq, dim = x.shape[1], x.shape[-1]
    half = dim // 2
    out = np.empty_like(x)
    for pos in range(seq):
        for i in range(half):
            theta = pos * base ** (-2.0 * i / dim)
            a, b = x[:, pos, :, i], x[:, pos, :, i + half]
            out[:, pos, :, i] = a * math.cos(theta) - b * math.sin(theta)
            out[:, pos, :, i + half] = a * math.sin(theta) + b * math.cos(theta)
    return out


def _np_attention(x: np.ndarray, p: dict) -> np.ndarray:
    b, s, w = x.shape
    d = w // HEADS
    qkv = _np_dense(x, p["c_attn"]).reshape(b, s, 3, HEADS, d)
    q, k, v = _np_rotary(qkv[:, :, 0]), _np_rotary(qkv[:, :, 1]), qkv[:, :, 2]
    out = np.zeros((b, s, HEADS, d))
    for t in range(s):
        scores = np.einsum("bhd,bkhd->bhk", q[:, t], k[:, : t + 1]) / math.sqrt(d)
        weights = np.exp(scores - scores.max(-1, keepdims=True))
        weights /= weights.sum(-1, keepdims=True)
        out[:, t] = np.einsum("bhk,bkhd->bhd", weights, v[:, : t + 1])
    return _np_dense(out.reshape(b, s, w), p["c_proj"])


def _np_gelu(x: np.ndarray) -> np.ndarray:  # flax's default: the tanh approximation
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


def _np_gpt(params: dict, x: np.ndarray, tie: bool) -> np.ndarray:
    p = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), params)
    h = p["wte"]["embedding"][x]
    for i in range(LAYERS):
        blk = p[f"blocks_{i}"]
        h = h + _np_attention(_np_layernorm(h, blk["ln_1"]), blk["attn"])
        m = blk["mlp"]
        h = h + _np_dense(
            _np_gelu(_np_dense(_np_layernorm(h, blk["ln_2"]), m["c_fc"])), m["c_proj"]
        )
    h = _np_layernorm(h, p["ln_f"])
    return h @ (p["wte"]["embedding"].T if tie else p["lm_head"]["kernel"])


@pytest.mark.parametrize(("tie", "bias"), [(True, False), (False, True)])
def test_logits_match_numpy_reference(tie: bool, bias: bool) -> None:
    model = _model(tie=tie, bias=bias)
    params = _params(model, seed=1)
    if bias:  # make biases nonzero so the reference really checks them
        params = jax.tree_util.tree_map_with_path(
            lambda path, a: a + 0.1 if path[-1].key == "bias" else a, params
        )
    x = np.random.default_rng(0).integers(0, VOCAB, (3, BLOCK))
    logits, loss = _apply(model, params, jnp.asarray(x))
    assert loss is None
    np.testing.assert_allclose(np.asarray(logits), _np_gpt(params, x, tie), rtol=2e-4, atol=2e-5)


@pytest.mark.parametrize("positions", ["rotary", "learned"])
def test_packed_sequences_compute_what_each_computes_alone(positions: str) -> None:
    """Three sequences and padding in one row (`segments`, as evaluations pack short
    requests): each one's logits are its own forward's (positions from 0, nothing read
    across), NumPy's for rotary positions; learned positions against the model's own
    unpacked forward. Tolerances as test_logits_match_numpy_reference."""
    model = _model()
    if positions == "learned":
        model = GPT.build(n_layers=LAYERS, n_embd=WIDTH, n_head=HEADS, block_size=BLOCK,
                          vocab_size=VOCAB, positions="learned", bias=True)  # fmt: skip
    params = _params(model, seed=2)
    rng = np.random.default_rng(5)
    parts = [rng.integers(0, VOCAB, n) for n in (4, 5, 2)]  # 11 of BLOCK = 12 positions
    tokens = np.zeros((1, BLOCK), np.int32)
    segments = np.zeros((1, BLOCK), np.int32)  # the last position: padding (0)
    tokens[0, :11] = np.concatenate(parts)
    segments[0, :11] = np.repeat([1, 2, 3], [len(p) for p in parts])
    packed = jax.jit(
        lambda p, x, s: model.apply({"params": p}, x, segments=s)[0]
    )(params, jnp.asarray(tokens), jnp.asarray(segments))  # fmt: skip
    at = 0
    for part in parts:
        if positions == "rotary":
            alone = _np_gpt(params, part[None], tie=True)[0]
        else:
            alone = np.asarray(_apply(model, params, jnp.asarray(part[None]))[0][0])
        np.testing.assert_allclose(
            np.asarray(packed[0, at : at + len(part)]), alone, rtol=2e-4, atol=2e-5
        )
        at += len(part)
    # a context and two continuations after it (`prefixes`): each continuation reads the
    # context and itself, as context + continuation would alone
    context, first, second = (rng.integers(0, VOCAB, n) for n in (5, 3, 4))
    tokens[0] = np.concatenate([context, first, second])
    segments[0] = np.repeat([1, 2, 3], [5, 3, 4])
    prefixes = np.ones_like(segments)
    tree = jax.jit(
        lambda p, x, s, r: model.apply({"params": p}, x, segments=s, prefixes=r)[0]
    )(params, jnp.asarray(tokens), jnp.asarray(segments), jnp.asarray(prefixes))  # fmt: skip
    for branch, span in ((first, slice(5, 8)), (second, slice(8, 12))):
        whole = np.concatenate([context, branch])[None]
        if positions == "rotary":
            alone = _np_gpt(params, whole, tie=True)[0]
        else:
            alone = np.asarray(_apply(model, params, jnp.asarray(whole))[0][0])
        np.testing.assert_allclose(np.asarray(tree[0, :5]), alone[:5], rtol=2e-4, atol=2e-5)
        np.testing.assert_allclose(np.asarray(tree[0, span]), alone[5:], rtol=2e-4, atol=2e-5)
    with pytest.raises(ValueError, match="segments must be \\[batch, seq\\] like the tokens"):
        model.apply({"params": params}, jnp.asarray(tokens), segments=jnp.asarray(segments[:, :5]))


def test_loss_is_mean_cross_entropy_over_counted_targets() -> None:
    model = _model()
    params = _params(model)
    rng = np.random.default_rng(1)
    x = rng.integers(0, VOCAB, (2, BLOCK))
    y = rng.integers(0, VOCAB, (2, BLOCK))
    y[0, :3] = -1
    mask = np.ones((2, BLOCK), bool)
    mask[1, -4:] = False
    logits, loss = _apply(model, params, jnp.asarray(x), jnp.asarray(y), jnp.asarray(mask))
    lg = np.asarray(logits, np.float64)
    logp = lg - lg.max(-1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
    counted = (y >= 0) & mask
    expected = -np.mean([logp[b, t, y[b, t]] for b, t in zip(*np.nonzero(counted), strict=True)])
    np.testing.assert_allclose(float(loss), expected, rtol=1e-5)
    _, count = cross_entropy(logits, jnp.asarray(y), jnp.asarray(mask))
    assert int(count) == counted.sum() == 2 * BLOCK - 3 - 4


def test_untrained_loss_is_near_log_vocab() -> None:
    model = _model()
    rng = np.random.default_rng(2)
    x, y = (jnp.asarray(rng.integers(0, VOCAB, (4, BLOCK))) for _ in range(2))
    _, loss = _apply(model, _params(model), x, y)
    assert abs(float(loss) - math.log(VOCAB)) < 0.1


def test_attention_is_causal() -> None:
    model = _model()
    params = _params(model)
    x = np.random.default_rng(3).integers(0, VOCAB, (1, BLOCK))
    changed = x.copy()
    changed[0, 7] = (changed[0, 7] + 1) % VOCAB
    a, _ = _apply(model, params, jnp.asarray(x))
    b, _ = _apply(model, params, jnp.asarray(changed))
    np.testing.assert_array_equal(np.asarray(a)[0, :7], np.asarray(b)[0, :7])
    assert np.abs(np.asarray(a)[0, 7:] - np.asarray(b)[0, 7:]).max() > 1e-4


@pytest.mark.slow  # eager dispatch of every operation: ~10 s; the debugger's tests run eagerly
def test_jit_matches_eager() -> None:
    model = _model()
    params = _params(model)
    forward = jax.jit(lambda p, x: model.apply({"params": p}, x)[0])
    x = jnp.asarray(np.random.default_rng(4).integers(0, VOCAB, (2, BLOCK)))
    eager = model.apply({"params": params}, x)[0]
    np.testing.assert_allclose(
        np.asarray(forward(params, x)), np.asarray(eager), rtol=1e-5, atol=1e-6
    )


def test_jit_does_not_recompile_for_new_tokens() -> None:
    model = _model()
    params = _params(model)
    forward = jax.jit(lambda p, x: model.apply({"params": p}, x)[0])
    x = jnp.asarray(np.random.default_rng(4).integers(0, VOCAB, (2, BLOCK)))
    first = forward(params, x)
    second = forward(params, (x + 1) % VOCAB)
    assert forward._cache_size() == 1
    assert not np.array_equal(np.asarray(first), np.asarray(second))


def test_module_paths_and_logical_axes() -> None:
    model = _model(tie=False)
    boxed = jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, BLOCK), jnp.int32))
    boxed = boxed["params"]
    assert set(boxed) == {"wte", "blocks_0", "blocks_1", "ln_f", "lm_head"}
    assert set(boxed["blocks_0"]) == {"ln_1", "attn", "ln_2", "mlp"}
    specs = nn.get_partition_spec(boxed)
    assert tuple(specs["wte"]["embedding"]) == ("vocab", "embed")
    assert tuple(specs["blocks_1"]["attn"]["c_attn"]["kernel"]) == ("embed", "heads")
    assert tuple(specs["blocks_0"]["mlp"]["c_fc"]["kernel"]) == ("embed", "mlp")
    assert tuple(specs["lm_head"]["kernel"]) == ("embed", "vocab")


def test_one_configuration_declares_every_model_key_once() -> None:
    """Every component reads `ModelConfig`; the three names earlier versions declared are
    its names, and no `architecture/*` key is declared by any other dataclass."""
    assert GPT.gather() == SelfAttention.gather() == MLP.gather() == [ModelConfig]
    assert GPTConfig is AttentionConfig is MLPConfig is ModelConfig
    paths = [f.metadata[PATH_KEY] for f in dataclasses.fields(ModelConfig)]
    assert len(paths) == len(set(paths))
    sources = Path(theseus.model.__file__).parents[1].rglob("*.py")  # theseus-core's
    sources = [path for path in sources if "config" not in path.parent.name]  # its own docs
    declaring = sorted(
        str(path.relative_to(Path(theseus.model.__file__).parents[1]))
        for path in sources
        if re.search(r'field\(\s*"architecture/', path.read_text())
    )
    assert declaring == ["model/config.py"]


def test_three_configurations_still_build_the_same_model() -> None:
    """`GPT(GPTConfig(...), AttentionConfig(...), MLPConfig(...))`, as earlier versions
    built one, gives the parameters and logits of `GPT(ModelConfig(...))`."""
    cfg = ModelConfig(n_layers=1, n_embd=16, n_head=2, n_kv_head=1, block_size=8)
    x = jnp.arange(16, dtype=jnp.int32).reshape(2, 8)
    one, three = (
        GPT(cfg),
        GPT(GPTConfig(**vars(cfg)), AttentionConfig(**vars(cfg)), MLPConfig(**vars(cfg))),
    )
    params = jax.jit(one.init)(jax.random.key(0), x)["params"]
    again = jax.jit(three.init)(jax.random.key(0), x)["params"]
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(again), strict=True):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(
        jax.jit(one.apply)({"params": params}, x)[0], jax.jit(three.apply)({"params": params}, x)[0]
    )


def test_build_reads_the_active_configuration() -> None:
    tree = Tree.of(*GPT.gather())
    tree["architecture/n_layers"] = 3
    tree["architecture/n_embd"] = 48
    with using(tree):
        model = GPT.build()
    assert model.config.n_layers == 3
    assert model.attention.n_embd == model.mlp_config.n_embd == 48


def test_bad_shapes_are_clear_errors() -> None:
    model = _model()
    with pytest.raises(ValueError, match="exceeds architecture/block_size"):
        jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, BLOCK + 1), jnp.int32))
    odd = GPT(GPTConfig(n_embd=30), AttentionConfig(n_embd=30, n_head=4), MLPConfig(n_embd=30))
    with pytest.raises(ValueError, match="must split into"):
        jax.eval_shape(odd.init, jax.random.key(0), jnp.zeros((1, 4), jnp.int32))


def test_build_sets_each_shared_setting_once_for_every_component() -> None:
    built = GPT.build(n_layers=LAYERS, n_embd=WIDTH, n_head=HEADS, block_size=BLOCK,
                      vocab_size=VOCAB, dropout=0.25, bias=True)  # fmt: skip
    by_hand = ModelConfig(n_layers=LAYERS, n_embd=WIDTH, n_head=HEADS, block_size=BLOCK,
                          vocab_size=VOCAB, dropout=0.25, bias=True)  # fmt: skip
    assert built.config == by_hand
    assert built.attention is built.mlp_config is built.config  # each part reads the one
    assert GPT.build(**{"architecture/n_embd": 48}).mlp_config.n_embd == 48  # a key works too
    with pytest.raises(UnknownKeyError, match=r"'n_emb'.*Did you mean 'n_embd'"):
        GPT.build(n_emb=WIDTH)
    with pytest.raises(ConfigTypeError, match="architecture/n_head"):
        GPT.build(n_head="four")
