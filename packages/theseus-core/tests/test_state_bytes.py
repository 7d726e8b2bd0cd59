"""`state_bytes` against the bytes each device's shards really hold."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from theseus.training.sharding import make_mesh, state_bytes


def _held(tree) -> dict:
    """The reference: every addressable shard's own buffer, summed per device."""
    held: dict = {}
    for leaf in jax.tree.leaves(tree):
        for shard in getattr(leaf, "addressable_shards", ()):
            held[shard.device] = held.get(shard.device, 0) + shard.data.nbytes
    return held


@pytest.mark.parametrize("shard", [1, 2])
def test_bytes_per_device_equal_what_the_shards_hold(shard: int) -> None:
    if jax.device_count() < 4:
        pytest.skip("needs 4 (virtual) devices")
    mesh = make_mesh(shard, jax.devices()[:4])
    put = lambda x, *spec: jax.device_put(x, NamedSharding(mesh, PartitionSpec(*spec)))  # noqa: E731
    tree = {
        "split": put(jnp.ones((8, 12), jnp.float32), "batch"),  # rows over `batch`
        "both": put(jnp.ones((4, 6), jnp.bfloat16), "batch", "shard"),
        "whole": put(jnp.ones((5,), jnp.int32)),  # replicated
        "count": 3,  # not an array: counts for nothing
    }
    held = _held(tree)
    measured = state_bytes(tree)
    assert measured.whole == 8 * 12 * 4 + 4 * 6 * 2 + 5 * 4
    assert measured.device == max(held.values())
    rows = 4 // shard
    assert measured.device == 8 * 12 * 4 // rows + 4 * 6 * 2 // 4 + 5 * 4
    assert measured.share == pytest.approx(measured.device / measured.whole)


def test_an_empty_tree_is_whole_on_every_device() -> None:
    measured = state_bytes({"none": None, "numbers": (1, 2.0)})
    assert (measured.whole, measured.device, measured.share) == (0, 0, 1.0)
    host = state_bytes({"host": np.zeros(3)})  # NumPy arrays are not device arrays
    assert host.whole == 0
