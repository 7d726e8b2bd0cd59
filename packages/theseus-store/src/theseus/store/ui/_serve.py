"""Start the browser: find the store under ROOT, open it read-only, serve it with uvicorn."""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading
import time
import webbrowser
from collections.abc import Iterator
from pathlib import Path

from theseus.store._store import MARKER, Store

__all__ = ["LOOPBACK", "open_readonly", "running", "serve", "store_folder"]

LOOPBACK = ("127.0.0.1", "localhost", "::1")


def store_folder(root: str | os.PathLike[str]) -> Path:
    """The store folder ROOT names: ROOT itself if it holds the marker, else ROOT/store.

    Raises:
        NotAStoreError: neither holds a store (the message says what was found).
    """
    from theseus.store._errors import NotAStoreError

    path = Path(root)
    if (path / MARKER).is_file():
        return path
    if (path / "store" / MARKER).is_file():
        return path / "store"
    if not path.exists():
        raise NotAStoreError(
            f"{path} does not exist. Pass a Theseus root (its store is ROOT/store) or a "
            "store folder (the one that holds theseus-store.json)."
        )
    if path.is_file():
        raise NotAStoreError(
            f"{path} is a file, not a store folder. Pass the folder that holds {MARKER} "
            "(a Theseus root keeps it in ROOT/store)."
        )
    raise NotAStoreError(
        f"{path} is not a theseus-store root (no {MARKER} in it or in {path / 'store'}). "
        "Pass a Theseus root or a store folder; the browser never creates one."
    )


def open_readonly(root: str | os.PathLike[str]) -> Store:
    """Open the store under ``root`` read-only, checking now that it can be read.

    Raises:
        StoreError: a missing folder, not a store, a damaged or newer store.
    """
    store = Store(store_folder(root), readonly=True)
    try:
        store.runs()  # reads the schema now: a damaged database fails here, not per page
    except BaseException:
        store.close()
        raise
    return store


def serve(
    root: str | os.PathLike[str], host: str = "127.0.0.1", port: int = 8765, open_: bool = False
) -> None:
    """Serve the browser of the store under ``root`` until interrupted."""
    import uvicorn

    from theseus.store.ui._app import create_app

    store = open_readonly(root)
    loopback = host in LOOPBACK
    if not loopback:
        print(
            f"theseus-store ui: warning: serving on {host}, not 127.0.0.1: the store "
            f"{store.root} becomes readable by anyone who can reach this machine on that "
            "network (there is no login). Pass --host 127.0.0.1 to keep it local.",
            file=sys.stderr,
        )
    allowed = ["127.0.0.1", "localhost", "[::1]"] if loopback else None
    app = create_app(store, allowed_hosts=allowed)
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{port}/"
    print(f"theseus-store ui: {store.root} (read-only) at {url}  (Ctrl-C stops)", flush=True)
    if open_:
        threading.Timer(1.0, webbrowser.open, (url,)).start()
    try:
        uvicorn.run(app, host=host, port=port, log_level="warning")
    finally:
        store.close()


@contextlib.contextmanager
def running(root: str | os.PathLike[str], start_timeout: float = 20.0) -> Iterator[str]:
    """Serve the browser of the store under ``root`` on a thread while the block runs.

    For scripts, tests and notebooks: the server listens on 127.0.0.1 at a free port,
    the block gets its URL (``http://127.0.0.1:PORT``, no trailing slash), and leaving
    the block stops the server and closes the store.

    Example:
        >>> with running("theseus-demo") as url:  # doctest: +SKIP
        ...     print(url + "/")

    Raises:
        StoreError: the store under ``root`` cannot be read (see `open_readonly`).
        TimeoutError: the server did not start within ``start_timeout`` seconds.
    """
    import uvicorn

    from theseus.store.ui._app import create_app

    store = open_readonly(root)
    sock = socket.socket()
    try:
        sock.bind(("127.0.0.1", 0))
        app = create_app(store, allowed_hosts=["127.0.0.1"])
        # log_config=None: a helper inside someone's process leaves their logging alone
        # (uvicorn's default configures handlers on the sys.stderr of the moment).
        config = uvicorn.Config(app, log_level="warning", log_config=None)
        server = uvicorn.Server(config)
        thread = threading.Thread(
            target=server.run, kwargs={"sockets": [sock]}, name="theseus-store-ui", daemon=True
        )
        thread.start()
        try:
            deadline = time.monotonic() + start_timeout
            while not server.started:
                if not thread.is_alive() or time.monotonic() > deadline:
                    raise TimeoutError(
                        f"the store browser of {store.root} did not start within "
                        f"{start_timeout:g} s"
                    )
                time.sleep(0.02)
            yield f"http://127.0.0.1:{sock.getsockname()[1]}"
        finally:
            server.should_exit = True
            thread.join(start_timeout)
    finally:
        sock.close()
        store.close()
