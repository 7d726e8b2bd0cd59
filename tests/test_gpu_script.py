"""benchmarks/gpu.py on the CPU: every (model, strategy, remat) row, its tokens/s and MFU.

The MFU is checked against a FLOP count made here from the architecture numbers (not
from the script's helpers): N = V d + L (12 d^2 + 2 d) + d for the trainer's GPT (no
biases, rotary positions, tied embedding, layer-norm scales only), and model FLOPs per
token = 6 N + 12 L d T.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu.py"
# (layers, width, block, vocab) of the models, written out here.
SHAPES = {
    "tiny": (2, 64, 64, 258),
    "tiny-1b": (3, 96, 64, 258),
    "gpt2-124m": (12, 768, 1024, 50304),
    "gpt-1b": (20, 2048, 1024, 50304),
}
EXPECTED = {
    ("tiny", "dp", "none"),
    ("tiny", "zero1", "none"),
    ("tiny", "fsdp", "none"),
    ("tiny-1b", "dp", "none"),
    ("tiny-1b", "zero1", "none"),
    ("tiny-1b", "fsdp", "none"),
    ("tiny-1b", "dp", "block"),
}


def parameters(layers: int, width: int, vocab: int) -> int:
    return vocab * width + layers * (12 * width * width + 2 * width) + width


def flops_per_token(name: str) -> int:
    layers, width, block, vocab = SHAPES[name]
    return 6 * parameters(layers, width, vocab) + 12 * layers * width * block


def load_script() -> ModuleType:
    """benchmarks/gpu.py as a module (registered: its dataclass looks itself up)."""
    name = "theseus_bench_gpu_script"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, SCRIPT)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def test_the_gpu_models_have_the_shapes_and_sizes_of_their_names() -> None:
    gpu = load_script()
    for name, (layers, width, block, vocab) in SHAPES.items():
        model = gpu.MODELS[name]
        assert (model["layers"], model["width"], model["block"], model["vocab"]) == (
            layers,
            width,
            block,
            vocab,
        )
    assert parameters(12, 768, 50304) == 123_587_328  # the docstring's counts
    assert parameters(20, 2048, 50304) == 1_109_739_520
    # Parameters, gradients and two Adam moments in float32 fit an 80 GB device with room
    # for batch 8's activations (about 3.7 GB per row, see the docstring).
    assert 16 * parameters(20, 2048, 50304) + 8 * 3.7e9 < 0.75 * 80e9
    assert gpu.MODELS["gpt-1b"]["dtype"] == "bfloat16"
    assert ("dp", "block") in gpu.RUNS["gpt-1b"] and ("dp", "block") in gpu.RUNS["tiny-1b"]


def test_a_failed_run_is_one_line_naming_the_error() -> None:
    gpu = load_script()
    output = [
        "Traceback (most recent call last):\n",
        '  File "x.py", line 1, in <module>\n',
        "theseus.config.ConfigError: training/strategy = fsdp splits logical axis 'embed' "
        "(size 64) over the 3 data-parallel devices, and 64 is not a multiple of 3. Use dp.\n",
    ]
    note = gpu.failure_note(output, 1)
    assert note.startswith("ConfigError: training/strategy = fsdp splits")
    assert "\n" not in note and "Use dp" not in note
    assert gpu.failure_note(["killed\n"], -9) == "exit -9: killed"


def test_peak_comes_from_the_table_or_the_override(monkeypatch: pytest.MonkeyPatch) -> None:
    gpu = load_script()
    monkeypatch.delenv("THESEUS_BENCH_PEAK_TFLOPS", raising=False)
    assert gpu.peak("NVIDIA H100 80GB HBM3", "bfloat16")[0] == 989.4
    assert gpu.peak("NVIDIA H100 PCIe", "bfloat16")[0] == 756.5
    assert gpu.peak("TPU v5 lite", "bfloat16")[0] == 197.0
    assert gpu.peak("cpu", "float32")[0] is None
    monkeypatch.setenv("THESEUS_BENCH_PEAK_TFLOPS", "2.5")
    assert gpu.peak("cpu", "float32") == (2.5, "THESEUS_BENCH_PEAK_TFLOPS")


@pytest.mark.slow
def test_gpu_script_on_cpu_reports_mfu_for_every_model_and_strategy(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # one CPU device
    env |= {
        "THESEUS_BENCH_MODEL": "tiny",
        "JAX_PLATFORMS": "cpu",
        "THESEUS_BENCH_PEAK_TFLOPS": "1",
    }
    out = tmp_path / "gpu.json"
    command = [sys.executable, str(SCRIPT), "--quick", "--budget", "1500", "--json", str(out)]
    done = subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=1800, cwd=ROOT, check=False
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    results = json.loads(out.read_text())
    table = results["info"]["mfu"]
    assert {(r["model"], r["strategy"], r["remat"]) for r in table} == EXPECTED
    assert len(table) == len(EXPECTED)
    for r in table:
        flops = flops_per_token(r["model"])
        layers, width, _, vocab = SHAPES[r["model"]]
        assert r["parameters"] == parameters(layers, width, vocab)
        assert r["flops_per_token"] == flops
        assert r["devices"] == 1
        assert r["tokens_per_s"] > 0
        assert r["peak_tflops"] == 1.0 and r["peak_source"] == "THESEUS_BENCH_PEAK_TFLOPS"
        mfu = r["tokens_per_s"] * flops / 1e12 / r["devices"] / 1.0
        assert r["mfu"] == pytest.approx(mfu, rel=1e-9)
        assert r["mfu"] > 0
    # The results-file rows: one per measurement, the two hand-loop rows, the tandem rows.
    whats = [row["what"] for row in results["rows"]]
    assert sum("trainer tokens/s and MFU" in w for w in whats) == len(EXPECTED)
    assert sum("hand-written" in w for w in whats) == 2
    assert any(w.startswith("tandem analysis") for w in whats)

    # The printed table: the same rows, the MFU within the rounding of the printed numbers.
    printed = {}
    for line in done.stdout.splitlines():
        found = re.match(r"(tiny(?:-1b)?)\s+(dp|zero1|fsdp)\s+(none|block)\s+([\d,]+)\s", line)
        if found:
            model, strategy, remat, tokens = found.groups()
            mfu_text = re.search(r"\s([\d.]+)%\s", line)
            assert mfu_text is not None, line
            printed[model, strategy, remat] = (
                float(tokens.replace(",", "")),
                float(mfu_text.group(1)) / 100,
            )
    assert set(printed) == EXPECTED
    for key, (tokens, mfu) in printed.items():
        assert tokens > 0
        expected = tokens * flops_per_token(key[0]) / 1e12 / 1.0
        assert mfu == pytest.approx(expected, abs=0.0006), key
    assert "peak 1 TFLOP/s per device: THESEUS_BENCH_PEAK_TFLOPS" in done.stdout
    assert "the same layout" in done.stdout
    assert "train step vs hand-written Flax+optax loop" in done.stdout
    assert "tandem analysis" in done.stdout
