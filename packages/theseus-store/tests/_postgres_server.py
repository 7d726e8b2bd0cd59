"""A private PostgreSQL server for the tests: Debian's binaries, a temporary folder, a free port.

``initdb`` refuses to run as root, so where the tests run as root the server's
commands run as the unprivileged ``postgres`` user (``runuser -u postgres --``), in a
folder under /tmp that user owns (pytest's own temporary folders are mode 0700 under
root). Authentication is ``trust`` on 127.0.0.1 only; the socket sits in the same
private folder. :func:`find_bin` looks for the server binaries in Debian's place
(``/usr/lib/postgresql/<major>/bin``) and on ``PATH``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

__all__ = ["PostgresServer", "find_bin", "running_server"]


def find_bin() -> Path | None:
    """The folder of ``initdb`` and ``pg_ctl`` (the newest Debian major first), or None."""
    debian = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/initdb"),
        key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit() else 0,
    )
    if debian:
        return debian[-1].parent
    found = shutil.which("initdb")
    return Path(found).parent if found else None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PostgresServer:
    """One server: ``start()`` makes its cluster and starts it, ``stop()`` removes both."""

    def __init__(self, bindir: Path) -> None:
        self.bindir = bindir
        self.port = _free_port()
        self.folder = Path(tempfile.mkdtemp(prefix="theseus-pg-", dir="/tmp"))
        self.data = self.folder / "data"
        self.as_postgres = os.geteuid() == 0
        self.user = "postgres" if self.as_postgres else os.environ.get("USER", "postgres")

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        command = [str(self.bindir / args[0]), *args[1:]]
        if self.as_postgres:
            command = ["runuser", "-u", "postgres", "--", *command]
        return subprocess.run(command, check=check, capture_output=True, text=True, timeout=120)

    def start(self) -> None:
        """Make the cluster (trust, UTF-8, C.UTF-8) and start the server on 127.0.0.1."""
        self.folder.chmod(0o755)
        if self.as_postgres:
            shutil.chown(self.folder, "postgres", "postgres")
        user = ["-U", self.user] if not self.as_postgres else []
        self._run(
            "initdb", "-D", str(self.data), "-A", "trust", "-E", "UTF8", "--locale=C.UTF-8", *user
        )
        self.resume()

    def resume(self) -> None:
        """Start the (stopped) server again, on the same port."""
        options = (
            f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.folder} "
            "-c fsync=off -c max_connections=200"
        )
        self._run(
            "pg_ctl",
            "-D",
            str(self.data),
            "-l",
            str(self.folder / "log"),
            "-w",
            "-o",
            options,
            "start",
        )

    def halt(self, mode: str = "fast") -> None:
        """Stop the server (its files stay; :meth:`resume` starts it again)."""
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop", check=False)

    def stop(self) -> None:
        """Stop the server and remove its folder."""
        self.halt("immediate")
        shutil.rmtree(self.folder, ignore_errors=True)

    def url(self, database: str) -> str:
        """The URL of ``database`` on this server (no password: trust)."""
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str | None = None) -> str:
        """Create a new, empty database and return its name."""
        name = name or f"t{uuid.uuid4().hex[:12]}"
        self._run("createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", self.user, name)
        return name


@contextlib.contextmanager
def running_server() -> Iterator[PostgresServer]:
    """A started server for the block; stopped and removed after it."""
    bindir = find_bin()
    if bindir is None:
        raise RuntimeError("PostgreSQL's initdb is not installed (apt-get install postgresql)")
    server = PostgresServer(bindir)
    try:
        server.start()
        yield server
    finally:
        server.stop()
