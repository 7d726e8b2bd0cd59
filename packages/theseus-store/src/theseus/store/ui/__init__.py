"""``theseus-store ui``: a read-only local web browser of a store.

Needs the ``ui`` extra (``pip install "theseus-store[ui]"``: Starlette, uvicorn,
Jinja2, pypdfium2); never JAX. The store is opened read-only (SQLite
``mode=ro``), so the browser runs beside a training run that writes it.
"""

from theseus.store.ui._application import create_app
from theseus.store.ui._downsample import downsample
from theseus.store.ui._serve import LOOPBACK, ServeError, open_readonly, running, serve
from theseus.store.ui._web import CSP

__all__ = [
    "CSP",
    "LOOPBACK",
    "ServeError",
    "create_app",
    "downsample",
    "open_readonly",
    "running",
    "serve",
]
