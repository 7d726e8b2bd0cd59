"""The GPU benchmark that ``gpu.sh`` runs: model FLOPs utilization per training strategy.

Run: ``bash benchmarks/gpu.sh [--json PATH]`` (it makes the environment, then runs this
file). On its own: ``python benchmarks/gpu.py [--json PATH] [--budget 420] [--quick]`` in
an environment with the workspace and ``jax[cuda12]`` (or ``jax[tpu]`` on a TPU host).

It measures on every device the host has (one GPU, or a TPU host's chips), through
``train_step.py`` in one process per measurement (JAX keeps its device memory until the
process ends), two models in bfloat16 activations and float32 parameters (no biases,
rotary positions, tied embedding: N = V d + L (12 d^2 + 2 d) + d):

* ``gpt2-124m``: GPT-2 small's shape, 12 layers, n_embd 768, 12 heads, 1,024 tokens,
  vocabulary 50,304: N = 123,587,328; batch 16 per device.
* ``gpt-1b``: 20 layers, n_embd 2048, 16 heads, 1,024 tokens, vocabulary 50,304:
  N = 1,109,739,520; batch 8 per device. Why 8 fits an 80 GB device: parameters,
  gradients and the two Adam moments in float32 take 16 bytes per parameter, 17.8 GB.
  The activations kept for the backward of one row are about 170 MB per block (the
  attention's float32 scores and softmax, 16 heads x 1024^2 x 4 bytes = 64 MB each, the
  bfloat16 weights 32 MB, and about 40 MB of bfloat16 tensors of 1024 x 2048 to 8192),
  3.4 GB for 20 blocks, plus 0.3 GB of logits: about 3.7 GB per row, 30 GB for 8 rows.
  The ``dp`` run also holds the hand loop's parameters and Adam state (12 bytes per
  parameter, 13.3 GB): about 61 GB in all, and at most 48 GB without the hand loop.
  (16 rows would need 77 GB alone.) The children run with
  ``XLA_PYTHON_CLIENT_MEM_FRACTION=0.92`` unless it is set (JAX's default, 0.75, leaves
  60 GB of an 80 GB device). ``training/remat = block`` keeps only each block's input
  (4 MB per row and block) and recomputes the block in the backward.

Per model, the trainer's step with each strategy (``training/strategy`` = ``dp``,
``zero1``, ``fsdp``; the 1B model also ``dp`` with ``training/remat = block``):

* ``dp``: ``train_step.py`` against the hand-written Flax + optax loop, as before: 5
  steps compared, 5 warm-up steps, then 8 rounds of 5 steps per side, alternating. The
  trainer's tokens/s and the hand-loop ratio (the hand loop has no strategy).
* the others: ``train_step.py --trainer-only``: 3 warm-up steps, then 4 rounds of 5 steps
  of the trainer alone (fewer rounds, to keep ``gpu.sh`` within its 8 minutes).

MFU = tokens/s x model FLOPs per token / devices / peak, with model FLOPs per token = 6 N
+ 12 L d T (PaLM, appendix B). It counts no recomputation: with remat, the hardware does
about a third more work than MFU credits (the forward again). The peak is per device,
from ``PEAK_TFLOPS`` by the device's ``device_kind`` (dense, without sparsity), or
``THESEUS_BENCH_PEAK_TFLOPS``; the table says which. On one device the three strategies
are the same layout (nothing is split): they still run, and their rows differ by noise.
A strategy that cannot split a dimension over the devices (or any run that fails: out
of memory, a timeout) is a one-line note in the table instead of a row of numbers.

Then ``analysis.py --checks tandem`` on the first model, as before: the validation step
with and without the tandem analysis.

The runs go in order of importance (each model's ``dp`` with the hand loop, the tandem
check, remat, then ``zero1`` and ``fsdp``) within ``--budget`` seconds (420): a run that
would start with less than ``MIN_START_S`` left is skipped, with a note; each run's
timeout is what is left (at most ``TIMEOUT_S``). ``--json PATH`` writes the table in the
results-file schema of ``_report.py`` (one row per measurement, the hand-loop and tandem
rows as their scripts wrote them) with the MFU table under ``info.mfu``. ``--quick``: 2
rounds of 2 steps everywhere (a smoke run). Exit status 1 when a run failed or was
skipped or the hand-loop check disagreed.

``THESEUS_BENCH_MODEL=tiny`` swaps in two tiny GPTs (``tiny`` and ``tiny-1b``, the
latter with the 1B model's runs) to try the script on a CPU with ``JAX_PLATFORMS=cpu``;
``THESEUS_BENCH_MODEL=gpt2-124m`` (or any comma-separated names of ``MODELS``) runs some.
``THESEUS_BENCH_PEAK_TFLOPS`` sets the peak for a device that ``PEAK_TFLOPS`` does not list.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file or with -m
from benchmarks import _report

HERE = Path(__file__).resolve().parent
# The model's shape; "batch" is per device (the global batch is batch x devices).
MODELS: dict[str, dict[str, Any]] = {
    "gpt2-124m": {
        "layers": 12,
        "width": 768,
        "heads": 12,
        "block": 1024,
        "vocab": 50304,
        "batch": 16,
        "dtype": "bfloat16",
    },
    "gpt-1b": {
        "layers": 20,
        "width": 2048,
        "heads": 16,
        "block": 1024,
        "vocab": 50304,
        "batch": 8,
        "dtype": "bfloat16",
    },
    "tiny": {
        "layers": 2,
        "width": 64,
        "heads": 4,
        "block": 64,
        "vocab": 258,
        "batch": 8,
        "dtype": "float32",
    },
    "tiny-1b": {  # the 1B model's stand-in on a CPU: the same runs, remat included
        "layers": 3,
        "width": 96,
        "heads": 4,
        "block": 64,
        "vocab": 258,
        "batch": 4,
        "dtype": "float32",
    },
}
LAYOUTS = [("dp", "none"), ("zero1", "none"), ("fsdp", "none")]
REMAT = [("dp", "block")]
# (strategy, remat) pairs per model: the strategies, and remat for the 1B model.
RUNS = {
    "gpt2-124m": LAYOUTS,
    "gpt-1b": LAYOUTS + REMAT,
    "tiny": LAYOUTS,
    "tiny-1b": LAYOUTS + REMAT,
}
MODEL_SETS = {"default": ["gpt2-124m", "gpt-1b"], "tiny": ["tiny", "tiny-1b"]}
# Dense peak TFLOP/s per device from the vendors' data sheets (without structured
# sparsity): bfloat16 tensor cores, TF32 tensor cores (the fastest a float32 matmul can run)
# and plain FP32. Matched against `device_kind` in order, so "H100 PCIe" comes before
# "H100" and "TPU v5 lite" before "TPU v5". TPUs: bfloat16 per chip (Google Cloud's
# pages); a float32 matmul at JAX's default precision runs in bfloat16 passes there, so
# the "tf32" column repeats the bfloat16 peak.
PEAK_TFLOPS = {
    "H200": {"bfloat16": 989.4, "tf32": 494.7, "float32": 66.9},
    "H100 PCIe": {"bfloat16": 756.5, "tf32": 378.0, "float32": 51.2},
    "H100": {"bfloat16": 989.4, "tf32": 494.7, "float32": 66.9},  # SXM5
    "A100": {"bfloat16": 312.0, "tf32": 156.0, "float32": 19.5},
    "TPU v6 lite": {"bfloat16": 918.0, "tf32": 918.0},  # v6e (Trillium)
    "TPU v5 lite": {"bfloat16": 197.0, "tf32": 197.0},  # v5e
    "TPU v5": {"bfloat16": 459.0, "tf32": 459.0},  # v5p
    "TPU v4": {"bfloat16": 275.0, "tf32": 275.0},
}
TIMEOUT_S = 300  # at most, per run
BUDGET_S = 420  # all runs together: gpu.sh as a whole must end within 8 minutes
MIN_START_S = 45  # a run that would start with less than this left is skipped
# Steps of each run (train_step.py's options): the dp run alternates with the hand loop.
HAND = ["--check", "5", "--warmup", "5", "--steps", "5", "--rounds", "8"]
ALONE = ["--trainer-only", "--warmup", "3", "--steps", "5", "--rounds", "4"]
TANDEM = ["--checks", "tandem", "--repeats", "40", "--breakdown", "2"]
QUICK = {
    "hand": ["--check", "2", "--warmup", "1", "--steps", "2", "--rounds", "2"],
    "alone": ["--trainer-only", "--warmup", "1", "--steps", "2", "--rounds", "2"],
    "tandem": ["--checks", "tandem", "--quick"],
}


@dataclasses.dataclass
class Run:
    """One measurement: a model with a strategy and remat (or the tandem check)."""

    model: str
    strategy: str = "dp"
    remat: str = "none"
    hand: bool = False  # alternate with the hand loop (and compare them first)
    tandem: bool = False  # analysis.py's tandem check instead
    results: dict[str, Any] | None = None
    note: str = ""  # why there are no results
    exit: int | None = None

    @property
    def label(self) -> str:
        if self.tandem:
            return f"{self.model} tandem check"
        return f"{self.model} {self.strategy} remat={self.remat}"


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--budget", type=float, default=BUDGET_S, help="seconds for all runs together")
    p.add_argument(
        "--models",
        default=os.environ.get("THESEUS_BENCH_MODEL", "default"),
        help=f"comma-separated names of {sorted(MODELS)}, or tiny (default: "
        "THESEUS_BENCH_MODEL, else gpt2-124m,gpt-1b)",
    )
    _report.add_arguments(p)
    args = p.parse_args(argv)
    names = MODEL_SETS.get(args.models, args.models.split(","))
    unknown = [name for name in names if name not in MODELS]
    if unknown:
        p.error(f"models {unknown} are not among {sorted(MODELS)} (or tiny)")
    args.models = names
    return args


def peak(device_kind: str, dtype: str) -> tuple[float | None, str]:
    """Peak TFLOP/s of one device for `dtype` activations, and where the number comes from."""
    override = os.environ.get("THESEUS_BENCH_PEAK_TFLOPS")
    if override:
        return float(override), "THESEUS_BENCH_PEAK_TFLOPS"
    column = "bfloat16" if dtype == "bfloat16" else "tf32"
    for name, peaks in PEAK_TFLOPS.items():
        if name.lower() in device_kind.lower():
            return peaks[column], f"{name} dense {column} peak (PEAK_TFLOPS in gpu.py)"
    known = ", ".join(PEAK_TFLOPS)
    return (
        None,
        f"no peak known for {device_kind!r} (known: {known}); set THESEUS_BENCH_PEAK_TFLOPS",
    )


def plan(models: list[str]) -> list[Run]:
    """Every run, the most important first (see the module docstring)."""
    first = [Run(name, hand=True) for name in models]
    later = [
        Run(name, strategy, remat)
        for name in models
        for strategy, remat in RUNS[name]
        if remat != "none"
    ]
    last = [
        Run(name, strategy, remat)
        for name in models
        for strategy, remat in RUNS[name]
        if remat == "none" and strategy != "dp"
    ]
    return [*first[:1], Run(models[0], tandem=True), *first[1:], *later, *last]


def failure_note(lines: list[str], code: int | None) -> str:
    """One line on why a run wrote no results: its last exception, else its last line."""
    for line in reversed(lines):
        found = re.search(r"\b(\w*(?:Error|Exception|Exhausted)\b:?.*)", line)
        if found:  # its first sentence
            return found.group(1).strip().split(". ")[0][:240]
    tail = [line.strip() for line in lines if line.strip()]
    return f"exit {code}: {tail[-1][:300] if tail else 'no output'}"


def execute(run: Run, command: list[str], out: Path, timeout: float) -> None:
    """Run one script with `--json`, echo its output, and keep its results or a note."""
    env = dict(os.environ)
    env.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.92")  # see the module docstring
    print(f"\n[{run.label}] $ {' '.join(command[1:])}", flush=True)
    start = time.perf_counter()
    child = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    killed = threading.Event()

    def kill() -> None:
        killed.set()
        child.kill()

    timer = threading.Timer(timeout, kill)
    timer.start()
    tail: collections.deque[str] = collections.deque(maxlen=40)
    assert child.stdout is not None
    for line in child.stdout:
        print(line, end="", flush=True)
        tail.append(line)
    run.exit = child.wait()
    timer.cancel()
    took = time.perf_counter() - start
    print(f"([{run.label}]: exit {run.exit}, {took:.0f} s)", flush=True)
    if killed.is_set():
        run.note = f"timed out after {timeout:.0f} s (the budget left)"
    elif out.exists():
        run.results = json.loads(out.read_text())
    else:
        run.note = failure_note(list(tail), run.exit)


def measure(args: argparse.Namespace, runs: list[Run], scratch: Path) -> None:
    """Execute `runs` in order within `args.budget` seconds."""
    deadline = time.perf_counter() + args.budget
    for i, run in enumerate(runs):
        left = deadline - time.perf_counter()
        if left < MIN_START_S:
            run.note = f"skipped: {max(left, 0):.0f} s of the {args.budget:.0f} s budget left"
            print(f"\n[{run.label}] {run.note}", flush=True)
            continue
        shape = MODELS[run.model]
        options = [
            str(x) for key, value in shape.items() for x in (f"--{key}", value) if key != "batch"
        ]
        out = scratch / f"{i}.json"
        if run.tandem:  # on as many devices as the runs before saw
            devices = next((r.results["info"]["devices"] for r in runs if r.results), 1)
            steps = QUICK["tandem"] if args.quick else TANDEM
            command = [sys.executable, str(HERE / "analysis.py"), *options]
            command += ["--batch", str(shape["batch"] * devices), *steps]
        else:
            kind = "hand" if run.hand else "alone"
            steps = QUICK[kind] if args.quick else (HAND if run.hand else ALONE)
            command = [sys.executable, str(HERE / "train_step.py"), *options]
            command += ["--per-device-batch", str(shape["batch"])]
            command += ["--strategy", run.strategy, "--remat", run.remat, *steps]
        execute(run, [*command, "--json", str(out)], out, min(TIMEOUT_S, left))


def mfu_row(run: Run) -> dict[str, Any]:
    """The MFU table's row of one training run (numbers None where it has no results)."""
    row: dict[str, Any] = {
        "model": run.model,
        "strategy": run.strategy,
        "remat": run.remat,
        "hand_loop": run.hand,
        "note": run.note,
    }
    if run.results is None:
        return row
    info = run.results["info"]
    samples = run.results["rows"][0]["ours_samples"]
    tokens_per_s = statistics.median(samples)
    tflops = tokens_per_s * info["flops_per_token"] / 1e12 / info["devices"]
    peak_tflops, source = peak(info["device_kind"], info["dtype"])
    row |= {
        key: info[key]
        for key in (
            "parameters",
            "flops_per_token",
            "devices",
            "device_kind",
            "platform",
            "dtype",
            "batch",
            "tokens_per_step",
            "rounds",
            "steps",
        )
    }
    row |= {
        "tokens_per_s": tokens_per_s,
        "tokens_per_s_samples": samples,
        "tflops_per_device": tflops,
        "peak_tflops": peak_tflops,
        "peak_source": source,
        "mfu": None if peak_tflops is None else tflops / peak_tflops,
    }
    if info["devices"] == 1:
        row["note"] = "1 device: the same layout as dp"
    return row


def report(args: argparse.Namespace, runs: list[Run], took: float) -> int:
    """Print the tables; write `--json`. Returns the exit status."""
    training = [run for run in runs if not run.tandem]
    order = {(name, s, r): i for i, name in enumerate(args.models) for s, r in RUNS[name]}
    training.sort(key=lambda run: order[run.model, run.strategy, run.remat])
    table = [mfu_row(run) for run in training]
    measured = [row for row in table if "tokens_per_s" in row]
    print(f"\nGPU benchmark ({took:.0f} s of a {args.budget:.0f} s budget)")
    if measured:
        first = measured[0]
        print(
            f"device: {first['devices']} x {first['device_kind']} ({first['platform']}); "
            "global batch = batch per device x devices"
        )
        if first["devices"] == 1:
            print(
                "one device: dp, zero1 and fsdp keep the same layout (nothing is split), "
                "so their rows differ by noise only; on a TPU host or a multi-GPU machine "
                "they differ"
            )
    for name in args.models:
        row = next((row for row in measured if row["model"] == name), None)
        if row is not None:
            print(
                f"{name}: {row['parameters']:,} parameters, {row['flops_per_token']:,} model "
                f"FLOPs per token (6 N + 12 L d T), {row['dtype']} activations, batch "
                f"{row['batch']} x {MODELS[name]['block']} tokens"
            )
    header = f"\n{'model':<11}{'strategy':<9}{'remat':<7}{'tokens/s':>12}{'TFLOP/s/dev':>13}"
    print(header + f"{'MFU':>8}{'peak':>9}  rounds x steps")
    sources: dict[str, str] = {}
    for row in table:
        head = f"{row['model']:<11}{row['strategy']:<9}{row['remat']:<7}"
        if "tokens_per_s" not in row:
            print(f"{head}{'':>12}  not measured: {row['note']}")
            continue
        peak_tflops = row["peak_tflops"]
        mfu = "?" if row["mfu"] is None else f"{row['mfu']:.1%}"
        peak_text = "?" if peak_tflops is None else f"{peak_tflops:g}"
        sources[peak_text] = row["peak_source"]
        alone = "" if row["hand_loop"] else ", trainer alone"
        print(
            f"{head}{row['tokens_per_s']:>12,.0f}{row['tflops_per_device']:>13,.2f}"
            f"{mfu:>8}{peak_text:>9}  {row['rounds']} x {row['steps']}{alone}"
        )
    for peak_text, source in sources.items():
        print(f"peak {peak_text} TFLOP/s per device: {source}")
    rows: list[_report.Row] = [mfu_report_row(row) for row in table]
    ratio_rows = []
    for run in sorted(runs, key=lambda run: run.tandem):  # the hand loops, then the tandem
        if run.results is not None and (run.hand or run.tandem):
            ratio_rows += [
                (run.model, _report.Row(**row)) for row in run.results["rows"] if row["ratios"]
            ]
    print(f"\n{'what':<75}{'ratio':>9}  {'range':<18}{'goal':<9}met?")
    for name, row in ratio_rows:
        ratios = row.ratios
        middle = statistics.median(ratios)
        spread = f"{min(ratios):.3f}..{max(ratios):.3f}"
        met = "-" if row.met is None else ("yes" if row.met else "NO")
        what = f"{name}: {row.what.split(' (')[0]}"
        print(f"{what[:74]:<75}{middle:>9.3f}  {spread:<18}{row.goal or '-':<9}{met}")
        rows.append(row)
    missing = [run for run in runs if run.results is None]
    for run in (run for run in missing if run.tandem):
        print(f"{run.label}: not measured: {run.note}")
    failed = [run for run in runs if run.hand and run.exit not in (0, None) and run.results]
    for run in failed:
        print(f"{run.label}: the trainer and the hand loop DISAGREED (see its output above)")
    info = {
        "models": {name: MODELS[name] for name in args.models},
        "mfu": table,
        "not_measured": [{"run": run.label, "note": run.note} for run in missing],
        "budget_s": args.budget,
        "took_s": took,
    }
    _report.write(args.json, "gpu", args.quick, rows, info)
    return 1 if missing or failed else 0


def mfu_report_row(row: dict[str, Any]) -> _report.Row:
    """One MFU measurement as a row of the results file."""
    what = f"{row['model']} {row['strategy']} remat={row['remat']}: trainer tokens/s and MFU"
    if "tokens_per_s" not in row:
        return _report.info_row(what, "not measured", [], unit="tokens/s", note=row["note"])
    mfu = "MFU ?" if row["mfu"] is None else f"MFU {row['mfu']:.1%}"
    return _report.info_row(
        what,
        f"{row['tokens_per_s']:,.0f} tokens/s, {mfu}",
        row["tokens_per_s_samples"],
        unit="tokens/s",
        note=f"{row['tflops_per_device']:.2f} TFLOP/s per device on {row['devices']} x "
        f"{row['device_kind']}; peak {row['peak_tflops']} ({row['peak_source']}); "
        f"{row['rounds']} rounds x {row['steps']} steps"
        + (f"; {row['note']}" if row["note"] else ""),
    )


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    runs = plan(args.models)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:
        measure(args, runs, Path(scratch))
    return report(args, runs, time.perf_counter() - start)


if __name__ == "__main__":
    sys.exit(main())
