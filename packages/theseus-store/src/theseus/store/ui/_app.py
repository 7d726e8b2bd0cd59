"""The store browser's pages and JSON endpoints, and the safety around them.

:class:`Browser` answers each route of the application ``_application.create_app(store)``
makes over a store opened read-only. Safety, in one place:

- artifact bytes are looked up by (node, name, version) through the store's
  API; no part of a request is ever used as a file path, and the static files
  are served from a fixed table read at start;
- every page is a Jinja2 template with autoescape, so no name or value from the
  store reaches the page as markup;
- every response carries a Content-Security-Policy that allows scripts, styles
  and images from the server itself only (no inline script, no inline style;
  :mod:`theseus.store.ui._web`);
- an unknown node, lineage, key, artifact or version is a 404 page that names the
  choices, a damaged PDF or a damaged blob included, never a traceback; a page opened
  without its parameters (``/slider``, ``/compare``) offers a picker instead; under
  ``/api/`` every error is JSON ``{"error": "..."}`` with its status.
"""

from __future__ import annotations

import collections
import difflib
import json
import math
import os
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response

from theseus.store._errors import CorruptStoreError, UnknownNodeError
from theseus.store._node import Node
from theseus.store._records import Artifact
from theseus.store._scheduler import scheduler_state
from theseus.store._store import Store
from theseus.store.ui import _data, _feature_page, _render
from theseus.store.ui._imports import applied_settings, imported
from theseus.store.ui._web import (
    choices,
    environment,
    log_scale,
    no_version,
    number,
    parse_lineage,
    parse_node,
    static_table,
    whole,
)

__all__ = ["Browser"]

# The keys whose last value the runs page shows by default.
DEFAULT_KEYS = ("val/loss", "train/loss", "train/step")
PER_PAGE = 50
MAX_PER_PAGE = 1000  # the most rows ``per_page`` asks for (the runs page and /api/runs)
MAX_POINTS = 2000
MAX_SMOOTH = 0.99  # the strongest smoothing the curves page offers


class Browser:
    """The pages and endpoints over one read-only store (one instance per application)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.env = environment()
        self.static = static_table()
        self.documents = _feature_page.Documents()  # the features.json read lately, parsed
        #: The store as every page's header names it.
        self.shown = _shown(store)

    # -- helpers ---------------------------------------------------------------------------

    def page(self, template: str, **context: Any) -> HTMLResponse:
        html = self.env.get_template(template).render(root=self.shown, **context)
        return HTMLResponse(html)

    def known_lineage(self, text: str | None) -> tuple[str, str]:
        """``(name, nonce)`` of a lineage the store holds, named ``project.group.run~nonce``;
        else a 404 naming it and the closest lineages the store holds."""
        name, nonce = parse_lineage(text)
        if self.store.lineage_end(name, nonce) is None:
            found, _ = _data.lineages(self.store, limit=MAX_PER_PAGE)
            held = [item.key for item in found]
            raise HTTPException(
                404, f"The store has no lineage {name}~{nonce}. {choices(f'{name}~{nonce}', held)}"
            )
        return name, nonce

    def artifact(self, request: Request) -> tuple[Node, Artifact]:
        """The artifact version a request names by ``node``, ``name`` and ``version``, its
        bytes read and checked (a missing or corrupt blob is a 404 naming the artifact)."""
        node = parse_node(request.query_params.get("node"))
        name = request.query_params.get("name", "")
        try:
            versions = self.store.history(node, name)
        except UnknownNodeError as err:
            raise HTTPException(404, str(err)) from err
        if not versions:
            raise HTTPException(404, f"Node {node.serialize()} has no artifact {name!r}.")
        version = whole(request, "version", versions[-1].version)
        for artifact in versions:
            if artifact.version == version:
                try:
                    artifact.content  # noqa: B018 (read once and checked here: cached)
                except CorruptStoreError as err:
                    raise HTTPException(
                        404,
                        f"Artifact {name!r} (v{version}) of {node.serialize()} cannot be read: "
                        f"{err}",
                    ) from None
                return node, artifact
        raise HTTPException(
            404,
            f"Artifact {name!r} of {node.serialize()} has versions "
            f"{', '.join(str(a.version) for a in versions)}; not {version}.",
        )

    # -- pages -----------------------------------------------------------------------------

    async def static_file(self, request: Request) -> Response:
        entry = self.static.get(request.path_params["name"])
        if entry is None:
            raise HTTPException(404, "No such file.")
        return Response(entry[0], media_type=entry[1])

    def runs(self, request: Request) -> HTMLResponse:
        context = self.runs_context(request)
        return self.page("runs.html", **context)

    def runs_context(self, request: Request) -> dict[str, Any]:
        text = request.query_params.get("q", "")
        status = request.query_params.get("status", "")
        keys_text = request.query_params.get("keys", ",".join(DEFAULT_KEYS))
        keys = [k.strip() for k in keys_text.split(",") if k.strip()][:8]
        page = whole(request, "page", 1, low=1)
        per_page = whole(request, "per_page", PER_PAGE, low=1, high=MAX_PER_PAGE)
        found, total = _data.lineages(
            self.store,
            text=text,
            status=status,
            keys=keys,
            offset=(page - 1) * per_page,
            limit=per_page,
        )
        pages = max(1, -(-total // per_page))
        groups: dict[tuple[str, str], list[_data.Lineage]] = {}
        for item in found:
            project, group, _ = item.name.split(".")
            groups.setdefault((project, group), []).append(item)
        return {
            "groups": groups,
            "total": total,
            "page": page,
            "per_page": per_page,
            "pages": pages,
            "q": text,
            "status": status,
            "keys": keys,
            "keys_text": ",".join(keys),
            "statuses": _data.statuses(self.store),
        }

    def runs_json(self, request: Request) -> JSONResponse:
        context = self.runs_context(request)
        rows = [
            {
                "lineage": item.key,
                "status": item.status,
                "last_seq": item.last_seq,
                "nodes": item.nodes,
                "checkpoints": item.checkpoints,
                "artifacts": item.artifacts,
                "last": {k: number(v) for k, v in item.last.items()},
            }
            for items in context["groups"].values()
            for item in items
        ]
        return JSONResponse({"total": context["total"], "rows": rows})

    def lineage(self, request: Request) -> HTMLResponse:
        name, nonce = self.known_lineage(request.path_params["lineage"])
        family = _data.lineage_family(self.store, name, nonce)
        artifacts = _data.artifact_names(self.store, name, nonce)
        scheduled = scheduler_state(self.store, name, nonce)
        return self.page(
            "lineage.html",
            family=family,
            lineage=f"{name}~{nonce}",
            artifacts=artifacts,
            pictures=_data.picture_names(self.store, name, nonce),
            scheduled=None if scheduled is None else str(scheduled),
        )

    def node(self, request: Request) -> HTMLResponse:
        node = parse_node(request.path_params["node"])
        try:
            values = self.store.values(node)
        except UnknownNodeError as err:
            raise HTTPException(404, str(err)) from err
        current = self.store.get(node)
        artifacts = [(name, self.store.history(node, name)) for name in current]
        record = _data.job(self.store, node)
        config = None if record is None else record[1]
        revision = imported(values)
        own = [k for k in values if k.startswith("import/")]
        if revision and config is not None:  # only what applied to the weights brought in
            config = applied_settings(config)
        return self.page(
            "node.html",
            node=node,
            lineage=f"{node.name}~{node.nonce}",
            # an imported revision's import/* keys are shown with its settings instead
            values={k: v for k, v in values.items() if not (revision and k in own)},
            job=None if record is None else record[0],
            config=config,
            imported={k: values[k] for k in own} if revision else None,
            checkpoints=self.store.checkpoints(node),
            artifacts=artifacts,
            parents=self.store.parents(node),
            children=self.store.children(node),
        )

    def artifact_page(self, request: Request) -> HTMLResponse:
        node, artifact = self.artifact(request)
        content = artifact.content
        kind = _render.kind_of(artifact.filename, content)
        shown: Any = None
        pages = 0
        if kind == "json":
            shown = json.loads(content.decode("utf-8"))
        elif kind == "text":
            shown = content.decode("utf-8")
        elif kind == "pdf":
            try:
                pages = _render.pdf_page_count(content)
            except Exception:  # a damaged PDF is offered as a download only
                kind = "binary"
        query = {"node": node.serialize(), "name": artifact.name, "version": artifact.version}
        return self.page(
            "artifact.html",
            node=node,
            artifact=artifact,
            versions=self.store.history(node, artifact.name),
            kind=kind,
            shown=shown,
            pages=pages,
            query=query,
        )

    def raw(self, request: Request) -> Response:
        """The exact bytes: images inline, everything else as a download."""
        _, artifact = self.artifact(request)
        suffix = Path(artifact.filename).suffix.lower()
        media = _render.IMAGES.get(suffix, "application/octet-stream")
        safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in artifact.filename)
        disposition = "inline" if media != "application/octet-stream" else "attachment"
        return Response(
            artifact.content,
            media_type=media,
            headers={"Content-Disposition": f'{disposition}; filename="{safe or "artifact"}"'},
        )

    def png(self, request: Request) -> Response:
        """A PDF artifact's page as a PNG picture, rendered here."""
        _, artifact = self.artifact(request)
        content = artifact.content
        if not content.startswith(b"%PDF-"):
            raise HTTPException(404, f"Artifact {artifact.name!r} is not a PDF.")
        page = whole(request, "page", 0)
        try:
            return Response(_render.pdf_to_png(content, page), media_type="image/png")
        except IndexError as err:
            raise HTTPException(404, str(err)) from err
        except Exception as err:  # PDFium refuses a damaged file: a bad artifact, not a fault
            raise HTTPException(
                404,
                f"Artifact {artifact.name!r} (v{artifact.version}) is a damaged PDF that cannot "
                f"be drawn ({err}); its page offers its bytes as a download.",
            ) from None

    def curves(self, request: Request) -> HTMLResponse:
        chosen = request.query_params.getlist("l")
        for text in chosen:
            self.known_lineage(text)
        found, _ = _data.lineages(self.store, limit=500)
        keys = _data.lineage_keys(self.store)
        key = request.query_params.get("key")
        if key is None or key == "":
            key = "val/loss" if "val/loss" in keys or not keys else keys[0]
        else:
            self.known_key(key, keys)
        log = log_scale(request)
        smooth_text = request.query_params.get("smooth") or "0"
        try:
            smooth = float(smooth_text)
        except ValueError:
            smooth = math.nan
        if not 0 <= smooth <= MAX_SMOOTH:
            raise HTTPException(
                400, f"smooth must be a number from 0 to {MAX_SMOOTH}; got {smooth_text!r}."
            )
        return self.page(
            "curves.html",
            keys=keys,
            key=key,
            chosen=chosen,
            lineages=[item.key for item in found],
            log=log,
            smooth=smooth_text,
        )

    @staticmethod
    def known_key(key: str, keys: list[str]) -> None:
        """Nothing when ``key`` is one of ``keys`` (the numeric keys); else a 404 naming them."""
        if key not in keys:
            raise HTTPException(404, f"No numeric key {key!r} in the store. {choices(key, keys)}")

    def series(self, request: Request) -> JSONResponse:
        key = request.query_params.get("key", "")
        self.known_key(key, _data.lineage_keys(self.store))
        cap = whole(request, "max", MAX_POINTS, low=4, high=MAX_POINTS)
        out = []
        for text in request.query_params.getlist("l")[:12]:
            name, nonce = self.known_lineage(text)
            out.append({"lineage": text, **_data.series(self.store, name, nonce, key, cap)})
        return JSONResponse({"key": key, "series": out})

    def slider(self, request: Request) -> HTMLResponse:
        if not request.query_params.get("l"):
            found, _ = _data.lineages(self.store, limit=MAX_PER_PAGE)
            # lineages that hold artifacts first: the one selected is one worth sliding
            found = sorted(found, key=lambda item: item.artifacts == 0)
            return self.page("slider_pick.html", lineages=found)
        name, nonce = self.known_lineage(request.query_params.get("l"))
        names = _data.artifact_names(self.store, name, nonce)
        pictures = _data.picture_names(self.store, name, nonce)
        artifact = request.query_params.get("name") or (pictures[0] if pictures else "")
        self.known_artifact(name, nonce, artifact, names)
        version = self.version(request)
        drawn = artifact in pictures  # else no frames: the page says what the slider shows
        every = _data.artifact_frames(self.store, name, nonce, artifact) if drawn else []
        held = sorted({v for frame in every for v in frame["versions"]})
        if drawn and version is not None and version not in held:
            raise HTTPException(404, no_version(artifact, f"{name}~{nonce}", held, version))
        newest = collections.Counter(frame["version"] for frame in every)
        return self.page(
            "slider.html",
            lineage=f"{name}~{nonce}",
            names=pictures,
            held=names,
            artifact=artifact,
            drawn=drawn,
            version="" if version is None else str(version),
            versions=held,
            newest=sorted(newest.items()),
        )

    @staticmethod
    def version(request: Request) -> int | None:
        """The version a slider request names (``version``): a number, or None: the newest."""
        raw = request.query_params.get("version") or "newest"
        if raw == "newest":
            return None
        try:
            return int(raw)
        except ValueError:
            raise HTTPException(
                400, f"version must be a whole number or 'newest'; got {raw!r}."
            ) from None

    @staticmethod
    def known_artifact(name: str, nonce: str, artifact: str, names: list[str]) -> None:
        """Nothing when ``artifact`` is one of the lineage's ``names`` (or empty while it holds
        none); else a 404 naming them."""
        if (artifact or names) and artifact not in names:
            raise HTTPException(
                404,
                f"Lineage {name}~{nonce} holds no artifact {artifact!r} (along its branch "
                f"points too). {choices(artifact, names)}",
            )

    def frames(self, request: Request) -> JSONResponse:
        name, nonce = self.known_lineage(request.query_params.get("l"))
        artifact = request.query_params.get("name", "")
        self.known_artifact(name, nonce, artifact, _data.artifact_names(self.store, name, nonce))
        version = self.version(request)
        frames = _data.artifact_frames(self.store, name, nonce, artifact, version)
        if version is not None and not frames:
            held = _data.artifact_frames(self.store, name, nonce, artifact)
            versions = sorted({v for frame in held for v in frame["versions"]})
            raise HTTPException(404, no_version(artifact, f"{name}~{nonce}", versions, version))
        for frame in frames:
            query = urlencode(
                {"node": frame["node"], "name": artifact, "version": frame["version"]}
            )
            pdf = frame["filename"].lower().endswith(".pdf")
            image = Path(frame["filename"]).suffix.lower() in _render.IMAGES
            frame["image"] = f"/png?{query}" if pdf else (f"/raw?{query}" if image else None)
            frame["page"] = f"/artifact?{query}"
        return JSONResponse({"frames": frames})

    def features(self, request: Request) -> HTMLResponse:
        """One SAE's features along a lineage (``l``, ``name``: ``*/features.json``), at
        ``node``, feature ``feature`` followed from ``from`` (see ``_feature_page``); without
        ``l`` a picker of the lineages that hold such artifacts."""
        if not request.query_params.get("l"):
            found = _data.feature_lineages(self.store, MAX_PER_PAGE)
            return self.page("features_pick.html", lineages=found)
        name, nonce = self.known_lineage(request.query_params.get("l"))
        names = [
            n for n in _data.artifact_names(self.store, name, nonce) if n.endswith(_data.FEATURES)
        ]
        artifact = request.query_params.get("name") or (names[0] if names else "")
        if not names:
            held = [item.key for item, _ in _data.feature_lineages(self.store, MAX_PER_PAGE)]
            raise HTTPException(
                404,
                f"Lineage {name}~{nonce} holds no SAE features (an artifact "
                f"NAME/SITE/WIDTH/features.json, which an SAE analysis writes). "
                f"{choices(f'{name}~{nonce}', held).replace('It holds', 'The store holds')}",
            )
        if artifact not in names:
            raise HTTPException(
                404,
                f"Lineage {name}~{nonce} holds no features artifact {artifact!r}. "
                f"{choices(artifact, names)}",
            )
        shown = _feature_page.view(
            self.store, self.documents, (name, nonce), artifact, request.query_params
        )
        return self.page(
            "features.html", lineage=f"{name}~{nonce}", names=names, artifact=artifact, **shown
        )

    def compare(self, request: Request) -> HTMLResponse:
        given = {side: request.query_params.get(side) or "" for side in ("a", "b")}
        if not given["a"] or not given["b"]:
            found, _ = _data.lineages(self.store, limit=MAX_PER_PAGE)
            return self.page("compare_pick.html", lineages=found, **given)
        a = parse_node(given["a"])
        b = parse_node(given["b"])
        try:
            va, vb = self.store.values(a), self.store.values(b)
        except UnknownNodeError as err:
            raise HTTPException(404, str(err)) from err
        ca = (self.store.job_config(a) or "").splitlines()
        cb = (self.store.job_config(b) or "").splitlines()
        diff = list(difflib.unified_diff(ca, cb, a.serialize(), b.serialize(), n=3, lineterm=""))
        keys = sorted(set(va) | set(vb))
        rows = [(k, va.get(k), vb.get(k), va.get(k) != vb.get(k)) for k in keys]
        return self.page(
            "compare.html",
            a=a,
            b=b,
            rows=rows,
            diff=diff,
            same=ca == cb,
            ja=self.store.job_of(a),
            jb=self.store.job_of(b),
        )

    def lineage_json(self, request: Request) -> JSONResponse:
        """The lineage's last node and its last values (what a live page polls)."""
        name, nonce = self.known_lineage(request.query_params.get("l"))
        found, _ = _data.lineages(self.store, text=f"{name}~{nonce}", keys=DEFAULT_KEYS)
        scheduled = scheduler_state(self.store, name, nonce)
        for item in found:
            if item.key == f"{name}~{nonce}":
                return JSONResponse(
                    {
                        "lineage": item.key,
                        "last_seq": item.last_seq,
                        "nodes": item.nodes,
                        "status": item.status,
                        "scheduled": None if scheduled is None else str(scheduled),
                        "last": {k: number(v) for k, v in item.last.items()},
                    }
                )
        raise HTTPException(404, f"The store has no lineage {name}~{nonce}.")


def _shown(store: Store) -> str:
    """The store as the header names it: its folder, and its database where that is elsewhere."""
    if store.database.startswith(f"{store.root}{os.sep}"):  # a database file in the folder
        return str(store.root)
    return f"{store.database} (files {store.root.parent})"
