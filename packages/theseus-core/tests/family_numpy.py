"""A float64 NumPy forward of the model families, written from their definitions.

Not from Theseus's code: LayerNorm or RMSNorm, `c_attn`'s columns as queries, keys,
values (each head's `head_dim` columns contiguous), the QK-norm over all query (key)
features before rotary, rotary pairing feature `i` with `i + rot/2` over the first
`rot = int(head_dim * rotary_fraction)` features with `inv_freq = base**(-2i/rot)`
(Llama 3.1's scaling as transformers' `_compute_llama3_parameters` writes it), query head
`h` reading key/value head `h // (n_head / n_kv_head)`, and the three residual forms.
`np_model(params, x, settings)` takes a model's parameter tree and its `GPT.build`
settings (test_families.py's `_settings`).
"""

from __future__ import annotations

import math

import jax
import numpy as np


def np_norm(x: np.ndarray, p: dict, s: dict) -> np.ndarray:
    if s["norm"] == "rmsnorm":
        return x / np.sqrt((x**2).mean(-1, keepdims=True) + s["norm_eps"]) * p["scale"]
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    out = (x - mean) / np.sqrt(var + s["norm_eps"]) * p["scale"]
    return out + p["bias"] if "bias" in p else out


def np_dense(x: np.ndarray, p: dict) -> np.ndarray:
    out = x @ p["kernel"]
    return out + p["bias"] if "bias" in p else out


def np_inv_freq(rot: int, s: dict) -> np.ndarray:
    inv = np.array([s["rope_base"] ** (-2.0 * i / rot) for i in range(rot // 2)])
    if s["rope_scaling_kind"] != "llama3":
        return inv
    factor, low, high = (s[f"rope_scaling_{k}"] for k in ("factor", "low_freq_factor",
                                                            "high_freq_factor"))  # fmt: skip
    old = s["rope_scaling_original_context"]
    out = []
    for f in inv:
        wavelen = 2 * math.pi / f
        if wavelen < old / high:  # high frequency: kept
            out.append(f)
        elif wavelen > old / low:  # low frequency: interpolated by factor
            out.append(f / factor)
        else:  # between: a smooth mix of the two
            smooth = (old / wavelen - low) / (high - low)
            out.append((1 - smooth) * f / factor + smooth * f)
    return np.array(out)


def np_rotary(x: np.ndarray, s: dict, start: int = 0) -> np.ndarray:
    """`x [batch, seq, heads, head_dim]` rotated; token `t` at position `start + t`."""
    head_dim = x.shape[-1]
    rot = int(head_dim * s["rotary_fraction"])
    half = rot // 2
    inv = np_inv_freq(rot, s)
    out = x.copy()
    for t in range(x.shape[1]):
        for i in range(half):
            theta = (start + t) * inv[i]
            a, b = x[:, t, :, i], x[:, t, :, i + half]
            out[:, t, :, i] = a * math.cos(theta) - b * math.sin(theta)
            out[:, t, :, i + half] = a * math.sin(theta) + b * math.cos(theta)
    return out


def np_attention(x: np.ndarray, p: dict, s: dict) -> tuple[np.ndarray, np.ndarray]:
    """The attention's output and its probabilities `[batch, n_head, q, k]`."""
    b, t, w = x.shape
    heads = s["n_head"]
    kv = s["n_kv_head"] or heads
    d = w // heads
    qkv = np_dense(x, p["c_attn"])
    q, k, v = (
        qkv[..., : heads * d],
        qkv[..., heads * d : (heads + kv) * d],
        qkv[..., (heads + kv) * d :],
    )
    if s["qk_norm"]:
        q, k = np_norm(q, p["q_norm"], s), np_norm(k, p["k_norm"], s)
    q, k, v = q.reshape(b, t, heads, d), k.reshape(b, t, kv, d), v.reshape(b, t, kv, d)
    if s["positions"] == "rotary":
        q, k = np_rotary(q, s), np_rotary(k, s)
    out = np.zeros((b, t, heads, d))
    probs = np.zeros((b, heads, t, t))
    for h in range(heads):
        g = h // (heads // kv)  # the key/value head this query head reads
        scores = np.einsum("bqd,bkd->bqk", q[:, :, h], k[:, :, g]) / math.sqrt(d)
        scores = np.where(np.tril(np.ones((t, t), bool)), scores, -np.inf)
        weights = np.exp(scores - scores.max(-1, keepdims=True))
        weights /= weights.sum(-1, keepdims=True)
        probs[:, h] = weights
        out[:, :, h] = np.einsum("bqk,bkd->bqd", weights, v[:, :, g])
    return np_dense(out.reshape(b, t, w), p["c_proj"]), probs


def np_act(x: np.ndarray, name: str) -> np.ndarray:
    if name == "gelu_tanh":
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    if name == "gelu":
        return 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))
    return x / (1 + np.exp(-x))  # silu


def np_mlp(x: np.ndarray, p: dict, s: dict) -> np.ndarray:
    up = np_dense(x, p["c_fc"])
    if s["gated_mlp"]:
        hidden = np_act(np_dense(x, p["c_gate"]), s["activation"]) * up
    else:
        hidden = np_act(up, s["activation"])
    return np_dense(hidden, p["c_proj"])


def np_model(params: dict, x: np.ndarray, s: dict) -> np.ndarray:
    p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
    h = p["wte"]["embedding"][x]
    if s["positions"] == "learned":
        h = h + p["wpe"]["embedding"][: x.shape[1]][None]
    for i in range(s["n_layers"]):
        blk = p[f"blocks_{i}"]
        if s["residual"] == "parallel":
            h = (
                h
                + np_attention(np_norm(h, blk["ln_1"], s), blk["attn"], s)[0]
                + np_mlp(np_norm(h, blk["ln_2"], s), blk["mlp"], s)
            )
        elif s["residual"] == "post_norm":
            h = h + np_norm(np_attention(h, blk["attn"], s)[0], blk["ln_1"], s)
            h = h + np_norm(np_mlp(h, blk["mlp"], s), blk["ln_2"], s)
        else:
            h = h + np_attention(np_norm(h, blk["ln_1"], s), blk["attn"], s)[0]
            h = h + np_mlp(np_norm(h, blk["ln_2"], s), blk["mlp"], s)
    h = np_norm(h, p["ln_f"], s)
    return h @ (p["lm_head"]["kernel"] if "lm_head" in p else p["wte"]["embedding"].T)
