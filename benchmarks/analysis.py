"""The analysis engine: tandem cost, host bytes, recompilations, debugger agreement.

Run: ``uv run python benchmarks/analysis.py [--repeats 120 --steps 1000 --breakdown 5]
[--quick] [--json PATH]`` (3.5-4.5 minutes on the shared 2-core CPU machine, more under
load); ``--quick`` is a smoke run (4 rounds, 50 training steps, no breakdown; about a
minute). One CPU device (JAX's default
here) and the trainer's own mesh. ``--json PATH`` also writes the rows of the benchmarks
table (``benchmarks/_report.py``). ``--checks`` picks some of the four checks and
``--layers/--width/--heads/--block/--batch/--vocab/--dtype`` change the model of checks
1, 2 and 4 (``gpu.sh`` runs the tandem cost on the 124M-parameter GPT).

1. **Tandem cost.** The default ``PretrainGPT`` (4 layers, n_embd 128, block 128,
   batch 16, 4 validation batches) with one tandem analysis: the input of the first
   ``SelfAttention``, cropped in the program to ``inputs.x[0, :64, :128]``. A
   *validation step* is what the trainer does at validation cadence, less logging:
   ``trainer.validate()`` (this trainer declares no evaluations, which would run
   next), then ``view.run()`` for each tandem view. Each round runs the three cheap variants in
   a random order (seeded); every fourth round then runs the two PDF variants, in a
   random order, each followed by one untimed validation, so that no timed sample
   directly follows the plotting (a validation right after it measured about 1% slower, and
   an earlier fixed rotation always put ``plain`` there):

   * ``plain``: ``validate()``;
   * ``+compute``: the same + ``view.compute()`` (the compiled analysis and the
     gather of its result to the host; no plot, no file);
   * ``+run json``: the same + ``view.run()`` with a ``plot()`` that returns a small
     JSON value (compute, plot, write ``crop.json`` atomically, store artifact);
   * ``+run pdf``: the same + ``view.run()`` of a second view whose ``plot()``
     draws ``self.heatmap(values)`` (written as ``crop_pdf.pdf``);
   * ``+published json``, ``+published pdf``: the same with ``view.run(background=True)``,
     what the trainer does at validation: the compiled computation on the training
     thread, then plot, file and artifact on the publishing thread. The sample ends
     when ``run`` returns; the publishing thread is then drained, untimed (its time
     is reported beside the row), so its work never overlaps a later sample.

   The verdict (and exit status) is on the median over rounds of ``variant / plain``
   within a round (goal <= 1.03; the PDF row is reported but not in the exit
   status). Each variant's extra part is also timed inside its own sample; the
   median of ``1 + extra / plain`` estimates the same ratio with far less noise, and
   its line says whether it is within the goal too; the variant's own ``validate()``
   part over ``plain`` is printed as a control (1 but for noise). A breakdown times
   the pieces of ``run()`` one by one.
2. **Host bytes.** A 6-site analysis (the four ``SelfAttention`` calls and the first
   and last ``MLP``) that returns ``inputs.x[0, :8, :16]`` of each, against the same
   model and batch through ``model.apply(..., capture_intermediates=True,
   mutable=["intermediates"])`` under ``jax.jit``: the sum of ``nbytes`` of the
   NumPy arrays that arrive on the host (goal: at least 1,000x fewer).
3. **Recompilations.** A tiny GPT (1 layer, n_embd 32, 2 heads, block 32, batch 8)
   trains ``--steps`` steps with the tandem analysis every 10 steps
   (``logging/validation_interval = 10``). Counted: the view's ``traces`` (each
   trace of the analysis function; must be 1) and every XLA compilation, from
   ``jax.monitoring``'s ``/jax/core/compile/backend_compile_duration`` event, by
   the step during which it happened (goal: none after the warm-up, steps 1-10).
4. **Debugger agreement.** ``layer, inputs = trainer.debug(path)`` eagerly, then
   ``layer(inputs.x)[0, :64, :128]``, against the same expression in ``analyze()``
   through the compiled engine, for every ``SelfAttention`` path: max relative error
   ``max|eager - jit| / max|jit|`` (goal <= 1e-6 in float32 on a CPU; elsewhere
   ``eps(dtype)`` x 64 on a GPU, x 512 on a TPU, with both sides at 'highest' matrix
   product precision: the "recompiled" tolerance of ``tests/accelerator/_tolerances.py``;
   ``DEBUGGER_ULPS``).

A model that does not fit on the device exits 1 with one line (``_memory.py``). Checks
2-4 and the analyses they run are in ``_analysis_checks.py``.
"""

from __future__ import annotations

import argparse
import collections
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file or with -m
from benchmarks import _memory, _report
from benchmarks._analysis_checks import (
    CompileLog,
    debugger_agreement,
    host_bytes,
    model_text,
    recompilations,
)
from theseus.analysis import AnalysisBase
from theseus.analysis._publish import render, write_atomic
from theseus.data.datasets import Synthetic
from theseus.experiments.models.gpt import PretrainGPT
from theseus.model.attention.base import SelfAttention
from theseus.quick import quick

TANDEM_GOAL = 1.03
PDF_EVERY = 4  # rounds per PDF sample
CHECKS = ("tandem", "bytes", "recompile", "debugger")
MODEL = {  # option -> configuration key (the model of checks 1, 2 and 4)
    "layers": "architecture/n_layers",
    "width": "architecture/n_embd",
    "heads": "architecture/n_head",
    "block": "architecture/block_size",
    "batch": "training/batch_size",
    "vocab": "architecture/vocab_size",
    "dtype": "architecture/dtype/activation",
}


# ----------------------------------------------------------------------- analyses
class Crop(AnalysisBase, PretrainGPT):
    """The input of the first attention call, cropped; a small JSON result."""

    TARGET = SelfAttention
    NAME = "crop"

    def select(self, paths: list[str]) -> str:
        return paths[0]

    def analyze(self, layer: Any, inputs: Any) -> Any:
        return inputs.x[0, :64, :128]

    def plot(self, values: Any) -> Any:
        return {"mean": float(values.mean()), "std": float(values.std())}


class CropPDF(Crop):
    """The same crop drawn as a heatmap (a Figure, written as PDF)."""

    NAME = "crop_pdf"

    def plot(self, values: Any) -> Any:
        return self.heatmap(values, xlabel="Feature", ylabel="Token")


class WithCrop(PretrainGPT):
    ANALYSIS = [Crop]


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--repeats",
        type=int,
        default=120,
        help="paired rounds of the tandem cost (the PDF variant: every fourth one)",
    )
    p.add_argument("--steps", type=int, default=1000, help="training steps of the recompile check")
    p.add_argument("--breakdown", type=int, default=5, help="repeats of each run() piece")
    p.add_argument(
        "--quick", action="store_true", help="smoke run: 4 rounds, 50 steps, no breakdown"
    )
    p.add_argument("--checks", default=",".join(CHECKS), help="some of " + ",".join(CHECKS))
    for option, key in MODEL.items():
        p.add_argument(
            f"--{option}", type=str if option == "dtype" else int, help=f"{key} (default: as is)"
        )
    _report.add_arguments(p, quick=False)
    args = p.parse_args(argv)
    if args.quick:
        args.repeats, args.steps, args.breakdown = 4, 50, 0
    args.checks = args.checks.split(",")
    unknown = sorted(set(args.checks) - set(CHECKS))
    if unknown:
        p.error(f"--checks: unknown {unknown}; choose from {','.join(CHECKS)}")
    return args


def med(values: list[float]) -> float:
    return statistics.median(values)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    compiles = CompileLog()
    settings = {MODEL[k]: getattr(args, k) for k in MODEL if getattr(args, k) is not None}
    rows: list[_report.Row] = []
    ok = True
    with tempfile.TemporaryDirectory() as root:
        # enough validation tokens for 4 batches of the largest model asked for
        rows_needed = 4 * (args.batch or 16) * ((args.block or 128) + 1)
        Synthetic.prepare(root, tokens=300_000, val_tokens=max(50_000, 2 * rows_needed))
        print(
            f"jax {jax.__version__}, {len(jax.devices())} {jax.devices()[0].platform} device(s); "
            f"{args.repeats} rounds, {args.steps} training steps; checks {','.join(args.checks)}"
        )
        model = ", ".join(f"--{k} {getattr(args, k)}" for k in MODEL if getattr(args, k))
        with (
            quick(root) as q,
            _memory.exit_on_out_of_memory(
                f"analysis.py ({model or 'the default model'})", "a smaller --batch or --block"
            ),
        ):
            q.build(WithCrop, "default")
            for key, value in settings.items():
                q.config[key] = value
            trainer: Any = q.create()
            if "tandem" in args.checks:
                ok = tandem_cost(trainer, args, rows) and ok
            if "bytes" in args.checks:
                ok = host_bytes(trainer, rows) and ok
            if "recompile" in args.checks:
                ok = recompilations(q, WithCrop, args, compiles, rows) and ok
            if "debugger" in args.checks:
                ok = debugger_agreement(trainer, rows) and ok
            model = model_text(trainer)
    _report.write(args.json, "analysis", args.quick, rows, {"model": model})
    return _report.exit_status([], checks=[(ok, "a check of analysis.py failed (above)")])


# ------------------------------------------------------------------ 1. tandem cost
def tandem_cost(trainer: Any, args: argparse.Namespace, rows: list[_report.Row]) -> bool:
    [crop] = trainer.loop.views
    pdf: Any = CropPDF.from_trainer(trainer)  # a TrainerView: its run() takes background
    cfg = trainer.configuration
    print(
        f"\n1. tandem cost: PretrainGPT {cfg['architecture/n_layers']} layers, n_embd "
        f"{cfg['architecture/n_embd']}, block {cfg['architecture/block_size']}, batch "
        f"{cfg['training/batch_size']}, {cfg['training/validation_steps']} validation batches; "
        "analysis inputs.x[0, :64, :128] of the first SelfAttention"
    )

    def plain() -> None:
        trainer.validate()  # no EVALUATION: the loop's evaluations would be none

    extras: dict[str, Callable[[], Any] | None] = {
        "plain": None,
        "+compute": crop.compute,
        "+run json": crop.run,
        "+published json": lambda: crop.run(background=True),
        "+run pdf": pdf.run,
        "+published pdf": lambda: pdf.run(background=True),
    }
    names = list(extras)
    heavy = ["+run pdf", "+published pdf"]  # about ten validations long: every fourth round
    published = {"+published json", "+published pdf"}
    backlog: dict[str, list[float]] = {n: [] for n in published}  # the worker's time after
    totals: dict[str, list[float]] = {n: [] for n in names}
    parts: dict[str, list[float]] = {n: [] for n in names}
    ratios: dict[str, list[float]] = {n: [] for n in names}
    bases: dict[str, list[float]] = {n: [] for n in names}  # plain, in the same rounds

    def sample(name: str) -> tuple[float, float]:
        extra = extras[name]
        start = time.perf_counter()
        plain()
        middle = time.perf_counter()
        if extra is not None:
            extra()
        end = time.perf_counter()
        if name in published:  # untimed: what the publishing thread still had to do
            crop.drain()
            backlog[name].append(time.perf_counter() - end)
        return end - start, end - middle

    for name in names:  # warm-up: compiles validation and both analyses, first files
        sample(name)
    rng = random.Random(0)
    controls: dict[str, list[float]] = {n: [] for n in names}
    estimates: dict[str, list[float]] = {n: [] for n in names}
    for round_ in range(args.repeats):
        # The cheap variants in a random order; the PDF variant (about ten validations
        # long) in every fourth round, last, then an untimed validation, so that no
        # timed sample directly follows the plotting.
        order = [name for name in names if name not in heavy]
        rng.shuffle(order)
        with_pdf = round_ % PDF_EVERY == 0
        if with_pdf:
            order += rng.sample(heavy, len(heavy))
        got = {}
        for name in order:
            got[name] = sample(name)
            if name in heavy:
                plain()  # untimed: no timed sample directly follows a PDF's plotting
        base = got["plain"][0]
        for name, (total, part) in got.items():
            totals[name].append(total)
            parts[name].append(part)
            ratios[name].append(total / base)
            bases[name].append(base)
            controls[name].append((total - part) / base)
            estimates[name].append(1 + part / base)

    def quartiles(values: list[float]) -> str:
        q1, _, q3 = statistics.quantiles(values, n=4) if len(values) > 1 else values * 3
        return f"{q1:.3f}..{q3:.3f}"

    plain_ms = med(totals["plain"])
    print(
        f"\n{'variant':<11}{'rounds':>7}{'median':>11}{'extra part':>13}{'paired ratio':>14}"
        f"{'IQR':>16}{'its validate':>14}{'1 + extra':>11}"
    )
    ok = True
    for name in names:
        if name == "plain":
            print(f"{name:<11}{len(totals[name]):>7}{plain_ms * 1e3:>8.1f} ms")
            continue
        print(
            f"{name:<11}{len(totals[name]):>7}{med(totals[name]) * 1e3:>8.1f} ms"
            f"{med(parts[name]) * 1e3:>10.2f} ms{med(ratios[name]):>14.4f}"
            f"{quartiles(ratios[name]):>16}{med(controls[name]):>14.4f}"
            f"{med(estimates[name]):>11.4f}"
        )
    print(
        "paired ratio: median over rounds of variant / plain (same round), IQR its quartiles;\n"
        "its validate: the same for the variant's own validate() part alone (a control: 1 "
        "but for noise);\n1 + extra: median over rounds of 1 + the variant's compute()/run() "
        "part / plain (the cost itself, far less noisy)"
    )
    for name in names[1:]:
        ratio, estimate = med(ratios[name]), med(estimates[name])
        passed, estimate_passed = ratio <= TANDEM_GOAL, estimate <= TANDEM_GOAL
        note = ""
        if name.startswith("+run "):
            note = " (inline: reported, not part of the exit status; the trainer publishes)"
        else:
            ok = ok and passed
        print(
            f"  {'PASS' if passed else 'FAIL'}: {name} / plain = {ratio:.4f} paired, "
            f"{estimate:.4f} from the parts ({'within' if estimate_passed else 'ABOVE'} the "
            f"goal); goal <= {TANDEM_GOAL}{note}"
        )
        rows.append(
            _report.compare(
                f"tandem analysis: validation step {name} vs plain ({model_text(trainer)})",
                [x * 1e3 for x in totals[name]],
                [x * 1e3 for x in bases[name]],
                unit="ms",
                fmt="{:.1f} ms",
                ratio="ours/theirs",
                meaning="(validation step + analysis) time / plain validation step time in "
                "the same round; 1 means free",
                # Inline publishing is what a standalone analysis does, not what training
                # waits for: information only, so its row carries no goal.
                goal=None if name.startswith("+run ") else ("<=", TANDEM_GOAL),
                note=(
                    f"{len(totals[name])} rounds; the cost timed inside the sample, 1 + extra = "
                    f"{estimate:.4f} ({med(parts[name]) * 1e3:.2f} ms); control (its own "
                    f"validate() / plain) {med(controls[name]):.4f}"
                    + (
                        "; view.run() inline, as a standalone analysis publishes; not in "
                        "analysis.py's exit status (the trainer publishes in the background)"
                        if name.startswith("+run ")
                        else ""
                    )
                    + (
                        "; what the training thread waits for at validation: compute, then "
                        "plot, file and artifact go to the publishing thread (drained, untimed, "
                        f"after each sample: {med(backlog[name]) * 1e3:.0f} ms of its work "
                        "runs beside the next training steps)"
                        if name in published
                        else ""
                    )
                ),
            )
        )
    breakdown(crop, pdf, args.breakdown)
    return ok


def breakdown(crop: Any, pdf: Any, repeats: int) -> None:
    """Where run()'s time goes: each step of `AnalysisBase.run`/`_publish`, timed alone."""
    if repeats <= 0:
        print("\n   breakdown of run(): skipped (--breakdown 0)")
        return
    values = crop.compute()
    node = crop.node
    times: dict[str, list[float]] = collections.defaultdict(list)

    def piece(label: str, fn: Callable[..., Any], *args: Any) -> Any:
        start = time.perf_counter()
        out = fn(*args)
        times[label].append(time.perf_counter() - start)
        return out

    def publish(view: Any, filename: str, content: bytes) -> None:
        write_atomic(view.spec.result(filename), content)
        view.store.put(node, view.NAME, filename, content)

    for _ in range(repeats):
        piece("compute() (jit call + gather to host)", crop.compute)
        piece("inspection_batch() (place the batch)", crop.inspection_batch)
        value = piece("plot() -> JSON value", crop.plot, values)
        json_name, json_bytes = piece("render JSON", render, crop.NAME, value, "Crop")
        piece("write_atomic JSON (fsync)", write_atomic, crop.spec.result(json_name), json_bytes)
        piece("store.put JSON artifact", crop.store.put, node, crop.NAME, json_name, json_bytes)
        figure = piece("plot() -> heatmap Figure", pdf.plot, values)
        pdf_name, pdf_bytes = piece(
            "render PDF (to_pdf: 2 draws)", render, pdf.NAME, figure, "CropPDF"
        )
        piece("write_atomic + store.put PDF", publish, pdf, pdf_name, pdf_bytes)
    print(f"\n   breakdown of run() (median of {repeats}, each piece timed alone):")
    for label, seconds in times.items():
        print(f"   {label:<40}{med(seconds) * 1e3:>9.2f} ms")
    print(f"   PDF size {len(pdf_bytes):,} bytes; JSON size {len(json_bytes)} bytes")


if __name__ == "__main__":
    sys.exit(main())
