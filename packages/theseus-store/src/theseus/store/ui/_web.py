"""The store browser's HTTP plumbing: security headers, request parameters, templates.

- :class:`SecurityHeaders` puts the Content-Security-Policy (:data:`CSP`: scripts,
  styles and images from the server itself only) and the other security headers on
  every response;
- :func:`parse_node`, :func:`parse_lineage`, :func:`whole` and :func:`log_scale` read a
  request's parameters, answering 404 (a malformed node or lineage, explained in the
  browser's terms) or 400 (a malformed number or switch);
- :func:`environment` is the Jinja2 environment (autoescape on every template) and
  :func:`static_table` the fixed table of static files read at start.
"""

from __future__ import annotations

import difflib
import math
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import jinja2
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from theseus.store._errors import InvalidNodeError
from theseus.store._node import Node

__all__ = [
    "CSP",
    "SecurityHeaders",
    "choices",
    "environment",
    "log_scale",
    "no_version",
    "number",
    "parse_lineage",
    "parse_node",
    "static_table",
    "whole",
]

CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "object-src 'none'; base-uri 'none'; frame-ancestors 'none'; form-action 'self'"
)
HERE = Path(__file__).parent
STATIC_TYPES = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8"}


def static_table() -> dict[str, tuple[bytes, str]]:
    """Every file the server serves under /static, read once: name -> (bytes, type)."""
    return {
        path.name: (path.read_bytes(), STATIC_TYPES[path.suffix])
        for path in sorted((HERE / "static").iterdir())
        if path.suffix in STATIC_TYPES
    }


def number(value: Any) -> str:
    """A value as a page shows it: floats to 6 significant digits, None as ``-``."""
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.6g}"
    return "-" if value is None else str(value)


def environment() -> jinja2.Environment:
    """The templates' Jinja2 environment: autoescape on, undefined names an error."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"),
        autoescape=True,  # every template is HTML: escape every value
        undefined=jinja2.StrictUndefined,
    )
    env.filters["number"] = number
    env.filters["when"] = when
    env.globals["urlencode"] = urlencode
    return env


def when(stamp: float) -> str:
    """A Unix time as local ``YYYY-MM-DD HH:MM:SS``."""
    import datetime

    return datetime.datetime.fromtimestamp(stamp).strftime("%Y-%m-%d %H:%M:%S")


# How the browser names a node's parts (the Node class's own messages speak Python).
PARTS = (
    "project, group and run of ASCII letters, digits, '_' and '-', a nonce of lowercase "
    "letters and digits"
)


def parse_node(text: str | None) -> Node:
    """The node a request names (``project.group.run~nonce~seq``), or a 404 in the browser's
    terms (how to write a node in the address, not how to build one in Python)."""
    try:
        return Node.deserialize(text or "")
    except (InvalidNodeError, ValueError):
        raise HTTPException(
            404,
            f"No node {text!r}: the browser names a node project.group.run~nonce~seq ({PARTS}, "
            "a seq from 0), e.g. lm.base.train~3f9a2c~12; the lineage pages link every node.",
        ) from None


def parse_lineage(text: str | None) -> tuple[str, str]:
    """The lineage a request names (``project.group.run~nonce``), or a 404 in the browser's
    terms."""
    parts = (text or "").split("~")
    try:
        if len(parts) != 2:
            raise ValueError(text)
        Node(parts[0], parts[1], 0)
    except (InvalidNodeError, ValueError):
        raise HTTPException(
            404,
            f"No lineage {text!r}: the browser names a lineage project.group.run~nonce ({PARTS}), "
            "e.g. lm.base.train~3f9a2c; the runs page lists every lineage.",
        ) from None
    return parts[0], parts[1]


def whole(request: Request, name: str, default: int, low: int = 0, high: int = 10**9) -> int:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError as err:
        raise HTTPException(400, f"{name} must be a whole number; got {raw!r}.") from err
    return min(max(value, low), high)


def log_scale(request: Request) -> bool:
    """Whether a curves request asks for a log scale (``log``: 1 yes, 0 or absent no), or a 400."""
    raw = request.query_params.get("log") or "0"
    if raw not in ("0", "1"):
        raise HTTPException(
            400,
            f"log must be 0 (linear) or 1 (log scale); got {raw!r}. Pass log=1 or leave it out.",
        )
    return raw == "1"


def choices(wanted: str, names: list[str]) -> str:
    """The sentence that lists the choices (closest to ``wanted`` first), or says there is none."""
    if not names:
        return "It holds none."
    close = difflib.get_close_matches(wanted, names, n=3)
    rest = [n for n in names if n not in close][: max(0, 12 - len(close))]
    more = len(names) - len(close) - len(rest)
    listed = ", ".join(repr(n) for n in [*close, *rest]) + (f" and {more} more" if more else "")
    return f"Choose one of {listed}."


def no_version(artifact: str, lineage: str, held: list[int], version: int) -> str:
    listed = ", ".join(str(v) for v in held) or "none"
    return (
        f"Artifact {artifact!r} along {lineage} has versions {listed}; not {version}. "
        "Pass version=newest (each node's newest) or one of them."
    )


class SecurityHeaders:
    """ASGI middleware: the CSP and the other security headers on every response."""

    HEADERS = (
        (b"content-security-policy", CSP.encode()),
        (b"x-content-type-options", b"nosniff"),
        (b"referrer-policy", b"no-referrer"),
        (b"cache-control", b"no-store"),
    )

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                names = {name for name, _ in self.HEADERS}
                kept = [(k, v) for k, v in message.get("headers", []) if k.lower() not in names]
                message = {**message, "headers": kept + list(self.HEADERS)}
            await send(message)

        await self.app(scope, receive, with_headers)
