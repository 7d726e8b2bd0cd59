"""Where arrays live: the device mesh, logical-axis rules, and batch placement.

The mesh has two axes: `batch` (data parallel) and `shard` (parameters split along
their `heads`, `mlp` and `vocab` axes). With `training/shard = 1` (the default) every
device holds all parameters and a slice of the batch. The same code runs on one CPU,
on N virtual devices, and on several hosts under `jax.distributed`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from theseus.config import ConfigError

__all__ = ["AXIS_SETTINGS", "DEFAULT_RULES", "ParameterShardingContext", "make_mesh"]

Rules = tuple[tuple[str, str | None], ...]

DEFAULT_RULES: Rules = (
    ("batch", "batch"),
    ("length", None),
    ("embed", None),
    ("heads", "shard"),
    ("mlp", "shard"),
    ("vocab", "shard"),
)

# The setting each built-in logical axis's size comes from, for error messages.
AXIS_SETTINGS = {
    "vocab": "architecture/vocab_size",
    "heads": "architecture/n_embd (split into architecture/n_head heads)",
    "mlp": "architecture/mlp_ratio x architecture/n_embd",
    "embed": "architecture/n_embd",
}


def make_mesh(shard: int = 1, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A `(batch, shard)` mesh over all devices (of every process).

    Raises:
        ValueError: the device count is not a multiple of `shard`.
    """
    devices = list(jax.devices() if devices is None else devices)
    if shard < 1 or len(devices) % shard:
        raise ConfigError(
            f"training/shard = {shard} must divide the number of devices ({len(devices)}); "
            "choose a divisor such as 1"
        )
    grid = np.asarray(devices, dtype=object).reshape(len(devices) // shard, shard)
    return Mesh(grid, ("batch", "shard"))


@dataclass(frozen=True)
class ParameterShardingContext:
    """The mesh and the logical-axis rules that parameters and activations follow.

    Attributes:
        mesh: a `jax.sharding.Mesh` with axes `batch` and `shard`.
        parameter_fwdbwd_mapping: logical-axis rules for `nn.logical_axis_rules`, used
            in the forward and backward passes.
    """

    mesh: Mesh
    parameter_fwdbwd_mapping: Rules = DEFAULT_RULES

    @classmethod
    def create(cls, shard: int = 1) -> ParameterShardingContext:
        """A context over every device with the default rules."""
        return cls(make_mesh(shard))

    @property
    def data_parallel(self) -> int:
        """How many ways the batch is split."""
        return int(self.mesh.shape["batch"])

    def batch_sharding(self, ndim: int = 2) -> NamedSharding:
        """Rows split over `batch`, everything else replicated."""
        return NamedSharding(self.mesh, PartitionSpec("batch", *([None] * (ndim - 1))))

    def replicated(self) -> NamedSharding:
        """A value every device holds whole."""
        return NamedSharding(self.mesh, PartitionSpec())

    def shardings_of(self, boxed: Any) -> Any:
        """NamedShardings for a pytree of logically partitioned (boxed) values.

        Raises:
            ConfigError: a dimension split over a mesh axis is not divisible by that
                axis's size (see `check_divisible`).
        """
        self.check_divisible(boxed)
        specs = nn.get_partition_spec(boxed)
        return nn.logical_to_mesh_sharding(specs, self.mesh, list(self.parameter_fwdbwd_mapping))

    def place_batch(self, batch: dict[str, np.ndarray]) -> dict[str, jax.Array]:
        """Assemble global arrays from this process's rows (`[rows_here, ...]` each)."""
        return {
            key: jax.make_array_from_process_local_data(self.batch_sharding(value.ndim), value)
            for key, value in batch.items()
        }

    def check_divisible(self, boxed: Any) -> None:
        """Refuse a parameter whose sharded dimension the mesh cannot split evenly.

        Each dimension of a boxed leaf whose logical axis a rule maps to a mesh axis
        must be a multiple of that axis's size. The message names the logical axis, the
        setting it usually comes from, the parameter, its size and the shard counts that
        divide it, instead of JAX's `IndivisibleError` from deep inside the setup.

        Raises:
            ConfigError: for the first dimension that does not divide.
        """
        rules = dict(self.parameter_fwdbwd_mapping)
        leaves = jax.tree_util.tree_flatten_with_path(
            boxed, is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned)
        )[0]
        for path, leaf in leaves:
            if not isinstance(leaf, nn.LogicallyPartitioned):
                continue
            for size, name in zip(leaf.value.shape, leaf.names, strict=False):
                if name is None:
                    continue
                axis = rules.get(name)
                if axis is None or axis not in self.mesh.shape:
                    continue
                ways = int(self.mesh.shape[axis])
                if size % ways:
                    where = jax.tree_util.keystr(path, simple=True, separator="/")
                    devices = self.mesh.devices.size
                    fits = [d for d in range(1, devices + 1) if devices % d == 0 and size % d == 0]
                    setting = AXIS_SETTINGS.get(name, f"the size of logical axis {name!r}")
                    raise ConfigError(
                        f"training/{axis} = {ways} cannot split logical axis {name!r} "
                        f"(size {size}, from {setting}) of parameter {where}: {size} is not "
                        f"a multiple of {ways}. Choose training/{axis} among "
                        f"{', '.join(map(str, fits))} (they divide both {size} and the {devices} "
                        f"devices), or change {setting} to a "
                        f"multiple of {ways}"
                    )

    def rules(self) -> Any:
        """The context manager that activates the logical-axis rules."""
        return nn.logical_axis_rules(list(self.parameter_fwdbwd_mapping))
