"""Where arrays live: the device mesh, logical-axis rules, and batch placement.

The mesh has two axes: `batch` (data parallel) and `shard` (parameters split along
their `heads`, `mlp` and `vocab` axes: tensor parallelism). With `training/shard = 1`
(the default) every device holds a slice of the batch.

`training/strategy` says where the train state is *kept* between steps; the forward and
backward always follow `parameter_fwdbwd_mapping`:

- `dp`: every data-parallel device keeps the whole state (less what `shard` splits).
- `zero1`: the optimizer state is split along its `embed` axis over `batch`; the
  parameters stay whole. Each device updates its slice of the moments, and the
  parameters' update is gathered (ZeRO stage 1).
- `fsdp`: parameters, gradients and optimizer state are split that way; XLA gathers
  each parameter where the forward and backward use it and reduce-scatters its
  gradient (fully sharded data parallel).

The same code runs on one CPU, on N virtual devices, and on several hosts under
`jax.distributed`.
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

__all__ = [
    "AXIS_SETTINGS",
    "DEFAULT_RULES",
    "STRATEGIES",
    "ParameterShardingContext",
    "StateBytes",
    "make_mesh",
    "state_bytes",
]

Rules = tuple[tuple[str, str | None], ...]

DEFAULT_RULES: Rules = (
    ("batch", "batch"),
    ("length", None),
    ("embed", None),
    ("heads", "shard"),
    ("mlp", "shard"),
    ("vocab", "shard"),
)

STRATEGIES = ("dp", "zero1", "fsdp")

# The logical axis a sharded strategy splits over the data-parallel devices: every
# parameter of the built-in models has one (its width, `architecture/n_embd`).
STORED_AXIS = "embed"

# The setting each built-in logical axis's size comes from, for error messages.
AXIS_SETTINGS = {
    "vocab": "architecture/vocab_size",
    "heads": "architecture/n_embd (split into architecture/n_head heads; "
    "architecture/n_kv_head of them for keys and values)",
    "mlp": "architecture/mlp_width (or architecture/mlp_ratio x architecture/n_embd)",
    "embed": "architecture/n_embd",
}


@dataclass(frozen=True)
class StateBytes:
    """The bytes of a pytree of arrays: in all, and the most that one device keeps.

    Attributes:
        whole: the bytes of every leaf at its global shape (what one device would keep
            unsharded).
        device: the most bytes any one device keeps of it, from each leaf's shard shape.
    """

    whole: int
    device: int

    @property
    def share(self) -> float:
        """`device / whole`: 1 when every device keeps all of it, 1/N when N split it."""
        return self.device / self.whole if self.whole else 1.0


def state_bytes(tree: Any) -> StateBytes:
    """Measure what a pytree of (possibly sharded) `jax.Array`s costs each device.

    Non-array leaves count for nothing. A device's bytes are the sizes of the shards it
    keeps (`sharding.shard_shape` of each leaf, summed per device over the leaves).
    """
    whole = 0
    per_device: dict[Any, int] = {}
    for leaf in jax.tree.leaves(tree):
        if not isinstance(leaf, jax.Array):
            continue
        whole += leaf.nbytes
        shard = int(np.prod(leaf.sharding.shard_shape(leaf.shape))) * leaf.dtype.itemsize
        for device in leaf.sharding.device_set:
            per_device[device] = per_device.get(device, 0) + shard
    return StateBytes(whole, max(per_device.values(), default=0))


def make_mesh(shard: int = 1, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A `(batch, shard)` mesh over all devices (of every process).

    Raises:
        ConfigError: `shard` does not divide the device count (the message lists the
            values that do).
    """
    devices = list(jax.devices() if devices is None else devices)
    if shard < 1 or len(devices) % shard:
        count = len(devices)
        fits = ", ".join(str(d) for d in range(1, count + 1) if count % d == 0)
        raise ConfigError(
            f"training/shard = {shard} must divide the number of devices ({count}); "
            f"set training/shard to one of {fits}"
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
    strategy: str = "dp"

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ConfigError(
                f"training/strategy = {self.strategy!r} is not a strategy; choose one of "
                f"{', '.join(STRATEGIES)}"
            )

    @classmethod
    def create(cls, shard: int = 1, strategy: str = "dp") -> ParameterShardingContext:
        """A context over every device with the default rules."""
        return cls(make_mesh(shard), strategy=strategy)

    @property
    def storage_rules(self) -> Rules:
        """The rules of a sharded strategy's state: `embed` over `batch`, the rest as the forward's."""
        return tuple(
            (name, "batch" if name == STORED_AXIS else axis)
            for name, axis in self.parameter_fwdbwd_mapping
        )

    def state_shardings(self, boxed: Any) -> Any:
        """The `NamedSharding`s a train state (`params`, `opt_state`, ...) is kept in.

        Args:
            boxed: the abstract state with logically partitioned leaves.

        Raises:
            ConfigError: a dimension the strategy or `training/shard` splits does not
                divide evenly (see `check_divisible`).
        """
        forward = self.shardings_of(boxed)
        if self.strategy == "dp":
            return forward
        stored = self.shardings_of(boxed, self.storage_rules)
        if self.strategy == "fsdp":
            return stored
        return forward.replace(opt_state=stored.opt_state)  # zero1

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

    def shardings_of(self, boxed: Any, rules: Rules | None = None) -> Any:
        """NamedShardings for a pytree of logically partitioned (boxed) values.

        Args:
            boxed: the values.
            rules: the logical-axis rules (default: the forward's).

        Raises:
            ConfigError: a dimension split over a mesh axis is not divisible by that
                axis's size (see `check_divisible`).
        """
        rules = self.parameter_fwdbwd_mapping if rules is None else rules
        self.check_divisible(boxed, rules)
        specs = nn.get_partition_spec(boxed)
        return nn.logical_to_mesh_sharding(specs, self.mesh, list(rules))

    def place_batch(self, batch: dict[str, np.ndarray]) -> dict[str, jax.Array]:
        """Assemble global arrays from this process's rows (`[rows_here, ...]` each)."""
        return {
            key: jax.make_array_from_process_local_data(self.batch_sharding(value.ndim), value)
            for key, value in batch.items()
        }

    def check_divisible(self, boxed: Any, rules: Rules | None = None) -> None:
        """Refuse a parameter whose sharded dimension the mesh cannot split evenly.

        Each dimension of a boxed leaf whose logical axis a rule maps to a mesh axis
        must be a multiple of that axis's size. The message names the logical axis, the
        setting it usually comes from, the parameter, its size and the shard counts that
        divide it (or, for a strategy's split over the data-parallel devices, the
        strategies and device counts that work), instead of JAX's `IndivisibleError`
        from deep inside the setup.

        Raises:
            ConfigError: for the first dimension that does not divide.
        """
        mapping = dict(self.parameter_fwdbwd_mapping if rules is None else rules)
        leaves = jax.tree_util.tree_flatten_with_path(
            boxed, is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned)
        )[0]
        for path, leaf in leaves:
            if not isinstance(leaf, nn.LogicallyPartitioned):
                continue
            for size, name in zip(leaf.value.shape, leaf.names, strict=False):
                if name is None:
                    continue
                axis = mapping.get(name)
                if axis is None or axis not in self.mesh.shape:
                    continue
                ways = int(self.mesh.shape[axis])
                if size % ways:
                    where = jax.tree_util.keystr(path, simple=True, separator="/")
                    devices = self.mesh.devices.size
                    setting = AXIS_SETTINGS.get(name, f"the size of logical axis {name!r}")
                    if axis == "batch":
                        fits = [d for d in range(1, ways + 1) if ways % d == 0 and size % d == 0]
                        raise ConfigError(
                            f"training/strategy = {self.strategy} splits logical axis "
                            f"{name!r} (size {size}, from {setting}) of {where} over the "
                            f"{ways} data-parallel devices, and {size} is not a multiple of "
                            f"{ways}. Use training/strategy = dp, or make {setting} a "
                            f"multiple of {ways}, or set training/shard so that "
                            f"devices / shard divides {size} (it is {ways}; "
                            f"{', '.join(map(str, fits))} would)"
                        )
                    fits = [d for d in range(1, devices + 1) if devices % d == 0 and size % d == 0]
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
