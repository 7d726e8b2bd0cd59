"""Loglikelihoods of continuations, against each pair's own unpadded forward.

Reference: `GPT.__call__` on one pair's tokens alone (one row, right-padded to the
window, which causal attention never reads back; compiled once), float64 NumPy
log-softmax of its logits, the continuation's log-probabilities summed, and greedy =
every continuation token is the argmax. Tolerances (float32 on CPU, logits of order
50 here): 1e-4 absolute per pair, and 1e-5 relative for a long document's sum, the
tolerances evaluation parity asks of lm-evaluation-harness's own model.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from theseus.model import scoring
from theseus.model.models import GPT
from theseus.model.scoring import ScoringError, loglikelihoods, rolling_windows

VOCAB, BLOCK = 40, 32
ATOL = 1e-4  # per pair
RTOL = 1e-5  # a document's sum over its windows


def _close(ours: float, reference: float) -> bool:
    return abs(ours - reference) <= ATOL


MODEL = GPT.build(
    n_layers=2, n_embd=32, n_head=4, block_size=BLOCK, vocab_size=VOCAB, positions="rotary"
)


@pytest.fixture(scope="module")
def model_and_params() -> tuple[GPT, dict]:
    model = MODEL
    params = nn.unbox(jax.jit(model.init)(jax.random.key(0), jnp.zeros((1, 8), jnp.int32)))
    # larger weights than the init's 0.02, so the argmax moves from token to token
    return model, jax.tree.map(lambda p: p * 6.0, params["params"])


@jax.jit
def _forward(params: dict, padded: jax.Array) -> jax.Array:
    return MODEL.apply({"params": params}, padded)[0][0]


def _reference(model: GPT, params: dict, context: list[int], continuation: list[int]):
    assert model is MODEL
    ids = [*context, *continuation][-(BLOCK + 1) :]
    padded = np.zeros((1, BLOCK), np.int32)
    padded[0, : len(ids) - 1] = ids[:-1]
    logits = np.asarray(_forward(params, jnp.asarray(padded)), np.float64)[: len(ids) - 1]
    logprobs = (
        logits
        - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1))[:, None]
        - logits.max(-1, keepdims=True)
    )
    scored = range(len(ids) - 1 - len(continuation), len(ids) - 1)
    total = sum(logprobs[i, ids[i + 1]] for i in scored)
    greedy = all(int(np.argmax(logits[i])) == ids[i + 1] for i in scored)
    return total, greedy


def test_each_pair_scores_as_its_own_forward_in_any_batch(model_and_params) -> None:
    model, params = model_and_params
    rng = np.random.default_rng(0)
    pairs = [
        (rng.integers(0, VOCAB, rng.integers(1, 40)).tolist(),
         rng.integers(0, VOCAB, rng.integers(1, 9)).tolist())
        for _ in range(21)
    ]  # fmt: skip
    # a pair whose continuation is the greedy one (decoded from the reference forward)
    context = [3, 1, 4, 1, 5]
    greedy_tail: list[int] = []
    for _ in range(4):
        ids = context + greedy_tail
        padded = np.zeros((1, BLOCK), np.int32)
        padded[0, : len(ids)] = ids
        greedy_tail.append(int(np.argmax(np.asarray(_forward(params, padded))[len(ids) - 1])))
    pairs.append((context, greedy_tail))
    ours = loglikelihoods(model, params, pairs, batch_size=4)
    for (ctx, cont), (total, greedy) in zip(pairs, ours, strict=True):
        expected_total, expected_greedy = _reference(model, params, ctx, cont)
        assert _close(total, expected_total), (ctx, cont, total, expected_total)
        assert greedy == expected_greedy
    assert ours[-1][1] is True  # the greedy continuation is recognized
    assert sum(g for _, g in ours[:-1]) < len(ours) - 1  # and random ones mostly are not
    # the batch size and the order change nothing
    again = loglikelihoods(model, params, pairs[::-1], batch_size=7)[::-1]
    assert all(_close(a, b) for (a, _), (b, _) in zip(again, ours, strict=True))
    assert [g for _, g in again] == [g for _, g in ours]


def test_a_context_longer_than_the_window_loses_its_left(model_and_params) -> None:
    model, params = model_and_params
    tail = list(range(1, BLOCK))  # with the continuation, exactly the window
    (short,), (long,) = (
        loglikelihoods(model, params, [(context, [7, 8])])
        for context in (tail, [9, 9, 9, 9, *tail])
    )
    assert _close(long[0], short[0]) and short[1] == long[1]


def test_one_program_per_length_bucket(model_and_params, monkeypatch) -> None:
    model, params = model_and_params
    monkeypatch.setattr(scoring, "MIN_BUCKET", 8)  # several buckets within this small block
    scoring._score.clear_cache()
    rng = np.random.default_rng(1)
    pairs = [
        (rng.integers(0, VOCAB, n).tolist(), rng.integers(0, VOCAB, 2).tolist())
        for n in rng.integers(1, BLOCK, 60)
    ]
    loglikelihoods(model, params, pairs, batch_size=8)
    buckets = {max(8, 1 << int(np.ceil(np.log2(len(c) + 1)))) for c, _ in pairs}
    buckets = {min(b, BLOCK) for b in buckets}
    assert scoring._score._cache_size() <= len(buckets) <= 3  # 8, 16 and 32: not 60
    loglikelihoods(model, params, pairs[::-1], batch_size=8)
    assert scoring._score._cache_size() <= len(buckets)  # a second task compiles nothing


def test_choices_after_one_context_share_it_and_score_as_alone(
    model_and_params, monkeypatch
) -> None:
    # A multiple-choice question of one-token answers: the pairs share their context,
    # read once, each answer a candidate at its last position; with 11 answers (more
    # than SHARED = 8) the question takes two units. A question of answers of several
    # tokens: the context once, each answer but its last token a branch after it. Also
    # continuations ending at the same position after different contexts, a choice equal
    # to the context's own next token, and a pair alone.
    model, params = model_and_params
    question = [3, 9, 2, 7, 7, 1]
    pairs = [(question, [answer]) for answer in range(11)]
    pairs += [([5, 1, 2], [4, 4]), ([5, 1, 2], [6, 1, 3]), ([5, 1, 2], [2])]
    pairs += [([1, 2, 3, 4], [5, 6]), ([1, 2, 3, 4, 5], [7]), ([1, 2, 3], [4, 5, 7])]
    pairs += [([8, 8], [2])]  # alone
    units, positions = [], []
    real = scoring._score

    def counted(model, params, tokens, segments, prefixes, targets):  # type: ignore[no-untyped-def]
        units.append(sum(len(set(row.tolist()) - {0}) for row in np.asarray(prefixes)))
        positions.append(int((np.asarray(segments) > 0).sum()))
        return real(model, params, tokens, segments, prefixes, targets)

    monkeypatch.setattr(scoring, "_score", counted)
    got = loglikelihoods(model, params, pairs, batch_size=4)
    for pair, (total, greedy) in zip(pairs, got, strict=True):
        want_total, want_greedy = _reference(model, params, *pair)
        assert _close(total, want_total), (pair, total, want_total)
        assert greedy == want_greedy, pair
    # units: 2 for the 11 answers, 1 for the three answers after [5, 1, 2], 1 for each
    # of the three other contexts, 1 for [8, 8]: 7 units in one batch, where 18 pairs
    # were given; the [5, 1, 2] question reads 3 + 1 + 2 positions, not 4 + 5 + 3
    assert sum(units) == 7 and len(units) == 1
    assert positions == [2 * 6 + 6 + 5 + 5 + 5 + 2]
    assert sum(greedy for _, greedy in got[:11]) == 1  # exactly one answer is the argmax


def test_where_a_kernel_attends_only_one_token_choices_share_a_context(
    model_and_params, monkeypatch
) -> None:
    """A fused kernel serves packed segments but not shared prefixes: then each longer
    choice is a unit of its own and the scores are the same."""
    model, params = model_and_params
    assert scoring._shares_prefixes(model)  # the reference, on this CPU
    splash = GPT.build(n_layers=2, n_embd=32, n_head=4, block_size=BLOCK, vocab_size=VOCAB,
                       attention="splash")  # fmt: skip
    assert not scoring._shares_prefixes(splash)
    monkeypatch.setattr(scoring, "_shares_prefixes", lambda model: False)
    pairs = [([5, 1, 2], [4, 4]), ([5, 1, 2], [6, 1, 3]), ([5, 1, 2], [2]), ([5, 1, 2], [7])]
    seen = []
    real = scoring._score

    def counted(model, params, tokens, segments, prefixes, targets):  # type: ignore[no-untyped-def]
        seen.append((prefixes, int((np.asarray(segments) > 0).sum())))
        return real(model, params, tokens, segments, prefixes, targets)

    monkeypatch.setattr(scoring, "_score", counted)
    got = loglikelihoods(model, params, pairs)
    assert seen == [(None, 4 + 5 + 3)]  # [5, 1, 2, 4], [5, 1, 2, 6, 1], [5, 1, 2] + 2 answers
    for pair, (total, greedy) in zip(pairs, got, strict=True):
        want_total, want_greedy = _reference(model, params, *pair)
        assert _close(total, want_total) and greedy == want_greedy, pair


def test_short_pairs_pack_into_rows_of_one_program(model_and_params, monkeypatch) -> None:
    """60 short pairs (reads of 2-9 tokens, 8 rows a batch): packed several to a row, in
    rows as wide as the window, so two forwards of one program score them (60 rows and 8
    forwards unpacked), each pair as its own forward."""
    model, params = model_and_params
    rng = np.random.default_rng(3)
    pairs = [
        (rng.integers(0, VOCAB, n).tolist(), rng.integers(0, VOCAB, 2).tolist())
        for n in rng.integers(1, 9, 60)
    ]
    shapes = []
    real = scoring._score

    def counted(model, params, tokens, *rest):  # type: ignore[no-untyped-def]
        shapes.append(tuple(tokens.shape))
        return real(model, params, tokens, *rest)

    monkeypatch.setattr(scoring, "_score", counted)
    got = loglikelihoods(model, params, pairs, batch_size=8)
    tokens = sum(len(c) + 1 for c, _ in pairs)  # each read: the context and one more
    assert shapes == [(8, BLOCK)] * -(-tokens // (8 * BLOCK)), (shapes, tokens)
    for pair, (total, greedy) in zip(pairs, got, strict=True):
        want_total, want_greedy = _reference(model, params, *pair)
        assert _close(total, want_total) and greedy == want_greedy, pair


def test_rolling_windows_predict_every_token_once() -> None:
    # worked by hand from the definition: window 4, prefix 99, tokens 0..9
    assert rolling_windows(range(10), 99, 4) == [
        ([99], [0, 1, 2, 3]),
        ([3], [4, 5, 6, 7]),
        ([5, 6, 7], [8, 9]),
    ]
    assert rolling_windows([5, 6], 0, 4) == [([0], [5, 6])]
    assert rolling_windows([], 0, 4) == []
    for n in (1, 4, 5, 17, 64):
        pairs = rolling_windows(range(n), -1, 4)
        assert [t for _, c in pairs for t in c] == list(range(n))  # each token once
        for context, continuation in pairs[1:]:  # each from the 4 tokens before it, or all
            assert len(context) + len(continuation) == 5


def test_a_documents_rolling_loglikelihood_is_the_sum_of_its_tokens(model_and_params) -> None:
    """Each token's log-probability from the tokens its window reads, one forward each."""
    model, params = model_and_params
    rng = np.random.default_rng(2)
    document = rng.integers(1, VOCAB, 3 * BLOCK + 5).tolist()
    pairs = rolling_windows(document, 0, BLOCK)
    total = sum(t for t, _ in loglikelihoods(model, params, pairs))
    expected = 0.0
    for end in range(len(document)):  # token `end`, read from its window
        window_end = min(len(document), (end // BLOCK + 1) * BLOCK)
        start = 0 if end < BLOCK else window_end - BLOCK - 1
        context = [0, *document[:end]] if end < BLOCK else document[start:end]
        expected += _reference(model, params, context, [document[end]])[0]
    assert abs(total - expected) <= RTOL * abs(expected), (total, expected)


@pytest.mark.parametrize(
    ("pairs", "settings", "message"),
    [
        ([([], [1])], {}, "context has no tokens"),
        ([([1], [])], {}, "continuation to score has no tokens"),
        ([([1], [2] * (BLOCK + 1))], {}, "longer than the model's context"),
        ([([1], [2])], {"batch_size": 0}, "batch_size must be a positive int"),
    ],
)
def test_bad_pairs_are_one_line_errors(model_and_params, pairs, settings, message) -> None:
    model, params = model_and_params
    with pytest.raises(ScoringError, match=message) as info:
        loglikelihoods(model, params, pairs, **settings)
    assert "\n" not in str(info.value)


def test_parameters_sharded_over_devices_score_the_same(model_and_params) -> None:
    model, params = model_and_params
    devices = jax.devices()
    if len(devices) < 4:
        pytest.skip("needs 4 devices (XLA_FLAGS=--xla_force_host_platform_device_count=4)")
    mesh = jax.sharding.Mesh(np.array(devices[:4]), ("shard",))

    def spread(p: jax.Array) -> jax.Array:  # the first axis split where it divides
        spec = ("shard",) if p.ndim and p.shape[0] % 4 == 0 else ()
        return jax.device_put(
            p, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(*spec))
        )

    sharded = jax.tree.map(spread, params)
    assert any(len(p.sharding.device_set) == 4 for p in jax.tree.leaves(sharded))
    pairs = [([1, 2, 3], [4, 5]), (list(range(30)), [7]), ([9], [8, 7, 6, 5])]
    one = loglikelihoods(model, params, pairs)
    four = loglikelihoods(model, sharded, pairs)
    assert all(abs(a - b) <= ATOL and g == h for (a, g), (b, h) in zip(one, four, strict=True))


def test_a_fixed_width_is_one_program_with_the_same_scores(model_and_params, monkeypatch) -> None:
    model, params = model_and_params
    monkeypatch.setattr(scoring, "MIN_BUCKET", 8)
    rng = np.random.default_rng(2)
    pairs = [
        (rng.integers(0, VOCAB, n).tolist(), rng.integers(0, VOCAB, 3).tolist())
        for n in (2, 5, 11, 20)
    ]
    bucketed = loglikelihoods(model, params, pairs, batch_size=2)
    scoring._score.clear_cache()
    fixed = loglikelihoods(model, params, pairs, batch_size=2, width=23)
    assert scoring._score._cache_size() == 1  # its batches fall in buckets 32 and 8: two programs
    for (a, greedy_a), (b, greedy_b) in zip(fixed, bucketed, strict=True):
        assert _close(a, b) and greedy_a == greedy_b
    with pytest.raises(scoring.ScoringError, match="longest pair"):
        loglikelihoods(model, params, pairs, width=10)
