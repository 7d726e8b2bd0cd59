"""An SAE's ``features.json`` (format ``theseus-sae-features/1``) as the features page reads it.

Pure functions over the document, no store: :func:`parse` checks the parts every
page needs (the measures, each feature's density, max and match) and refuses a
document that is not JSON or not the format in one line (:class:`FeaturesError`);
:func:`contexts` checks one feature's top contexts when they are shown (a large
SAE's thousands of windows are never all read); :func:`step_forward` and
:func:`step_back` follow a feature from one SAE of a chain to the next through the
``previous`` matches; :func:`visible` makes a token's whitespace and control
characters visible.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, TypeGuard

from theseus.errors import TheseusError

__all__ = [
    "FORMAT",
    "LEVELS",
    "Context",
    "Feature",
    "Features",
    "FeaturesError",
    "Step",
    "Token",
    "contexts",
    "parse",
    "step_back",
    "step_forward",
    "visible",
]

FORMAT = "theseus-sae-features/1"
LEVELS = 10  # shades of a token's activation (0: none; 1..10: share of the feature's max)

# The measures a page lists first, in this order; any others follow in the document's order.
KNOWN_MEASURES = ("l0", "fvu", "dead", "loss_recovered", "matched", "born", "gone")

# Characters a token's text shows as a visible sign (the others of C0 as U+2400 + code).
SIGNS = {"\n": "⏎", "\t": "⇥", "\r": "␍", "\x7f": "␡"}


class FeaturesError(TheseusError, ValueError):
    """A features.json that is not JSON or not the format, in one line."""


@dataclass(frozen=True)
class Feature:
    """One feature's summary: where it fires, how strongly, and its match in the previous SAE."""

    index: int
    density: float
    max: float
    previous: int | None  # its match's index in the previous SAE (None: born, or no previous)
    cosine: float | None  # the decoder cosine with that match


@dataclass(frozen=True)
class Features:
    """One SAE's features.json: what the page shows of it, checked."""

    sae: str  # the LABEL, SITE/WIDTH
    analysis: str
    architecture: str
    previous: str | None  # the node whose SAE this one is matched to, serialized
    measures: dict[str, Any]  # name -> number (or None), the known ones first
    features: list[Feature]
    tops: list[str]  # each feature's ``top`` as JSON text, read and checked when shown

    @property
    def width(self) -> int:
        return len(self.features)

    def densest(self, count: int) -> list[Feature]:
        """The ``count`` features of the highest density, densest first (ties: lower index)."""
        return sorted(self.features, key=lambda f: (-f.density, f.index))[:count]

    def born(self) -> list[int]:
        """The features without a match in the previous SAE (only where it has one)."""
        if self.previous is None:
            return []
        return [f.index for f in self.features if f.previous is None]


@dataclass(frozen=True)
class Token:
    """A context's token as the page shows it."""

    text: str  # the token's own text
    shown: str  # what the page writes: whitespace and control characters made visible
    blank: bool  # the token is whitespace or empty (shown muted)
    activation: float
    level: int  # 0..LEVELS: the shade
    at: bool  # the activating token

    @property
    def label(self) -> str:
        """The token's exact text (a JSON string) and its activation: the tooltip."""
        return f"{json.dumps(self.text, ensure_ascii=False)} {self.activation:.4g}"


@dataclass(frozen=True)
class Context:
    """One of a feature's top contexts: its activation, where it is, its window's tokens."""

    activation: float
    row: int | None
    position: int | None
    tokens: list[Token]


@dataclass(frozen=True)
class Step:
    """One step of a feature from one SAE of the chain to a neighbour's.

    ``index``: the feature shown there; ``how``: ``matched`` (``index`` is the match,
    at ``cosine``), ``gone`` (forward: no feature there matches it), ``born`` (back: it
    has no match there), ``unmatched`` (the neighbour's SAE is not the one the match
    refers to) or ``unreadable`` (one of the two documents cannot be read); in all but
    ``matched`` the index is kept.
    """

    index: int
    how: str
    cosine: float | None = None


def _number(value: Any) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _whole(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else "-"


def parse(content: bytes) -> Features:
    """The features.json ``content``, checked.

    Raises:
        FeaturesError: it is not UTF-8 JSON, not format ``theseus-sae-features/1``, or a
            part the page reads is missing or of the wrong type (the message names it).
    """
    try:
        doc = json.loads(content.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as err:
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise FeaturesError(f"it is not UTF-8 JSON ({reason})") from None
    if not isinstance(doc, dict):
        raise FeaturesError(f"it is a JSON {type(doc).__name__}, not an object ({FORMAT})")
    if doc.get("format") != FORMAT:
        raise FeaturesError(
            f"its format is {doc.get('format')!r}, not {FORMAT!r} (the one this browser reads)"
        )
    previous = doc.get("previous")
    if previous is not None and not isinstance(previous, str):
        raise FeaturesError(f"'previous' is {previous!r}, not a node (text) or null")
    measures = doc.get("measures")
    if not isinstance(measures, dict) or not all(
        v is None or _number(v) for v in measures.values()
    ):
        raise FeaturesError("'measures' is not an object of numbers")
    entries = doc.get("features")
    if not isinstance(entries, list):
        raise FeaturesError("'features' is not a list")
    features = [_feature(entry, position) for position, entry in enumerate(entries)]
    width = doc.get("width")
    if width is not None and width != len(features):
        raise FeaturesError(f"'width' is {width!r} but 'features' holds {len(features)}")
    ordered = {k: measures[k] for k in KNOWN_MEASURES if k in measures}
    ordered.update({k: v for k, v in measures.items() if k not in ordered})
    return Features(
        sae=_text(doc.get("sae")),
        analysis=_text(doc.get("analysis")),
        architecture=_text(doc.get("architecture")),
        previous=previous,
        measures=ordered,
        features=features,
        # one text per feature, not a Python object per token: a wide SAE's contexts are
        # tens of MB of JSON and several times that as objects
        tops=[json.dumps(entry.get("top")) for entry in entries],
    )


def _feature(entry: Any, position: int) -> Feature:
    where = f"feature {position}"
    if not isinstance(entry, dict):
        raise FeaturesError(f"{where} is not an object")
    if entry.get("index") != position or not _whole(entry.get("index")):
        raise FeaturesError(f"{where} has index {entry.get('index')!r} (features are in order)")
    for key in ("density", "max"):
        if not _number(entry.get(key)):
            raise FeaturesError(f"{where}'s {key!r} is {entry.get(key)!r}, not a number")
    previous, cosine = entry.get("previous"), entry.get("cosine")
    if previous is not None and not (_whole(previous) and previous >= 0):
        raise FeaturesError(f"{where}'s 'previous' is {previous!r}, not an index or null")
    if cosine is not None and not _number(cosine):
        raise FeaturesError(f"{where}'s 'cosine' is {cosine!r}, not a number or null")
    return Feature(position, float(entry["density"]), float(entry["max"]), previous, cosine)


def contexts(features: Features, index: int) -> list[Context]:
    """Feature ``index``'s top contexts, each token shaded by its share of the feature's max.

    Raises:
        FeaturesError: a context is not the format (the message names the feature and it).
    """
    feature = features.features[index]
    top = json.loads(features.tops[index])
    if not isinstance(top, list):
        raise FeaturesError(f"feature {index}'s 'top' is not a list")
    out = []
    for k, item in enumerate(top):
        where = f"feature {index}'s context {k}"
        if not isinstance(item, dict):
            raise FeaturesError(f"{where} is not an object")
        tokens, acts, at = item.get("tokens"), item.get("activations"), item.get("at")
        if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
            raise FeaturesError(f"{where}'s 'tokens' is not a list of text")
        if not isinstance(acts, list) or len(acts) != len(tokens) or not all(map(_number, acts)):
            raise FeaturesError(f"{where}'s 'activations' is not one number per token")
        if not (_whole(at) and 0 <= at < len(tokens)):
            raise FeaturesError(f"{where}'s 'at' is {at!r}, not an index into its tokens")
        activation = item.get("activation")
        if not _number(activation):
            raise FeaturesError(f"{where}'s 'activation' is {activation!r}, not a number")
        scale = feature.max if feature.max > 0 else max([0.0, *acts])
        shown = [
            Token(text, *visible(text), float(a), _level(a, scale), i == at)
            for i, (text, a) in enumerate(zip(tokens, acts, strict=True))
        ]
        row, position = item.get("row"), item.get("position")
        out.append(
            Context(
                float(activation),
                row if _whole(row) else None,
                position if _whole(position) else None,
                shown,
            )
        )
    return out


def _level(activation: float, scale: float) -> int:
    """The shade of ``activation``: 0 for none, else 1..LEVELS by its share of ``scale``."""
    if not (activation > 0 and scale > 0) or math.isnan(activation):
        return 0
    return max(1, min(LEVELS, round(LEVELS * activation / scale)))


def visible(token: str) -> tuple[str, bool]:
    """``(shown, blank)``: the token's text with newlines, tabs and other control characters
    as visible signs (``\\n`` as ⏎), a token of spaces alone as middle dots and an empty one
    as ∅; ``blank``: it is whitespace or empty.

    >>> visible("\\n")
    ('⏎', True)
    >>> visible(" the")
    (' the', False)
    >>> visible("  ")
    ('··', True)
    """
    blank = token.strip() == ""
    if token == "":
        return "∅", True
    shown = "".join(SIGNS.get(c, chr(0x2400 + ord(c)) if ord(c) < 0x20 else c) for c in token)
    if blank:
        shown = shown.replace(" ", "·")
    return shown, blank


def step_forward(there: Features, node: str, index: int) -> Step:
    """Feature ``index`` of the SAE at ``node`` followed to ``there``, the next SAE of the
    chain: the feature there whose match is ``index``; else the index kept (gone)."""
    if there.previous != node:
        return Step(index, "unmatched")
    for feature in there.features:
        if feature.previous == index:
            return Step(feature.index, "matched", feature.cosine)
    return Step(index, "gone")


def step_back(here: Features, there_node: str, there: Features, index: int) -> Step:
    """Feature ``index`` of ``here`` followed back to ``there`` (the SAE at ``there_node``,
    the previous of the chain): its own match; else the index kept (born)."""
    if here.previous != there_node:
        return Step(index, "unmatched")
    feature = here.features[index] if index < here.width else None
    if feature is None or feature.previous is None:
        return Step(index, "born")
    if feature.previous >= there.width:
        return Step(index, "unmatched")
    return Step(feature.previous, "matched", feature.cosine)
