"""The mesh's refusal of a `training/shard` that does not divide the devices."""

from __future__ import annotations

import jax
import pytest

from theseus.config import ConfigError
from theseus.training.sharding import make_mesh


@pytest.mark.parametrize(
    ("count", "shard", "fits"), [(4, 3, "1, 2, 4"), (4, 0, "1, 2, 4"), (3, 2, "1, 3")]
)
def test_a_shard_that_does_not_divide_the_devices_names_every_value_that_does(
    count: int, shard: int, fits: str
) -> None:
    if jax.device_count() < count:
        pytest.skip(f"needs {count} (virtual) devices")
    with pytest.raises(ConfigError) as caught:
        make_mesh(shard, jax.devices()[:count])
    message = str(caught.value)
    assert message == (
        f"training/shard = {shard} must divide the number of devices ({count}); "
        f"set training/shard to one of {fits}"
    )
    for working in fits.split(", "):  # each value it names builds a mesh
        assert make_mesh(int(working), jax.devices()[:count]).shape["shard"] == int(working)
