"""Which host this process is, and a barrier across hosts (JAX only when it is in use)."""

from __future__ import annotations

import sys


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
