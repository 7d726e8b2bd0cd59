"""What `SAEBase` records beside the values: the match to the previous SAE over the
features that fired, and the features.json document (its format: theseus-analysis's
README, "Sparse autoencoders")."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np

from theseus.analysis.sae._model import SAEConfig
from theseus.store import Artifact, Node

__all__ = [
    "FORMAT",
    "MATCH",
    "alive_features",
    "changes",
    "features_document",
    "json_number",
    "plain",
]

FORMAT = "theseus-sae-features/1"
MATCH = 0.9  # decoder cosine above which two features are the same feature


def changes(pairing: Any, before: Any, now: np.ndarray) -> dict[str, Any]:
    """The match to the previous SAE, counted over live features (a dead feature gets no
    gradient and so keeps matching itself): `matched`, the share of the features that
    fired in this node's training whose one-to-one partner is alike (cosine above
    `MATCH`); `born`, those without one; `gone`, the previous SAE's live features whose
    partner is not alike. Where the previous liveness is unknown, all count as live."""
    old = np.ones(len(pairing.pairs), bool) if before is None else np.asarray(before, bool)
    alike = pairing.cosines > MATCH
    new_alike = {int(j) for (_, j), same in zip(pairing.pairs, alike, strict=True) if same}
    old_alike = {int(i) for (i, _), same in zip(pairing.pairs, alike, strict=True) if same}
    live = [int(j) for j in np.flatnonzero(now)]
    kept = sum(j in new_alike for j in live)
    return {
        "matched": kept / len(live) if live else float("nan"),
        "born": len(live) - kept,
        "gone": sum(int(i) not in old_alike for i in np.flatnonzero(old)),
    }


def alive_features(held: dict[str, Artifact], name: str, label: str) -> Any:
    """Which features of a stored SAE fired in its training (its features.json), or None."""
    artifact = held.get(f"{name}/{label}/features.json")
    if artifact is None:
        return None
    try:
        features = json.loads(artifact.content)["features"]
        return np.array([bool(f["alive"]) for f in features])
    except (ValueError, KeyError, TypeError):  # an older file, or not ours: unknown
        return None


def plain(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    return value


def features_document(
    values: dict[str, Any],
    label: str,
    sae: dict[str, Any],
    name: str,
    tokenizer: Any,
    window: tuple[int, int],
) -> dict[str, Any]:
    """The features.json of one SAE (its format: docs/architecture.md, SAE artifacts)."""
    node: Node = values["node"]
    ids = np.asarray(values["ids"])
    length = ids.shape[1]
    before, after = window
    found = sae["contexts"]
    texts: dict[int, str] = {}

    def text(token: int) -> str:
        if token not in texts:
            texts[token] = tokenizer.decode([token])
        return texts[token]

    previous: dict[int, tuple[int, float]] = {}
    pairing = sae["match"]
    if pairing is not None:
        for (old, new), cosine in zip(pairing.pairs, pairing.cosines, strict=True):
            if cosine > MATCH:
                previous[int(new)] = (int(old), float(cosine))
    features = []
    width = found["values"].shape[0]
    for index in range(width):
        top = []
        for value, where, acts in zip(
            found["values"][index], found["where"][index], found["window"][index], strict=True
        ):
            if value <= 0:
                break
            row, position = divmod(int(where), length)
            first = max(0, position - before)
            last = min(length, position + after + 1)
            offset = first - (position - before)
            top.append(
                {
                    "activation": float(value),
                    "row": row,
                    "position": position,
                    "tokens": [text(int(t)) for t in ids[row, first:last]],
                    "activations": [float(a) for a in acts[offset : offset + last - first]],
                    "at": position - first,
                }
            )
        match_of = previous.get(index)
        features.append(
            {
                "index": index,
                "density": float(found["density"][index]),
                "max": max(0.0, float(found["max"][index])),
                "alive": bool(sae["alive"][index]),
                "previous": None if match_of is None else match_of[0],
                "cosine": None if match_of is None else match_of[1],
                "top": top,
            }
        )
    config: SAEConfig = sae["config"]
    return {
        "format": FORMAT,
        "analysis": name,
        "sae": label,
        "site": sae["site"],
        "width": config.width,
        "architecture": config.architecture,
        "node": node.serialize(),
        "seq": node.seq,
        "previous": None if sae["previous"] is None else sae["previous"].serialize(),
        "measures": {k: json_number(plain(v)) for k, v in sae["measures"].items()},
        "context": {"before": before, "after": after},
        "features": features,
    }


def json_number(value: Any) -> Any:
    """NaN and infinities as null (JSON has no such numbers)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
