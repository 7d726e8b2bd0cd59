"""Run every benchmark, one subprocess after another, and write one table.

Run: ``uv run --group bench python -m benchmarks [--quick] [--only NAME,...] [--merge]
[--out DIR] [--note TEXT] [--device cpu|tpu|auto [--tiny]] [--extra ARGS]``

Each script of ``BENCHMARKS`` runs in its own process (``python benchmarks/NAME.py
--json FILE [--quick]``), so a JAX device-count flag or a crash in one leaves the others
alone; its output is echoed as it comes. The rows of the files (``_report.py``) become
``results.md``, a table of medians and paired ratios, and ``results.json``, every sample
plus the machine and the run. The command prints the table and exits 1 when a benchmark
crashed (no valid results file); a goal not met is a row of the table, not a crash.

``--only NAME --merge`` runs some benchmarks again and puts their records in place of
the same benchmarks' records in the existing ``results.json``, keeping the others: the
table stays whole, and each benchmark from an earlier run says when and at which
commit it ran. A ratio is still measured side by side within one benchmark's run.
``--only NAME --extra ARGS`` adds options to those scripts' commands (the library's
``--trained DIR``: its lineage trained in one run, measured in the next, where a device
is lent for ten minutes at a time).

``--device tpu`` runs the TPU plan instead (``tpu_plan.py``: the 124M and 354M GPTs, sized
for one 16 GB chip) and writes ``results-tpu.md`` and ``results-tpu.json``, the device and
date in the header; ``--device auto`` asks JAX, in a process of its own, which backend it
has (a TPU serves one process at a time: this one never imports JAX) and runs the TPU plan
on a TPU, the CPU table elsewhere. ``--tiny`` runs the TPU plan at tiny sizes (a smoke
test on a CPU, with ``JAX_PLATFORMS=cpu``).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import importlib.metadata
import json
import os
import platform
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))  # run as a file or with -m
from benchmarks._table import markdown  # noqa: E402

QUICK_LIMIT_S, FULL_LIMIT_S = 240, 1200  # per benchmark; a run past it counts as a crash
ROW_KEYS = {
    "what": str,
    "ours": str,
    "theirs": str,
    "unit": str,
    "ours_samples": list,
    "theirs_samples": list,
    "ratios": list,
    "ratio_meaning": str,
    "note": str,
}


@dataclasses.dataclass(frozen=True)
class Benchmark:
    """One run of a script (`script`, default `name`); `what` names its row when it does
    not run."""

    name: str
    what: str
    args: tuple[str, ...] = ()
    limit_s: float | None = None  # a full run's time limit, when not FULL_LIMIT_S
    script: str = ""

    def __post_init__(self) -> None:
        if not self.script:
            object.__setattr__(self, "script", self.name)


BENCHMARKS = (
    Benchmark("train_step", "train step vs hand-written Flax+optax loop"),
    Benchmark("store_vs_mlflow", "store write and query+read vs MLflow"),
    Benchmark("recorder", "recorder vs clouseau, eager and under jit"),
    Benchmark("checkpoint", "checkpoint save: loop blocked by the async save vs a sync save"),
    Benchmark("analysis", "tandem analysis vs plain validation; bytes vs capture_intermediates"),
    Benchmark("scaling", "training tokens/s on 1, 2 and 4 virtual CPU devices"),
    Benchmark("store_scale", "store at scale: latest checkpoint and get(node) p99"),
    Benchmark(
        "store_postgres",
        "store on PostgreSQL at 30,000 runs vs MLflow's server on PostgreSQL",
        limit_s=3600,  # both stores are filled with 45 million values first (~25 min)
    ),
    Benchmark("generation", "generation: KV-cache decoding vs full recompute"),
    Benchmark("backfill", "backfill: one --over run vs a --resume run per checkpoint"),
    Benchmark("suite_over", "suite: --over an imported 10-revision suite vs 10 x --resume"),
    Benchmark("interventions", "intervention sweep vs n + 1 forwards; attribution patching"),
    Benchmark("strategies", "dp, zero1, fsdp on 4 and 8 virtual devices: bytes kept, step time"),
    Benchmark("ui", "store browser: page, series and PDF-render latency at scale"),
    Benchmark("hf_import", "hf import: host memory streaming a 1 GB sharded folder / shard"),
    Benchmark("hf_vs_transformers", "hf import throughput vs transformers from_pretrained"),
    Benchmark("evaluation", "tandem multiple choice in the validation step vs plain validation"),
    Benchmark("harness", "lm-eval requests/s: theseus's model vs the harness's hf model"),
    Benchmark("sae", "SAE training tokens/s vs a hand-written JAX + optax loop; tandem SAE cost"),
    Benchmark(
        "library",
        "analysis library: seven analyses in one --over walk vs seven walks; each in tandem",
        limit_s=1800,  # 3 rounds of 8 walks over 10 checkpoints, each node drawing 7 figures
    ),
)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="smoke run of every benchmark (< 5 min)")
    names = ",".join(b.name for b in BENCHMARKS)
    p.add_argument("--only", help=f"comma-separated subset of {names} (or of the TPU plan's)")
    p.add_argument(
        "--merge",
        action="store_true",
        help="with --only: replace those benchmarks' records in the existing results.json",
    )
    p.add_argument("--out", type=Path, default=HERE, help="folder of results.md/.json")
    p.add_argument("--note", default="", help="what else ran on the machine (for the header)")
    p.add_argument(
        "--device",
        choices=["cpu", "tpu", "auto"],
        default="cpu",
        help="cpu: the CPU table; tpu: the TPU plan (results-tpu.md); auto: ask JAX",
    )
    p.add_argument("--tiny", action="store_true", help="the TPU plan at tiny sizes (on a CPU)")
    p.add_argument(
        "--extra",
        default="",
        metavar="ARGS",
        help="with --only: more options for those scripts, as one string (library: "
        "'--trained DIR' trains in one run and measures in the next; one option alone is "
        "written --extra=--flag)",
    )
    args = p.parse_args(argv)
    args.only = args.only.split(",") if args.only else None
    if args.merge and not args.only:
        p.error("--merge replaces some benchmarks' records: name them with --only")
    if args.extra and not args.only:
        p.error("--extra passes options to some benchmarks' scripts: name them with --only")
    args.extra = tuple(shlex.split(args.extra))
    if args.tiny and args.device == "cpu":
        p.error("--tiny shrinks the TPU plan: add --device tpu")
    return args


def choose_plan(args: argparse.Namespace) -> tuple[tuple[Benchmark, ...], dict[str, Any] | None]:
    """The benchmarks to run and, for the TPU plan, the device JAX sees.

    Raises:
        SystemExit: ``--device tpu`` where JAX sees no TPU (unless ``--tiny``), or
            ``--only`` names a benchmark the plan lacks.
    """
    from benchmarks import tpu_plan

    device = tpu_plan.probe_device() if args.device != "cpu" else None
    if device is not None:
        print(f"JAX sees: {device}", flush=True)
    plan: tuple[Benchmark, ...] = BENCHMARKS
    if args.device == "tpu" and device is not None and device["backend"] != "tpu" and not args.tiny:
        raise SystemExit(
            f"--device tpu: JAX sees no TPU ({device.get('error') or device['backend']}); "
            "run on a TPU host, or add --tiny to smoke-test the plan here"
        )
    if args.device == "tpu" or (device is not None and device["backend"] == "tpu"):
        plan = tpu_plan.tiny(tpu_plan.TPU_BENCHMARKS) if args.tiny else tpu_plan.TPU_BENCHMARKS
    else:
        device = None
    known = [b.name for b in plan]
    if args.only and set(args.only) - set(known):
        raise SystemExit(
            f"--only: unknown {sorted(set(args.only) - set(known))}; choose from {','.join(known)}"
        )
    return plan, device


def _stop_on_sigterm() -> None:
    """SIGTERM (``timeout``, a scheduler) ends the runner as Ctrl-C does: the running
    benchmark, in its own process group, is killed with it instead of holding the
    device (a TPU's lock) after the runner is gone."""

    def stop(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    _stop_on_sigterm()
    plan, device = choose_plan(args)
    chosen = [
        dataclasses.replace(b, args=(*b.args, *args.extra))
        for b in plan
        if args.only is None or b.name in args.only
    ]
    machine = describe_machine(args.quick)
    stem = "results"
    if device is not None:
        stem = "results-tpu"
        machine["device"] = device
        machine["tiny"] = args.tiny
    started = time.perf_counter()
    args.out.mkdir(parents=True, exist_ok=True)
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="benchmarks-") as scratch:
        earlier = Path(scratch) / f"{stem}.json"
        if args.merge:  # a snapshot: each entry merges into what was there at the start
            merged(args.out / f"{stem}.json", [], machine, args.note, plan)  # or refuses now
            shutil.copyfile(args.out / f"{stem}.json", earlier)

        def finish() -> str:
            """The table of the runs so far, written (merged into the snapshot)."""
            if device is not None:
                from benchmarks import tpu_plan

                tpu_plan.add_derived_rows(runs)
            machine["seconds"] = round(time.perf_counter() - started, 1)
            machine["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
            done, note = runs, args.note
            partial = None if args.only is None else [b.name for b in chosen]
            if args.merge:
                done, note = merged(earlier, runs, machine, args.note, plan)
                partial = None
            table = markdown(done, machine, note, partial)
            record = {"machine": machine, "note": note, "only": partial, "benchmarks": done}
            _write(args.out / f"{stem}.json", json.dumps(record, indent=1) + "\n")
            _write(args.out / f"{stem}.md", table)
            return table

        for bench in chosen:
            runs.append(run_one(bench, Path(scratch) / f"{bench.name}.json", args.quick))
            if args.merge and len(runs) < len(chosen):
                finish()  # a run stopped later (a device call's time limit) keeps these
        table = finish()
    print("\n" + table)
    crashed = [r["name"] for r in runs if r["status"] == "crashed"]
    if crashed:
        print(f"crashed: {', '.join(crashed)} (their output is above and in {stem}.json)")
    return 1 if crashed else 0


def merged(
    path: Path,
    runs: list[dict[str, Any]],
    machine: dict[str, Any],
    note: str,
    plan: tuple[Benchmark, ...] = BENCHMARKS,
) -> tuple[list[dict[str, Any]], str]:
    """The records of ``path`` with ``runs`` in place of theirs, in ``plan`` order,
    each kept one marked with its own run (``ran``), and the header's note.

    Raises:
        SystemExit: ``path`` is missing, or from a quick run when this one is full (or
            the reverse): the table would mix a smoke test with measurements.
    """
    try:
        earlier = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise SystemExit(
            f"--merge: cannot read {path} ({err}); run every benchmark first."
        ) from None
    if earlier["machine"]["quick"] != machine["quick"]:
        raise SystemExit(
            f"--merge: {path} is from a {'quick' if earlier['machine']['quick'] else 'full'} run; merge like with like."
        )
    stamp = {"date": earlier["machine"]["date"], "commit": earlier["machine"]["git_commit"]}
    new = {run["name"]: run for run in runs}
    kept = {r["name"]: {**r, "ran": r.get("ran", stamp)} for r in earlier["benchmarks"]}
    order = [b.name for b in plan]
    together = {**kept, **new}
    result = [together[name] for name in order if name in together]
    text = f"{', '.join(new)} run again and merged; the others from earlier runs (dated below)"
    earlier_note = earlier.get("note") or ""
    return result, "; ".join(x for x in (note, text, earlier_note) if x)


def describe_machine(quick: bool) -> dict[str, Any]:
    """CPU, Python, library versions, date, git commit: what the numbers depend on."""

    def version(name: str) -> str | None:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return None

    def git(*command: str) -> str:
        done = subprocess.run(["git", *command], cwd=ROOT, capture_output=True, text=True)
        return done.stdout.strip() if done.returncode == 0 else "unknown"

    model = ""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        lines = [x for x in cpuinfo.read_text().splitlines() if x.startswith("model name")]
        model = lines[0].split(":", 1)[1].strip() if lines else ""
    return {
        "quick": quick,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "git_commit": git("rev-parse", "HEAD"),
        "git_uncommitted_changes": bool(git("status", "--porcelain", "--untracked-files=no")),
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "cpu_model": model,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "versions": {
            name: version(name)
            for name in ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "mlflow", "clouseau")
        },
        "load_average_start": [round(x, 2) for x in os.getloadavg()],
    }


def run_one(bench: Benchmark, out: Path, quick: bool) -> dict[str, Any]:
    """Run one script to its results file; a crash becomes a record, never an exception."""
    script = HERE / f"{bench.script}.py"
    command = [sys.executable, str(script), "--json", str(out), *bench.args]
    if quick:
        command.append("--quick")
    shown = " ".join(["python", str(script.relative_to(ROOT)), *command[2:]])
    record: dict[str, Any] = {
        "name": bench.name,
        "what": bench.what,
        "command": shown.replace(str(out), "FILE"),
        "status": "crashed",
        "returncode": None,
        "seconds": 0.0,
        "load_average": [round(os.getloadavg()[0], 2)],  # 1 minute, at the start and end
        "error": None,
        "results": None,
    }
    print(f"\n== {bench.name}: {record['command']}", flush=True)
    limit = QUICK_LIMIT_S if quick else (bench.limit_s or FULL_LIMIT_S)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    start = time.perf_counter()
    proc = subprocess.Popen(
        command,
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group: a kill reaches its workers too
    )

    def kill() -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)

    timer = threading.Timer(limit, kill)
    timer.start()
    tail: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            print(f"   | {line}", end="", flush=True)
            tail = [*tail[-39:], line.rstrip("\n")]
        returncode = proc.wait()
    finally:
        timed_out = not timer.is_alive() and proc.returncode not in (0, 1)
        timer.cancel()
        if proc.poll() is None:  # interrupted (Ctrl-C, SIGTERM): take the benchmark down with us
            kill()
    record["seconds"] = round(time.perf_counter() - start, 1)
    record["load_average"].append(round(os.getloadavg()[0], 2))
    record["returncode"] = returncode
    problem = None
    if timed_out:
        problem = f"killed after the {limit} s limit"
    elif returncode not in (0, 1):
        problem = f"exit status {returncode}"
    elif not out.exists():
        problem = f"exit status {returncode} without writing its results file"
    else:
        try:
            results = json.loads(out.read_text())
            check_results(results, bench.name)
            record["results"] = results
        except (ValueError, KeyError, TypeError) as exc:
            problem = f"invalid results file: {exc}"
    if problem is None:
        record["status"] = "ok"
        if returncode == 1:
            record["error"] = "exit status 1: a goal or check of the script was missed"
        return record
    last = next((x for x in reversed(tail) if x.strip()), "")
    hint = " (run the command with `uv run --group bench`)" if "No module named" in last else ""
    record["error"] = f"{problem}; last line: {last.strip()[:300]}{hint}"
    record["output_tail"] = tail
    return record


def check_results(results: dict[str, Any], name: str) -> None:
    """Raise ValueError when `results` does not follow the schema of `_report.py`."""
    if not isinstance(results.get("rows"), list) or not results["rows"]:
        raise ValueError(f"{name}: no rows")
    for row in results["rows"]:
        for key, kind in ROW_KEYS.items():
            if not isinstance(row.get(key), kind):
                raise ValueError(f"{name}: row {row.get('what')!r}: {key} is not a {kind.__name__}")
        for key in ("goal", "goal_value", "met"):
            if key not in row:
                raise ValueError(f"{name}: row {row.get('what')!r} has no {key}")


def _write(path: Path, text: str) -> None:
    scratch = path.with_name(path.name + ".partial")
    scratch.write_text(text)
    scratch.replace(path)


if __name__ == "__main__":
    sys.exit(main())
