"""What the train state costs in memory: said before the first step, checked before allocating.

`check_fits` runs at setup, after the state's layout is traced and before any of it is
allocated. It measures the parameters and the optimizer state from the layout's
abstract shapes (`jax.eval_shape`: shapes, dtypes and shardings, nothing allocated) and
compares what each device would keep with what the device can hold: its
`memory_stats()["bytes_limit"]` where the platform reports one (GPU, TPU), else the
machine's available memory, which the CPU devices of a process share. A state that
cannot fit is refused in one line that names both numbers and the settings to change;
without the check, XLA's allocation of a state many times the memory could block the
process for good, with nothing printed. Host zero decides, every host raises.

`describe_memory` is the line a run prints before its first step: the state's bytes
and each device's share, read from the arrays' own shardings.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from theseus.job import from_host_zero
from theseus.training._errors import TrainerError
from theseus.training.sharding import ParameterShardingContext, state_bytes

__all__ = [
    "available_memory",
    "check_fits",
    "describe_memory",
    "device_bytes",
    "refusal",
    "whole_bytes",
]

#: The parts of a train state the check counts (the step, a scalar, is left out).
PARTS = (("parameters", "params"), ("optimizer state", "opt_state"))


def device_bytes(tree: Any) -> dict[jax.Device, int]:
    """The bytes each device keeps of `tree`'s leaves: arrays, or `jax.ShapeDtypeStruct`s
    with a sharding (a layout's abstract state; nothing need be allocated).

    A leaf of shape `[d0, d1, ...]` split by its sharding costs each device that holds a
    piece `prod(shard_shape) * itemsize` bytes; leaves without a sharding count nothing.
    """
    kept: dict[jax.Device, int] = {}
    for leaf in jax.tree.leaves(tree):
        sharding = getattr(leaf, "sharding", None)
        if sharding is None or not hasattr(leaf, "shape"):
            continue
        piece = int(np.prod(sharding.shard_shape(leaf.shape))) * np.dtype(leaf.dtype).itemsize
        for device in sharding.device_set:
            kept[device] = kept.get(device, 0) + piece
    return kept


def available_memory() -> int | None:
    """The machine's available memory in bytes (`MemAvailable` of `/proc/meminfo`, else
    the free pages `sysconf` reports), or None where neither is known."""
    try:
        with open("/proc/meminfo", encoding="ascii") as lines:
            for line in lines:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024  # kB
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        return None


def _limit(device: jax.Device) -> int | None:
    """What `device` can hold: `memory_stats()["bytes_limit"]`, None where not reported."""
    try:
        stats = device.memory_stats()
    except Exception:  # a platform without memory statistics
        return None
    return int(stats["bytes_limit"]) if stats and "bytes_limit" in stats else None


def whole_bytes(tree: Any) -> int:
    """The bytes of `tree`'s array leaves at their global shapes (arrays or
    `jax.ShapeDtypeStruct`s), as one device would keep them unsharded."""
    return sum(
        int(np.prod(leaf.shape)) * np.dtype(leaf.dtype).itemsize
        for leaf in jax.tree.leaves(tree)
        if hasattr(leaf, "shape") and hasattr(leaf, "dtype")
    )


def refusal(
    abstract: Any,
    limit: Callable[[jax.Device], int | None] = _limit,
    available: Callable[[], int | None] = available_memory,
) -> tuple[str, bool] | None:
    """Why the state `abstract` (a `TrainState` of `ShapeDtypeStruct`s with shardings)
    cannot fit in this process's devices, or None when it can (or nothing is known).

    A device that reports `limit` must hold its own share; devices that do not (the
    CPU's) share the machine's `available` memory, so their shares add up against it.

    Returns:
        `(reason, own)`: what does not fit where, and whether it is a device with memory
        of its own (splitting the state over devices then helps).
    """
    local = set(jax.local_devices())
    trees = [getattr(abstract, name) for _, name in PARTS]
    kept = device_bytes(trees)
    need = {device: count for device, count in kept.items() if device in local}
    if not need:
        return None
    state = " + ".join(
        f"{label} {_gigabytes(whole_bytes(tree))}"
        for (label, _), tree in zip(PARTS, trees, strict=True)
    )
    shared = []
    for device, count in sorted(need.items(), key=lambda item: item[0].id):
        holds = limit(device)
        if holds is None:
            shared.append(count)
        elif count > holds:
            return (
                f"the model's state does not fit on {device.platform.upper()} device "
                f"{device.id}: {state}, of which the device keeps {_gigabytes(count)}, and "
                f"it holds {_gigabytes(holds)} (memory_stats bytes_limit)",
                True,
            )
    room = available() if shared else None
    if room is not None and sum(shared) > room:
        return (
            f"the model's state does not fit in this machine's memory: {state}, of which "
            f"the {len(shared)} CPU device(s) of this process keep {_gigabytes(sum(shared))}, "
            f"and {_gigabytes(room)} is available",
            False,
        )
    return None


def check_fits(abstract: Any, strategy: str, shard: int) -> None:
    """Refuse a train state that cannot fit, before anything is allocated (see the module).

    Args:
        abstract: the layout's abstract `TrainState` (`StateLayout.abstract`).
        strategy, shard: `training/strategy` and `training/shard`, named in the fix.

    Raises:
        TrainerError: on every host, when host zero's devices cannot hold the state.
    """
    refused = from_host_zero(lambda: refusal(abstract))
    if refused is None:
        return
    reason, own = refused
    fix = "Make the model smaller (architecture/n_embd, architecture/n_layers, architecture/vocab_size)"
    if own:  # devices with memory of their own: splitting the state over them helps
        fix += (
            f", or split the state over the devices (training/strategy = {strategy} now; "
            f"fsdp splits parameters and optimizer state; training/shard = {shard} now)"
        )
    raise TrainerError(f"{reason}. {fix}.")


def describe_memory(state: Any, sharding: ParameterShardingContext, name: str) -> str:
    """One line: the parameters' and optimizer state's bytes, and what one device keeps.

    Read from the arrays' own shardings, so it shows what `training/strategy` and
    `training/shard` really did (e.g. `fsdp` on 4 devices: each keeps a quarter).
    """
    parts = []
    for label, tree in (("parameters", state.params), ("optimizer state", state.opt_state)):
        if tree is None:  # imported weights, not trained here
            continue
        size = state_bytes(tree)
        parts.append(
            f"{label} {_megabytes(size.whole)}, each device keeps {_megabytes(size.device)} "
            f"({size.share:.0%})"
        )
    return (
        f"{name} state on {sharding.mesh.size} device(s) (training/strategy = "
        f"{sharding.strategy}, training/shard = {sharding.mesh.shape['shard']}): {'; '.join(parts)}"
    )


def _megabytes(count: int) -> str:
    return f"{count / 1e6:,.2f} MB"


def _gigabytes(count: int) -> str:
    return f"{count / 1e9:,.2f} GB"
