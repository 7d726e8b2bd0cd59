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
