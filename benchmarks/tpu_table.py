"""The TPU table: `results-tpu.md` from the results files of runs made on a TPU.

Run (here, after the runs on the TPU host wrote their files into ``benchmarks/tpu/``)::

    uv run python benchmarks/tpu_table.py benchmarks/tpu --device "TPU v5 lite" \\
        --date 2026-12-06 --commit f85e8a5 [--peak-tflops 197]

``python -m benchmarks --device tpu`` now runs the TPU plan and writes the same files
(``tpu_plan.py``); this script remains for result files run by hand. A TPU host holds one
program at a time and has no network, so those runs are the scripts themselves (``python3 benchmarks/train_step.py ... --json FILE``, installed as README "On a
TPU" says), each writing the same results file as under ``python -m benchmarks``; this
script turns a folder of them into ``results-tpu.md`` and ``results-tpu.json`` in the
schema of ``results.md``, with the device and date in the header. Each training row gets
its model FLOPs utilization (tokens/s x model FLOPs per token / the chip's peak, bf16
dense: 197 TFLOP/s for a v5e) as a row of its own, against the goal of issue 44 (50%).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import _table, run, tpu_plan


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folder", type=Path, help="the results files (*.json) of the TPU runs")
    p.add_argument("--device", required=True, help="the chip, as JAX names it")
    p.add_argument("--date", required=True, help="when the runs ran")
    p.add_argument("--commit", required=True, help="the commit the runs' wheels were built at")
    p.add_argument("--peak-tflops", type=float, default=197.0, help="the chip's bf16 peak")
    p.add_argument("--out", type=Path, default=Path(__file__).resolve().parent)
    args = p.parse_args(argv)
    runs = []
    for path in sorted(args.folder.glob("*.json")):
        results = json.loads(path.read_text())
        run.check_results(results, path.stem)
        for row in results["rows"]:
            row["what"] += f" [{path.stem}]"
        extra = tpu_plan.mfu_row(results, args.peak_tflops, "--peak-tflops")
        if extra is not None:
            results["rows"].append(extra)
        runs.append({
            "name": path.stem,
            "what": results["rows"][0]["what"],
            "command": f"python3 benchmarks/{results['benchmark']}.py ... ({path.name})",
            "status": "ok",
            "returncode": 0,
            "seconds": 0.0,
            "load_average": [0.0],
            "error": None,
            "results": results,
        })  # fmt: skip
    machine = {
        "quick": False,
        "date": args.date,
        "git_commit": args.commit,
        "git_uncommitted_changes": False,
        "cpu_count": 13,
        "cpus_usable": 13,
        "cpu_model": f"host of one {args.device} chip",
        "python": "3.11",
        "versions": {"jax": "0.10.2"},
        "seconds": 0.0,
        "load_average_start": [0.0],
        "load_average_end": [0.0],
    }
    note = f"one {args.device} chip, {args.peak_tflops:g} TFLOP/s bf16 peak; runs as listed below"
    table = _table.markdown(runs, machine, note, None).splitlines()
    table[0] = f"# Benchmarks on a TPU ({args.device})"
    table[2] = (
        f"Runs of the benchmark scripts on one {args.device} chip on {args.date}, wheels built "
        f"at commit {args.commit}, JAX 0.10.2 (the host's), installed as README 'On a TPU' "
        f"says; collected by `python benchmarks/tpu_table.py` (what each run varied: "
        f"benchmarks/tpu/README.md)."
    )
    table = "\n".join(table).replace("in `results.json`", "in `results-tpu.json`") + "\n"
    record = {"machine": machine, "note": note, "only": None, "benchmarks": runs}
    (args.out / "results-tpu.json").write_text(json.dumps(record, indent=1) + "\n")
    (args.out / "results-tpu.md").write_text(table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
