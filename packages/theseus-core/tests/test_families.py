"""The one configurable block, per model family, against a float64 NumPy reference.

The reference (`family_numpy.np_model`) is written from each family's definition, not
from Theseus's code (its docstring says how). Parameters are random, scaled so
activations keep unit size through the layers. Tolerance: the model runs in float32, so
logits within 1e-5 of their scale (max |ours - reference| <= 1e-5 max |reference|).
"""

from __future__ import annotations

import functools
import math
from functools import partial
from pathlib import Path
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from theseus.config import ConfigRangeError, Tree
from theseus.model import GPT, KVCache
from theseus.model.config import AttentionConfig
from theseus.model.generation import generate
from theseus.model.mlp import MLPConfig
from theseus.model.models import GPTConfig
from theseus.registry import import_module_or_file

R = import_module_or_file(str(Path(__file__).with_name("family_numpy.py")))

BLOCK, VOCAB = 12, 40
RELATIVE = 1e-5
SIZES = {"n_layers": 2, "n_embd": 64, "n_head": 4, "block_size": BLOCK, "vocab_size": VOCAB}

FAMILIES: dict[str, dict[str, Any]] = {
    "gpt2": {"positions": "learned", "bias": True, "activation": "gelu_tanh"},
    "gpt_neox": {
        "residual": "parallel",
        "rotary_fraction": 0.25,
        "bias": True,
        "activation": "gelu",
        "tie_embeddings": False,
    },
    "llama": {
        "n_kv_head": 2,
        "norm": "rmsnorm",
        "activation": "silu",
        "gated_mlp": True,
        "mlp_width": 96,
        "rope_base": 500000.0,
        "rope_scaling_kind": "llama3",
        "rope_scaling_factor": 8.0,
        "rope_scaling_low_freq_factor": 1.0,
        "rope_scaling_high_freq_factor": 4.0,
        "rope_scaling_original_context": 256,
        "tie_embeddings": False,
    },
    "qwen2": {
        "n_kv_head": 2,
        "norm": "rmsnorm",
        "activation": "silu",
        "gated_mlp": True,
        "mlp_width": 80,
        "qkv_bias": True,
        "rope_base": 1000000.0,
        "norm_eps": 1e-6,
    },
    "olmo2": {
        "n_kv_head": 2,
        "residual": "post_norm",
        "qk_norm": True,
        "norm": "rmsnorm",
        "activation": "silu",
        "gated_mlp": True,
        "rope_base": 500000.0,
        "norm_eps": 1e-6,
        "tie_embeddings": False,
    },
}


def _settings(family: str) -> dict[str, Any]:
    defaults = {
        "positions": "rotary",
        "bias": False,
        "tie_embeddings": True,
        "n_kv_head": 0,
        "residual": "sequential",
        "norm": "layernorm",
        "norm_eps": 1e-5,
        "activation": "gelu_tanh",
        "gated_mlp": False,
        "mlp_width": 0,
        "rotary_fraction": 1.0,
        "rope_base": 10000.0,
        "rope_scaling_kind": "none",
        "qk_norm": False,
        "qkv_bias": None,
    }
    return {**SIZES, **defaults, **FAMILIES[family]}


# ---- the model under test ----


def _random_params(model: GPT, seed: int) -> dict:
    """Parameters of `model`'s tree drawn so that activations stay near unit size."""
    shapes = jax.eval_shape(
        lambda: nn.unbox(model.init(jax.random.key(0), jnp.zeros((1, 4), jnp.int32)))["params"]
    )
    rng = np.random.default_rng(seed)

    def draw(path: Any, leaf: Any) -> np.ndarray:
        name = path[-1].key
        if name == "kernel":
            value = rng.normal(0, 1 / math.sqrt(leaf.shape[0]), leaf.shape)
        elif name == "scale":
            value = 1 + 0.3 * rng.normal(size=leaf.shape)
        elif name == "bias":
            value = 0.3 * rng.normal(size=leaf.shape)
        else:  # embeddings
            value = rng.normal(size=leaf.shape)
        return value.astype(np.float32)

    return jax.tree_util.tree_map_with_path(draw, shapes)


@functools.cache
def _family(name: str) -> tuple[str, GPT, dict, dict]:
    settings = _settings(name)
    model = GPT.build(**settings)
    return name, model, _random_params(model, seed=len(name)), settings


@pytest.fixture(params=list(FAMILIES))
def family(request: pytest.FixtureRequest) -> tuple[str, GPT, dict, dict]:
    return _family(request.param)


@partial(jax.jit, static_argnums=0)
def _logits(model: GPT, params: dict, x: jax.Array) -> jax.Array:
    return model.apply({"params": params}, x)[0]


def _assert_close(ours: Any, reference: np.ndarray) -> None:
    error = float(np.abs(np.asarray(ours, np.float64) - reference).max())
    assert error <= RELATIVE * float(np.abs(reference).max()), error


# one token, a few, the whole block; two tokens (a few as well) are the slow set's
@pytest.mark.parametrize("length", [1, pytest.param(2, marks=pytest.mark.slow), 7, BLOCK])
def test_logits_match_the_family_reference(family: tuple, length: int) -> None:
    _, model, params, settings = family
    x = np.random.default_rng(length).integers(0, VOCAB, (2, length))
    reference = R.np_model(params, x, settings)
    assert np.abs(reference).max() > 1.0  # activations are not tiny
    _assert_close(_logits(model, params, jnp.asarray(x)), reference)


def test_llama3_scaling_touches_all_three_frequency_bands() -> None:
    """The llama family's settings exercise kept, divided and smoothed frequencies, and
    the reference's scaling is not the identity (a scaling ignored would fail above)."""
    s = _settings("llama")
    rot = s["n_embd"] // s["n_head"]
    plain = R.np_inv_freq(rot, {**s, "rope_scaling_kind": "none"})
    scaled = R.np_inv_freq(rot, s)
    ratio = plain / scaled
    assert np.isclose(ratio, 1).any() and np.isclose(ratio, 8).any()
    assert ((ratio > 1.01) & (ratio < 7.99)).any()


@partial(jax.jit, static_argnums=0)
def _cached(model: GPT, params: dict, x: jax.Array, cache: Any) -> tuple[jax.Array, Any]:
    return model.apply({"params": params}, x, cache=cache)


def test_cached_generation_equals_the_full_forward(family: tuple) -> None:
    """Prefill of two rows (one left-padded), then one token per step: each step's logits
    are the full forward's at that row's last token."""
    _, model, params, settings = family
    rng = np.random.default_rng(3)
    prompts = [list(rng.integers(0, VOCAB, 5)), list(rng.integers(0, VOCAB, 2))]
    width, steps = 5, BLOCK - 5
    padded = np.zeros((2, width), np.int32)
    for row, prompt in enumerate(prompts):
        padded[row, width - len(prompt) :] = prompt
    start = jnp.asarray([width - len(p) for p in prompts], jnp.int32)
    caches = model.empty_cache(2, BLOCK, start)
    kv = settings["n_kv_head"] or settings["n_head"]
    assert caches[0].keys.shape == (2, BLOCK, kv, settings["n_embd"] // settings["n_head"])
    logits, caches = _cached(model, params, jnp.asarray(padded), caches)
    seqs = [list(p) for p in prompts]
    for step in range(steps):
        # the full forward, each row unpadded at positions 0.., right-filled to the block
        # (causal: what follows a position never changes its logits), compiled once
        full = np.zeros((2, BLOCK), np.int32)
        for row, seq in enumerate(seqs):
            full[row, : len(seq)] = seq
        want = np.asarray(_logits(model, params, jnp.asarray(full)), np.float64)
        for row, seq in enumerate(seqs):
            _assert_close(logits[row, -1], want[row, len(seq) - 1])
        tokens = [int(np.argmax(logits[row, -1])) for row in range(2)]
        for seq, token in zip(seqs, tokens, strict=True):
            seq.append(token)
        if step == steps - 1:
            break
        logits, caches = _cached(model, params, jnp.asarray(tokens, jnp.int32)[:, None], caches)
        assert int(caches[0].length) == width + step + 1


# gpt2 and olmo2 hold every kind of matrix the cast meets (learned positions, a tied
# embedding; grouped heads, a gate, an untied head) and the default suite decodes them;
# the other families, whose matrices are of those kinds, are the slow set's
@pytest.mark.parametrize(
    "name",
    [
        "gpt2",
        "olmo2",
        *(pytest.param(n, marks=pytest.mark.slow) for n in ("gpt_neox", "llama", "qwen2")),
    ],
)
def test_decoding_params_give_the_same_logits_bit_for_bit(name: str) -> None:
    """`GPT.decoding_params` (float32 matrices in the 16-bit activation dtype, which
    `generate` decodes from) changes nothing a decode computes: the prefill and a cached
    step give the same logits bit for bit, from half the bytes."""
    _, _, params, settings = _family(name)
    model = GPT.build(**{**settings, "dtype": "bfloat16"})
    cast = model.decoding_params(params)
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(cast), strict=True):
        assert b.dtype == (jnp.bfloat16 if a.ndim >= 2 else jnp.float32), a.shape
    x = jnp.asarray(np.random.default_rng(4).integers(0, VOCAB, (2, 6)), jnp.int32)
    start = jnp.asarray([0, 2], jnp.int32)
    outs = []
    for p in (params, cast):
        logits, caches = _cached(model, p, x, model.empty_cache(2, BLOCK, start))
        token = jnp.argmax(logits[:, -1], -1)[:, None].astype(jnp.int32)
        step, _ = _cached(model, p, token, caches)
        outs.append((np.asarray(logits, np.float32), np.asarray(step, np.float32)))
    assert np.abs(outs[0][1]).max() > 1.0  # logits of some size, not all zeros
    np.testing.assert_array_equal(outs[1][0], outs[0][0])
    np.testing.assert_array_equal(outs[1][1], outs[0][1])


def test_a_float32_model_decodes_from_its_params_as_they_are() -> None:
    _, model, params, _ = _family("gpt2")
    assert model.decoding_params(params) is params


@pytest.mark.parametrize("name", ["llama", "olmo2"])
def test_greedy_generate_with_grouped_heads_is_greedy_over_the_full_forward(name: str) -> None:
    """`generate` (prompt buckets, left padding, the compiled step) on a grouped-query
    model: every token is the argmax of the full forward's logits at that point."""
    _, model, params, _ = _family(name)
    prompts = [[3, 17, 5, 9, 22], [11, 2], [39]]
    new = generate(model, params, prompts, 5, temperature=0)
    full = np.zeros((len(prompts), BLOCK), np.int32)
    for row, (prompt, tokens) in enumerate(zip(prompts, new, strict=True)):
        full[row, : len(prompt) + len(tokens)] = prompt + tokens
    logits = np.asarray(_logits(model, params, jnp.asarray(full)))
    for row, (prompt, tokens) in enumerate(zip(prompts, new, strict=True)):
        for n, token in enumerate(tokens):
            assert token == int(np.argmax(logits[row, len(prompt) + n - 1])), (row, n)
    assert len({tuple(t) for t in new}) > 1


def test_heads_sum_to_the_attention_and_weights_are_the_references(family: tuple) -> None:
    _, model, params, settings = family
    x = np.random.default_rng(4).normal(size=(2, 7, settings["n_embd"])).astype(np.float32)

    def parts(module: GPT, x: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        attn = module.blocks[0].attn
        return attn.heads(x), attn(x), attn.weights(x)

    heads, whole, weights = model.apply({"params": params}, jnp.asarray(x), method=parts)
    assert heads.shape == (2, 7, settings["n_head"], settings["n_embd"])
    summed = np.asarray(heads, np.float64).sum(2)
    bias = params["blocks_0"]["attn"]["c_proj"].get("bias")
    if bias is not None:
        summed = summed + np.asarray(bias, np.float64)
    _assert_close(summed, np.asarray(whole, np.float64))
    attn = jax.tree.map(lambda a: np.asarray(a, np.float64), params["blocks_0"]["attn"])
    out, probs = R.np_attention(x.astype(np.float64), attn, settings)
    _assert_close(whole, out)
    assert weights.shape == (2, settings["n_head"], 7, 7)
    np.testing.assert_allclose(np.asarray(weights), probs, atol=1e-5)


# parallel and post_norm; sequential is test_remat.py's model
@pytest.mark.parametrize("name", ["gpt_neox", "olmo2"])
def test_remat_gives_the_same_loss_and_gradients_on_every_residual_form(name: str) -> None:
    _, model, params, settings = _family(name)
    remat = GPT.build(**settings, remat="block")
    x = jnp.asarray(np.random.default_rng(5).integers(0, VOCAB, (2, BLOCK)))

    def loss(m: GPT, p: dict) -> jax.Array:
        return m.apply({"params": p}, x, x)[1]

    plain = jax.jit(jax.value_and_grad(partial(loss, model)))(params)
    again = jax.jit(jax.value_and_grad(partial(loss, remat)))(params)
    for a, b in zip(jax.tree.leaves(plain), jax.tree.leaves(again), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


# ---- today's checkpoints restore: the default and GPT-2 trees are unchanged ----


def _layout(model: GPT) -> dict[str, tuple[tuple[int, ...], tuple[str, ...]]]:
    boxed = jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, 4), jnp.int32))
    leaves = jax.tree_util.tree_flatten_with_path(
        boxed["params"], is_leaf=lambda a: isinstance(a, nn.LogicallyPartitioned)
    )[0]
    return {
        jax.tree_util.keystr(path, simple=True, separator="/"): (
            tuple(getattr(leaf, "value", leaf).shape),
            tuple(getattr(leaf, "names", ())),
        )
        for path, leaf in leaves
    }


def _block(i: int, d: int, bias: bool) -> dict[str, tuple[tuple[int, ...], tuple[str, ...]]]:
    """One block's leaves as the code before the configurable block laid them out."""
    b = f"blocks_{i}"
    tree = {
        f"{b}/attn/c_attn/kernel": ((d, 3 * d), ("embed", "heads")),
        f"{b}/attn/c_proj/kernel": ((d, d), ("heads", "embed")),
        f"{b}/ln_1/scale": ((d,), ("embed",)),
        f"{b}/ln_2/scale": ((d,), ("embed",)),
        f"{b}/mlp/c_fc/kernel": ((d, 4 * d), ("embed", "mlp")),
        f"{b}/mlp/c_proj/kernel": ((4 * d, d), ("mlp", "embed")),
    }
    if bias:
        tree |= {
            f"{b}/attn/c_attn/bias": ((3 * d,), ()),
            f"{b}/attn/c_proj/bias": ((d,), ()),
            f"{b}/ln_1/bias": ((d,), ("embed",)),
            f"{b}/ln_2/bias": ((d,), ("embed",)),
            f"{b}/mlp/c_fc/bias": ((4 * d,), ()),
            f"{b}/mlp/c_proj/bias": ((d,), ()),
        }
    return tree


def test_the_default_and_gpt2_trees_are_those_saved_checkpoints_hold() -> None:
    default = {
        "ln_f/scale": ((128,), ("embed",)),
        "wte/embedding": ((258, 128), ("vocab", "embed")),
    }
    for i in range(4):
        default |= _block(i, 128, bias=False)
    assert _layout(GPT.build()) == default

    gpt2 = {
        "ln_f/scale": ((64,), ("embed",)),
        "ln_f/bias": ((64,), ("embed",)),
        "wte/embedding": ((100, 64), ("vocab", "embed")),
        "wpe/embedding": ((32, 64), ("length", "embed")),
    }
    for i in range(2):
        gpt2 |= _block(i, 64, bias=True)
    settings = {"positions": "learned", "bias": True, "n_layers": 2, "n_embd": 64, "n_head": 4,
                "block_size": 32, "vocab_size": 100}  # fmt: skip
    assert _layout(GPT.build(**settings)) == gpt2
    untied = _layout(GPT.build(**settings, tie_embeddings=False))
    assert untied == gpt2 | {"lm_head/kernel": ((64, 100), ("embed", "vocab"))}


def test_every_new_parameter_has_logical_axes_and_the_contracts_shapes() -> None:
    model = GPT.build(**_settings("olmo2"))
    tree = _layout(model)
    d, hd, kv = 64, 16, 2
    assert tree["blocks_0/attn/c_attn/kernel"] == ((d, (4 + 2 * kv) * hd), ("embed", "heads"))
    assert tree["blocks_0/attn/q_norm/scale"] == ((4 * hd,), ("heads",))
    assert tree["blocks_0/attn/k_norm/scale"] == ((kv * hd,), ("heads",))
    assert tree["blocks_0/mlp/c_gate/kernel"] == ((d, 4 * d), ("embed", "mlp"))
    assert tree["blocks_0/ln_1/scale"] == ((d,), ("embed",))
    assert "blocks_0/ln_1/bias" not in tree  # RMSNorm: scale only
    assert tree["lm_head/kernel"] == ((d, VOCAB), ("embed", "vocab"))
    llama = _layout(GPT.build(**_settings("llama")))
    assert llama["blocks_1/mlp/c_fc/kernel"] == ((d, 96), ("embed", "mlp"))
    assert llama["blocks_1/mlp/c_proj/kernel"] == ((96, d), ("mlp", "embed"))
    qwen = _layout(GPT.build(**_settings("qwen2")))
    assert qwen["blocks_0/attn/c_attn/bias"][0] == ((4 + 2 * kv) * hd,)
    assert "blocks_0/attn/c_proj/bias" not in qwen and "blocks_0/mlp/c_fc/bias" not in qwen


# ---- settings that do not fit together: one line each, when the configuration is checked ----


@pytest.mark.parametrize(
    ("settings", "match"),
    [
        ({"n_head": 4, "n_kv_head": 3}, r"'architecture/n_kv_head' must divide .*got 3\. Set "),
        ({"n_embd": 64, "n_head": 2, "rotary_fraction": 0.3},
         r"'architecture/rotary_fraction' must rotate an even.*int\(32 \* 0\.3\) = 9"),
        ({"positions": "learned", "rotary_fraction": 0.5}, "only applies to rotary positions"),
        ({"positions": "learned", "rope_scaling_kind": "llama3"}, "only applies to rotary"),
        ({"rope_scaling_kind": "llama3", "rope_scaling_low_freq_factor": 4.0},
         "'architecture/rope_scaling/high_freq_factor' must exceed"),
        ({"activation": "swish"}, "architecture/activation"),
        ({"residual": "pre"}, "architecture/residual"),
    ],
)  # fmt: skip
def test_settings_that_do_not_fit_are_one_line_errors(settings: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match) as caught:
        GPT.build(**settings)
    assert "\n" not in str(caught.value)


def test_qk_norm_with_learned_positions_and_a_layernorm_is_fine() -> None:
    model = GPT.build(positions="learned", qk_norm=True, bias=True, n_kv_head=2)
    tree = _layout(model)
    assert tree["blocks_0/attn/q_norm/bias"] == ((128,), ("heads",))
    assert tree["blocks_0/attn/k_norm/scale"] == ((64,), ("heads",))


def test_the_shard_count_must_split_the_key_value_heads() -> None:
    from theseus.training.base import BaseTrainerConfig

    tree = Tree.of(GPTConfig, AttentionConfig, MLPConfig, BaseTrainerConfig)
    tree.set("architecture/n_kv_head", 2)
    tree.set("training/shard", 4)
    with pytest.raises(ConfigRangeError, match=r"'training/shard' must split") as caught:
        tree.check()
    assert "Set training/shard to one of 1, 2" in str(caught.value)
    tree.set("training/shard", 2)
    tree.check()


def test_the_kv_cache_holds_only_the_key_value_heads() -> None:
    model = GPT.build(n_kv_head=1)
    cache = KVCache.empty(model.attention, 3, 20)
    assert cache.keys.shape == cache.values.shape == (3, 20, 1, 32)
