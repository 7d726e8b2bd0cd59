"""The GPU benchmark that ``gpu.sh`` runs: the 124M-parameter GPT on one NVIDIA GPU.

Run: ``bash benchmarks/gpu.sh`` (it makes the environment, then runs this file). On its
own: ``python benchmarks/gpu.py`` in an environment with the workspace and ``jax[cuda12]``.

Two scripts of this folder, one after the other, on the GPT of GPT-2 small (12 layers,
n_embd 768, 12 heads, 1024 tokens, vocabulary 50,304: 124M parameters; bfloat16
activations, float32 parameters):

1. ``train_step.py``: the trainer's step against the hand-written Flax + optax loop,
   50 steps on the theseus side (5 compared with the hand loop, 5 warm-up, 8 timed
   blocks of 5), alternating with the hand loop. Prints tokens/s and the model FLOPs
   utilization: tokens/s x model FLOPs per token (6 N + 12 L d T) / the device's peak.
2. ``analysis.py --checks tandem``: the validation step with and without the tandem
   analysis on the same model.

``THESEUS_BENCH_MODEL=tiny`` swaps in a tiny GPT (to try the script on a CPU with
``JAX_PLATFORMS=cpu``); ``THESEUS_BENCH_PEAK_TFLOPS`` sets the peak for a device that
``PEAK_TFLOPS`` does not list.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
MODELS = {
    "gpt2-124m": {
        "layers": 12,
        "width": 768,
        "heads": 12,
        "block": 1024,
        "vocab": 50304,
        "batch": 16,
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
}
# Dense peak TFLOP/s per GPU from NVIDIA's data sheets (without structured sparsity):
# bfloat16 tensor cores, TF32 tensor cores (the fastest a float32 matmul can run) and
# plain FP32. Matched against `device_kind` in order, so "H100 PCIe" comes before "H100".
PEAK_TFLOPS = {
    "H200": {"bfloat16": 989.4, "tf32": 494.7, "float32": 66.9},
    "H100 PCIe": {"bfloat16": 756.5, "tf32": 378.0, "float32": 51.2},
    "H100": {"bfloat16": 989.4, "tf32": 494.7, "float32": 66.9},  # SXM5
    "A100": {"bfloat16": 312.0, "tf32": 156.0, "float32": 19.5},
}
TIMEOUT_S = 300  # per script; gpu.sh as a whole must end within 8 minutes


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


def run(script: str, args: list[str], out: Path) -> dict[str, Any]:
    """Run one benchmark script with `--json`; its output goes to the terminal."""
    command = [sys.executable, str(HERE / script), *args, "--json", str(out)]
    print(f"\n$ {' '.join(command[1:])}", flush=True)
    start = time.perf_counter()
    done = subprocess.run(command, timeout=TIMEOUT_S, check=False)
    print(f"({script}: exit {done.returncode}, {time.perf_counter() - start:.0f} s)", flush=True)
    if not out.exists():
        sys.exit(f"{script} wrote no results (exit {done.returncode}); its output is above")
    results: dict[str, Any] = json.loads(out.read_text())
    return results


def main() -> int:
    name = os.environ.get("THESEUS_BENCH_MODEL", "gpt2-124m")
    if name not in MODELS:
        sys.exit(f"THESEUS_BENCH_MODEL={name!r} is not one of {sorted(MODELS)}")
    model = MODELS[name]
    options = [str(x) for key, value in model.items() for x in (f"--{key}", value)]
    train_options = [*options, "--check", "5", "--warmup", "5", "--steps", "5", "--rounds", "8"]
    with tempfile.TemporaryDirectory() as scratch:
        train = run("train_step.py", train_options, Path(scratch) / "train_step.json")
        analysis_options = [*options, "--checks", "tandem", "--repeats", "40", "--breakdown", "2"]
        analysis = run("analysis.py", analysis_options, Path(scratch) / "analysis.json")
    info = train["info"]
    [step] = train["rows"]
    tokens_per_s = statistics.median(step["ours_samples"])
    tflops, source = peak(info["device_kind"], info["dtype"])
    achieved = tokens_per_s * info["flops_per_token"] / 1e12 / info["devices"]
    print(f"\nGPU benchmark: model {name} ({info['parameters']:,} parameters, {info['dtype']})")
    print(
        f"device: {info['devices']} x {info['device_kind']} ({info['platform']}); "
        f"{info['tokens_per_step']:,} tokens per step"
    )
    print(f"tokens/s (theseus, median of 8 blocks): {tokens_per_s:,.0f}")
    print(
        f"model FLOPs per token: {info['flops_per_token']:,} (6 N + 12 L d T); achieved "
        f"{achieved:,.1f} TFLOP/s per device"
    )
    if tflops is None:
        print(f"MFU: unknown, {source}")
    else:
        print(f"MFU: {achieved / tflops:.1%} of {tflops:g} TFLOP/s ({source})")
    print(f"\n{'what':<75}{'ratio':>9}  {'range':<18}{'goal':<9}met?")
    for row in [step, *analysis["rows"]]:
        ratios = row["ratios"]
        middle = statistics.median(ratios)
        spread = f"{min(ratios):.3f}..{max(ratios):.3f}"
        met = "-" if row["met"] is None else ("yes" if row["met"] else "NO")
        what = row["what"].split(" (")[0]  # the model is printed above
        print(f"{what[:74]:<75}{middle:>9.3f}  {spread:<18}{row['goal'] or '-':<9}{met}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
