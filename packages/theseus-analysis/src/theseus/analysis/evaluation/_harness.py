"""lm-evaluation-harness's model over a Theseus node: `TheseusLM`, registered as `theseus`.

The harness asks a model three things; each goes through Theseus's own compiled code:

* `loglikelihood` (multiple choice, `is_greedy`): the harness encodes each context and
  continuation (`tok_encode`, without the tokenizer's start-of-text, as its own `hf`
  model does) and `theseus.model.scoring.loglikelihoods` scores them, packed into
  power-of-two length buckets (one program per bucket);
* `loglikelihood_rolling` (perplexity): each document split by
  `theseus.model.scoring.rolling_windows` (the harness's rolling windows with a one-token
  context, made disjoint), its windows' loglikelihoods summed;
* `generate_until`: `theseus.model.generation.generate` (the key-value cache) for
  `max_gen_toks` tokens from the context's last `block_size - max_gen_toks` tokens,
  greedy unless the request asks to sample, the text cut at the end-of-text token and at
  the first `until` string.

The model and its parameters are the trainer's, as its checkpoint restored them (no
copy): `TheseusLM(root=ROOT, target=NODE)` opens the node as `theseus sample` does, and
`TheseusLM(trainer=...)` wraps a trainer already set up.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model

from theseus.analysis._progress import bars_off
from theseus.config import ConfigError
from theseus.errors import TheseusError
from theseus.model.generation import generate
from theseus.model.scoring import loglikelihoods, rolling_windows

__all__ = ["EvaluationError", "TheseusLM"]

DEFAULT_BATCH = 8
DEFAULT_GEN_TOKENS = 256


class EvaluationError(TheseusError, ValueError):
    """An evaluation that cannot run as asked (the message says what to change)."""


def _positive(name: str, value: Any, default: int) -> int:
    if value is None or value == "auto":
        return default
    try:
        number = int(value)
    except (TypeError, ValueError):
        number = 0
    if number < 1 or str(number) != str(value).strip():
        raise EvaluationError(f"{name} must be a positive integer; got {value!r}")
    return number


def stored(root: str | Path) -> Path:
    """The Theseus root `root` names (its folder, its store folder or a URL), once it is
    known to hold a store (else `EvaluationError`)."""
    from theseus.cli import require_store
    from theseus.config import ConfigError

    try:
        return require_store(root)
    except ConfigError as error:
        raise EvaluationError(str(error)) from None


def _import(module: str) -> None:
    """Import a module or file of jobs, as `theseus --import` does (one-line errors)."""
    from theseus.registry import import_module_or_file

    try:
        import_module_or_file(module)
    except ImportError as error:
        raise EvaluationError(
            f"import={module} in --model_args cannot be imported: {error}"
        ) from None


def open_trainer_at(root: str | Path, target: str) -> Any:
    """The trainer that wrote `target` under `root`, restored at its checkpoint."""
    from theseus.cli import open_trainer
    from theseus.quick import quick

    with quick(stored(root)) as q:
        return open_trainer(q, target)


@register_model("theseus")
class TheseusLM(TemplateLM):
    """A Theseus node's model as lm-evaluation-harness sees it.

    Args:
        root, target: where the node is (`lm_eval --model theseus --model_args
            root=ROOT,target=NODE`); TARGET as `theseus sample` takes it.
        import (a `--model_args` key): modules (or files) of jobs to import first,
            `;`-separated, as `theseus --import` takes them (the job that wrote the node
            must be registered).
        batch_size: rows per compiled call (`auto` is 8).
        max_gen_toks: tokens `generate_until` adds when a task does not say.
        trainer: a trainer already set up (instead of root and target).
    """

    def __init__(
        self,
        root: str | None = None,
        target: str | None = None,
        batch_size: int | str | None = None,
        max_gen_toks: int | str | None = None,
        *,
        trainer: Any = None,
        **ignored: Any,
    ) -> None:
        super().__init__()
        modules = str(ignored.pop("import", "") or "")
        unknown = sorted(set(ignored) - {"device", "max_batch_size"})
        if unknown:
            raise EvaluationError(
                f"--model_args for theseus take root, target, import, batch_size, "
                f"max_gen_toks; got {', '.join(unknown)}"
            )
        for module in filter(None, (m.strip() for m in modules.split(";"))):
            _import(module)
        if trainer is None:
            if not root or not target:
                raise EvaluationError(
                    "the theseus model needs a node: --model_args root=ROOT,target=NODE "
                    "(TARGET: a run name, name~nonce or name~nonce~seq)"
                )
            try:
                trainer = open_trainer_at(str(root), str(target))
            except ConfigError as error:  # a job this interpreter has not registered
                said = re.sub(
                    r"pass --import (\S+) \(before the verb or after it\)",
                    r"add import=\1 to --model_args",
                    str(error),
                )
                raise EvaluationError(said) from None
        if not hasattr(trainer.model, "empty_cache"):
            raise EvaluationError(
                f"{type(trainer).__name__}'s model ({type(trainer.model).__name__}) has no "
                "key-value cache (`empty_cache`); the theseus model evaluates GPT-like models"
            )
        self.trainer = trainer
        self._tokenizer = trainer.tokenizer
        self._batch = _positive("batch_size", batch_size, DEFAULT_BATCH)
        self._gen_tokens = _positive("max_gen_toks", max_gen_toks, DEFAULT_GEN_TOKENS)

    # -- what the harness reads -------------------------------------------------------------
    @property
    def eot_token_id(self) -> int:
        return int(self._tokenizer.eot)

    @property
    def max_length(self) -> int:
        return int(self.trainer.model.config.block_size)

    @property
    def batch_size(self) -> int:
        return self._batch

    @property
    def tokenizer_name(self) -> str:
        return str(self._tokenizer.name)

    def tok_encode(
        self, string: str, add_special_tokens: bool | None = None, **kwargs: Any
    ) -> list[int]:
        return [int(i) for i in self._tokenizer.encode(string, special=bool(add_special_tokens))]

    def tok_decode(self, tokens: Sequence[int]) -> str:
        return str(self._tokenizer.decode(list(tokens)))

    def _score(self, pairs: list[tuple[list[int], list[int]]]) -> list[tuple[float, bool]]:
        state = self.trainer.state
        return loglikelihoods(self.trainer.model, state.params, pairs, batch_size=self._batch)

    # -- the three requests -----------------------------------------------------------------
    def loglikelihood(self, requests: list[Any], disable_tqdm: bool = False) -> list[Any]:
        # the harness's "Tokenizing inputs" bar passes `disable=` itself: off where the
        # process turned bars off (`theseus eval` and `theseus demo` without --progress-bars)
        return super().loglikelihood(requests, disable_tqdm=disable_tqdm or bars_off())

    def _loglikelihood_tokens(
        self, requests: list[tuple[tuple[str, str], list[int], list[int]]], **kwargs: Any
    ) -> list[tuple[float, bool]]:
        results = self._score([(list(ctx), list(cont)) for _, ctx, cont in requests])
        for (key, _, _), result in zip(requests, results, strict=True):
            self.cache_hook.add_partial("loglikelihood", key, result)
        return results

    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[float]:
        windows: list[tuple[list[int], list[int]]] = []
        owners: list[int] = []
        for index, request in enumerate(requests):
            (text,) = request.args
            for pair in rolling_windows(
                self.tok_encode(text), self.prefix_token_id, self.max_length
            ):
                windows.append(pair)
                owners.append(index)
        totals = [0.0] * len(requests)
        for owner, (logprob, _) in zip(owners, self._score(windows), strict=True):
            totals[owner] += logprob
        for request, total in zip(requests, totals, strict=True):
            self.cache_hook.add_partial("loglikelihood_rolling", request.args, total)
        return totals

    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        settings = [self._generation(kwargs) for _, kwargs in (r.args for r in requests)]
        answers = [""] * len(requests)
        groups: dict[tuple[int, float], list[int]] = {}
        for index, (new, temperature, _) in enumerate(settings):
            groups.setdefault((new, temperature), []).append(index)
        params = self.trainer.state.params
        for (new, temperature), members in groups.items():
            room = self.max_length - new
            for first in range(0, len(members), self._batch):
                rows = members[first : first + self._batch]
                prompts = []
                for index in rows:
                    context = self.tok_encode(requests[index].args[0])[-room:]
                    prompts.append(context or [self.prefix_token_id])
                tokens = generate(
                    self.trainer.model, params, prompts, new, temperature=temperature,
                    key=jax.random.key(self.trainer.args.seed),
                    vocab=self._tokenizer.vocab_size,
                )  # fmt: skip
                for index, continuation in zip(rows, tokens, strict=True):
                    ids = list(continuation)
                    if self.eot_token_id in ids:  # the model ended its text there
                        ids = ids[: ids.index(self.eot_token_id)]
                    text = self.tok_decode(ids)
                    for stop in settings[index][2]:
                        if stop:
                            text = text.split(stop)[0]
                    answers[index] = text
                    self.cache_hook.add_partial("generate_until", requests[index].args, text)
        return answers

    def _generation(self, kwargs: dict[str, Any]) -> tuple[int, float, list[str]]:
        """`(new tokens, temperature, stop strings)` of one `generate_until` request."""
        kwargs = dict(kwargs or {})
        until = kwargs.pop("until", None)
        stops = [until] if isinstance(until, str) else list(until or [])
        stops.append(self.tok_decode([self.eot_token_id]))
        new = _positive("max_gen_toks", kwargs.pop("max_gen_toks", None), self._gen_tokens)
        new = min(new, self.max_length - 1)
        sample = bool(kwargs.pop("do_sample", False))
        temperature = float(kwargs.pop("temperature", 1.0 if sample else 0.0))
        if not sample:
            temperature = 0.0
        return new, temperature, stops
