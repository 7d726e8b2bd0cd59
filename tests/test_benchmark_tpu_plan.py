"""`python -m benchmarks --device tpu`: the TPU plan, its MFU rows and the out-of-memory line.

The one-line out-of-memory exit is checked on the error texts JAX gives (XLA:TPU at
compile time, PJRT allocating on a TPU, XLA on a GPU), copied from real reports; the
expected numbers are worked out by hand from them (XLA's "G" is 2**30 bytes). The plan
itself runs end to end at tiny sizes on the CPU in two slow tests
(`_tpu_plan_tiny.py`).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks import _memory, run, tpu_plan  # noqa: E402

# XLA:TPU, compile time (github.com/LargeWorldModel/LWM/issues/60).
COMPILE = (
    "RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in memory space "
    "hbm. Used 21.95G of 15.48G hbm.\n Exceeded hbm capacity by 6.47G.\n\nTotal hbm usage "
    ">= 22.47G:\n    reserved        530.00M\n    program          21.95G\n    arguments  0B\n"
)
# PJRT on a TPU, allocating a buffer.
ALLOCATE = (
    "RESOURCE_EXHAUSTED: Error allocating device buffer: Attempting to allocate 3.00G. That "
    "was not possible. There are 1.50G free.; (0x0x0_HBM0)"
)
# XLA on a GPU (github.com/google-deepmind/jaxline/issues/11).
GPU = "RESOURCE_EXHAUSTED: Out of memory while trying to allocate 285212672 bytes."


def test_the_compile_time_message_gives_what_it_needs_and_what_the_chip_has() -> None:
    line = _memory.oom_line(COMPILE, what="train step", advice="--batch 16 or --remat block")
    assert line == (
        "out of memory: train step needs about 21.95 GiB; the device has 15.48 GiB; "
        "try --batch 16 or --remat block"
    )


def test_an_allocation_says_how_much_more_and_the_device_size_comes_from_its_stats() -> None:
    line = _memory.oom_line(ALLOCATE, what="sae", advice="--tokens 2048", device_bytes=16 * 2**30)
    assert line == (
        "out of memory: sae needs about 3.00 GiB more with 1.50 GiB free; the device has "
        "16.00 GiB; try --tokens 2048"
    )
    # 285,212,672 bytes = 272 MiB = 0.265625 GiB
    assert _memory.oom_line(GPU, what="x", advice="y") == (
        "out of memory: x needs about 0.27 GiB more; try y"
    )


def test_only_out_of_memory_errors_are_recognized() -> None:
    assert all(_memory.is_out_of_memory(RuntimeError(m)) for m in (COMPILE, ALLOCATE, GPU))
    assert not _memory.is_out_of_memory(ValueError("INVALID_ARGUMENT: shapes differ"))


def test_an_out_of_memory_error_exits_1_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as raised, _memory.exit_on_out_of_memory("step", "--batch 4"):
        raise RuntimeError(COMPILE)
    assert raised.value.code == 1
    assert capsys.readouterr().err.splitlines() == [
        "out of memory: step needs about 21.95 GiB; the device has 15.48 GiB; try --batch 4"
    ]
    with pytest.raises(ValueError, match="other"), _memory.exit_on_out_of_memory("s", "a"):
        raise ValueError("other")


def test_the_cpu_backend_reports_no_peak() -> None:
    assert _memory.peak_bytes() is None


def test_program_bytes_counts_arguments_and_leaves_out_donated_outputs() -> None:
    import jax
    import jax.numpy as jnp

    x = jnp.ones((256, 512), jnp.float32)  # 524,288 bytes
    kept = _memory.program_bytes(jax.jit(lambda a: a * 2).lower(x).compile())
    donated = jax.jit(lambda a: a * 2, donate_argnums=0).lower(x).compile()
    assert kept is not None and kept["arguments"] == 256 * 512 * 4
    assert kept["outputs"] == 256 * 512 * 4  # a fresh buffer for the result
    assert _memory.program_bytes(donated)["outputs"] == 0  # written over the argument
    assert kept["total"] == sum(kept[k] for k in ("arguments", "outputs", "temporaries"))


def test_tiny_replaces_only_the_sizes() -> None:
    args = ("--layers", "12", "--batch", "8", "--d-model", "768", "--checks", "tandem")
    assert tpu_plan.shrink(args) == (
        "--layers", "2", "--batch", "8", "--d-model", "64", "--checks", "tandem",
    )  # fmt: skip
    plan = tpu_plan.tiny(tpu_plan.TPU_BENCHMARKS)
    assert [b.name for b in plan] == [b.name for b in tpu_plan.TPU_BENCHMARKS]
    assert len({b.name for b in plan}) == len(plan)
    assert all((ROOT / "benchmarks" / f"{b.script}.py").exists() for b in plan)
    assert set(tpu_plan.EXPECTED_S) == {b.name for b in plan}
    # each entry fits one device call (600 s), but `library` (its commands: about 11 minutes
    # on the v5e, measured in parts), and the whole plan two sessions' 30 device-minutes
    assert max(v for k, v in tpu_plan.EXPECTED_S.items() if k != "library") < 600
    # the plan's own limit never stops an entry that takes its usual time
    assert all(b.limit_s > 1.2 * tpu_plan.EXPECTED_S[b.name] for b in tpu_plan.TPU_BENCHMARKS)
    assert sum(tpu_plan.EXPECTED_S.values()) < 2 * 25 * 60


def test_mfu_is_tokens_per_second_times_flops_per_token_over_the_peak() -> None:
    info = {"flops_per_token": 854_770_176, "parameters": 123_587_328, "batch": 8,
            "dtype": "bfloat16", "remat": "none", "tokens_per_step": 8192}  # fmt: skip
    results = {"benchmark": "train_step", "rows": [{"ours_samples": [100_000.0, 120_000.0]}],
               "info": info}  # fmt: skip
    row = tpu_plan.mfu_row(results, 197.0, "v5e")
    assert row is not None
    # 110,000 tokens/s x 854,770,176 FLOPs / 197e12 FLOP/s = 0.47728...
    assert row["ours"] == "47.7%" and row["met"] is False and row["goal"] == ">= 50%"
    unknown = tpu_plan.mfu_row(results, None, "no peak known for 'cpu'")
    assert unknown is not None and unknown["ours"] == "unknown" and unknown["met"] is None


def test_the_tpu_plan_refuses_a_machine_without_a_tpu_unless_tiny() -> None:
    args = run.parse(["--device", "tpu"])
    with pytest.raises(SystemExit, match="JAX sees no TPU"):
        run.choose_plan(args)
    plan, device = run.choose_plan(run.parse(["--device", "auto"]))
    assert plan == run.BENCHMARKS and device is None  # auto on a CPU: the CPU table
    with pytest.raises(SystemExit):
        run.parse(["--tiny"])
