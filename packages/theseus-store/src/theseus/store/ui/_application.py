"""The store browser's web application: its routes, security middleware and error pages.

``create_app(store)`` returns a Starlette application over a store opened read-only:
each route is answered by ``_app.Browser``, every response carries the security headers
of ``_web`` (a Content-Security-Policy allowing the server's own scripts, styles and
images only), an optional ``Host`` check guards against DNS rebinding, and an error is
a page (under ``/api/``, JSON ``{"error": "..."}``) with its status, never a traceback.
"""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from theseus.store._errors import StoreError
from theseus.store._store import Store
from theseus.store.ui._app import Browser
from theseus.store.ui._web import SecurityHeaders

__all__ = ["create_app"]


def create_app(store: Store, allowed_hosts: list[str] | None = None) -> Starlette:
    """The browser over ``store`` (open it with ``Store(path, readonly=True)``).

    Args:
        store: the store to show; the application never writes it.
        allowed_hosts: the ``Host`` headers to answer (a guard against DNS
            rebinding); None answers any.
    """
    browser = Browser(store)

    async def error(request: Request, exc: Exception) -> Response:
        """The error page; under /api/ JSON ``{"error": detail}`` (a 500 for a StoreError)."""
        code = exc.status_code if isinstance(exc, HTTPException) else 500
        detail = exc.detail if isinstance(exc, HTTPException) else str(exc)
        if request.url.path.startswith("/api/"):
            return JSONResponse({"error": detail}, status_code=code)
        html = browser.env.get_template("error.html").render(
            root=browser.shown, code=code, detail=detail
        )
        return HTMLResponse(html, status_code=code)

    routes = [
        Route("/", browser.runs),
        Route("/lineage/{lineage}", browser.lineage),
        Route("/node/{node}", browser.node),
        Route("/artifact", browser.artifact_page),
        Route("/raw", browser.raw),
        Route("/png", browser.png),
        Route("/curves", browser.curves),
        Route("/slider", browser.slider),
        Route("/features", browser.features),
        Route("/compare", browser.compare),
        Route("/api/runs", browser.runs_json),
        Route("/api/lineage", browser.lineage_json),
        Route("/api/series", browser.series),
        Route("/api/frames", browser.frames),
        Route("/static/{name}", browser.static_file),
        Route("/favicon.ico", lambda request: Response(status_code=204)),
    ]
    middleware = [Middleware(SecurityHeaders)]
    if allowed_hosts is not None:
        middleware.append(Middleware(TrustedHostMiddleware, allowed_hosts=allowed_hosts))
    return Starlette(
        routes=routes,
        middleware=middleware,
        exception_handlers={HTTPException: error, StoreError: error},
    )
