"""Start the browser: find the store under ROOT, open it read-only, serve it with uvicorn."""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import sys
import threading
import time
import webbrowser
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from theseus.store._errors import StoreError
from theseus.store._place import locate
from theseus.store._store import Store

__all__ = ["LOOPBACK", "ServeError", "listen", "open_readonly", "running", "serve", "store_folder"]

LOOPBACK = ("127.0.0.1", "localhost", "::1")


def store_folder(root: str | os.PathLike[str]) -> Path:
    """The store folder ROOT names: a Theseus root's ``ROOT/store``, a store folder itself,
    or a ``postgresql://`` URL's (``theseus.store.locate``).

    Raises:
        NotAStoreError: no store is there (the message says what was found).
    """
    return locate(root).store


def open_readonly(root: str | os.PathLike[str]) -> Store:
    """Open the store under ``root`` read-only, checking now that it can be read.

    Raises:
        StoreError: a missing folder, not a store, a damaged or newer store.
    """
    store = Store(locate(root).opens, readonly=True)
    try:
        store.runs()  # reads the schema now: a damaged database fails here, not per page
    except BaseException:
        store.close()
        raise
    return store


#: The browser cannot listen where it was asked to (a bad port or host, a busy port): a
#: `StoreError` (the earlier name, kept for old imports; no caller told the two apart).
ServeError = StoreError


def listen(host: str, port: int) -> socket.socket:
    """A socket listening on ``host:port``, checked before anything is announced.

    Raises:
        ServeError: the port is out of range, the host is no address of this machine,
            or the port is taken (one line naming the option and how to fix it).
    """
    where = _address(host, port)
    _check_host(host, where)
    return _bind(host, port, where)


_Address = tuple[Any, Any, int, Any]


def _address(host: str, port: int) -> _Address:
    """Where ``host:port`` is: ``(family, type, proto, address)`` (checks both, binds nothing)."""
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ServeError(
            f"--port must be a whole number from 0 to 65535 (0: any free port); got {port!r}. "
            "Pass --port 8765, or another free port."
        )
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        return family, kind, proto, address
    except (socket.gaierror, UnicodeError) as err:
        raise ServeError(
            f"--host must be an address or name of this machine; got {host!r} "
            f"({getattr(err, 'strerror', None) or err}). Pass --host 127.0.0.1 (this machine "
            "only) or the address of one of its network interfaces."
        ) from None


def _check_host(host: str, where: _Address) -> None:
    """Nothing when ``host`` is an address of this machine (a throwaway socket binds to it,
    at a free port); else the ServeError of :func:`listen`. A busy port is not checked here."""
    family, kind, proto, address = where
    _bind(host, 0, (family, kind, proto, (address[0], 0, *address[2:]))).close()


def _bind(host: str, port: int, where: _Address) -> socket.socket:
    """A socket bound to ``where`` (see :func:`listen` for the errors)."""
    family, kind, proto, address = where
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        sock.bind(address)
        sock.listen(2048)  # connections wait from now on (uvicorn's default backlog)
    except OSError as err:
        sock.close()
        if err.errno == errno.EADDRINUSE:
            raise ServeError(
                f"port {port} on {host} is in use (another program listens there); "
                "pass --port to choose another (--port 0 picks a free one)."
            ) from None
        if err.errno == errno.EACCES:
            raise ServeError(
                f"--port {port} needs privileges this user lacks (ports below 1024 are "
                "reserved); pass --port with a number from 1024 to 65535."
            ) from None
        raise ServeError(
            f"--host {host!r} is not an address of this machine ({err.strerror or err}); "
            "pass --host 127.0.0.1 (this machine only) or the address of one of its "
            "network interfaces."
        ) from None
    return sock


def serve(
    root: str | os.PathLike[str], host: str = "127.0.0.1", port: int = 8765, open_: bool = False
) -> None:
    """Serve the browser of the store under ``root`` until interrupted.

    Checked in order before the address is printed: the port's range and the host
    (an address of this machine), then the warning for a host others can reach, then
    the port bound (a busy one fails after the warning).

    Raises:
        StoreError: the store under ``root`` cannot be read (see `open_readonly`).
        ServeError: the browser cannot listen on ``host:port`` (see :func:`listen`).
    """
    import uvicorn

    from theseus.store.ui._application import create_app

    store = open_readonly(root)
    try:
        where = _address(host, port)
        _check_host(host, where)
        loopback = host in LOOPBACK
        if not loopback:
            print(
                f"theseus-store ui: warning: serving on {host}, not 127.0.0.1: the store "
                f"{store.root} becomes readable by anyone who can reach this machine on that "
                "network (there is no login). Pass --host 127.0.0.1 to keep it local.",
                file=sys.stderr,
            )
        sock = _bind(host, port, where)
    except BaseException:
        store.close()
        raise
    try:
        allowed = ["127.0.0.1", "localhost", "[::1]"] if loopback else None
        app = create_app(store, allowed_hosts=allowed)
        shown = f"[{host}]" if ":" in host else host
        url = f"http://{shown}:{sock.getsockname()[1]}/"
        print(f"theseus-store ui: {store.root} (read-only) at {url}  (Ctrl-C stops)", flush=True)
        if open_:
            threading.Timer(1.0, webbrowser.open, (url,)).start()
        config = uvicorn.Config(app, log_level="warning")
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        sock.close()
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

    from theseus.store.ui._application import create_app

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
