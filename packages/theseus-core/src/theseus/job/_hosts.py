"""Which host this process is, a barrier, and host zero's answers (JAX only when in use).

Only host zero opens the store's database: SQLite's WAL mode needs memory shared on one
machine, and readers on other machines of a network file system can see torn pages.
What the other hosts need from it (the node to resume, its configuration, the
checkpoint to restore) host zero reads and broadcasts with :func:`from_host_zero`.
"""

from __future__ import annotations

import pickle
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn, TypeVar, cast

from theseus.job._errors import JobError
from theseus.store import Store, StoreError

T = TypeVar("T")


def process_index() -> int:
    """This process's index among the JAX processes (0 when JAX is not imported)."""
    if "jax" not in sys.modules:
        return 0
    import jax

    return int(jax.process_index())


def process_count() -> int:
    """The number of JAX processes (1 when JAX is not imported)."""
    if "jax" not in sys.modules:
        return 1
    import jax

    return int(jax.process_count())


def is_primary() -> bool:
    """Whether this process is host zero, the only one that writes to the store."""
    return process_index() == 0


def sync_hosts(tag: str) -> None:
    """Wait until every JAX process reaches the barrier named ``tag`` (no-op on one host).

    Args:
        tag: a name every host passes in the same order.
    """
    if process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(tag)


_NONCE_BYTES = 64


def agree_on_nonce(nonce: str) -> str:
    """Return host zero's ``nonce`` on every host (``Node.new`` draws a random one per host).

    Args:
        nonce: this host's candidate (lowercase letters and digits, at most 64 characters).

    Returns:
        Host zero's nonce; ``nonce`` itself on one host.
    """
    if process_count() == 1:
        return nonce
    import numpy as np
    from jax.experimental import multihost_utils

    raw = np.zeros(_NONCE_BYTES, dtype=np.uint8)
    encoded = nonce.encode("ascii")[:_NONCE_BYTES]
    raw[: len(encoded)] = np.frombuffer(encoded, dtype=np.uint8)
    agreed = np.asarray(multihost_utils.broadcast_one_to_all(raw))
    return bytes(agreed.astype(np.uint8)).rstrip(b"\0").decode("ascii")


def from_host_zero(compute: Callable[[], T]) -> T:
    """Run ``compute`` on host zero alone and return its result on every host.

    Every host calls this at the same point (it is a collective); ``compute`` runs on
    host zero only, so it may read the store, and the other hosts never do. The result
    travels pickled. An exception raised by ``compute`` is raised on every host (host
    zero's own, with its traceback; a copy on the others), so no host waits at a later
    collective for one that has failed.

    Args:
        compute: the read to run (it must be picklable in its result).

    Returns:
        What ``compute`` returned on host zero.
    """
    if process_count() == 1:
        return compute()
    failure: BaseException | None = None
    payload = b""
    if is_primary():
        try:
            payload = pickle.dumps((True, compute()))
        except Exception as err:
            failure = err
            try:
                payload = pickle.dumps((False, err))
            except Exception:  # an exception that does not pickle: send what it says
                payload = pickle.dumps((False, JobError(f"{type(err).__name__}: {err}")))
    received = _broadcast_bytes(payload)
    if failure is not None:
        raise failure
    ok, value = pickle.loads(received)  # host zero of this same job sent it
    if not ok:
        raise value
    return value


def _broadcast_bytes(payload: bytes) -> bytes:
    """Host zero's ``payload`` on every host (the others pass anything; it is ignored)."""
    import numpy as np
    from jax.experimental import multihost_utils

    size = int(np.asarray(multihost_utils.broadcast_one_to_all(np.int32(len(payload)))))
    bucket = max(256, 1 << (size - 1).bit_length())  # few shapes, so few compilations
    raw = np.zeros(bucket, dtype=np.uint8)
    raw[: len(payload)] = np.frombuffer(payload, dtype=np.uint8)
    agreed = np.asarray(multihost_utils.broadcast_one_to_all(raw))
    return bytes(agreed[:size].astype(np.uint8))


class HostZeroStore:
    """The store as a host other than zero holds it: its folder, never its database.

    Reading the store on these hosts is a mistake that would work on one machine and
    tear on a network file system, so every use but :attr:`root`, :meth:`close` and
    :meth:`discard_if_empty` raises a one-line error saying what to do instead.

    Args:
        root: the store's folder (``ROOT/store``), as host zero opened it.
    """

    def __init__(self, root: Path) -> None:
        self.root = root

    def close(self) -> None:
        """Nothing to close: this host never opened the database."""

    def discard_if_empty(self) -> bool:
        """False: host zero decides whether the store is discarded."""
        return False

    def __enter__(self) -> HostZeroStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getattr__(self, name: str) -> NoReturn:
        raise StoreError(
            f"store.{name} on host {process_index()}: only host zero opens the store at "
            f"{self.root} (SQLite is not safe to read from several machines). Use it on "
            f"host zero (inside `if theseus.job.is_primary():`), or have every host call "
            f"theseus.job.from_host_zero(lambda: store.{name}(...)) at the same point."
        )

    def __repr__(self) -> str:
        return f"<HostZeroStore {self.root} (host {process_index()}: database not opened)>"


def open_store(root: Path) -> Store:
    """The store at ``root`` on host zero; on the other hosts, a :class:`HostZeroStore`."""
    if is_primary():
        return Store(root)
    return cast("Store", HostZeroStore(root))
