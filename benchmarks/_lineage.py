"""A trained lineage's walks as a benchmark runs them: work in a process of its own, a
root twinned for each side, `theseus run ... --over` as a command, two stores compared.

A TPU is held by one process at a time, so a benchmark whose sides start `theseus`
processes must not open the accelerator itself before they run (`in_child`).
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def in_child(fn: Callable[..., Any], *args: Any) -> Any:
    """`fn(*args)` in a new (spawned) process: its result, or its exception raised here."""
    import concurrent.futures
    import multiprocessing

    spawn = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=spawn) as child:
        return child.submit(fn, *args).result()


def twin(root: Path, to: Path) -> None:
    """A copy of the trained `root` at `to` for one side to write into: its checkpoints
    hard-linked where the filesystem allows (the analyses only read them; the 124M GPT's
    ten are 15 GB), everything else (the store, which both sides write) copied."""
    checkpoints = root / "checkpoints"

    def place(source: str, target: str) -> None:
        if Path(source).is_relative_to(checkpoints):
            try:
                os.link(source, target)
                return
            except OSError:
                pass
        shutil.copy2(source, target)

    shutil.copytree(root, to, copy_function=place)


def job_settings(root: Path, job: str, settings: dict[str, Any]) -> list[str]:
    """`KEY=VALUE` arguments of `theseus run` for the settings `job` declares (found with
    the quick API, untimed), lists as `[a,b]`."""
    from theseus.quick import quick
    from theseus.registry import JOBS

    with quick(root) as q:
        q.build(JOBS[job], "probe")
        declared = [key for key in settings if key in q.config]

    def text(value: Any) -> str:
        return f"[{','.join(map(str, value))}]" if isinstance(value, list) else str(value)

    return [f"{key}={text(settings[key])}" for key in declared]


def run_command(
    root: Path, job: str, run: str, overrides: list[str], config: Path, *, over: str
) -> float:
    """`theseus configure JOB` (untimed, where `config` does not exist yet), then `theseus
    run RUN CONFIG ROOT --over OVER --force KEY=VALUE...` in a new process: its seconds,
    from the process's start to its exit (Python's start, the imports and the
    accelerator's opening included). A failed command raises with the end of its stderr."""
    cli = [sys.executable, "-c", "import sys; from theseus.cli import main; sys.exit(main())"]
    if not config.exists():
        subprocess.run([*cli, "configure", job, str(config)], check=True, capture_output=True)
    command = [*cli, "run", run, str(config), str(root), "--over", over, "--force"]
    start = time.perf_counter()
    done = subprocess.run([*command, *overrides], capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command[3:])} failed:\n{done.stderr[-3000:]}")
    return seconds


def same_values(
    ours: Path, theirs: Path, relative: float, absolute: float, *, run: str, prefix: str
) -> tuple[bool, int, float, str]:
    """Whether every value under `prefix` of every node of `run` is equal in the two roots'
    stores (numbers within `relative` and `absolute`, the rest exactly); how many were
    compared, the largest difference and the value it is in. False where none compared."""
    from theseus.store import Store

    def values(root: Path) -> dict[str, dict[str, Any]]:
        with Store(root / "store") as store:
            nodes = store.query().spec(run=run).all()
            return {
                n.serialize(): {k: v for k, v in store.values(n).items() if k.startswith(prefix)}
                for n in nodes
            }

    a, b = values(ours), values(theirs)
    same, compared, worst, where = a.keys() == b.keys(), 0, 0.0, "none"
    for node in sorted(a.keys() & b.keys()):
        same = same and a[node].keys() == b[node].keys()
        for key in sorted(a[node].keys() & b[node].keys()):
            x, y = a[node][key], b[node][key]
            compared += 1
            if isinstance(x, int | float) and isinstance(y, int | float):
                if abs(x - y) > worst:
                    worst, where = abs(x - y), f"{key} ({x!r} vs {y!r})"
                same = same and math.isclose(x, y, rel_tol=relative, abs_tol=absolute)
            else:
                same = same and x == y
    return same and compared > 0, compared, worst, where
