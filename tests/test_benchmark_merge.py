"""`python -m benchmarks --only NAME --merge`: one benchmark run again, the table kept whole."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks import run  # noqa: E402


def _record(name: str, what: str) -> dict:
    row = {"what": what, "ours": "1 s", "theirs": "2 s", "unit": "s", "ours_samples": [1.0],
           "theirs_samples": [2.0], "ratios": [2.0], "ratio_meaning": "theirs/ours",
           "note": "n", "goal": ">= 1", "met": True}  # fmt: skip
    return {"name": name, "what": what, "command": f"python benchmarks/{name}.py --json FILE",
            "status": "ok", "returncode": 0, "seconds": 3.0, "load_average": [0.5, 0.6],
            "error": None, "results": {"rows": [row]}}  # fmt: skip


def test_a_merged_run_replaces_its_benchmark_and_dates_the_others(tmp_path: Path) -> None:
    names = [b.name for b in run.BENCHMARKS]
    first, second, third = names[0], names[1], names[2]
    machine = {**run.describe_machine(quick=False), "seconds": 60.0, "load_average_end": [1.0]}
    earlier = {**machine, "date": "2026-01-01T00:00:00+00:00", "git_commit": "a" * 40}
    record = {"machine": earlier, "note": "old", "only": None,
              "benchmarks": [_record(first, "one"), _record(second, "two (old)"),
                             {**_record(third, "three"), "status": "crashed"}]}  # fmt: skip
    (tmp_path / "results.json").write_text(json.dumps(record))

    fresh = [_record(second, "two (new)"), _record(third, "three (new)")]
    runs, note = run.merged(tmp_path / "results.json", fresh, machine, "")
    assert [r["name"] for r in runs] == [first, second, third]  # the table's order
    assert [r["results"]["rows"][0]["what"] for r in runs] == ["one", "two (new)", "three (new)"]
    assert runs[0]["ran"] == {"date": earlier["date"], "commit": "a" * 40}
    assert "ran" not in runs[1] and "ran" not in runs[2]
    assert note.startswith(f"{second}, {third} run again and merged;") and note.endswith("old")
    table = run.markdown(runs, machine, note, None)
    assert "(run on 2026-01-01T00:00:00+00:00, commit aaaaaaaaaa)" in table
    assert table.count("(run on ") == 1 and "Partial run" not in table


def test_merge_refuses_a_missing_file_or_a_quick_one(tmp_path: Path) -> None:
    machine = run.describe_machine(quick=False)
    with pytest.raises(SystemExit, match=r"cannot read .* run every benchmark first"):
        run.merged(tmp_path / "results.json", [], machine, "")
    shutil.copy(ROOT / "benchmarks" / "results.json", tmp_path / "results.json")
    with pytest.raises(SystemExit, match="from a full run; merge like with like"):
        run.merged(tmp_path / "results.json", [], run.describe_machine(quick=True), "")
    with pytest.raises(SystemExit):
        run.parse(["--merge"])  # --merge without --only


def test_a_merge_stopped_during_an_entry_keeps_the_entries_before_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A device call's time limit kills the runner mid-plan: what finished is on disk."""
    names = [b.name for b in run.BENCHMARKS]
    machine = {**run.describe_machine(quick=False), "date": "2026-01-01T00:00:00+00:00"}
    record = {"machine": machine, "note": "old", "only": None,
              "benchmarks": [_record(name, f"{name} (old)") for name in names[:3]]}  # fmt: skip
    (tmp_path / "results.json").write_text(json.dumps(record))
    ran: list[str] = []

    def run_one(bench: run.Benchmark, out: Path, quick: bool) -> dict:
        if ran:  # the second entry: the device call's limit stops the runner here
            raise SystemExit(124)
        ran.append(bench.name)
        return _record(bench.name, f"{bench.name} (new)")

    monkeypatch.setattr(run, "run_one", run_one)
    argv = ["--only", f"{names[1]},{names[2]}", "--merge", "--out", str(tmp_path)]
    with pytest.raises(SystemExit):
        run.main(argv)
    kept = json.loads((tmp_path / "results.json").read_text())
    whats = [r["results"]["rows"][0]["what"] for r in kept["benchmarks"]]
    assert whats == [f"{names[0]} (old)", f"{names[1]} (new)", f"{names[2]} (old)"]
    assert kept["note"].startswith(f"{names[1]} run again and merged;")
    assert f"{names[1]} (new)" in (tmp_path / "results.md").read_text()
    assert run.merged(tmp_path / "results.json", [], run.describe_machine(quick=False), "")


def test_extra_options_reach_the_chosen_scripts_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--only NAME --extra ARGS`: ARGS, split as a shell would, end that script's command."""
    names = [b.name for b in run.BENCHMARKS]
    commands: dict[str, tuple[str, ...]] = {}

    def run_one(bench: run.Benchmark, out: Path, quick: bool) -> dict:
        commands[bench.name] = bench.args
        return _record(bench.name, bench.name)

    monkeypatch.setattr(run, "run_one", run_one)
    argv = ["--only", names[1], "--out", str(tmp_path), "--extra", "--trained '/a b/c'"]
    assert run.main(argv) == 0
    given = next(b for b in run.BENCHMARKS if b.name == names[1]).args
    assert commands == {names[1]: (*given, "--trained", "/a b/c")}
    with pytest.raises(SystemExit):
        run.parse(["--extra", "--trained x"])  # --extra without --only
