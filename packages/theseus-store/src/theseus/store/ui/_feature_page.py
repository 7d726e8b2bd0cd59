"""The features page: one SAE's features along a lineage, node by node, a feature followed.

The page's frames are the slider's (:func:`~theseus.store.ui._data.artifact_frames`:
the nodes along the stitched lineage that hold the artifact, each its newest version).
A request names the node shown (``node``; the last frame when absent) and a feature
(``feature``), an index into the SAE at ``from`` when given, else at ``node``: from
``from`` to ``node`` the feature is followed one frame at a time (forward: the feature
whose ``previous`` is it; back: its own ``previous``), so a jump of the slider shows
what single steps would. :class:`Documents` keeps the documents read lately, parsed.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from typing import Any
from urllib.parse import urlencode

from starlette.datastructures import QueryParams
from starlette.exceptions import HTTPException

from theseus.store._errors import CorruptStoreError
from theseus.store._node import Node
from theseus.store._store import Store
from theseus.store.ui import _data
from theseus.store.ui._features import (
    Features,
    FeaturesError,
    Step,
    contexts,
    parse,
    step_back,
    step_forward,
)
from theseus.store.ui._web import choices, number, parse_node

__all__ = ["DENSEST", "Documents", "view"]

DENSEST = 24  # the features the page lists as the most active
BORN_SHOWN = 40  # the born features it names at most
TRAIL_SHOWN = 8  # the steps of a followed feature it tells at most (the last ones)


class Documents:
    """The features.json documents read lately, parsed (or their error), by content hash.

    An artifact's bytes never change under its hash, so an entry never goes stale. The
    last ``count`` are kept while their files add up to at most ``size`` bytes (the last
    one always: a step reads the node shown and its two neighbours). A blob that cannot
    be read is not remembered (it may be restored).
    """

    def __init__(self, count: int = 8, size: int = 256 << 20) -> None:
        self.count = count
        self.size = size
        self.lock = threading.Lock()
        self.kept: collections.OrderedDict[str, tuple[int, Features | FeaturesError]] = (
            collections.OrderedDict()
        )

    def of(self, store: Store, frame: dict[str, Any], name: str) -> Features | FeaturesError:
        """The document of ``frame`` (a slider frame of artifact ``name``), or why it cannot
        be read (a FeaturesError, returned: the page shows it)."""
        seq = frame["seq"]
        artifact = _data.artifact_version(
            store, Node.deserialize(frame["node"]), name, frame["version"]
        )
        if artifact is None:  # written over between two reads: the frames are newer
            return FeaturesError(f"seq {seq}'s v{frame['version']} is gone; reload the page")
        with self.lock:
            if artifact.hash in self.kept:
                self.kept.move_to_end(artifact.hash)
                return self.kept[artifact.hash][1]
        try:
            content = artifact.content
        except CorruptStoreError as err:
            return FeaturesError(f"its bytes cannot be read: {err}")
        try:
            parsed: Features | FeaturesError = parse(content)
        except FeaturesError as err:
            parsed = err
        with self.lock:
            self.kept[artifact.hash] = (artifact.size, parsed)
            while len(self.kept) > 1 and (
                len(self.kept) > self.count
                or sum(size for size, _ in self.kept.values()) > self.size
            ):
                self.kept.popitem(last=False)
        return parsed


def view(
    store: Store,
    documents: Documents,
    lineage: tuple[str, str],
    artifact: str,
    params: QueryParams,
) -> dict[str, Any]:
    """What ``features.html`` shows of ``artifact`` along ``lineage`` for a request's
    ``node``, ``from`` and ``feature``.

    Raises:
        HTTPException: 404 for a node or ``from`` that holds no frame of the artifact, or a
            feature the SAE does not have; 400 for a feature that is not a whole number.
    """
    name, nonce = lineage
    key = f"{name}~{nonce}"
    frames = _data.artifact_frames(store, name, nonce, artifact)
    nodes = [frame["node"] for frame in frames]
    at = _position(nodes, params.get("node"), len(nodes) - 1, "node", key, artifact)
    start = _position(nodes, params.get("from"), at, "from", key, artifact)

    def at_frame(k: int) -> Features | FeaturesError:
        return documents.of(store, frames[k], artifact)

    first = at_frame(start)
    index = _feature(params.get("feature"), first, frames[start])
    trail, index = _follow(at_frame, frames, start, at, index)
    doc = at_frame(at)
    context: dict[str, Any] = {
        "frames": frames,
        "at": at,
        "frame": frames[at],
        "index": index,
        "trail": trail[-TRAIL_SHOWN:],
        "trail_left": max(0, len(trail) - TRAIL_SHOWN),
        "error": str(doc) if isinstance(doc, FeaturesError) else None,
        "doc": None,
        "feature": None,
        "contexts": [],
        "contexts_error": None,
        "info": _info(frames, at),
        "canonical": _url(key, artifact, nodes[at], index),
    }
    for side, k in (("back", at - 1), ("forward", at + 1)):
        context[side] = None  # the first or the last node: no step that way
        if 0 <= k < len(frames):
            (move,), _ = _follow(at_frame, frames, at, k, index)
            href = _url(key, artifact, nodes[k], index, origin=nodes[at])
            context[side] = {"href": href, "seq": frames[k]["seq"], "step": move["step"]}
    if isinstance(doc, FeaturesError):
        return context
    context["doc"] = doc
    context["measures"] = _measures(store, key, artifact, doc)
    context["densest"] = doc.densest(DENSEST)
    context["dead"] = sum(1 for f in doc.features if f.density == 0)
    born = doc.born()
    context["born"], context["born_left"] = born[:BORN_SHOWN], max(0, len(born) - BORN_SHOWN)
    context["previous"] = _previous_frame(frames, at, doc)
    if index < doc.width:
        context["feature"] = doc.features[index]
        try:
            context["contexts"] = contexts(doc, index)
        except FeaturesError as err:
            context["contexts_error"] = str(err)
    return context


def _url(lineage: str, artifact: str, node: str, feature: int, origin: str | None = None) -> str:
    query = {"l": lineage, "name": artifact, "node": node, "feature": feature}
    if origin is not None:
        query["from"] = origin
    return "/features?" + urlencode(query)


def _position(
    nodes: list[str], text: str | None, default: int, param: str, lineage: str, artifact: str
) -> int:
    """The frame a request's ``param`` names (a node), ``default`` when absent; else a 404
    naming the nodes that hold the artifact."""
    if not text:
        return default
    node = parse_node(text).serialize()  # a malformed node: the browser's own 404
    if node in nodes:
        return nodes.index(node)
    raise HTTPException(
        404,
        f"{param}: node {node} holds no {artifact!r} along {lineage} ({len(nodes)} nodes do). "
        f"{choices(node, nodes)}",
    )


def _feature(text: str | None, doc: Features | FeaturesError, frame: dict[str, Any]) -> int:
    """The feature a request names; without one, the densest of ``doc`` (0 if unreadable)."""
    if text is None or text == "":
        if isinstance(doc, FeaturesError) or not doc.features:
            return 0
        return doc.densest(1)[0].index
    try:
        index = int(text)
    except ValueError:
        raise HTTPException(
            400, f"feature must be a whole number (a feature's index); got {text!r}."
        ) from None
    if isinstance(doc, Features) and not 0 <= index < doc.width:
        raise HTTPException(
            404,
            f"The SAE {doc.sae} at seq {frame['seq']} has features 0 to {doc.width - 1}; "
            f"not {index}. Choose one of them.",
        )
    if index < 0:
        raise HTTPException(400, f"feature must be 0 or more; got {text!r}.")
    return index


def _follow(
    at_frame: Callable[[int], Features | FeaturesError],
    frames: list[dict[str, Any]],
    start: int,
    end: int,
    index: int,
) -> tuple[list[dict[str, Any]], int]:
    """Feature ``index`` at frame ``start`` followed one frame at a time to frame ``end``.

    Returns:
        The steps (``{"from", "to"}`` frames, ``"index"`` before, ``"step"``: a
        :class:`Step`, ``"text"``: the sentence the page shows) and the index reached.
    """
    trail: list[dict[str, Any]] = []
    k = start
    while k != end:
        j = k + 1 if end > k else k - 1
        here, there = at_frame(k), at_frame(j)
        nodes = frames[k]["node"], frames[j]["node"]
        if isinstance(here, FeaturesError) or isinstance(there, FeaturesError):
            step = Step(index, "unreadable")
        elif j > k:
            step = step_forward(there, nodes[0], index)
        else:
            step = step_back(here, nodes[1], there, index)
        trail.append({"from": frames[k], "to": frames[j], "index": index, "step": step})
        trail[-1]["text"] = _told(trail[-1], here, there)
        index, k = step.index, j
    return trail, index


def _told(move: dict[str, Any], here: Any, there: Any) -> str:
    """One step of a followed feature, as the page tells it."""
    step, i = move["step"], move["index"]
    a, b = f"seq {move['from']['seq']}", f"seq {move['to']['seq']}"
    kept = f"#{i} shown at {b} is another feature that has the same index"
    if step.how == "matched":
        return f"#{i} at {a} → #{step.index} at {b} (matched at cosine {number(step.cosine)})."
    if step.how == "gone":
        return f"#{i} at {a} is gone at {b}: no feature there matches it; {kept}."
    if step.how == "born":
        return f"#{i} at {a} was born there: it has no match at {b}; {kept}."
    if step.how == "unmatched":
        forward = move["to"]["seq"] > move["from"]["seq"]
        later, other = (there, move["from"]) if forward else (here, move["to"])
        if later.previous == other["node"]:  # back: its match is no feature of the SAE there
            return (
                f"#{i} at {a} is matched to #{later.features[i].previous}, which the SAE at {b} "
                f"does not have: the index #{i} is kept."
            )
        return (
            f"The SAE at {b if forward else a} is matched to {later.previous or 'no SAE'}, "
            f"not to the one at {a if forward else b}: the index #{i} is kept."
        )
    bad, where = (here, a) if isinstance(here, FeaturesError) else (there, b)
    return f"The features.json at {where} cannot be read ({bad}): the index #{i} is kept."


def _previous_frame(frames: list[dict[str, Any]], at: int, doc: Features) -> dict[str, Any]:
    """Where this SAE's matches point: ``frame`` (the frame of ``doc.previous``, or None),
    ``node`` (``doc.previous``) and ``adjacent`` (it is the frame before this one)."""
    found = next((f for f in frames if f["node"] == doc.previous), None)
    before = frames[at - 1] if at > 0 else None
    return {
        "frame": found,
        "node": doc.previous,
        "adjacent": doc.previous is None or (before is not None and found is before),
    }


def _measures(store: Store, lineage: str, artifact: str, doc: Features) -> list[tuple[Any, ...]]:
    """``(name, value, curves link or None)`` of the SAE's measures; a link where the store
    holds the value ``sae/NAME/LABEL/<measure>`` the analysis logs beside it."""
    prefix = artifact[: -len(_data.FEATURES)]
    held = set(_data.lineage_keys(store))
    out = []
    for measure, value in doc.measures.items():
        key = f"sae/{prefix}/{measure}"
        link = "/curves?" + urlencode({"l": lineage, "key": key}) if key in held else None
        out.append((measure, value, link))
    return out


def _info(frames: list[dict[str, Any]], at: int) -> str:
    """The slider's line: which frame, node, seq, step (and the version where it matters)."""
    frame = frames[at]
    held = frame["versions"]
    of = f" · v{frame['version']} of {', '.join(f'v{v}' for v in held)}" if len(held) > 1 else ""
    return (
        f"{at + 1}/{len(frames)} · {frame['node']} · seq {frame['seq']} · "
        f"step {number(frame['step'])}{of}"
    )
