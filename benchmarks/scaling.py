"""Training tokens/s on 1, 2 and 4 virtual CPU devices, taken in turns: the scaling shape.

Run: ``uv run python benchmarks/scaling.py [--devices 1,2,4 --rounds 12 --steps 10]
[--quick] [--json PATH]``

JAX fixes the device count when it starts (``XLA_FLAGS=
--xla_force_host_platform_device_count=N``), so each count gets its own worker process:
``scaling.py --worker N`` builds the trainer of ``train_step.py`` (same model options,
data parallel over its N devices), compiles and warms up its step, then waits. The
parent runs one block of ``--steps`` steps in one worker at a time, in a rotating order
(1 2 4, 2 4 1, 4 1 2, ...), so that every count meets the same machine load; each row's
ratios are tokens/s on N devices over tokens/s on 1 device in the same round.

On this machine all virtual devices share 2 CPU cores: the rows show the shape of the
curve (what sharding the batch costs or gains), not a speed-up a real multi-device
machine would see. No goal.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file or with -m
from benchmarks import _report

HERE = Path(__file__).resolve()
PROTOCOL = "@scaling "  # prefix of the lines a worker sends its parent
QUICK = {"rounds": 3, "steps": 5, "warmup": 2}
MODEL = ("--layers", "--width", "--heads", "--block", "--batch")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--devices", default="1,2,4", help="device counts, comma-separated (1 first)")
    p.add_argument("--rounds", type=int, default=12, help="blocks per device count")
    p.add_argument("--steps", type=int, default=10, help="steps per block")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps per worker")
    p.add_argument("--worker", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--block", type=int, default=64)
    p.add_argument("--batch", type=int, default=16, help="global rows (a multiple of each count)")
    _report.add_arguments(p)
    args = p.parse_args(argv)
    if args.quick:
        args.rounds, args.steps, args.warmup = QUICK["rounds"], QUICK["steps"], QUICK["warmup"]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.worker:
        return worker(args)
    counts = [int(n) for n in args.devices.split(",")]
    if counts[0] != 1:
        sys.exit(f"--devices {args.devices}: the first count must be 1 (the reference)")
    bad = [n for n in counts if args.batch % n]
    if bad:
        sys.exit(f"--batch {args.batch} is not a multiple of --devices {bad}; pick another batch")
    model = [str(x) for flag in MODEL for x in (flag, getattr(args, flag[2:]))]
    workers = {n: start(n, model, args.warmup) for n in counts}
    try:
        for n, proc in workers.items():
            got = receive(proc)
            print(f"{n} device(s): ready ({got['platform']}, {got['devices']} devices)")
        rates: dict[int, list[float]] = {n: [] for n in counts}
        for round_ in range(args.rounds):
            shift = round_ % len(counts)
            for n in counts[shift:] + counts[:shift]:
                proc = workers[n]
                send(proc, {"steps": args.steps})
                rates[n].append(receive(proc)["tokens_per_second"])
    finally:
        for proc in workers.values():
            if proc.stdin is not None:
                proc.stdin.close()
            proc.wait(timeout=60)
    report(rates, args)
    return 0


def start(devices: int, model: list[str], warmup: int) -> subprocess.Popen[str]:
    """A worker with `devices` virtual CPU devices (the flag must precede `import jax`)."""
    env = dict(os.environ)
    env["XLA_FLAGS"] = (
        env.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={devices}"
    ).strip()
    command = [sys.executable, str(HERE), "--worker", str(devices), "--warmup", str(warmup)]
    return subprocess.Popen(
        [*command, *model], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
    )


def send(proc: subprocess.Popen[str], message: dict[str, Any]) -> None:
    assert proc.stdin is not None
    proc.stdin.write(json.dumps(message) + "\n")
    proc.stdin.flush()


def receive(proc: subprocess.Popen[str]) -> dict[str, Any]:
    """The worker's next message; its other output is passed through."""
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith(PROTOCOL):
            message: dict[str, Any] = json.loads(line[len(PROTOCOL) :])
            return message
        print(line, end="")
    raise RuntimeError(f"scaling worker {proc.args!r} ended (exit {proc.wait()}) without answering")


def worker(args: argparse.Namespace) -> int:
    """Build and warm up the trainer, then run blocks of steps on request."""
    import jax

    from benchmarks.train_step import TheseusSide, parse, synthetic_trainer

    def answer(out: IO[str], message: dict[str, Any]) -> None:
        out.write(PROTOCOL + json.dumps(message) + "\n")
        out.flush()

    model = [str(x) for flag in MODEL for x in (flag, getattr(args, flag[2:]))]
    options = parse([*model, "--devices", str(args.worker)])
    with (
        tempfile.TemporaryDirectory() as root,
        synthetic_trainer(options, root) as (trainer, host),
    ):
        side = TheseusSide(trainer, host, "once")
        side.steps(args.warmup)
        devices = jax.devices()
        answer(sys.stdout, {"platform": devices[0].platform, "devices": len(devices)})
        tokens = args.batch * args.block
        for line in sys.stdin:
            steps = int(json.loads(line)["steps"])
            begin = time.perf_counter()
            side.steps(steps)
            answer(
                sys.stdout, {"tokens_per_second": steps * tokens / (time.perf_counter() - begin)}
            )
    return 0


def report(rates: dict[int, list[float]], args: argparse.Namespace) -> None:
    import statistics

    one = rates[1]
    cores = len(os.sched_getaffinity(0))
    print(f"\n{args.rounds} rounds x {args.steps} steps per device count, in rotating order")
    print(f"{'devices':<9}{'tokens/s':>12}{'min':>12}{'max':>12}{'vs 1 device':>14}{'range':>16}")
    rows = []
    for n, values in rates.items():
        paired = [a / b for a, b in zip(values, one, strict=True)]
        print(
            f"{n:<9}{statistics.median(values):>12,.0f}{min(values):>12,.0f}"
            f"{max(values):>12,.0f}{statistics.median(paired):>14.3f}"
            f"{min(paired):>8.3f}..{max(paired):.3f}"
        )
        if n == 1:
            continue
        rows.append(
            _report.compare(
                f"training tokens/s, {n} virtual CPU devices vs 1 (GPT {args.layers}x"
                f"{args.width}, block {args.block}, batch {args.batch})",
                values,
                one,
                unit="tokens/s",
                fmt="{:,.0f} tokens/s",
                ratio="ours/theirs",
                meaning=f"tokens/s on {n} devices / tokens/s on 1 device in the same round",
                note=(
                    f"virtual CPU devices share {cores} cores: shape only. "
                    f"{args.rounds} rounds x {args.steps} steps, rotating order"
                ),
            )
        )
    print(f"virtual CPU devices share {cores} cores: the shape of the curve, not a speed-up")
    _report.write(args.json, "scaling", args.quick, rows)


if __name__ == "__main__":
    sys.exit(main())
