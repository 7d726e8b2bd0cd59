"""Device memory of a benchmark: the peak bytes in use, and one line when it runs out.

A benchmark that asks for more device memory than the chip has gets JAX's
``RESOURCE_EXHAUSTED`` error, at compile time (XLA:TPU sums the program's buffers first)
or when a buffer is allocated; ``exit_on_out_of_memory`` turns it into one line on stderr
and exit status 1, never a traceback::

    out of memory: train step (GPT 24x1024, batch 32) needs about 21.95 GiB; the device
    has 15.48 GiB; try --batch 16 or --remat block

``peak_bytes()`` is ``memory_stats()['peak_bytes_in_use']`` of the first local device
where the backend reports it (TPU, GPU), else None (JAX's CPU backend reports nothing).
On a TPU v5e it leaves out what a program allocates for its own temporaries: the 124M
GPT's trainer read 1.53 GiB at batch 32, its parameters and AdamW moments (1.39 GiB)
and little else. ``program_bytes(compiled)`` is what XLA planned for one compiled
program instead (``memory_analysis()``: arguments, outputs not aliased to a donated
argument, temporaries), the same on every backend.

Example:
    >>> oom_line("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 2147483648 "
    ...          "bytes.", what="sae", advice="--tokens 2048")
    'out of memory: sae needs about 2.00 GiB more; try --tokens 2048'
"""

from __future__ import annotations

import contextlib
import re
import sys
from collections.abc import Iterator
from typing import Any

__all__ = [
    "exit_on_out_of_memory",
    "gigabytes",
    "is_out_of_memory",
    "oom_line",
    "peak_bytes",
    "program_bytes",
]

_UNITS = {"": 1, "B": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
_SIZE = r"([0-9.]+)\s*([KMGT]?)(?:i?B)?"
# XLA:TPU at compile time: "Ran out of memory in memory space hbm. Used 21.95G of 15.48G hbm."
_COMPILE = re.compile(rf"Used {_SIZE} of {_SIZE} hbm")
# PJRT on a TPU at allocation: "Attempting to allocate 3.00G. That was not possible. There
# are 1.23G free."
_ALLOCATE = re.compile(rf"Attempting to allocate {_SIZE}\..*?There are {_SIZE} free", re.S)
# XLA on a GPU or CPU: "Out of memory while trying to allocate 285212672 bytes."
_BYTES = re.compile(r"trying to allocate ([0-9]+) bytes")


def _bytes(number: str, unit: str) -> float:
    """`("15.48", "G")` -> bytes (XLA prints binary units: G is 2**30)."""
    return float(number) * _UNITS[unit]


def gigabytes(n: float) -> str:
    """Bytes in GiB (as XLA and `memory_stats` count), two decimals: `2**34` -> `"16.00 GiB"`."""
    return f"{n / 2**30:.2f} GiB"


def is_out_of_memory(error: BaseException) -> bool:
    """Whether `error` is JAX's (XLA's) report of device memory running out."""
    text = str(error)
    return "RESOURCE_EXHAUSTED" in text or "Out of memory" in text or "out of memory" in text


def oom_line(message: str, *, what: str, advice: str, device_bytes: float | None = None) -> str:
    """The one line for an out-of-memory `message` (the error's text).

    Args:
        message: the text of JAX's `RESOURCE_EXHAUSTED` error.
        what: what ran out (e.g. "train step (GPT 12x768, batch 32)").
        advice: what to try, as options (e.g. "--batch 16 or --remat block").
        device_bytes: the device's memory when the message does not say (from
            `memory_stats()['bytes_limit']`), or None.

    Returns:
        `"out of memory: WHAT needs about X GiB; the device has Y GiB; try ADVICE"`, with the
        parts the message and `device_bytes` allow (a bare allocation says "X GiB more").
    """
    need = ""
    have = device_bytes
    if found := _COMPILE.search(message):
        need = f"needs about {gigabytes(_bytes(*found.group(1, 2)))}"
        have = _bytes(*found.group(3, 4))
    elif found := _ALLOCATE.search(message):
        free = _bytes(*found.group(3, 4))
        need = (
            f"needs about {gigabytes(_bytes(*found.group(1, 2)))} more with {gigabytes(free)} free"
        )
    elif found := _BYTES.search(message):
        need = f"needs about {gigabytes(float(found.group(1)))} more"
    parts = [f"out of memory: {what}" + (f" {need}" if need else "")]
    if have is not None:
        parts.append(f"the device has {gigabytes(have)}")
    parts.append(f"try {advice}")
    return "; ".join(parts)


def _device_stats() -> dict[str, int] | None:
    import jax

    stats = jax.local_devices()[0].memory_stats()
    return dict(stats) if stats else None


def peak_bytes() -> int | None:
    """`peak_bytes_in_use` of the first local device since the process began; None
    where the backend keeps no statistics (CPU)."""
    stats = _device_stats()
    return None if stats is None or "peak_bytes_in_use" not in stats else stats["peak_bytes_in_use"]


def program_bytes(compiled: Any) -> dict[str, int] | None:
    """What XLA planned for a compiled program (`jitted.lower(...).compile()`), in bytes:
    `{"arguments", "outputs", "temporaries", "total"}`, outputs counting only those not
    aliased to a donated argument; None where the backend gives no analysis."""
    analysis = compiled.memory_analysis()
    if analysis is None:
        return None
    arguments = int(analysis.argument_size_in_bytes)
    outputs = int(analysis.output_size_in_bytes) - int(analysis.alias_size_in_bytes)
    temporaries = int(analysis.temp_size_in_bytes)
    return {
        "arguments": arguments,
        "outputs": outputs,
        "temporaries": temporaries,
        "total": arguments + outputs + temporaries,
    }


@contextlib.contextmanager
def exit_on_out_of_memory(what: str, advice: str) -> Iterator[None]:
    """Turn an out-of-memory error inside the block into `SystemExit(oom_line(...))`:
    one line on stderr and exit status 1. Any other error passes through."""
    try:
        yield
    except Exception as error:
        if not is_out_of_memory(error):
            raise
        try:
            stats = _device_stats()
        except Exception:  # the runtime may be unusable after the failure
            stats = None
        limit = None if stats is None else stats.get("bytes_limit")
        line = oom_line(str(error), what=what, advice=advice, device_bytes=limit)
        print(line, file=sys.stderr, flush=True)
        raise SystemExit(1) from None
