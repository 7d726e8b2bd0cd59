"""The checks across a trainer's settings that the configuration alone can decide.

Each is a :func:`theseus.config.rule` attached to a field of `BaseTrainerConfig`; it runs
when the configuration is checked (a job is constructed, `theseus configure` writes a
file), before anything is written. What depends on the devices (the batch split over
the data-parallel devices) is still checked when the trainer sets up.
"""

from __future__ import annotations

from theseus.config import rule

__all__ = ["MAX_SEED", "MAX_STEPS", "micro_batches", "one_batch"]

#: The largest seed (`training/seed`, `data/seed`): JAX keys and numpy generators take 63 bits.
MAX_SEED = 2**63 - 1
#: The most optimizer steps a run may take: the step counter is a 32-bit integer on the device.
MAX_STEPS = 2**31 - 1


@rule("training/tokens", "training/batch_size", "architecture/block_size")
def one_batch(tokens: int, batch_size: int, block_size: int) -> str | None:
    """`training/tokens` covers at least one batch (`total_steps` = tokens // batch tokens) and
    at most `MAX_STEPS` of them."""
    batch = batch_size * block_size
    if tokens // batch > MAX_STEPS:
        return (
            f"Configuration value for 'training/tokens' must be at most {MAX_STEPS:,} steps of "
            f"{batch} tokens ({MAX_STEPS * batch:,} tokens: the step counter is a 32-bit "
            f"integer); got {tokens:,}. Set `training.tokens={MAX_STEPS * batch}` or less, or make "
            "the batch larger."
        )
    if tokens >= batch:
        return None
    return (
        f"Configuration value for 'training/tokens' must be at least one batch, "
        f"training/batch_size x architecture/block_size = {batch_size} x {block_size} = "
        f"{batch} tokens; got {tokens}. Set `training.tokens={batch}` or more (a multiple of "
        f"{batch} trains whole steps), or make the batch smaller."
    )


@rule("training/batch_size", "training/per_device_batch_size")
def micro_batches(batch_size: int, per_device: int) -> str | None:
    """`training/batch_size` splits into micro-batches of `training/per_device_batch_size` rows."""
    if per_device == 0 or batch_size % per_device == 0:
        return None
    return (
        f"Configuration value for 'training/per_device_batch_size' must divide "
        f"training/batch_size ({batch_size}) into whole micro-batches (or be 0: no "
        f"accumulation); got {per_device}. Set training/per_device_batch_size to a divisor "
        f"of {batch_size} or 0, or training/batch_size to a multiple of {per_device}."
    )
