"""benchmarks/_profile.py: a hand-written Chrome trace summed by operation."""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import _profile


def _write(folder: Path, events: list[dict]) -> None:
    where = folder / "plugins" / "profile" / "2026_12_06"
    where.mkdir(parents=True)
    with gzip.open(where / "host.trace.json.gz", "wt") as fh:
        json.dump({"displayTimeUnit": "ns", "metadata": {}, "traceEvents": events}, fh)


def _meta(kind: str, pid: int, name: str, tid: int = 0) -> dict:
    return {"ph": "M", "name": kind, "pid": pid, "tid": tid, "args": {"name": name}}


def test_the_first_devices_ops_thread_is_summed_heaviest_first(tmp_path: Path) -> None:
    _write(
        tmp_path,
        [
            _meta("process_name", 1, "/host:CPU"),
            _meta("process_name", 7, "/device:TPU:0"),
            _meta("thread_name", 7, "XLA Modules", tid=1),
            _meta("thread_name", 7, "XLA Ops", tid=2),
            {"ph": "X", "pid": 7, "tid": 2, "name": "fusion.1", "ts": 0, "dur": 3000},
            {"ph": "X", "pid": 7, "tid": 2, "name": "splash", "ts": 5, "dur": 5000},
            {"ph": "X", "pid": 7, "tid": 2, "name": "fusion.1", "ts": 9, "dur": 1000},
            {"ph": "X", "pid": 7, "tid": 1, "name": "jit_step", "ts": 0, "dur": 9000},
            {"ph": "X", "pid": 1, "tid": 0, "name": "host work", "ts": 0, "dur": 99000},
        ],
    )
    where, ops = _profile.top_ops(tmp_path)
    assert where == "/device:TPU:0, XLA Ops"
    assert ops == [("splash", 5.0, 1), ("fusion.1", 4.0, 2)]
    lines = _profile.lines(tmp_path, steps=2)
    assert lines[0].endswith("2 steps, 4.50 ms a step:")
    assert lines[1].split()[:2] == ["55.6%", "2.500"]


def test_a_folder_without_a_trace_says_where_it_looked(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no profiler trace under"):
        _profile.top_ops(tmp_path)


def _program_text() -> str:
    """A two-layer program's gradient, compiled on the CPU, each layer a named scope."""
    import jax
    import jax.numpy as jnp

    def loss(ws: list, x: jax.Array) -> jax.Array:
        for i, w in enumerate(ws):
            with jax.named_scope(f"blocks_{i}"), jax.named_scope("mlp"):
                x = jnp.tanh(x @ w)
        return jnp.sum(x**2)

    ws = [jnp.ones((16, 16)), jnp.ones((16, 16))]
    return jax.jit(jax.grad(loss)).lower(ws, jnp.ones((8, 16))).compile().as_text()


def test_a_compiled_programs_instructions_say_what_and_where() -> None:
    found = _profile.instructions(_program_text())
    dots = {name: i for name, i in found.items() if i.kind() == "dot"}
    places = {_profile.place(i.op_name) for i in dots.values()}
    assert "blocks_*/mlp/dot_general" in places  # the forward's matmuls, layers folded
    assert any(p.startswith("blocks_*/mlp/") and p.endswith(" (bwd)") for p in places)
    assert all(i.shape.startswith("f32[") for i in dots.values())
    assert _profile.place("jit(step)/transpose(jvp(GPT))/blocks_11/attn/c_attn/dot_general") == (
        "GPT/blocks_*/attn/c_attn/dot_general (bwd)"
    )


def test_lines_sum_the_layers_of_one_place_together(tmp_path: Path) -> None:
    text = _program_text()
    found = _profile.instructions(text)
    forward = sorted(
        name
        for name, i in found.items()
        if i.kind() == "dot" and _profile.place(i.op_name) == "blocks_*/mlp/dot_general"
    )
    assert len(forward) >= 1
    events = [
        _meta("process_name", 7, "/device:TPU:0"),
        _meta("thread_name", 7, "XLA Ops", tid=2),
        {"ph": "X", "pid": 7, "tid": 2, "name": "not.in.the.text", "ts": 0, "dur": 1000},
    ]
    events += [
        {"ph": "X", "pid": 7, "tid": 2, "name": name, "ts": 10 * i, "dur": 2000}
        for i, name in enumerate(forward)
    ]
    _write(tmp_path, events)
    out = _profile.lines(tmp_path, steps=1, hlo=text)
    annotated = [line for line in out if forward[0] in line]
    assert annotated and annotated[0].endswith("blocks_*/mlp/dot_general")
    start = out.index(next(line for line in out if line.startswith("device time by place")))
    summed = out[start + 1].split()
    assert summed[1] == f"{2.0 * len(forward):.3f}"  # every layer's forward matmul in one row
    assert summed[-2:] == ["dot", "blocks_*/mlp/dot_general"]
    assert out[-1].split()[-2:] == ["?", "not.in.the.text"]
