"""A procedurally generated language whose per-token entropy is known exactly.

Text is drawn from a Markov chain of a fixed order over a small alphabet of lowercase
letters; documents end with a fixed probability per token. Because the chain is known,
the entropy rate (the lowest cross-entropy any model can reach, in nats per token) is
computed in closed form, so a test can check that a model really learns: its validation
loss must approach `entropy_bound()` from above.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from theseus.config import ConfigError
from theseus.data.tokenizer import ByteTokenizer

__all__ = ["MarkovLanguage"]


def _entropy(p: np.ndarray, axis: int = -1) -> np.ndarray:
    """Shannon entropy in nats along `axis`, with 0 log 0 = 0."""
    logs = np.log(np.where(p > 0, p, 1.0))
    return -(p * logs).sum(axis=axis)


@dataclass(frozen=True)
class MarkovLanguage:
    """An order-`order` Markov chain over `alphabet` letters, split into documents.

    Args:
        alphabet: number of symbols (the letters `a`, `b`, ...), 2 to 26.
        order: how many previous symbols the next one depends on (1 to 4).
        concentration: Dirichlet concentration of each transition row; small values
            give peaked, low-entropy rows.
        smoothing: probability mass spread uniformly over every row, so the chain is
            ergodic and every symbol can follow every context.
        mean_doc_len: expected document length; a document ends after each symbol with
            probability `1 / mean_doc_len` (an end-of-text token is then emitted).
        seed: seeds the transition table (the "grammar"); sampling has its own seed.

    Example:
        >>> lang = MarkovLanguage(alphabet=4, order=1, seed=0)
        >>> text = lang.sample_tokens(1000, seed=1)
        >>> bool(0.0 < lang.entropy_rate() < math.log(4))
        True
    """

    alphabet: int = 16
    order: int = 2
    concentration: float = 0.2
    smoothing: float = 0.02
    mean_doc_len: int = 512
    seed: int = 0

    def __post_init__(self) -> None:
        if not 2 <= self.alphabet <= 26:
            raise ConfigError(f"alphabet must be between 2 and 26 letters, got {self.alphabet}")
        if not 1 <= self.order <= 4:
            raise ConfigError(f"order must be between 1 and 4, got {self.order}")
        if not 0.0 <= self.smoothing < 1.0 or self.concentration <= 0:
            raise ConfigError(
                "need concentration > 0 and 0 <= smoothing < 1, got "
                f"concentration={self.concentration}, smoothing={self.smoothing}"
            )
        if self.mean_doc_len < 2:
            raise ConfigError(f"mean_doc_len must be at least 2, got {self.mean_doc_len}")

    @property
    def n_contexts(self) -> int:
        """Number of distinct contexts (`alphabet ** order`)."""
        return int(self.alphabet**self.order)

    @cached_property
    def transitions(self) -> np.ndarray:
        """Row-stochastic table `[n_contexts, alphabet]`: P(next symbol | context)."""
        rng = np.random.default_rng(self.seed)
        rows = rng.dirichlet(np.full(self.alphabet, self.concentration), size=self.n_contexts)
        return (1.0 - self.smoothing) * rows + self.smoothing / self.alphabet

    def _successor(self, context: np.ndarray, symbol: np.ndarray) -> np.ndarray:
        """The context index after appending `symbol` to `context` (oldest symbol drops)."""
        return (context * self.alphabet) % self.n_contexts + symbol

    @cached_property
    def stationary(self) -> np.ndarray:
        """Stationary distribution over contexts `[n_contexts]`, by power iteration."""
        n, a = self.n_contexts, self.alphabet
        contexts = np.repeat(np.arange(n), a)
        symbols = np.tile(np.arange(a), n)
        successors = self._successor(contexts, symbols)
        pi = np.full(n, 1.0 / n)
        for _ in range(10_000):
            nxt = np.bincount(
                successors, weights=np.repeat(pi, a) * self.transitions.ravel(), minlength=n
            )
            if np.abs(nxt - pi).max() < 1e-15:
                return nxt
            pi = nxt
        return pi

    def entropy_rate(self) -> float:
        """Entropy of the next symbol given its context, in nats, under the stationary law."""
        return float(self.stationary @ _entropy(self.transitions))

    def entropy_bound(self) -> float:
        """Lowest achievable loss per token of the document stream, in nats (a lower bound).

        After each symbol the document ends with probability `q = 1/mean_doc_len` (an
        end-of-text token follows) and otherwise the chain emits its next symbol. A
        document of `1/q` symbols on average carries at least `(1/q) * (entropy_rate() +
        h(q))` nats in `1/q + 1` tokens, so no model can average below
        `(entropy_rate() + h(q)) / (1 + q)` per token. The first symbols of a document (and
        of a training window) have less context, so real losses sit slightly above it.
        """
        q = 1.0 / self.mean_doc_len
        binary = -(q * math.log(q) + (1 - q) * math.log(1 - q))
        return (self.entropy_rate() + binary) / (1.0 + q)

    def sample_tokens(self, n_tokens: int, *, seed: int, chains: int = 256) -> np.ndarray:
        """Sample a stream of byte-tokenizer ids `[n_tokens]`: documents joined by end-of-text.

        `chains` documents are generated side by side (vectorized); every document starts
        from a context drawn from the stationary distribution.
        """
        tok = ByteTokenizer()
        rng = np.random.default_rng([self.seed, seed])
        cdf = np.cumsum(self.transitions, axis=1)
        cdf[:, -1] = 1.0
        stationary_cdf = np.cumsum(self.stationary)
        stationary_cdf[-1] = 1.0
        out: list[np.ndarray] = []
        total = 0
        stop = 1.0 / self.mean_doc_len
        letters = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz", dtype=np.uint8)[: self.alphabet]
        while total < n_tokens:
            context = np.searchsorted(stationary_cdf, rng.random(chains), side="right")
            alive = np.ones(chains, dtype=bool)
            steps: list[np.ndarray] = []
            while alive.any():
                u = rng.random(chains)
                symbol = (u[:, None] > cdf[context]).sum(axis=1)
                token = np.where(alive, letters[symbol].astype(np.int64), -1)
                steps.append(token)
                context = self._successor(context, symbol)
                alive &= rng.random(chains) >= stop
            grid = np.stack(steps, axis=1)  # [chains, longest document]
            for row in grid:
                doc = row[row >= 0].astype(tok.dtype)
                out.append(np.append(doc, np.asarray(tok.eot, dtype=tok.dtype)))
                total += doc.size + 1
        return np.concatenate(out)[:n_tokens]
