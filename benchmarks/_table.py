"""The benchmark table: `results.md` (or `results-tpu.md`) from the runs' records.

`markdown(runs, machine, note, partial)` gives the header (machine, run), one row per
result row (ours, theirs, the median of paired ratios and its range, the goal and whether
it is met), then how to read each row and what each command did. `run.py` writes it;
`tpu_table.py` renders result files of runs made by hand the same way.
"""

from __future__ import annotations

import statistics
from typing import Any

__all__ = ["markdown", "rows_of"]


def _number(value: float) -> str:
    size = abs(value)
    if size >= 1000:
        return f"{value:,.0f}"
    if size >= 100:
        return f"{value:.0f}"
    if size >= 10:
        return f"{value:.1f}"
    return f"{value:.3f}" if size >= 0.01 or size == 0 else f"{value:.2e}"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def rows_of(run: dict[str, Any]) -> list[dict[str, Any]]:
    """The table rows of one benchmark run; one placeholder row when it has none."""
    if run["status"] == "ok":
        return list(run["results"]["rows"])
    label = "not run" if run["status"] == "not run" else "crashed"
    return [
        {
            "what": run["what"],
            "ours": label,
            "theirs": label,
            "ratios": [],
            "ratio_meaning": "",
            "goal": None,
            "met": None,
            "note": run["error"],
            "status": label,
        }
    ]


def markdown(
    runs: list[dict[str, Any]],
    machine: dict[str, Any],
    note: str,
    partial: list[str] | None,
) -> str:
    """`results.md` (or, with `machine["device"]`, `results-tpu.md`): a header (machine,
    run), the table, then how to read each row."""
    quick = machine["quick"]
    device = machine.get("device")
    title = "# Benchmarks" + (f" on {_device_text(device)}" if device else "")
    if machine.get("tiny"):
        title += ": TINY sizes (a smoke test of the TPU plan, not a measurement)"
    elif quick:
        title += ": QUICK run (smoke test: few repeats, not a measurement)"
    versions = machine["versions"]
    commit = machine["git_commit"][:10] + (
        " with uncommitted changes" if machine["git_uncommitted_changes"] else ""
    )
    command = "uv run --group bench python -m benchmarks"
    if device:
        command = "python -m benchmarks --device tpu" + (" --tiny" if machine.get("tiny") else "")
    lines = [
        title,
        "",
        f"`{command}{' --quick' if quick else ''}` on "
        f"{machine['date']}, commit {commit}; "
        + (f"{_device_text(device)}, JAX {device['jax']} (as the run saw it); " if device else "")
        + f"{machine['cpus_usable']} usable of "
        f"{machine['cpu_count']} CPUs ({machine['cpu_model'] or 'unknown model'}), Python "
        f"{machine['python']}, JAX {versions['jax']}; the run took "
        f"{machine['seconds'] / 60:.1f} min; load average (1 min) "
        f"{machine['load_average_start'][0]} at the start, {machine['load_average_end'][0]} "
        "at the end.",
    ]
    if partial is not None:
        lines += ["", f"Partial run: only {', '.join(partial)}."]
    if note:
        lines += ["", f"Also on the machine: {note}"]
    lines += [
        "",
        "Each ratio is the median of paired ratios: two measurements taken side by side "
        "(the same round, in alternating order), so that both meet the same load on the "
        "shared CPUs; the range is the smallest and largest paired ratio over the repeats. "
        "What each ratio divides is under the table. Samples are in "
        f"`{'results-tpu' if device else 'results'}.json`.",
        "",
        "| # | what | ours | theirs | ratio (median of paired ratios) | range over repeats "
        "| goal | met? |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    explained = []
    number = 0
    for run in runs:
        for row in rows_of(run):
            number += 1
            ratios = row["ratios"]
            ratio = _number(statistics.median(ratios)) if ratios else "—"
            spread = (
                f"{_number(min(ratios))}\N{EN DASH}{_number(max(ratios))}"
                if len(ratios) > 1
                else "—"
            )
            if row.get("status"):
                met = row["status"]
            elif row["met"] is None:
                met = "—"
            else:
                met = "yes" if row["met"] else "**no**"
            what = ("[quick] " if quick else "") + row["what"]
            cells = [str(number), what, row["ours"], row["theirs"] or "—", ratio, spread]
            cells += [row["goal"] or "—", met]
            lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
            reading = f"ratio: {row['ratio_meaning']}. " if row["ratio_meaning"] else ""
            explained.append(f"{number}. {reading}{row['note']}".rstrip())
    lines += ["", "How to read each row:", "", *explained, "", "Benchmarks run:", ""]
    for run in runs:
        error = run["error"] or ""
        status = error if error.startswith(run["status"]) else run["status"]
        status += f" ({error})" if error and status != error else ""
        load = " to ".join(str(x) for x in run["load_average"])
        ran = run.get("ran")
        when = f" (run on {ran['date']}, commit {ran['commit'][:10]})" if ran else ""
        lines.append(
            f"- `{run['command']}`: {status}, {run['seconds']:.0f} s, load average {load}{when}"
        )
    return "\n".join(lines) + "\n"


def _device_text(device: dict[str, Any]) -> str:
    """`{"backend": "tpu", "count": 1, "kind": "TPU v5 lite", ...}` -> "1 TPU v5 lite (tpu)"."""
    if device.get("backend") == "unknown":
        return f"an unknown device ({device.get('error', '')})"
    return f"{device['count']} {device['kind']} ({device['backend']})"
