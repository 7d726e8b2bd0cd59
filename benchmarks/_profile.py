"""Where a compiled program's device time goes: JAX's profiler trace, summed by operation.

``jax.profiler.trace(folder)`` writes a Chrome trace (``plugins/profile/*/HOST.trace.json.gz``)
with one process per device (``/device:TPU:0``, ...; on a CPU only ``/host:CPU``) and in it
a thread of the operations XLA ran (``XLA Ops``). ``top_ops(folder)`` sums each operation's
time over the trace, heaviest first, from the first device's ops thread where there is one,
else from every event of the trace's first process (a CPU's trace has no ops thread).

With the compiled program's text (``compiled.as_text()``), ``lines(..., hlo=TEXT)`` also
says what each operation is: the matmuls, kernels and reductions inside it, and where
in the model its JAX operation came from (``op_name``; ``bwd`` where it is a transpose,
i.e. the backward), and sums the time by that place with the layers folded together
(``blocks_3/mlp/c_fc`` and ``blocks_7/mlp/c_fc`` as ``blocks_*/mlp/c_fc``).

Example (``train_step.py --trainer-only --profile DIR`` prints this for its timed steps)::

    device time by operation (/device:TPU:0, XLA Ops), 5 steps:
      41.2%   152.3 ms  x60  splash_mha_fwd_bwd ...
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

__all__ = ["Instruction", "instructions", "lines", "place", "top_ops"]


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


@dataclasses.dataclass(frozen=True)
class Instruction:
    """One instruction of a compiled program's text: its opcode, result shape, the JAX
    operation it came from (`op_name`, "" when the text has none) and, for a fusion or a
    loop, the notable opcodes of the computations it calls (dot, convolution,
    custom-call, reduce, scatter, gather, sort, while)."""

    opcode: str
    shape: str
    op_name: str
    inside: tuple[str, ...]

    def kind(self) -> str:
        """What the instruction does, in a word or two: `dot`, `kernel` (a custom call),
        `reduce`, ..., or the fusion's or instruction's opcode."""
        notable = self.inside or ((self.opcode,) if self.opcode in _NOTABLE else ())
        if self.opcode == "custom-call" or "custom-call" in notable:
            return "kernel"
        for word in ("dot", "convolution", "while", "scatter", "gather", "sort", "reduce"):
            if word in notable:
                return "dot" if word == "convolution" else word
        return "elementwise" if self.opcode == "fusion" else self.opcode


_NOTABLE = ("dot", "convolution", "custom-call", "reduce", "scatter", "gather", "sort", "while")
_COMPUTATION = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
_INSTRUCTION = re.compile(r"^\s+(?:ROOT\s+)?%?([\w.\-]+)\s+=\s+(.*)$")
_OPCODE = re.compile(r"(?:^|[\s}\)])([a-z][\w\-]*)\(")


def instructions(hlo: str) -> dict[str, Instruction]:
    """Each instruction of `hlo` (a compiled program's `as_text()`) by its name."""
    opcodes: dict[str, set[str]] = {}
    calls: dict[str, list[str]] = {}
    parsed: dict[str, tuple[str, str, str, list[str]]] = {}
    current = ""
    for line in hlo.splitlines():
        if (found := _COMPUTATION.match(line)) and " = " not in line:
            current = found.group(1)
            opcodes.setdefault(current, set())
            continue
        found = _INSTRUCTION.match(line)
        if found is None:
            continue
        name, rest = found.groups()
        head = rest.split(", metadata=")[0]
        opcode = _OPCODE.search(head)
        op = opcode.group(1) if opcode else ""
        shape = head[: opcode.start(1)].strip() if opcode else ""
        op_name = re.search(r'op_name="([^"]*)"', rest)
        called = re.findall(r"(?:calls|body|condition|to_apply)=%?([\w.\-]+)", rest)
        opcodes.setdefault(current, set()).add(op)
        calls.setdefault(current, []).extend(called)
        parsed[name] = (op, shape, op_name.group(1) if op_name else "", called)

    def reach(computation: str, seen: set[str]) -> set[str]:
        if computation in seen:
            return set()
        seen.add(computation)
        found = set(opcodes.get(computation, ()))
        for inner in calls.get(computation, ()):
            found |= reach(inner, seen)
        return found

    out = {}
    for name, (op, shape, op_name, called) in parsed.items():
        inside: set[str] = set()
        for computation in called:
            inside |= reach(computation, set())
        notable = tuple(word for word in _NOTABLE if word in inside)
        out[name] = Instruction(op, shape, op_name, notable)
    return out


def place(op_name: str) -> str:
    """Where in the model a JAX operation is, layers folded: `blocks_*/mlp/c_fc/dot_general
    (bwd)` for `jit(step)/transpose(jvp(GPT))/blocks_3/mlp/c_fc/dot_general`."""
    if not op_name:
        return "(no op_name)"
    backward = "transpose(" in op_name
    parts = [p for p in op_name.split("/") if not p.startswith("jit(")]
    cleaned = []
    for part in parts:
        while (inner := re.fullmatch(r"[a-z_]+\((.*)\)", part)) is not None:
            part = inner.group(1)
        cleaned.append(re.sub(r"_\d+$", "_*", part))
    return "/".join(p for p in cleaned if p) + (" (bwd)" if backward else "")


def lines(folder: Path | str, steps: int, top: int = 20, hlo: str | None = None) -> list[str]:
    """The `top` heaviest operations as lines: share of the summed time, ms a step, calls;
    with `hlo` (the program's text) also what each is and where it came from, then the
    time summed by place (`place`), heaviest first."""
    where, ops = top_ops(folder)
    whole = sum(ms for _, ms, _ in ops) or 1.0
    known = instructions(hlo) if hlo is not None else {}
    out = [f"device time by operation ({where}), {steps} steps, {whole / steps:.2f} ms a step:"]
    for name, ms, n in ops[:top]:
        line = f"  {ms / whole:6.1%} {ms / steps:9.3f} ms/step  x{n / steps:g}  {name[:100]}"
        if name in known:
            line += (
                f"  [{known[name].kind()} {known[name].shape[:40]}]  {place(known[name].op_name)}"
            )
        out.append(line)
    if not known:
        return out
    by_place: Counter[str] = Counter()
    for name, ms, _ in ops:
        item = known.get(name)
        label = f"{item.kind():11} {place(item.op_name)}" if item else f"{'?':11} {name}"
        by_place[label] += ms
    out.append(f"device time by place in the model (op_name, layers folded), {steps} steps:")
    for label, ms in by_place.most_common(top):
        out.append(f"  {ms / whole:6.1%} {ms / steps:9.3f} ms/step  {label[:140]}")
    return out
