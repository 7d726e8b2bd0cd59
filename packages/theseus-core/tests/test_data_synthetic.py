"""The synthetic language: its entropy formula against its own sampler."""

from __future__ import annotations

import math

import numpy as np
import pytest

from theseus.data.synthetic import MarkovLanguage
from theseus.data.tokenizer import ByteTokenizer, TokenizerError


def test_byte_tokenizer_round_trip_and_specials() -> None:
    tok = ByteTokenizer()
    text = "naïve café, 東京 🙂"
    ids = tok.encode(text, eot=True)
    assert ids.dtype == np.uint16
    assert ids[-1] == tok.eot == 256
    assert list(ids[:-1]) == list(text.encode("utf-8"))
    assert tok.decode(ids) == text
    stream = tok.encode_batch(["ab", "c"])
    assert stream.tolist() == [97, 98, 256, 99, 256]
    with pytest.raises(TokenizerError, match="outside the byte tokenizer"):
        tok.decode([1, 300])


def test_stationary_distribution_is_a_fixed_point() -> None:
    lang = MarkovLanguage(alphabet=5, order=2, seed=3)
    pi = lang.stationary
    n, a = lang.n_contexts, lang.alphabet
    moved = np.zeros(n)
    for context in range(n):
        for symbol in range(a):
            moved[(context * a) % n + symbol] += pi[context] * lang.transitions[context, symbol]
    np.testing.assert_allclose(moved, pi, atol=1e-12)
    assert math.isclose(pi.sum(), 1.0, abs_tol=1e-12)


def test_entropy_rate_matches_empirical_conditional_entropy() -> None:
    lang = MarkovLanguage(alphabet=6, order=2, mean_doc_len=4096, seed=1)
    stream = lang.sample_tokens(600_000, seed=7)
    letters = stream[stream != 256].astype(np.int64) - ord("a")
    # Counts of (context, next) over the symbol stream (document joins are rare: 1/4096).
    context = letters[:-2] * 6 + letters[1:-1]
    joint = np.zeros((36, 6))
    np.add.at(joint, (context, letters[2:]), 1.0)
    p_context = joint.sum(1) / joint.sum()
    conditional = joint / joint.sum(1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        h = -np.nansum(p_context[:, None] * conditional * np.log(conditional))
    assert abs(h - lang.entropy_rate()) < 0.01, (h, lang.entropy_rate())
    np.testing.assert_allclose(p_context, lang.stationary, atol=0.01)


def test_true_model_loss_sits_just_above_the_bound() -> None:
    """The generating process itself scores within 1% above `entropy_bound()`."""
    lang = MarkovLanguage(alphabet=8, order=1, mean_doc_len=64, seed=2)
    stream = lang.sample_tokens(200_000, seed=3).astype(np.int64)
    q = 1.0 / lang.mean_doc_len
    first = lang.stationary @ lang.transitions  # law of a document's first symbol
    nll, count, previous = 0.0, 0, None
    for token in stream:
        if token == 256:
            nll -= math.log(q)
            previous = None
        else:
            symbol = token - ord("a")
            if previous is None:
                nll -= math.log(first[symbol])
            else:
                nll -= math.log((1 - q) * lang.transitions[previous, symbol])
            previous = symbol
        count += 1
    # Tokens after end-of-text never predict "end" (documents are nonempty), which the
    # loop above charges as a plain first symbol: the true loss is a hair above the bound.
    loss = nll / count
    bound = lang.entropy_bound()
    assert bound <= loss + 0.005, (loss, bound)
    assert loss < bound * 1.01 + 0.01, (loss, bound)
    assert lang.entropy_bound() < math.log(8)


def test_sampling_is_deterministic_and_seeded() -> None:
    lang = MarkovLanguage(seed=0)
    a = lang.sample_tokens(5000, seed=1)
    b = lang.sample_tokens(5000, seed=1)
    c = lang.sample_tokens(5000, seed=2)
    np.testing.assert_array_equal(a, b)
    assert (a != c).any()
    assert set(np.unique(a).tolist()) <= set(range(ord("a"), ord("a") + 16)) | {256}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"alphabet": 1}, "alphabet"),
        ({"order": 0}, "order"),
        ({"smoothing": 1.0}, "smoothing"),
        ({"mean_doc_len": 1}, "mean_doc_len"),
    ],
)
def test_bad_settings_are_rejected(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        MarkovLanguage(**kwargs)  # type: ignore[arg-type]
