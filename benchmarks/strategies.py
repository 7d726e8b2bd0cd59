"""Training strategies on 4 and 8 virtual CPU devices: bytes each device keeps, step time.

Run: ``uv run python benchmarks/strategies.py [--devices 4,8 --rounds 6 --steps 5]
[--quick] [--json PATH]``

For each device count, one worker process (``--worker N``: JAX fixes the device count
when it starts) builds the trainer of ``train_step.py`` (GPT 4 layers, n_embd 64, block
64, batch 16) once per layout: ``dp``, ``zero1``, ``fsdp``, and ``fsdp`` with
``training/shard=2`` (a 2-D mesh, tensor parallel over ``shard``). It reads the bytes
each layout's first device keeps of the parameters and of the optimizer state from the
arrays' own shards (``addressable_shards[0]``), warms each step up, then times blocks of
``--steps`` steps, the layouts in a rotating order, and reports each block's time.

Rows: per count and layout, the parameter and optimizer bytes one device keeps over
the whole (goal for ``fsdp``: 1/N of both, within 5%; for ``zero1``: 1/N of the
optimizer state), and the step time over ``dp``'s in the same round (information).
All virtual devices share this machine's 2 CPU cores: the step times show the shape
of what gathering costs, not a speed-up; a real accelerator's numbers come from
``gpu.py``.

``--remat`` (or ``--parts remat``): ``training/remat = block`` against ``none`` on a GPT of
4 layers x 256, block 256, batch 16, one device: the compiled train step's temporary
bytes (``memory_analysis().temp_size_in_bytes``, mostly the activations kept for the
backward), once with XLA CPU's default scheduler and once with its memory-minimizing one
(``--xla_cpu_enable_concurrency_optimized_scheduler=false``; the default schedules every
recomputation early and so keeps it all: remat saves nothing there), and the step time
over ``none``'s in the same round (CPU: the shape of the recomputation's cost only).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file or with -m
from benchmarks import _report

HERE = Path(__file__).resolve()
PROTOCOL = "@strategies "
LAYOUTS = (("dp", 1), ("zero1", 1), ("fsdp", 1), ("fsdp", 2))


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--devices", default="4,8", help="device counts, comma-separated")
    p.add_argument("--rounds", type=int, default=6, help="timed blocks per layout")
    p.add_argument("--steps", type=int, default=5, help="steps per block")
    p.add_argument(
        "--parts", default="layouts,remat", help="layouts (dp/zero1/fsdp), remat, or both"
    )
    p.add_argument("--remat", action="store_true", help="only the remat part (--parts remat)")
    p.add_argument("--worker", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--remat-worker", action="store_true", help=argparse.SUPPRESS)
    _report.add_arguments(p)
    args = p.parse_args(argv)
    if args.quick:
        args.rounds, args.steps = 2, 2
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.worker:
        return worker(args)
    if args.remat_worker:
        return remat_worker(args)
    parts = {"remat"} if args.remat else set(args.parts.split(","))
    rows: list[_report.Row] = []
    ok = True
    if "remat" in parts:
        remat_rows(args, rows)
    for devices in (int(n) for n in args.devices.split(",") if "layouts" in parts):
        env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
        env.setdefault("JAX_PLATFORMS", "cpu")
        command = [sys.executable, str(HERE), "--worker", str(devices)]
        command += ["--rounds", str(args.rounds), "--steps", str(args.steps)]
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
        print(done.stderr[-2000:], end="")
        lines = [
            json.loads(x[len(PROTOCOL) :])
            for x in done.stdout.splitlines()
            if x.startswith(PROTOCOL)
        ]
        if done.returncode != 0 or not lines:
            print(done.stdout[-3000:])
            return 2
        ok = report(devices, lines[-1], rows, args) and ok
    _report.write(args.json, "strategies", args.quick, rows)
    return _report.exit_status([], checks=[(ok, "a strategy's check failed (above)")])


def _name(layout: tuple[str, int]) -> str:
    strategy, shard = layout
    return strategy if shard == 1 else f"{strategy} + shard={shard}"


def report(devices: int, found: dict[str, Any], rows: list[_report.Row], args: Any) -> bool:
    ok = True
    dp = found["dp-1"]
    for layout in LAYOUTS:
        key = f"{layout[0]}-{layout[1]}"
        got = found[key]
        params = got["kept_params"] / got["whole_params"]
        opt = got["kept_opt"] / got["whole_opt"]
        print(
            f"{devices} devices, {_name(layout)}: params {params:.4f}, optimizer {opt:.4f} "
            f"of the whole kept per device; step "
            f"{1000 * sum(got['times']) / (len(got['times']) * args.steps):.1f} ms"
        )
        if layout != ("dp", 1):
            goal: tuple[str, float] | None = None
            met: bool | None = None
            if layout[0] == "fsdp":
                goal, met = ("<=", 1.05 / devices), max(params, opt) <= 1.05 / devices
            elif layout[0] == "zero1":
                goal, met = ("<=", 1.05 / devices), opt <= 1.05 / devices
            ok = ok and met is not False
            rows.append(
                _report.info_row(
                    f"{_name(layout)} on {devices} virtual devices: share of the parameters / "
                    "optimizer state one device keeps",
                    f"{params:.3f} / {opt:.3f}",
                    [params, opt],
                    unit="of the whole",
                    goal=goal,
                    met=met,
                    theirs=f"dp: {dp['kept_params'] / dp['whole_params']:.3f} / "
                    f"{dp['kept_opt'] / dp['whole_opt']:.3f}",
                    note=f"{got['kept_params'] + got['kept_opt']:,} of "
                    f"{got['whole_params'] + got['whole_opt']:,} bytes (params + Adam moments); "
                    f"goal on {'both' if layout[0] == 'fsdp' else 'the optimizer state'}",
                )
            )
            rows.append(
                _report.compare(
                    f"{_name(layout)} vs dp on {devices} virtual devices: step time (shape only)",
                    [1000 * t / args.steps for t in got["times"]],
                    [1000 * t / args.steps for t in dp["times"]],
                    unit="ms",
                    fmt="{:.1f} ms",
                    ratio="ours/theirs",
                    meaning="step time / dp's step time in the same round; virtual devices "
                    "share 2 CPU cores, so this is the cost of gathering, not a speed-up",
                    note=f"{args.rounds} rounds of {args.steps} steps, rotating order",
                )
            )
    return ok


def worker(args: argparse.Namespace) -> int:
    import jax

    from benchmarks.train_step import TheseusSide, synthetic_trainer
    from benchmarks.train_step import parse as train_parse

    options = train_parse(["--devices", str(args.worker)])
    found: dict[str, Any] = {}
    sides: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as root:
        contexts = []
        for strategy, shard in LAYOUTS:
            key = f"{strategy}-{shard}"
            context = synthetic_trainer(
                options,
                os.path.join(root, key),
                **{"training/strategy": strategy, "training/shard": shard},
            )
            trainer, host = context.__enter__()
            contexts.append(context)
            leaves = {"params": trainer.state.params, "opt": trainer.state.opt_state}
            found[key] = {
                f"kept_{name}": sum(
                    x.addressable_shards[0].data.nbytes for x in jax.tree.leaves(tree)
                )
                for name, tree in leaves.items()
            } | {
                f"whole_{name}": sum(x.nbytes for x in jax.tree.leaves(tree))
                for name, tree in leaves.items()
            }
            found[key]["times"] = []
            side = TheseusSide(trainer, host, "once")
            side.steps(3)  # compile and warm up
            sides[key] = side
        keys = list(sides)
        for round_ in range(args.rounds):
            order = keys[round_ % len(keys) :] + keys[: round_ % len(keys)]
            for key in order:
                begin = time.perf_counter()
                sides[key].steps(args.steps)
                found[key]["times"].append(time.perf_counter() - begin)
        for context in reversed(contexts):
            context.__exit__(None, None, None)
    print(PROTOCOL + json.dumps(found), flush=True)
    return 0


REMAT_SHAPE = ["--layers", "4", "--width", "256", "--heads", "4", "--block", "256"]
REMAT_SCHEDULERS = {
    "XLA CPU's default scheduler": "",
    "the memory-minimizing scheduler": " --xla_cpu_enable_concurrency_optimized_scheduler=false",
}


def remat_rows(args: argparse.Namespace, rows: list[_report.Row]) -> None:
    """Rows of `training/remat = block` vs `none` (module docstring), one worker per scheduler."""
    for scheduler, flags in REMAT_SCHEDULERS.items():
        env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=1" + flags)
        env.setdefault("JAX_PLATFORMS", "cpu")
        command = [sys.executable, str(HERE), "--remat-worker"]
        command += ["--rounds", str(args.rounds), "--steps", str(args.steps)]
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1800)
        print(done.stderr[-2000:], end="")
        lines = [x for x in done.stdout.splitlines() if x.startswith(PROTOCOL)]
        if done.returncode != 0 or not lines:
            print(done.stdout[-3000:])
            raise SystemExit(2)
        found = json.loads(lines[-1][len(PROTOCOL) :])
        none, block = found["none"], found["block"]
        print(
            f"remat, {scheduler}: train step temp bytes none {none['temp']:,}, block "
            f"{block['temp']:,} ({block['temp'] / none['temp']:.3f}x)"
        )
        rows.append(
            _report.info_row(
                f"training/remat=block vs none: the compiled train step's temporary bytes "
                f"(GPT 4 x 256, block 256, batch 16; {scheduler})",
                f"{block['temp'] / none['temp']:.3f}",
                [block["temp"] / none["temp"]],
                unit="of none's",
                theirs=f"none: {none['temp'] / 2**20:.1f} MiB",
                note=f"block: {block['temp'] / 2**20:.1f} MiB "
                f"(memory_analysis().temp_size_in_bytes, one CPU device)",
            )
        )
        if flags:  # one timing is enough: the scheduler changes memory, not the FLOPs
            continue
        rows.append(
            _report.compare(
                "training/remat=block vs none: step time (GPT 4 x 256, block 256, batch 16; "
                "CPU, shape only)",
                [1000 * t / args.steps for t in block["times"]],
                [1000 * t / args.steps for t in none["times"]],
                unit="ms",
                fmt="{:.0f} ms",
                ratio="ours/theirs",
                meaning="remat's step time / none's in the same round: the cost of "
                "recomputing each block's forward in the backward (CPU: shape only)",
                note=f"{args.rounds} rounds of {args.steps} steps, alternating order",
            )
        )


def remat_worker(args: argparse.Namespace) -> int:
    """Build the trainer with remat none and block; print temp bytes and step times."""
    import jax

    from benchmarks.train_step import TheseusSide, synthetic_trainer
    from benchmarks.train_step import parse as train_parse

    options = train_parse(REMAT_SHAPE)
    found: dict[str, Any] = {}
    sides: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as root:
        contexts = []
        for remat in ("none", "block"):
            context = synthetic_trainer(
                options, os.path.join(root, remat), **{"training/remat": remat}
            )
            trainer, host = context.__enter__()
            contexts.append(context)
            step = jax.jit(
                functools.partial(
                    type(trainer).train_step, accumulate_steps=1, sharding=trainer.sharding
                )
            )
            batch = trainer.sharding.place_batch(host[0])
            compiled = step.lower(trainer.state, batch, jax.random.key(0)).compile()
            found[remat] = {"temp": compiled.memory_analysis().temp_size_in_bytes, "times": []}
            side = TheseusSide(trainer, host, "once")
            side.steps(2)  # compile and warm up
            sides[remat] = side
        for round_ in range(args.rounds):
            order = ["none", "block"] if round_ % 2 == 0 else ["block", "none"]
            for remat in order:
                begin = time.perf_counter()
                sides[remat].steps(args.steps)
                found[remat]["times"].append(time.perf_counter() - begin)
        for context in reversed(contexts):
            context.__exit__(None, None, None)
    print(PROTOCOL + json.dumps(found), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
