"""Checks 2-4 of `analysis.py` (host bytes, recompilations, debugger agreement), the
analyses they run and what they share with check 1; the checks are described in
`analysis.py`'s docstring.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from jax import monitoring

from benchmarks import _report
from theseus.analysis import AnalysisBase
from theseus.experiments.models.gpt import PretrainGPT
from theseus.model.attention.base import SelfAttention
from theseus.model.models import MLP

BYTES_GOAL = 1000
REL_ERR_GOAL = 1e-6  # float32 on a CPU
# Elsewhere: multiples of eps(activation dtype), "recompiled" in tests/accelerator/_tolerances.py.
DEBUGGER_ULPS = {"cpu": 16, "gpu": 64, "tpu": 512}
COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
WARMUP_STEPS = 10  # the first validation (and analysis) happens after step 10


# ----------------------------------------------------------------------- analyses
class Sites(AnalysisBase, PretrainGPT):
    """Six call sites, each input cropped to [8, 16]."""

    TARGET = (SelfAttention, MLP)
    NAME = "sites"

    def select(self, paths: list[str]) -> list[str]:
        attention = [p for p in paths if p.endswith("/attn")]
        mlp = [p for p in paths if p.endswith("/mlp")]
        return [*attention, mlp[0], mlp[-1]]

    def analyze(self, layers: Any, inputs: Any) -> Any:
        return [given.x[0, :8, :16] for given in inputs]

    def plot(self, values: Any) -> Any:
        return None


class Replay(AnalysisBase, PretrainGPT):
    """Every attention call replayed on its own input, cropped."""

    TARGET = SelfAttention
    NAME = "replay"

    def select(self, paths: list[str]) -> list[str]:
        return paths

    def analyze(self, layers: Any, inputs: Any) -> Any:
        return [layer(given.x)[0, :64, :128] for layer, given in zip(layers, inputs, strict=True)]

    def plot(self, values: Any) -> Any:
        return None


# -------------------------------------------------------------------------- helpers
class CompileLog:
    """XLA compilations, tagged with a phase marker (the training step when it happened).

    Counted from `jax.monitoring`'s backend-compile event (one per XLA compilation);
    identified by the lowering's debug log record in `jax._src.interpreters.pxla`
    ("Compiling NAME with global shapes and types AVALS"), so that two eager ops of the
    same name on different shapes are two programs, not one compiled twice.
    """

    def __init__(self) -> None:
        self.phase: Any = "setup"
        self.events: list[tuple[Any, str]] = []
        self.programs: list[tuple[Any, str]] = []
        monitoring.register_event_duration_secs_listener(self)

    def __call__(self, event: str, duration_secs: float, **kwargs: str | int) -> None:
        if event == COMPILE_EVENT:
            self.events.append((self.phase, str(kwargs.get("fun_name", "?"))))

    @contextlib.contextmanager
    def identified(self) -> Any:
        """Record each lowering's name and argument shapes while the block runs."""
        log = self

        class Handler(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                if str(record.msg).startswith("Compiling ") and len(record.args or ()) >= 2:
                    name, avals = record.args[0], record.args[1]  # type: ignore[index]
                    log.programs.append((log.phase, f"{name} {avals}"))

        logger = logging.getLogger("jax._src.interpreters.pxla")
        handler, level, propagate = Handler(logging.DEBUG), logger.level, logger.propagate
        logger.addHandler(handler)
        logger.setLevel(logging.DEBUG)
        logger.propagate = False
        try:
            yield
        finally:
            logger.removeHandler(handler)
            logger.setLevel(level)
            logger.propagate = propagate


def timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def nbytes(tree: Any) -> int:
    return sum(np.asarray(leaf).nbytes for leaf in jax.tree.leaves(tree))


def model_text(trainer: Any) -> str:
    cfg = trainer.configuration
    return (
        f"PretrainGPT {cfg['architecture/n_layers']}x{cfg['architecture/n_embd']}, block "
        f"{cfg['architecture/block_size']}, batch {cfg['training/batch_size']}"
    )


# -------------------------------------------------------------------- 2. host bytes
def host_bytes(trainer: Any, rows: list[_report.Row]) -> bool:
    view = Sites.from_trainer(trainer)
    paths = view._prepare().paths
    values = view.compute()
    analysis = nbytes(values)

    batch = trainer.inspection_batch()
    sharding = trainer.sharding

    def everything(params: Any, batch: dict[str, Any], which: Any) -> Any:
        with sharding.rules():
            return trainer.model.apply(
                {"params": params},
                batch["x"],
                batch["y"],
                batch["padding_mask"],
                deterministic=True,
                capture_intermediates=which,
                mutable=["intermediates"],
            )

    full = jax.jit(lambda p, b: everything(p, b, True))
    host = jax.tree.map(np.asarray, full(trainer.state.params, batch))
    captured = nbytes(host)
    n_modules = len(jax.tree.leaves(host[1]))

    wanted = set(paths)
    only = jax.jit(
        lambda p, b: everything(
            p, b, lambda m, method: method == "__call__" and "/".join(m.path) in wanted
        )
    )
    sites = jax.tree.map(np.asarray, only(trainer.state.params, batch))
    site_bytes = nbytes(sites[1])

    ratio = captured / analysis
    print(f"\n2. host bytes: {len(paths)} sites {list(paths)}")
    print(
        f"   analysis (crops [8, 16] of each input)             {analysis:>12,} bytes "
        f"({len(values)} arrays)"
    )
    print(
        f"   capture_intermediates=True (+ logits and loss)     {captured:>12,} bytes "
        f"({n_modules} module outputs)"
    )
    print(
        f"   information: the 6 sites' whole outputs only       {site_bytes:>12,} bytes "
        f"({site_bytes / analysis:,.0f}x the crops)"
    )
    verdict = "PASS" if ratio >= BYTES_GOAL else "FAIL"
    print(f"   {verdict}: {ratio:,.0f}x fewer bytes with the analysis; goal >= {BYTES_GOAL:,}x")
    rows.append(
        _report.compare(
            f"analysis host bytes vs flax capture_intermediates ({len(paths)} sites, "
            f"{model_text(trainer)})",
            [analysis],
            [captured],
            unit="bytes",
            fmt="{:,.0f} B",
            ratio="theirs/ours",
            meaning="capture_intermediates bytes / analysis bytes reaching the host; above 1 "
            "means the analysis keeps fewer",
            goal=(">=", BYTES_GOAL),
            note=(
                f"crops [8, 16] of {len(paths)} inputs vs every module output ({n_modules}) + "
                f"logits + loss of the same forward; one count (deterministic)"
            ),
        )
    )
    return ratio >= BYTES_GOAL


# ------------------------------------------------------------ 4. debugger agreement
def debugger_tolerance(platform: str, dtype: str) -> float:
    """The goal on the max relative error: 1e-6 for float32 on a CPU, else `DEBUGGER_ULPS`."""
    if platform == "cpu" and dtype == "float32":
        return REL_ERR_GOAL
    eps = float(jax.numpy.finfo(dtype).eps)
    return eps * DEBUGGER_ULPS.get(platform, DEBUGGER_ULPS["tpu"])


def debugger_agreement(trainer: Any, rows: list[_report.Row]) -> bool:
    platform = jax.default_backend()
    dtype = str(trainer.configuration["architecture/dtype/activation"])
    goal = debugger_tolerance(platform, dtype)
    # Off a CPU a float32 matmul runs in bfloat16 passes by default: both sides at 'highest'.
    precise = (
        contextlib.nullcontext() if platform == "cpu" else jax.default_matmul_precision("highest")
    )
    with precise:
        return _debugger_agreement(trainer, rows, goal, f"{dtype} on {platform}")


def _debugger_agreement(trainer: Any, rows: list[_report.Row], goal: float, where: str) -> bool:
    view = Replay.from_trainer(trainer)
    paths = view._prepare().paths
    compiled = view.compute()
    print(f"\n4. debugger vs compiled engine: layer(inputs.x)[0, :64, :128] at {len(paths)} paths")
    worst, ok = 0.0, True
    for path, jitted in zip(paths, compiled, strict=True):
        with trainer.debug(path) as (layer, inputs):
            eager = np.asarray(layer(inputs.x)[0, :64, :128])
        diff = np.abs(eager.astype(np.float64) - jitted.astype(np.float64))
        rel = float(diff.max() / max(np.abs(jitted).max(), np.finfo(np.float32).tiny))
        worst = max(worst, rel)
        bitwise = "bit-identical" if np.array_equal(eager, jitted) else "differs"
        print(
            f"   {path:<14} shape {tuple(eager.shape)}  max|diff| {diff.max():.2e}  "
            f"max rel err {rel:.2e}  ({bitwise})"
        )
        ok = ok and rel <= goal
    verdict = "PASS" if ok else "FAIL"
    print(f"   {verdict}: worst max relative error {worst:.2e}; goal <= {goal:g} ({where})")
    rows.append(
        _report.info_row(
            "analysis: debugger (eager) vs compiled engine, max relative error",
            f"{worst:.2e}",
            [worst],
            unit="relative error",
            goal=("<=", float(f"{goal:.2g}")),
            met=ok,
            note=f"layer(inputs.x)[0, :64, :128] at {len(paths)} attention paths; {where}"
            + ("" if goal == REL_ERR_GOAL else ", both at 'highest' matmul precision"),
        )
    )
    return ok


# -------------------------------------------------------------- 3. recompilations
def recompilations(
    q: Any, job: type, args: argparse.Namespace, compiles: CompileLog, rows: list[_report.Row]
) -> bool:
    """`job` (a trainer with the tandem crop) trains a tiny GPT; no compilation after the
    warm-up."""
    block, batch = 32, 8
    q.build(job, "tiny")
    settings = {
        "architecture/n_layers": 1,
        "architecture/n_embd": 32,
        "architecture/n_head": 2,
        "architecture/block_size": block,
        "training/batch_size": batch,
        "training/tokens": args.steps * batch * block,
        "logging/validation_interval": 10,
        "logging/report_interval": 10,
    }
    for key, value in settings.items():
        q.config[key] = value
    trainer: Any = q.create()
    [view] = trainer.loop.views
    runs = [0]
    view_run = view.run

    def counted_run(**kw: Any) -> Any:
        runs[0] += 1
        return view_run(**kw)

    view.run = counted_run
    train, save = trainer.loop.compiled_train(), trainer.save_checkpoint

    def tagged_train(state: Any, batch: Any, cursor: Any) -> Any:
        # the train call of step `cursor + 1` (a fresh run), then its report, validation
        # and analysis
        compiles.phase = int(cursor) + 1
        return train(state, batch, cursor)

    def tagged_save() -> None:
        phase = compiles.phase
        compiles.phase = f"checkpoint@{phase}"
        try:
            save()
        finally:
            compiles.phase = phase

    trainer.loop.compiled_train = lambda: tagged_train
    trainer.save_checkpoint = tagged_save
    compiles.phase = 1
    start, first = len(compiles.events), len(compiles.programs)
    with compiles.identified():
        seconds = timed(trainer)
    events, programs = compiles.events[start:], compiles.programs[first:]
    compiles.phase = "after"

    def step_of(phase: Any) -> int:
        return int(str(phase).rsplit("@", 1)[-1])

    warm = [(p, f) for p, f in events if step_of(p) <= WARMUP_STEPS]
    late = [(p, f) for p, f in events if step_of(p) > WARMUP_STEPS]
    seen = collections.Counter(f for _, f in warm)
    lowered = collections.Counter(program for _, program in programs)
    again = sorted(program for program, n in lowered.items() if n > 1)
    late_plain = [(p, f) for p, f in late if not str(p).startswith("checkpoint@")]
    logged = f"{len(programs)} lowerings logged" + (
        "" if len(programs) == len(events) else " (differs from the compile events!)"
    )
    print(
        f"\n3. recompilations: tiny GPT (1 layer, n_embd 32, 2 heads, block {block}, batch "
        f"{batch}), {trainer.total_steps} steps in {seconds:.1f} s, validation + analysis "
        f"every 10 steps ({runs[0]} analysis runs)"
    )
    print(f"   view.traces after training: {view.traces}")
    print(f"   XLA compilations while training: {len(events)} ({logged})")
    print(f"   XLA compilations in steps 1-{WARMUP_STEPS} (warm-up): {len(warm)}")
    for name, n in sorted(seen.items()):
        print(f"      {n} x {name}")
    print(f"   XLA compilations in steps {WARMUP_STEPS + 1}-{trainer.total_steps}: {len(late)}")
    for phase, name in late:
        print(f"      {name} (at {phase})")
    print(
        f"   programs (name + argument shapes) lowered more than once in all "
        f"{trainer.total_steps} steps: {len(again)} (of {len(lowered)} lowered)"
    )
    for program in again:
        print(f"      {lowered[program]} x {program[:160]}")
    print(f"   compilations after the warm-up outside checkpoint saves: {len(late_plain)}")
    ok = view.traces == 1 and runs[0] == trainer.total_steps // 10 and not again
    verdict = "PASS" if ok else "FAIL"
    print(f"   {verdict}: view.traces == 1 and no program compiled a second time")
    if late:
        print(
            f"   NOT ZERO: {len(late)} first-time compilation(s) after the warm-up"
            + (
                " (all in a checkpoint save: the first checkpoint comes at the last step)"
                if not late_plain
                else ""
            )
        )
    else:
        print(f"   PASS: nothing compiled in steps {WARMUP_STEPS + 1}-{trainer.total_steps}")
    where = "all in the final checkpoint save" if late and not late_plain else "outside saves"
    rows.append(
        _report.info_row(
            f"analysis: recompilations over {trainer.total_steps} training steps with the "
            "tandem analysis",
            f"{len(again)} programs compiled twice; traces {view.traces}; "
            f"{len(late)} first compilations after warm-up" + (f" ({where})" if late else ""),
            [float(len(again))],
            unit="programs",
            goal=("<=", 0),
            met=ok and not late_plain,
            note=(
                f"tiny GPT, analysis every 10 steps ({runs[0]} runs); {len(events)} XLA "
                f"compilations in all, {len(warm)} in steps 1-{WARMUP_STEPS}"
            ),
        )
    )
    return ok and not late_plain
