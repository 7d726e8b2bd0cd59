"""`SAEBase`'s settings: the class attributes, their checks, and the configuration
schema under `sae/<NAME>/` they become (each default the class attribute)."""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any, Literal

from theseus.analysis.sae._model import ARCHITECTURES
from theseus.config import field

__all__ = ["CHECKS", "SETTINGS", "schema", "segment"]

SETTINGS = (
    "ARCHITECTURE",
    "WIDTH",
    "EXPANSION",
    "K",
    "L1",
    "L0",
    "THRESHOLD",
    "BANDWIDTH",
    "LEARNING_RATE",
    "TOKENS",
    "BUFFER",
    "EVAL_BATCHES",
    "CONTEXTS",
    "WINDOW",
    "SEED",
)


def _positive_ints(value: Any) -> bool:
    items = value if isinstance(value, tuple) else (value,)
    return bool(items) and all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in items
    )


def _number(value: Any, low: float, *, strict: bool) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return False
    return value > low if strict else value >= low


CHECKS: dict[str, tuple[Any, str]] = {
    "ARCHITECTURE": (lambda v: v in ARCHITECTURES, "one of " + ", ".join(map(repr, ARCHITECTURES))),
    "WIDTH": (lambda v: v is None or _positive_ints(v), "None, a positive int or a tuple of them"),
    "EXPANSION": (_positive_ints, "a positive int or a tuple of them (width = EXPANSION x d)"),
    "K": (_positive_ints, "a positive int (active features per token, topk)"),
    "L1": (lambda v: _number(v, 0, strict=False), "a number >= 0 (the L1 penalty, relu)"),
    "L0": (lambda v: _number(v, 0, strict=False), "a number >= 0 (the L0 penalty, jumprelu)"),
    "THRESHOLD": (
        lambda v: _number(v, 0, strict=True),
        "a number > 0 (jumprelu's initial threshold)",
    ),
    "BANDWIDTH": (lambda v: _number(v, 0, strict=True), "a number > 0 (jumprelu's kernel width)"),
    "LEARNING_RATE": (lambda v: _number(v, 0, strict=True), "a number > 0"),
    "TOKENS": (_positive_ints, "a positive int (tokens each SAE trains on per node)"),
    "BUFFER": (_positive_ints, "a positive int (forwards the shuffling buffer holds)"),
    "EVAL_BATCHES": (_positive_ints, "a positive int (held-out batches measured)"),
    "CONTEXTS": (_positive_ints, "a positive int (top contexts kept per feature)"),
    "WINDOW": (
        lambda v: (
            isinstance(v, tuple)
            and len(v) == 2
            and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in v)
        ),
        "(tokens before, tokens after) the activating token, e.g. (12, 3)",
    ),
    "SEED": (lambda v: isinstance(v, int) and not isinstance(v, bool), "an int"),
}


def segment(name: str) -> str:
    """`NAME` as one configuration path segment (an identifier)."""
    text = re.sub(r"[^A-Za-z0-9_]", "_", name)
    return f"_{text}" if text[0].isdigit() else text


def schema(cls: type[Any]) -> type:
    """The settings of `cls` as a configuration schema under `sae/<NAME>/`, each
    default the class attribute (so `theseus configure` writes them and `key=value`
    overrides them)."""
    prefix = f"sae/{segment(cls.NAME)}"
    widths = (
        cls.WIDTH if isinstance(cls.WIDTH, tuple) else (() if cls.WIDTH is None else (cls.WIDTH,))
    )
    expansions = cls.EXPANSION if isinstance(cls.EXPANSION, tuple) else (cls.EXPANSION,)

    def setting(name: str, default: Any, help: str, **bounds: Any) -> Any:
        if isinstance(default, tuple) and name != "window":
            return field(
                f"{prefix}/{name}", default_factory=lambda: list(default), help=help, **bounds
            )
        return field(f"{prefix}/{name}", default=default, help=help, **bounds)

    fields = [
        ("architecture", Literal["topk", "jumprelu", "relu"],
         setting("architecture", cls.ARCHITECTURE, "topk | jumprelu | relu")),
        ("width", list[int], setting("width", tuple(widths), "features of each SAE, one SAE per "
         "entry; [] uses expansion x the site's width", ge=1)),
        ("expansion", list[int], setting("expansion", tuple(expansions), "width = expansion x "
         "the site's width, one SAE per entry (when width is [])", ge=1)),
        ("k", int, setting("k", cls.K, "active features per token (topk)", ge=1)),
        ("l1", float, setting("l1", float(cls.L1), "L1 penalty (relu)", ge=0)),
        ("l0", float, setting("l0", float(cls.L0), "L0 penalty (jumprelu)", ge=0)),
        ("threshold", float, setting("threshold", float(cls.THRESHOLD),
         "initial threshold (jumprelu)", gt=0)),
        ("bandwidth", float, setting("bandwidth", float(cls.BANDWIDTH),
         "the threshold gradient's kernel width (jumprelu)", gt=0)),
        ("lr", float, setting("lr", float(cls.LEARNING_RATE), "Adam's learning rate", gt=0)),
        ("tokens", int, setting("tokens", cls.TOKENS, "tokens each SAE trains on per node", ge=1)),
        ("buffer", int, setting("buffer", cls.BUFFER, "forwards the shuffling buffer holds", ge=1)),
        ("eval_batches", int, setting("eval_batches", cls.EVAL_BATCHES,
         "held-out val batches the measures read", ge=1)),
        ("contexts", int, setting("contexts", cls.CONTEXTS, "top contexts kept per feature", ge=1)),
        ("window", tuple[int, int], setting("window", tuple(cls.WINDOW),
         "tokens shown before and after a context's activating token", ge=0)),
        ("seed", int, setting("seed", cls.SEED, "the SAEs' initialization and draws", unbounded=True)),
    ]  # fmt: skip
    schema = dataclasses.make_dataclass(f"{cls.__name__}Settings", fields, frozen=True)
    schema.__module__ = cls.__module__
    return schema
