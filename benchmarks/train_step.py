"""BaseTrainer's train step against a hand-written Flax + optax loop: tokens per second.

Run: ``uv run python benchmarks/train_step.py [--steps 10 --rounds 16 --devices 1
--layers 4 --width 64 --block 64 --batch 16 --placement once] [--quick] [--json PATH]``

Both sides train the same GPT (the trainer's own Flax module), from the same initial
parameters, on the same fixed list of batches, on the same devices, with the same
AdamW (global-norm clipping 1.0, constant learning rate, decay on matrices only) and
with their state donated. Host batches are fetched once before any timing.

* **theseus**: what ``BaseTrainer.run`` does per step, less data loading and
  reporting: ``state, loss, meta, grad_norm = trainer.loop.compiled_train()(state,
  placed, np.uint32(trainer.cursor))``.
* **hand**: ``params, opt_state, loss = step(params, opt_state, x, y)``, a
  ``jax.jit`` of ``value_and_grad`` + ``tx.update`` + ``optax.apply_updates``.

``--placement once`` (default) places every batch on the devices before timing
(theseus with ``trainer.sharding.place_batch``, hand with ``jax.device_put`` to a
``NamedSharding`` over a ``batch`` mesh axis: the same layout); ``per-step`` places
it inside the timed step, as a training loop does.

First both sides run ``--check`` steps from the same parameters and their losses and
parameters are compared (this also compiles both); then, after warm-up, blocks of
``--steps`` steps alternate between the sides for ``--rounds`` rounds (theseus first in
even rounds, hand first in odd ones), each block ending in ``block_until_ready``. The
table gives the median tokens/s per side; the ratio is the median over rounds of
theseus/hand within a round (adjacent blocks see the same load on a shared machine),
PASS when it is at least 0.98. ``host/call`` is how long one step call holds Python:
near the step time, the loop is waiting for the device every step.

``--quick`` runs 6 rounds of 5 steps after 2 warm-up steps (a smoke run); ``--json PATH`` also writes the
result as a row of the benchmarks table (``benchmarks/_report.py``), with the model's
parameter count and model FLOPs per token for ``gpu.py``. ``--vocab`` and ``--dtype``
(activations) exist for the 124M-parameter GPT of ``gpu.sh``.

For ``gpu.py`` (each defaults to what the script always did): ``--strategy dp|zero1|fsdp``
and ``--remat none|block`` build the trainer with ``training/strategy`` and
``training/remat`` (the hand loop keeps its replicated parameters and plain blocks: it
has no strategy); ``--trainer-only`` times the trainer's step alone (no hand loop, no
check; the row is the trainer's tokens/s per round, without a ratio);
``--per-device-batch N`` makes the global batch ``N`` x the number of devices JAX sees
(instead of ``--batch``).

Memory: each row's note gives the device's peak bytes in use (``memory_stats()``; the CPU
backend reports none, and the note says so), and ``--trainer-only`` adds it as a row of its
own where it is known, and a row of what XLA planned for the compiled step (arguments,
outputs, temporaries: ``_memory.program_bytes``), which on a TPU is the one that counts
the activations. The comparison holds both sides' state at once: for the 124M GPT
of the TPU plan (123,587,328 parameters) that is 2 x 12 bytes a parameter (float32
parameters and AdamW's two moments) = 3.0 GB, plus a step's gradients (0.5 GB) and
activations; at batch 8 the hand loop's float32 logits ``[8, 1024, 50304]`` add 1.6 GB
and their gradient as much, about 10 GB in all on a 15.75 GB v5e chip (it ran:
``benchmarks/tpu/t124b8_vs_flash.json``). Larger runs go ``--trainer-only``. A run that
does not fit exits 1 with one line (``_memory.py``: what it needs, what the device has,
what to try), never a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file or with -m
from benchmarks import _memory, _report
from benchmarks._sides import (
    ADAMW,
    CLIP,
    LR,
    TOLERANCES,
    HandSide,
    TheseusSide,
    check,
)

TARGET = 0.98
QUICK = {"steps": 5, "rounds": 6, "warmup": 2}


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=10, help="steps per timed block")
    p.add_argument("--rounds", type=int, default=16, help="timed blocks per side (alternating)")
    p.add_argument("--devices", type=int, default=1, help="virtual CPU devices (data parallel)")
    p.add_argument("--layers", type=int, default=4, help="architecture/n_layers")
    p.add_argument("--width", type=int, default=64, help="architecture/n_embd")
    p.add_argument("--heads", type=int, default=4, help="architecture/n_head")
    p.add_argument("--block", type=int, default=64, help="architecture/block_size")
    p.add_argument("--batch", type=int, default=16, help="training/batch_size (global rows)")
    p.add_argument("--batches", type=int, default=8, help="distinct batches, cycled")
    p.add_argument("--check", type=int, default=5, help="steps of the equivalence check")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps per side after the check")
    p.add_argument("--placement", choices=["once", "per-step"], default="once")
    p.add_argument("--vocab", type=int, default=258, help="architecture/vocab_size")
    p.add_argument(
        "--dtype", choices=sorted(TOLERANCES), default="float32", help="activation dtype"
    )
    p.add_argument(
        "--strategy", choices=["dp", "zero1", "fsdp"], default="dp", help="training/strategy"
    )
    p.add_argument("--remat", choices=["none", "block"], default="none", help="training/remat")
    p.add_argument(
        "--attention",
        choices=["auto", "reference", "splash", "flash", "cudnn"],
        default="auto",
        help="architecture/attention of the trainer's model",
    )
    p.add_argument("--loss-chunk", type=int, default=0, help="training/loss_chunk (0: the default)")
    p.add_argument(
        "--hand-attention",
        choices=["same", "reference", "splash", "flash", "cudnn"],
        default="same",
        help="the hand loop's attention (same: the trainer's model as it is)",
    )
    p.add_argument(
        "--trainer-only", action="store_true", help="time the trainer's step alone (no hand loop)"
    )
    p.add_argument(
        "--profile",
        type=Path,
        help="with --trainer-only: trace --steps more steps with JAX's profiler into this "
        "folder and print the device time by operation (what each is and where in the "
        "model it came from, from the compiled step's text) and by place in the model",
    )
    p.add_argument(
        "--profile-top", type=int, default=20, help="with --profile: the lines of each list"
    )
    p.add_argument(
        "--per-device-batch",
        type=int,
        default=0,
        help="global batch = this x the devices JAX sees (overrides --batch)",
    )
    _report.add_arguments(p)
    args = p.parse_args(argv)
    if args.quick:
        args.steps, args.rounds, args.warmup = QUICK["steps"], QUICK["rounds"], QUICK["warmup"]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.devices > 1:  # must precede the first `import jax`
        os.environ["XLA_FLAGS"] = (
            os.environ.get("XLA_FLAGS", "")
            + f" --xla_force_host_platform_device_count={args.devices}"
        )
    if not args.per_device_batch and args.batch % args.devices:
        sys.exit(f"--batch {args.batch} must be a multiple of --devices {args.devices}")
    shape = f"GPT {args.layers}x{args.width}, block {args.block}, batch {args.batch}"
    what = f"train step ({shape}, remat {args.remat}" + (
        ")" if args.trainer_only else ", beside the hand loop's state)"
    )
    advice = " or ".join(
        [f"--batch {max(1, args.batch // 2)}"]
        + (["--remat block"] if args.remat == "none" else [])
        + ([] if args.trainer_only else ["--trainer-only"])
    )
    with tempfile.TemporaryDirectory() as root, _memory.exit_on_out_of_memory(what, advice):
        return run(args, root)


@contextlib.contextmanager
def synthetic_trainer(
    args: argparse.Namespace, root: str, **extra: Any
) -> Iterator[tuple[Any, list[dict[str, Any]]]]:
    """A `BaseTrainer` on synthetic data, built as `args` say, and `args.batches` host batches.

    `extra` adds configuration settings (`{"logging/checkpoint_interval": 10}`).
    """
    import numpy as np

    from theseus.data.datasets import Synthetic
    from theseus.quick import quick
    from theseus.training.base import BaseTrainer

    class BenchTrainer(BaseTrainer):
        DATASET = Synthetic

    n_batches = max(args.batches, 1)
    Synthetic.prepare(root, tokens=4 * n_batches * args.batch * (args.block + 1), val_tokens=4096)
    with quick(root) as q:
        q.build(BenchTrainer, "bench")
        settings = {
            "architecture/n_layers": args.layers,
            "architecture/n_embd": args.width,
            "architecture/n_head": args.heads,
            "architecture/block_size": args.block,
            "architecture/vocab_size": args.vocab,
            "architecture/dtype/activation": args.dtype,
            "architecture/dropout": 0.0,
            "training/batch_size": args.batch,
            "training/tokens": 10**9,
            "optimization/lr": LR,
            "optimization/beta1": ADAMW["b1"],
            "optimization/beta2": ADAMW["b2"],
            "optimization/eps": ADAMW["eps"],
            "optimization/weight_decay": ADAMW["weight_decay"],
            "optimization/clip_norm": CLIP,
            **_layout(args),
            **extra,
        }
        for key, value in settings.items():
            q.config[key] = value
        trainer: Any = q.create()
        host = []
        for _ in range(n_batches):
            host.append({k: np.asarray(v) for k, v in trainer.batch("train").items()})
            trainer.tick()
        yield trainer, host


def _layout(args: argparse.Namespace) -> dict[str, Any]:
    """The `training/strategy` and `training/remat` settings, when `args` has them."""
    settings: dict[str, Any] = {}
    if getattr(args, "strategy", "dp") != "dp":
        settings["training/strategy"] = args.strategy
    if getattr(args, "remat", "none") != "none":
        settings["training/remat"] = args.remat
    if getattr(args, "attention", "auto") != "auto":
        settings["architecture/attention"] = args.attention
    if getattr(args, "loss_chunk", 0):
        settings["training/loss_chunk"] = args.loss_chunk
    return settings


def model_flops_per_token(params: Any, layers: int, width: int, block: int) -> tuple[int, int]:
    """`(parameters, model FLOPs per trained token)`: 6 N + 12 L d T (PaLM, appendix B).

    The model has no position table (rotary positions), so every parameter counts; the
    tied embedding is counted once, as the unembedding matmul it also does.
    """
    import jax

    n = sum(int(leaf.size) for leaf in jax.tree.leaves(params))
    return n, 6 * n + 12 * layers * width * block


def run(args: argparse.Namespace, root: str) -> int:
    import jax

    if args.per_device_batch:
        args.batch = args.per_device_batch * len(jax.devices())
    with synthetic_trainer(args, root) as (trainer, host):
        if args.trainer_only:
            return run_trainer_only(args, trainer, host)
        theseus = TheseusSide(trainer, host, args.placement)
        hand = HandSide(trainer, host, args.placement, args.hand_attention)

        tokens = args.batch * args.block
        n_params, flops = model_flops_per_token(
            trainer.state.params, args.layers, args.width, args.block
        )
        device = jax.devices()[0]
        print(
            f"model: GPT {args.layers} layers, n_embd {args.width}, {args.heads} heads, "
            f"block {args.block}, vocab {args.vocab}, {args.dtype} activations; {n_params:,} "
            f"parameters, {flops:,} model FLOPs/token; batch {args.batch} ({tokens} tokens/step); "
            f"{len(jax.devices())} {device.platform} device(s) ({device.device_kind}); "
            f"placement {args.placement}"
        )
        agreed, agreement = check(theseus, hand, args.check, args.dtype)
        for side in (theseus, hand):
            side.steps(args.warmup)
        rates: dict[str, list[float]] = {theseus.name: [], hand.name: []}
        calls: dict[str, list[float]] = {theseus.name: [], hand.name: []}
        for round_ in range(args.rounds):  # AB, BA, AB, ...: neither side always goes first
            for side in (theseus, hand) if round_ % 2 == 0 else (hand, theseus):
                start = time.perf_counter()
                calls[side.name] += side.steps(args.steps)
                rates[side.name].append(args.steps * tokens / (time.perf_counter() - start))
        report(rates, calls, args)
        info = run_info(args, n_params, flops, tokens)
        compared = row(rates, calls, args, agreement)
        compared.note += f"; {memory_note(info)} (both sides' state)"
        _report.write(args.json, "train_step", args.quick, [compared], info)
    return _report.exit_status(
        [], checks=[(agreed, "the trainer and the hand loop trained to different parameters")]
    )


def run_info(args: argparse.Namespace, n_params: int, flops: int, tokens: int) -> dict[str, Any]:
    """The results file's `info`: the model's size, the layout and the devices (for gpu.py)."""
    import jax

    device = jax.devices()[0]
    return {
        "parameters": n_params,
        "flops_per_token": flops,
        "tokens_per_step": tokens,
        "platform": device.platform,
        "device_kind": device.device_kind,
        "devices": len(jax.devices()),
        "dtype": args.dtype,
        "batch": args.batch,
        "strategy": args.strategy,
        "remat": args.remat,
        "rounds": args.rounds,
        "steps": args.steps,
        "trainer_only": args.trainer_only,
        "peak_bytes": _memory.peak_bytes(),
    }


def memory_note(info: dict[str, Any]) -> str:
    """The peak device memory for a row's note (or why there is none)."""
    if info["peak_bytes"] is None:
        return f"peak device memory: not reported by the {info['platform']} backend"
    return f"peak device memory {_memory.gigabytes(info['peak_bytes'])}"


def run_trainer_only(args: argparse.Namespace, trainer: Any, host: list[dict[str, Any]]) -> int:
    """`--trainer-only`: warm up, then `--rounds` blocks of `--steps` steps of the trainer."""
    import jax

    med = statistics.median
    theseus = TheseusSide(trainer, host, args.placement, keep_initial=False)
    tokens = args.batch * args.block
    n_params, flops = model_flops_per_token(
        trainer.state.params, args.layers, args.width, args.block
    )
    device = jax.devices()[0]
    print(
        f"model: GPT {args.layers} layers, n_embd {args.width}, {args.heads} heads, block "
        f"{args.block}, vocab {args.vocab}, {args.dtype} activations; {n_params:,} parameters, "
        f"{flops:,} model FLOPs/token; batch {args.batch} ({tokens} tokens/step); "
        f"{len(jax.devices())} {device.platform} device(s) ({device.device_kind}); strategy "
        f"{args.strategy}, remat {args.remat}; the trainer alone"
    )
    theseus.steps(max(args.warmup, 1))  # compiles
    rates: list[float] = []
    calls: list[float] = []
    for _ in range(args.rounds):
        start = time.perf_counter()
        calls += theseus.steps(args.steps)
        rates.append(args.steps * tokens / (time.perf_counter() - start))
    print(
        f"\n{args.rounds} rounds x {args.steps} steps: {med(rates):,.0f} tokens/s (median; "
        f"range {min(rates):,.0f}..{max(rates):,.0f}), host/call {med(calls) * 1e3:.2f} ms, "
        f"final loss {float(theseus.loss):.4f}"
    )
    shape = (
        f"GPT {args.layers}x{args.width}, block {args.block}, batch {args.batch}, strategy "
        f"{args.strategy}, remat {args.remat}"
        + (f", attention {args.attention}" if args.attention != "auto" else "")
        + (f", loss chunk {args.loss_chunk}" if args.loss_chunk else "")
    )
    info = run_info(args, n_params, flops, tokens)
    compiled = theseus.compiled()
    if args.profile is not None:
        from benchmarks import _profile

        with jax.profiler.trace(str(args.profile)):
            theseus.steps(args.steps)
        summary = _profile.lines(
            args.profile, args.steps, top=args.profile_top, hlo=compiled.as_text()
        )
        print("\n".join(summary))
        info["profile"] = summary
    rows = [
        _report.info_row(
            f"train step alone ({shape})",
            f"{med(rates):,.0f} tokens/s",
            rates,
            unit="tokens/s",
            note=f"{args.rounds} rounds x {args.steps} steps after {max(args.warmup, 1)} "
            f"warm-up steps; host/call {med(calls) * 1e3:.2f} ms; no hand loop; "
            f"{memory_note(info)}",
        )
    ]
    if info["peak_bytes"] is not None:
        print(f"peak device memory: {_memory.gigabytes(info['peak_bytes'])}")
        rows.append(
            _report.info_row(
                f"peak device memory of the trainer ({shape})",
                _memory.gigabytes(info["peak_bytes"]),
                [info["peak_bytes"]],
                unit="bytes",
                note=f"memory_stats()['peak_bytes_in_use'] of {info['device_kind']} after "
                "the timed steps (the process's peak: setup included; on a TPU without "
                "the step's temporaries: see the next row)",
            )
        )
    planned = _memory.program_bytes(compiled)
    if planned is not None:
        info["program_bytes"] = planned
        parts = ", ".join(f"{k} {_memory.gigabytes(v)}" for k, v in planned.items() if k != "total")
        print(f"the compiled step's memory: {_memory.gigabytes(planned['total'])} ({parts})")
        rows.append(
            _report.info_row(
                f"device memory the compiled train step needs ({shape})",
                _memory.gigabytes(planned["total"]),
                [planned["total"]],
                unit="bytes",
                note=f"XLA's memory_analysis() of the step on {info['device_kind']}: {parts} "
                "(outputs less those aliased to the donated state)",
            )
        )
    _report.write(args.json, "train_step", args.quick, rows, info)
    return 0


def row(
    rates: dict[str, list[float]],
    calls: dict[str, list[float]],
    args: argparse.Namespace,
    agreement: str,
) -> _report.Row:
    """The table row: theseus's tokens/s over the hand loop's, paired by round."""
    med = statistics.median
    theseus, hand = rates["theseus"], rates["hand"]
    devices = f", {args.devices} devices" if args.devices > 1 else ""
    layout = "".join(f", {x}" for x in _layout(args).values())
    if getattr(args, "hand_attention", "same") != "same":
        layout += f", hand loop's attention {args.hand_attention}"
    return _report.compare(
        f"train step vs hand-written Flax+optax loop (GPT {args.layers}x{args.width}, block "
        f"{args.block}, batch {args.batch}{devices}{layout})",
        theseus,
        hand,
        unit="tokens/s",
        fmt="{:,.0f} tokens/s",
        ratio="ours/theirs",
        meaning="ours tokens/s / theirs tokens/s in the same round; above 1 means ours is faster",
        goal=(">=", TARGET),
        note=(
            f"{args.rounds} rounds x {args.steps} steps per side, alternating; ratio of the "
            f"medians {med(theseus) / med(hand):.3f}; host/call {med(calls['theseus']) * 1e3:.2f} "
            f"vs {med(calls['hand']) * 1e3:.2f} ms; {agreement}"
        ),
    )


def report(
    rates: dict[str, list[float]], calls: dict[str, list[float]], args: argparse.Namespace
) -> None:
    """The table; the verdict is on the median of per-round ratios (adjacent blocks share load)."""
    med = statistics.median
    theseus, hand = rates["theseus"], rates["hand"]
    paired = [a / b for a, b in zip(theseus, hand, strict=True)]
    ratio = med(paired)
    print(f"\n{args.rounds} rounds x {args.steps} steps per side, alternating AB BA AB ...")
    print(f"{'side':<10}{'tokens/s':>12}{'min':>12}{'max':>12}{'host/call':>12}")
    for name, values in rates.items():
        host = f"{med(calls[name]) * 1e3:.2f} ms"
        print(
            f"{name:<10}{med(values):>12,.0f}{min(values):>12,.0f}{max(values):>12,.0f}{host:>12}"
        )
    print(
        f"ratio theseus/hand: {ratio:.3f}  (median of per-round ratios, range "
        f"{min(paired):.3f}..{max(paired):.3f}; ratio of the medians {med(theseus) / med(hand):.3f})"
    )
    print(f"{'PASS' if ratio >= TARGET else 'FAIL'}: target ratio >= {TARGET}")
    print(
        "host/call: median time one step() call holds Python; close to the step time means "
        "the loop waits for the device every step (no asynchronous dispatch)."
    )


if __name__ == "__main__":
    sys.exit(main())
