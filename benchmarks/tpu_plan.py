"""The TPU plan: what ``python -m benchmarks --device tpu`` runs, sized for one 16 GB chip.

Each entry is a benchmark script with the options of one row group of
``results-tpu.md`` (issue 45). The models are the 124M GPT (``M124``: 12 layers, width
768, 12 heads, block 1024, vocab 50304, bfloat16 activations) and a 354M one (``M354``:
24 layers, width 1024, 16 heads). Sizing for a TPU v5e (15.75 GB of HBM): no run holds
two models' state but the batch-8 comparison of ``train_step.py`` (about 10 GB; its
docstring has the arithmetic); the 354M and the batch-32 runs time the trainer alone.
On a v5e, each program's ~15 s of opening the chip and its compilations included, the
plan takes about 31 minutes (``EXPECTED_S``: each entry's time on 2026-12-06 and, for
``library``, 2026-12-07, in several device calls: more than one session's device time).

``--tiny`` (a smoke test of the plan on a CPU, ``JAX_PLATFORMS=cpu``) replaces the model
and SAE sizes by ``TINY``'s; each script's own ``--quick`` cuts its repeats.

Derived rows: each ``train_step`` result gets its model FLOPs utilization, tokens/s x
model FLOPs per token (6 N + 12 L d T) / the chip's dense bf16 peak (``gpu.PEAK_TFLOPS``
by the device's kind), against the goal of issue 44 (50%).
"""

from __future__ import annotations

import dataclasses
import statistics
import subprocess
import sys
from typing import Any

from benchmarks import _report, gpu
from benchmarks.run import Benchmark

M124 = ("--layers", "12", "--width", "768", "--heads", "12", "--block", "1024",
        "--vocab", "50304", "--dtype", "bfloat16")  # fmt: skip
M354 = ("--layers", "24", "--width", "1024", "--heads", "16", "--block", "1024",
        "--vocab", "50304", "--dtype", "bfloat16")  # fmt: skip
HAND = ("--hand-attention", "flash", "--check", "3", "--warmup", "2", "--steps", "5",
        "--rounds", "6")  # fmt: skip
ALONE = ("--trainer-only", "--warmup", "2", "--steps", "5", "--rounds", "4")
#: The library's walks as commands on the 124M GPT (the synthetic language's vocabulary).
LIBRARY = ("--layers", "12", "--width", "768", "--heads", "12", "--block", "1024", "--batch",
           "8", "--checkpoints", "10", "--rounds", "0", "--tandem", "0", "--commands", "1")  # fmt: skip
MFU_GOAL = 0.50
#: The sizes of `--tiny`: option -> value, wherever an entry passes the option.
TINY = {"--layers": "2", "--width": "64", "--heads": "2", "--block": "128", "--vocab": "258",
        "--d-model": "64", "--expansion": "4"}  # fmt: skip

TPU_BENCHMARKS = (
    Benchmark(
        "train_124m_b8",
        "124M GPT, batch 8: trainer vs a hand loop with Pallas flash attention; MFU",
        (*M124, "--batch", "8", *HAND),
        limit_s=600,
        script="train_step",
    ),
    Benchmark(
        "train_124m_b32",
        "124M GPT, batch 32, remat none: the trainer alone; MFU; peak HBM",
        (*M124, "--batch", "32", *ALONE),
        limit_s=480,
        script="train_step",
    ),
    Benchmark(
        "train_124m_b32_remat",
        "124M GPT, batch 32, remat block: the trainer alone; MFU; peak HBM",
        (*M124, "--batch", "32", "--remat", "block", *ALONE),
        limit_s=480,
        script="train_step",
    ),
    Benchmark(
        "train_354m_b8",
        "354M GPT, batch 8: the trainer alone; MFU",
        (*M354, "--batch", "8", *ALONE),
        limit_s=600,
        script="train_step",
    ),
    Benchmark(
        "generation_b1",
        "124M GPT decoding, batch 1: generate vs a hand loop with the same cache, vs recompute",
        (*M124, "--batch", "1"),
        limit_s=480,
        script="generation",
    ),
    Benchmark(
        "generation_b8",
        "124M GPT decoding, batch 8: generate vs a hand loop with the same cache, vs recompute",
        (*M124, "--batch", "8"),
        limit_s=480,
        script="generation",
    ),
    Benchmark(
        "analysis_tandem",
        "tandem analysis vs plain validation on the 124M GPT, batch 8",
        (*M124, "--batch", "8", "--checks", "tandem", "--repeats", "40", "--breakdown", "0"),
        limit_s=600,
        script="analysis",
    ),
    Benchmark(
        "analysis_debugger",
        "debugger (eager) vs the compiled engine, float32, 'highest' matmul precision",
        ("--checks", "debugger"),
        limit_s=300,
        script="analysis",
    ),
    Benchmark(
        "sae",
        "SAE training (d 768, 16x: 12,288 features) vs a hand JAX loop; tandem SAE cost",
        ("--d-model", "768", "--expansion", "16"),
        limit_s=480,
    ),
    Benchmark(
        "harness",
        "lm-eval requests/s of theseus's model alone (no torch on a TPU host)",
        ("--ours-only", "--rounds", "2"),
        limit_s=480,
    ),
    Benchmark(
        "library",
        "the analysis library on the 124M GPT: its seven analyses in one `theseus run --over` "
        "of 10 checkpoints vs seven, each command a new process (the in-process walks and "
        "the tandem rows: the CPU table)",
        LIBRARY,
        limit_s=900,
    ),
    Benchmark(
        "kernels",
        "attention and loss kernels, one layer: JAX's Pallas splash/flash and theseus's "
        "chunked loss vs tokamax (where installed)",
        limit_s=300,
    ),
)
#: Seconds each entry took on a v5e (start, compile, measure), 2026-12-06; `library`'s was
#: measured in parts on 2026-12-07 (benchmarks/README): 192 s of training and settings,
#: 74 s for the one command, 366 s for the seven, the values check.
EXPECTED_S = {"train_124m_b8": 137, "train_124m_b32": 83, "train_124m_b32_remat": 89,
              "train_354m_b8": 114, "generation_b1": 127, "generation_b8": 169,
              "analysis_tandem": 103, "analysis_debugger": 40, "sae": 104, "harness": 62,
              "library": 650, "kernels": 179}  # fmt: skip


PROBE = (
    "import jax; d = jax.devices(); "
    "print(jax.default_backend(), len(d), d[0].device_kind, jax.__version__, sep='\\t')"
)


def probe_device(timeout: float = 300) -> dict[str, Any]:
    """What JAX sees, asked in a process of its own (this one never holds a TPU):
    `{"backend", "count", "kind", "jax"}`, or `{"backend": "unknown", "error": line}`."""
    try:
        done = subprocess.run(
            [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        return {"backend": "unknown", "error": f"JAX did not answer within {timeout:g} s"}
    fields = (done.stdout.strip().splitlines() or [""])[-1].split("\t")
    if done.returncode != 0 or len(fields) != 4:
        said = [x for x in done.stderr.splitlines() if x.strip()] or ["no output"]
        return {"backend": "unknown", "error": said[-1].strip()[:300]}
    return {"backend": fields[0], "count": int(fields[1]), "kind": fields[2], "jax": fields[3]}


def shrink(args: tuple[str, ...]) -> tuple[str, ...]:
    """`args` with the value of each option of `TINY` replaced by its tiny one."""
    out = list(args)
    for i, arg in enumerate(out[:-1]):
        if arg in TINY:
            out[i + 1] = TINY[arg]
    return tuple(out)


def tiny(plan: tuple[Benchmark, ...]) -> tuple[Benchmark, ...]:
    """The plan with `TINY`'s sizes (a smoke test on a CPU)."""
    return tuple(dataclasses.replace(b, args=shrink(b.args)) for b in plan)


def mfu_row(results: dict[str, Any], peak: float | None, source: str) -> dict[str, Any] | None:
    """The MFU of a train_step results file's trainer side, as a row (None: no model info).

    Args:
        results: a `train_step.py` results file (its `info` has `flops_per_token`).
        peak: the device's dense peak in TFLOP/s, or None when unknown (the row says so).
        source: where the peak comes from, or why it is unknown.
    """
    info = results.get("info") or {}
    if "flops_per_token" not in info:
        return None
    what = (
        f"MFU of the trainer ({info['parameters'] / 1e6:.0f}M GPT, batch {info['batch']}, "
        f"{info['dtype']} activations, remat {info['remat']})"
    )
    basis = f"tokens/s x {info['flops_per_token']:,} model FLOPs per token (6 N + 12 L d T) / "
    if peak is None:
        row = _report.info_row(what, "unknown", [], unit="", note=basis + source)
        return {**row.__dict__}
    samples = results["rows"][0]["ours_samples"]
    mfu = [s * info["flops_per_token"] / (peak * 1e12) for s in samples]
    row = _report.info_row(
        what,
        f"{statistics.median(mfu):.1%}",
        mfu,
        unit="",
        goal=(">=", MFU_GOAL),
        met=bool(statistics.median(mfu) >= MFU_GOAL),
        note=basis + f"{peak:g} TFLOP/s ({source}); {info['tokens_per_step']:,} tokens a step",
    )
    return {**row.__dict__, "goal": f">= {MFU_GOAL:.0%}"}


def add_derived_rows(runs: list[dict[str, Any]]) -> None:
    """Append to each train_step run's rows its MFU row, in place."""
    for record in runs:
        results = record.get("results")
        if record["status"] != "ok" or not results or results.get("benchmark") != "train_step":
            continue
        info = results.get("info") or {}
        peak, source = gpu.peak(str(info.get("device_kind", "")), str(info.get("dtype", "")))
        row = mfu_row(results, peak, source)
        if row is not None and not any(r["what"] == row["what"] for r in results["rows"]):
            results["rows"].append(row)
