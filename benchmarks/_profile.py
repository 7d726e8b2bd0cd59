"""Where a compiled program's device time goes: JAX's profiler trace, summed by operation.

``jax.profiler.trace(folder)`` writes a Chrome trace (``plugins/profile/*/HOST.trace.json.gz``)
with one process per device (``/device:TPU:0``, ...; on a CPU only ``/host:CPU``) and in it
a thread of the operations XLA ran (``XLA Ops``). ``top_ops(folder)`` sums each operation's
time over the trace, heaviest first, from the first device's ops thread where there is one,
else from every event of the trace's first process (a CPU's trace has no ops thread).

Example (``train_step.py --trainer-only --profile DIR`` prints this for its timed steps)::

    device time by operation (/device:TPU:0, XLA Ops), 5 steps:
      41.2%   152.3 ms  x60  splash_mha_fwd_bwd ...
"""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path
from typing import Any

__all__ = ["lines", "top_ops"]


def _trace(folder: Path) -> dict[str, Any]:
    found = sorted(Path(folder).glob("plugins/profile/*/*.trace.json.gz"))
    if not found:
        raise FileNotFoundError(f"no profiler trace under {folder}/plugins/profile/")
    with gzip.open(found[-1], "rb") as fh:
        return json.load(fh)


def top_ops(folder: Path | str) -> tuple[str, list[tuple[str, float, int]]]:
    """`(where, [(operation, total milliseconds, calls)])`, heaviest first: `where` names the
    process (and thread) summed."""
    events = _trace(Path(folder))["traceEvents"]
    processes = {
        e["pid"]: e["args"]["name"]
        for e in events
        if e.get("ph") == "M" and e.get("name") == "process_name"
    }
    threads = {
        (e["pid"], e["tid"]): e["args"]["name"]
        for e in events
        if e.get("ph") == "M" and e.get("name") == "thread_name"
    }
    devices = sorted(pid for pid, name in processes.items() if name.startswith("/device:"))
    pid = devices[0] if devices else min(processes)
    ops = [key for key, name in threads.items() if key[0] == pid and name == "XLA Ops"]
    where = processes[pid] + (", XLA Ops" if ops else ": every event, nested ones overlap")
    total: Counter[str] = Counter()
    calls: Counter[str] = Counter()
    for e in events:
        if e.get("ph") != "X" or e["pid"] != pid or (ops and (e["pid"], e["tid"]) not in ops):
            continue
        total[e["name"]] += e.get("dur", 0) / 1000
        calls[e["name"]] += 1
    return where, [(name, ms, calls[name]) for name, ms in total.most_common()]


def lines(folder: Path | str, steps: int, top: int = 20) -> list[str]:
    """The `top` heaviest operations as lines: share of the summed time, ms a step, calls."""
    where, ops = top_ops(folder)
    whole = sum(ms for _, ms, _ in ops) or 1.0
    out = [f"device time by operation ({where}), {steps} steps, {whole / steps:.2f} ms a step:"]
    for name, ms, n in ops[:top]:
        out.append(f"  {ms / whole:6.1%} {ms / steps:9.3f} ms/step  x{n / steps:g}  {name[:100]}")
    return out
