"""Induction and previous-token scores of a model whose heads are set by hand.

Two layers of two heads with learned positions and RMSNorm, every weight written out
here: layer 0 head 0 attends to the previous token and copies its identity into a
subspace of the residual stream; layer 1 head 0 matches the current token against
that subspace (an induction head, K-composition), preferring itself when nothing
matches and never the first position; layer 0 head 1 and layer 1 head 1 attend to
their own position. Every logit gap is at least 30, so each query's attention is, to
within e^-30, uniform over the keys of highest score.

Reference: those highest-score sets written out from the batch's tokens (no model
code), and the scores' definitions applied to the resulting patterns; within 1e-4.
The planted heads score near 1, the others near 0.
"""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np

from theseus.analysis.library import InductionHeads
from theseus.quick import quick

V, N, HD, H = 128, 8, 160, 2  # vocabulary, half length, head width, heads
D = H * HD
TOK, POS, PREV = 0, 128, 144  # where the token, position and previous-token codes live
Z = 150  # a head coordinate every query carries (the first position's penalty)


SETTINGS = {
    "architecture/n_layers": 2,
    "architecture/n_head": H,
    "architecture/n_embd": D,
    "architecture/block_size": 2 * N,
    "architecture/vocab_size": V,
    "architecture/positions": "learned",
    "architecture/norm": "rmsnorm",
    "architecture/norm_eps": 1e-12,
    "architecture/mlp_width": 8,
    "library/induction/length": N,
    "library/induction/rows": 8,
}


def planted(params: dict) -> dict:
    """The hand-set weights (see the module docstring), in the parameter tree's layout."""
    out = jax.tree.map(np.zeros_like, params)
    out["wte"]["embedding"][np.arange(V), TOK + np.arange(V)] = 1.0
    out["wpe"]["embedding"][np.arange(2 * N), POS + np.arange(2 * N)] = 1.0
    for norm in ("ln_1", "ln_2"):
        for block in ("blocks_0", "blocks_1"):
            out[block][norm]["scale"][:] = 1.0
    out["ln_f"]["scale"][:] = 1.0
    s0 = np.sqrt(D / 2)  # RMSNorm's factor on a layer-0 input (two ones)
    a = np.sqrt(40 / (s0**2 / np.sqrt(HD)))  # a logit gap of 40 in layer 0
    q, k, v = 0, H * HD, 2 * H * HD  # where c_attn's query, key and value columns start
    w0 = out["blocks_0"]["attn"]["c_attn"]["kernel"]
    p = np.arange(2 * N)
    w0[POS + p, q + p] = a  # head 0: a query at p ...
    w0[POS + p, k + p + 1] = a  # ... matches the key at p - 1
    w0[TOK + np.arange(V), v + np.arange(V)] = 1 / s0  # and reads its token
    out["blocks_0"]["attn"]["c_proj"]["kernel"][np.arange(V), PREV + np.arange(V)] = 1.0
    w0[POS + p, q + HD + p] = a  # head 1: itself
    w0[POS + p, k + HD + p] = a
    s1 = np.sqrt(D / 3)  # layer 1's input: token, position, previous token
    unit = s1**2 / np.sqrt(HD)
    b, c, e = np.sqrt(60 / unit), np.sqrt(30 / unit), np.sqrt(60 / unit)
    w1 = out["blocks_1"]["attn"]["c_attn"]["kernel"]
    w1[TOK + np.arange(V), q + np.arange(V)] = b  # head 0: the current token ...
    w1[PREV + np.arange(V), k + np.arange(V)] = b  # ... against each key's previous token
    w1[POS + p, q + 128 + p] = c  # itself, when nothing matches
    w1[POS + p, k + 128 + p] = c
    w1[POS + p, q + Z] = e  # never the first position
    w1[POS + 0, k + Z] = -e
    w1[POS + p, q + HD + p] = a * s0 / s1  # head 1: itself
    w1[POS + p, k + HD + p] = a * s0 / s1
    return out


def reference(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`(induction, previous_token)` `[2, 2]` from the highest-score key sets of `x`."""
    rows, seq = x.shape
    patterns = np.zeros((2, 2, rows, seq, seq))
    for r in range(rows):
        for t in range(seq):
            keys = np.arange(t + 1)
            sets = {
                (0, 0): [t - 1] if t else [0],
                (0, 1): [t],
                (1, 1): [t],
            }
            score = np.zeros(t + 1)
            score[1:] += 60 * (x[r, keys[1:] - 1] == x[r, t])
            score[t] += 30
            score[0] -= 60
            sets[(1, 0)] = list(np.flatnonzero(score == score.max()))
            for (layer, head), chosen in sets.items():
                patterns[layer, head, r, t, chosen] = 1 / len(chosen)
    n = seq // 2
    later, after = np.arange(n, seq), np.arange(1, seq)
    induction = patterns[:, :, :, later, later - n + 1].mean(axis=(2, 3))
    previous = patterns[:, :, :, after, after - 1].mean(axis=(2, 3))
    return induction, previous


def test_planted_induction_and_previous_token_heads(tmp_path: Path) -> None:
    with quick(tmp_path) as q:
        q.build(InductionHeads, "planted")
        for key, value in SETTINGS.items():
            q.config[key] = value
        job = q.create()
        job.setup()
        hand = planted(jax.tree.map(np.asarray, job.state.params))
        placed = jax.tree.map(lambda h, p: jax.device_put(h, p.sharding), hand, job.state.params)
        job.state = job.state.replace(params=placed)
        got = job.compute()  # what run() publishes (the values and the figure: test_library.py)
        x = np.asarray(job.repeated_batch()["x"])
    induction, previous = reference(x)
    np.testing.assert_allclose(got["induction"], induction, atol=1e-4)
    np.testing.assert_allclose(got["previous_token"], previous, atol=1e-4)
    assert got["induction"][1, 0] > 0.9 and got["previous_token"][0, 0] > 0.99
    others = np.ones((2, 2), bool)
    others[1, 0] = False
    assert np.all(got["induction"][others] < 0.05)
    others = np.ones((2, 2), bool)
    others[0, 0] = False
    assert np.all(got["previous_token"][others] < 0.05)
    values = InductionHeads.values(got)
    assert values["dynamics/induction/L1H0"] == got["induction"][1, 0]
    assert values["dynamics/previous_token/max"] == got["previous_token"].max()
    assert job.traces == 1
