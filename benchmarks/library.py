"""The analysis library: all its analyses in one `--over` walk vs one walk each; in tandem.

Run: ``uv run python benchmarks/library.py [--checkpoints 10 --rounds 3 --tandem 8
--commands 1] [--quick] [--json PATH]`` (5 minutes on the quiet 2-core CPU machine, about
15 under load; ``--quick``: 1 checkpoint, at most one round of each kind).

A small GPT (``--layers`` 2, ``--width`` 64, 4 heads, ``--block`` 64, ``--batch`` 8, the
synthetic language) trains ``--checkpoints`` steps with a checkpoint after each, once, in
a process of its own (so that this one has not opened the accelerator when the commands
below start theirs: a TPU is held by one process at a time); its root is copied so that
each side writes a store of its own (the checkpoints hard-linked where the filesystem
allows: the analyses only read them). ``--trained DIR`` keeps the trained lineage in DIR
and, run again with the same settings, trains nothing: training and measuring in two runs
(on a device lent for minutes at a time). The library's seven
analyses (induction, icl, logit-lens, loss-by-position, loss-by-frequency, drift,
memorization) run with the same settings on both sides (`SETTINGS`, every one at its
default but the ICL's early position and the induction tokens, which the block and the
synthetic language need):

1. **One walk vs seven.** Each walk as ``theseus run ... --over trained --force`` runs it
   (``q.find()...over(force=True)``), in this process, from the job's build to its last
   node, after ``jax.clear_caches()`` (so every walk compiles its programs again, as a
   new process would; Python's start and imports are not counted, which favours theirs):

   * ours: ``FirstAnalyses`` with ``library/analyses`` = all seven: each checkpoint is
     read once; the five analyses that share a forward run in one compiled program (the
     model once on the repeated tokens, once per validation batch), drift and
     memorization beside it on the same state (`library/first`'s companions);
   * theirs: each of the seven analyses walked alone, one after another.

   Both write every analysis's values, figure and files on every node (``force``: each
   round writes new versions). A round runs both sides in alternating order; the row's
   ratios are theirs / ours per round (goal >= 3). Checked after the rounds: every
   ``dynamics/`` value of every node equal in the two stores (numbers within 1e-5
   relative, 1e-6 absolute on a CPU: the shared program fuses the measures in another
   order than each analysis's own; 2e-3 on an accelerator, whose float32 matmuls run in
   bfloat16 passes by default; the largest difference is named), and the one walk's
   program traced once. Each walk's
   ``compute()`` and ``_publish()`` are timed at every node: the note gives a node's
   (after the first, median) computation and publishing, ours against theirs summed.
   Publishing (figures, files, artifacts) is the same work on both sides, so where it
   dominates a node it bounds the ratio.
   **As commands** (``--commands`` rounds, default 1; 0: none): the same two sides as a
   researcher types them, each walk a new process, ``theseus run first first.yaml ROOT
   --over trained --force`` with ``library/analyses`` = all seven against seven ``theseus
   run NAME NAME.yaml ROOT --over trained --force`` (each configured with ``theseus
   configure`` beforehand, untimed; the settings as ``KEY=VALUE``), timed from each
   process's start to its exit: Python's start, the imports and the accelerator's opening
   count once for the one walk and seven times for the seven. Both sides write to roots
   of their own; the same values check follows. The goal (>= 3) is this row's too.
2. **Tandem cost.** A trainer resumed at the last checkpoint with the seven analyses as
   tandem views (``ANALYSIS``), and ``library/first`` with all seven as one more. A
   validation step is ``trainer.validate()``; each variant adds one view's
   ``run(background=True)``, what the trainer does at validation (the computation on the
   training thread; figure, file and artifact on the publishing thread, drained untimed
   after each sample, its time in the note). Each round runs plain and every variant in
   a random order (seeded); each row's ratios are variant / plain of the same round
   (information rows: a tandem analysis costs what its forward costs). Drift in tandem
   compares with the previous validation's node; here every sample is at one node, so
   it records its residuals and finds nothing earlier to compare with.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file or with -m
from benchmarks import _report
from benchmarks._lineage import in_child, job_settings, run_command, same_values, twin

GOAL = 3.0
QUICK = {"checkpoints": 1, "rounds": 1, "tandem": 1, "commands": 1}
#: Each analysis's `NAME` and registered job.
ANALYSES = {
    "induction": "library/induction",
    "icl": "library/icl",
    "logit-lens": "library/logit-lens",
    "loss-by-position": "library/loss-by-position",
    "loss-by-frequency": "library/loss-by-frequency",
    "drift": "library/drift",
    "memorization": "library/memorization",
}
#: Settings both sides run with (each analysis is given the ones it declares).
SETTINGS = {
    "library/icl/early": 8,  # the default 50 lies beyond the 64-token block's late position
    "library/induction/tokens": "data",  # the synthetic language uses a few of its ids
}
#: The one walk's settings: the same, and all seven analyses in `library/first`.
EVERYTHING = {**SETTINGS, "library/analyses": list(ANALYSES)}
MODEL = {  # option -> configuration key
    "layers": "architecture/n_layers",
    "width": "architecture/n_embd",
    "heads": "architecture/n_head",
    "block": "architecture/block_size",
    "batch": "training/batch_size",
}
DEFAULTS = {"layers": 2, "width": 64, "heads": 4, "block": 64, "batch": 8}
TRAINING = {  # validation (4 batches, as library/batches reads) only at the end
    "training/analyze": False,
    "logging/report_interval": 5,
    "logging/validation_interval": 1000,
    "logging/checkpoint_interval": 1,
}
RELATIVE, ABSOLUTE = 1e-5, 1e-6  # the values check on a CPU (float32 throughout)
#: ... on an accelerator: its float32 matmuls run at the default precision (bfloat16
#: passes on a TPU), so the set's program and each analysis's own round differently;
#: 2e-3 is also drift's own precision (its residual streams are kept in float16)
RELATIVE_ACCELERATOR = ABSOLUTE_ACCELERATOR = 2e-3


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoints", type=int, default=10, help="checkpoints in the lineage")
    p.add_argument("--rounds", type=int, default=3, help="paired rounds of the walks")
    p.add_argument(
        "--tandem", type=int, default=8, help="rounds of the tandem cost (0: the walks alone)"
    )
    p.add_argument(
        "--commands",
        type=int,
        default=1,
        help="rounds of the walks as `theseus run` commands, each a new process (0: none)",
    )
    p.add_argument(
        "--trained",
        type=Path,
        metavar="DIR",
        help="train the lineage into DIR and keep it there; where DIR already holds the one "
        "these settings train, train nothing (so training and measuring can be run apart)",
    )
    for option, default in DEFAULTS.items():
        p.add_argument(f"--{option}", type=int, default=default, help=MODEL[option])
    _report.add_arguments(p)
    args = p.parse_args(argv)
    if args.quick:  # cuts the repeats; what was turned off (0) stays off
        args.checkpoints = QUICK["checkpoints"]
        args.rounds, args.tandem, args.commands = (
            min(getattr(args, key), QUICK[key]) for key in ("rounds", "tandem", "commands")
        )
    return args


def model_settings(args: argparse.Namespace) -> dict[str, int]:
    return {key: getattr(args, option) for option, key in MODEL.items()}


def counted(checkpoints: int) -> str:
    return f"{checkpoints} checkpoint" + ("" if checkpoints == 1 else "s")


def model_text(args: argparse.Namespace) -> str:
    return f"GPT {args.layers}x{args.width}, block {args.block}, batch {args.batch}"


#: The file in a trained root that records the settings it was trained with.
TRAINED = "library-benchmark.json"
#: The commands' `KEY=VALUE` settings: the one walk's, and each of the seven's by name.
Settings = tuple[list[str], dict[str, list[str]]]


def train(root: Path, args: argparse.Namespace) -> Settings | None:
    """Train the GPT with a checkpoint at every step and, when the commands are measured,
    build their settings (`command_settings`), both in one process of its own: this one
    must not open the accelerator before the commands' processes need it (a TPU is held by
    one process at a time), and each process opens it once (about 15 s on a TPU).

    A `root` that holds the lineage these settings train (its `TRAINED` record says so) is
    not trained again; one that holds anything else is refused."""
    record = root / TRAINED
    wanted = {"checkpoints": args.checkpoints, **model_settings(args)}
    if record.exists():
        found = json.loads(record.read_text())
        if found != wanted:
            raise SystemExit(
                f"--trained {root} holds a lineage trained with {found}, not {wanted}: "
                "give the same settings, or another folder"
            )
        print(f"the lineage in {root} is trained with these settings: not trained again")
        return in_child(command_settings, root) if args.commands else None
    if root.exists() and any(root.iterdir()):
        raise SystemExit(
            f"--trained {root} is neither empty nor a lineage this benchmark trained "
            f"(no {TRAINED}): give a new or empty folder"
        )
    print(f"training {args.checkpoints} steps of a {model_text(args)}, a checkpoint after each ...")
    settings = in_child(_train, root, args)
    record.write_text(json.dumps(wanted))
    return settings


def _train(root: Path, args: argparse.Namespace) -> Settings | None:
    from theseus.data.datasets import Synthetic
    from theseus.experiments.models.gpt import PretrainGPT
    from theseus.quick import quick

    rows = 8 * args.batch * (args.block + 1)  # the validation batches the analyses read
    Synthetic.prepare(root, tokens=max(40_000, 4 * rows), val_tokens=max(6_000, rows))
    with quick(root) as q:
        q.build(PretrainGPT, "trained")
        for key, value in {**TRAINING, **model_settings(args)}.items():
            q.config[key] = value
        q.config["training/tokens"] = args.checkpoints * args.batch * args.block
        q.create()()
    return command_settings(root) if args.commands else None


#: XLA compilations as JAX reports them: `(program name, seconds)`, appended as they end.
COMPILES: list[tuple[str, float]] = []


def _listen_to_compiles() -> None:
    import jax

    def heard(event: str, duration_secs: float, **details: str | int) -> None:
        if event == "/jax/core/compile/backend_compile_duration":
            COMPILES.append((str(details.get("fun_name", "?")), duration_secs))

    jax.monitoring.register_event_duration_secs_listener(heard)


def compiled(since: int) -> str:
    """The compilations after the first `since`: how many, their seconds, the longest."""
    done = COMPILES[since:]
    longest = sorted(done, key=lambda c: -c[1])[:3]
    named = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in longest)
    return f"{len(done)} compilations, {sum(s for _, s in done):.1f} s (longest: {named})"


def walk(
    root: Path, cls: type, run: str, settings: dict[str, Any], parts: dict[str, list[float]]
) -> tuple[float, Any]:
    """`cls` over the lineage of `trained` (`--force`), from a fresh start: JAX's caches
    cleared (its compiled programs are made again, as in a new process), the job built,
    set up at the first checkpoint and walked. `(seconds, the job)`; each node's
    `compute()` and `_publish()` seconds are appended to `parts`, and the walk's
    compilations are printed."""
    import jax

    from theseus.quick import quick

    jax.clear_caches()
    since = len(COMPILES)
    start = time.perf_counter()
    with quick(root) as q:
        q.build(cls, run)
        q.find().spec(run="trained").over(force=True)
        for key, value in settings.items():
            if key in q.config:  # each analysis is given the settings it declares
                q.config[key] = value
        job: Any = q.create()
        for name in ("compute", "_publish"):  # timed where the walk calls them
            setattr(job, name, timing(getattr(job, name), parts[name]))
        job()
    seconds = time.perf_counter() - start
    print(f"      {run}: {compiled(since)}", flush=True)
    return seconds, job


def timing(fn: Callable[..., Any], into: list[float]) -> Callable[..., Any]:
    """`fn`, its seconds appended to `into` at each call."""

    def timed(*args: Any) -> Any:
        begun = time.perf_counter()
        try:
            return fn(*args)
        finally:
            into.append(time.perf_counter() - begun)

    return timed


def warm_up() -> None:
    """What the first walk would pay alone: matplotlib, seaborn, the fonts, a PDF."""
    import numpy as np

    from theseus.plot import heatmap, line, to_pdf

    to_pdf(heatmap(np.eye(2), annot=True, xlabel="Head", ylabel="Layer"))
    to_pdf(line(x=[0, 1], y=[0.0, 1.0], marker="o", xlabel="layer", ylabel="loss"))


def alternate(
    rounds: int, label: str, ours: Callable[[], None], theirs: Callable[[], None]
) -> None:
    """`rounds` rounds of both sides, the first side alternating (ours first in round 1)."""
    for index in range(rounds):
        print(f"{label} {index + 1}/{rounds}", flush=True)
        for side in (ours, theirs) if index % 2 == 0 else (theirs, ours):
            side()


def seconds_row(
    what: str, ours: list[float], theirs: list[float], faster: str, note: str
) -> _report.Row:
    """A row of paired walk times in seconds, theirs / ours, against the goal."""
    return _report.compare(
        what,
        ours,
        theirs,
        unit="s",
        fmt="{:.1f} s",
        ratio="theirs/ours",
        meaning=f"theirs time / ours time; above 1: {faster} faster",
        goal=(">=", GOAL),
        note=note,
    )


# ------------------------------------------------------------- 1. one walk vs seven
def walks(root: Path, scratch: Path, args: argparse.Namespace) -> tuple[list[_report.Row], bool]:
    from theseus.analysis.library import CATALOGUE, FirstAnalyses

    ours_root, theirs_root = scratch / "ours", scratch / "theirs"
    twin(root, ours_root)
    twin(root, theirs_root)
    warm_up()
    _listen_to_compiles()
    ours: list[float] = []
    theirs: list[float] = []
    traces: list[int] = []
    # each node's compute() and _publish() seconds: ours, and each of theirs
    parts: dict[str, dict[str, list[float]]] = {
        name: {"compute": [], "_publish": []} for name in ["ours", *ANALYSES]
    }
    computing: dict[str, list[float]] = {"ours": [], "theirs": []}  # per round, summed
    compiling: dict[str, list[float]] = {"ours": [], "theirs": []}  # XLA compile seconds

    def compile_seconds(since: int) -> float:
        return sum(seconds for _, seconds in COMPILES[since:])

    def spent(names: list[str]) -> float:
        return sum(sum(parts[name]["compute"]) for name in names)

    def measure_ours() -> None:
        before, since = spent(["ours"]), len(COMPILES)
        seconds, job = walk(ours_root, FirstAnalyses, "first", EVERYTHING, parts["ours"])
        compiling["ours"].append(compile_seconds(since))
        ours.append(seconds)
        computing["ours"].append(spent(["ours"]) - before)
        traces.append(job.traces)
        print(f"  one walk, all seven: {seconds:.1f} s", flush=True)

    def measure_theirs() -> None:
        total, before, since = 0.0, spent(list(ANALYSES)), len(COMPILES)
        for name, registered in ANALYSES.items():
            cls = CATALOGUE[registered]
            seconds, _ = walk(theirs_root, cls, name, SETTINGS, parts[name])
            total += seconds
            print(f"    {name}: {seconds:.1f} s", flush=True)
        theirs.append(total)
        compiling["theirs"].append(compile_seconds(since))
        computing["theirs"].append(spent(list(ANALYSES)) - before)
        print(f"  seven walks: {total:.1f} s", flush=True)

    alternate(args.rounds, "round", measure_ours, measure_theirs)

    same, compared, worst, where = same_dynamics(ours_root, theirs_root)
    relative, absolute = tolerances()
    print(
        f"check: {compared} dynamics/ values on {counted(args.checkpoints)} equal in the two "
        f"stores: {same} (largest difference {worst:.2e}, in {where})",
        flush=True,
    )
    computed, published = node_parts(parts, args.checkpoints)
    print(
        f"a node after the first (median): one walk computes {computed['ours']:.0f} ms and "
        f"publishes {published['ours']:.0f} ms; the seven walks compute {computed['theirs']:.0f} "
        f"ms and publish {published['theirs']:.0f} ms together",
        flush=True,
    )
    row = seconds_row(
        f"library: all seven analyses in one --over walk vs seven walks "
        f"({counted(args.checkpoints)}, {model_text(args)})",
        ours,
        theirs,
        "the one walk",
        (
            "`FirstAnalyses` with library/analyses = all seven walked over the lineage "
            "(`q.find()...over(force=True)`, as `theseus run --over --force`) against each "
            "analysis walked alone, in-process, each walk from its build to its last node "
            "with JAX's caches cleared first (so each compiles as a new process would; "
            f"Python's start is not counted); the one walk traced its program {max(traces)} "
            f"time(s); {compared} dynamics/ values equal (numbers within {relative:g} "
            f"relative or {absolute:g} absolute): {same}, largest absolute difference "
            f"{worst:.1e} ({where}); a node after the first "
            f"(median): ours computes {computed['ours']:.0f} ms (every analysis, one read) "
            f"and publishes {published['ours']:.0f} ms (seven figures, files, artifacts), "
            f"theirs compute {computed['theirs']:.0f} ms and publish {published['theirs']:.0f} "
            "ms together: publishing is the same work on both sides and cannot be shared; "
            f"XLA compilation (median per round) {statistics.median(compiling['ours']):.1f} s "
            f"for the one walk, {statistics.median(compiling['theirs']):.1f} s for the seven"
        ),
    )
    computation = _report.compare(
        f"library: the walks' computation alone, one vs seven ({counted(args.checkpoints)}, "
        f"{model_text(args)})",
        computing["ours"],
        computing["theirs"],
        unit="s",
        fmt="{:.1f} s",
        ratio="theirs/ours",
        meaning="theirs compute() time / ours; above 1: sharing saves computation",
        note=(
            "the same walks as the row above, only their compute() at every node, summed "
            "(the forwards, the logit lens's unembeddings, CKA, greedy decoding; the first "
            "node's compile included): what one forward per batch kind saves; the rest of a "
            "walk is its setup, checkpoint reads and publishing"
        ),
    )
    print(
        f"one walk {row.ours}, seven walks {row.theirs}: {statistics.median(row.ratios):.2f}x "
        f"(goal >= {GOAL:g}, {'met' if row.met else 'NOT met'}); the computation alone "
        f"{computation.ours} vs {computation.theirs}: {statistics.median(computation.ratios):.2f}x; "
        f"XLA compilation {statistics.median(compiling['ours']):.1f} s vs "
        f"{statistics.median(compiling['theirs']):.1f} s"
    )
    return [row, computation], same and max(traces) == 1


# ------------------------------------------------------ 1b. as theseus run commands
def command_settings(root: Path) -> Settings:
    """`job_settings` of the one walk and of each of the seven (in the training process:
    building a job's configuration opens the accelerator)."""
    ours = job_settings(root, "library/first", EVERYTHING)
    return ours, {name: job_settings(root, job, SETTINGS) for name, job in ANALYSES.items()}


def as_commands(
    root: Path, scratch: Path, args: argparse.Namespace, settings: Settings
) -> tuple[list[_report.Row], bool]:
    """The one walk and the seven as a researcher types them: `theseus run first ...
    --over trained --force` against seven `theseus run NAME ... --over trained --force`,
    each a new process; `args.commands` rounds, alternating which side goes first."""
    ours_root, theirs_root = scratch / "ours-commands", scratch / "theirs-commands"
    twin(root, ours_root)
    twin(root, theirs_root)
    configs = scratch / "configs"
    configs.mkdir(exist_ok=True)
    ours_args, theirs_args = settings
    ours: list[float] = []
    theirs: list[float] = []

    def measure_ours() -> None:
        seconds = run_command(ours_root, "library/first", "first", ours_args,
                              configs / "first.yaml", over="trained")  # fmt: skip
        ours.append(seconds)
        print(f"  one command, all seven: {seconds:.1f} s", flush=True)

    def measure_theirs() -> None:
        total = 0.0
        for name, job in ANALYSES.items():
            seconds = run_command(theirs_root, job, name, theirs_args[name],
                                  configs / f"{name}.yaml", over="trained")  # fmt: skip
            total += seconds
            print(f"    {name}: {seconds:.1f} s", flush=True)
        theirs.append(total)
        print(f"  seven commands: {total:.1f} s", flush=True)

    alternate(args.commands, "commands, round", measure_ours, measure_theirs)
    same, compared, worst, where = same_dynamics(ours_root, theirs_root)
    relative, absolute = tolerances()
    print(f"check: {compared} dynamics/ values equal: {same} (largest difference {worst:.2e}, "
          f"in {where})", flush=True)  # fmt: skip
    row = seconds_row(
        f"library as commands: `theseus run first --over` vs seven `theseus run NAME --over` "
        f"({counted(args.checkpoints)}, {model_text(args)})",
        ours,
        theirs,
        "the one command",
        (
            "each walk a new process, `theseus run RUN CONFIG ROOT --over trained --force` "
            "with the settings as KEY=VALUE (each configured by `theseus configure` "
            "beforehand, untimed), timed from the process's start to its exit: Python's "
            "start, the imports and the accelerator's opening count on both sides, once for "
            f"the one walk and seven times for the seven; {args.commands} round(s), "
            f"alternating which side goes first; {compared} dynamics/ values equal (within "
            f"{relative:g} relative or {absolute:g} absolute): {same}, largest absolute "
            f"difference {worst:.1e} ({where})"
        ),
    )
    print(
        f"one command {row.ours}, seven commands {row.theirs}: "
        f"{statistics.median(row.ratios):.2f}x (goal >= {GOAL:g}, "
        f"{'met' if row.met else 'NOT met'})",
        flush=True,
    )
    return [row], same


def tolerances() -> tuple[float, float]:
    """The values check's relative and absolute tolerance on JAX's default backend."""
    import jax

    if jax.default_backend() == "cpu":
        return RELATIVE, ABSOLUTE
    return RELATIVE_ACCELERATOR, ABSOLUTE_ACCELERATOR


def same_dynamics(ours: Path, theirs: Path) -> tuple[bool, int, float, str]:
    """`same_values` of every `dynamics/` value of the lineage's nodes in the two roots,
    within `tolerances()`."""
    relative, absolute = tolerances()
    return same_values(ours, theirs, relative, absolute, run="trained", prefix="dynamics/")


def node_parts(
    parts: dict[str, dict[str, list[float]]], checkpoints: int
) -> tuple[dict[str, float], dict[str, float]]:
    """The median milliseconds a node after the first spends in `compute()` and in
    `_publish()`: ours, and theirs (the seven analyses' summed); with one checkpoint, the
    first node's (compile included)."""

    def per_node(samples: list[float]) -> float:
        later = [x for i, x in enumerate(samples) if i % checkpoints or checkpoints == 1]
        return statistics.median(later) * 1e3

    out: tuple[dict[str, float], dict[str, float]] = ({}, {})
    for which, part in zip(out, ("compute", "_publish"), strict=True):
        which["ours"] = per_node(parts["ours"][part])
        which["theirs"] = sum(per_node(parts[name][part]) for name in ANALYSES)
    return out


# -------------------------------------------------------------------- 2. tandem cost
def tandem(root: Path, args: argparse.Namespace) -> list[_report.Row]:
    from theseus.analysis.library import CATALOGUE, FirstAnalyses
    from theseus.experiments.models.gpt import PretrainGPT
    from theseus.quick import quick

    analyses = [CATALOGUE[job] for job in ANALYSES.values()]

    class Tandem(PretrainGPT):
        """The trained GPT with the seven analyses, and all seven as one, in tandem."""

        ANALYSIS = [*analyses, FirstAnalyses]

    with quick(root) as q:
        q.build(Tandem, "trained")
        q.find().spec(run="trained").checkpoint().latest().resume()
        for key, value in {**SETTINGS, "training/analyze": True}.items():
            q.config[key] = value
        q.config["library/analyses"] = list(ANALYSES)
        trainer: Any = q.create()
        views = dict(zip([*ANALYSES, "all seven (library/first)"], trainer.loop.views, strict=True))
        return tandem_rows(trainer, views, args)


def tandem_rows(trainer: Any, views: dict[str, Any], args: argparse.Namespace) -> list[_report.Row]:
    names = ["plain", *views]
    totals: dict[str, list[float]] = {n: [] for n in names}
    bases: dict[str, list[float]] = {n: [] for n in names}
    backlog: dict[str, list[float]] = {n: [] for n in names}

    def sample(name: str) -> float:
        start = time.perf_counter()
        trainer.validate()
        if name != "plain":
            views[name].run(background=True)
        end = time.perf_counter()
        if name != "plain":  # untimed: what the publishing thread still had to do
            views[name].drain()
            backlog[name].append(time.perf_counter() - end)
        return end - start

    for name in names:  # warm-up: compiles validation and every analysis, first files
        sample(name)
    rng = random.Random(0)
    for index in range(args.tandem):
        order = list(names)
        rng.shuffle(order)
        got = {name: sample(name) for name in order}
        for name in names:
            totals[name].append(got[name])
            bases[name].append(got["plain"])
        print(f"  tandem round {index + 1}/{args.tandem}", flush=True)
    rows = []
    print(f"\n{'variant':<28}{'median':>10}{'/ plain':>10}{'publishing':>12}")
    for name in names[1:]:
        row = _report.compare(
            f"library in tandem: validation step + {name} vs plain ({model_text(args)})",
            [x * 1e3 for x in totals[name]],
            [x * 1e3 for x in bases[name]],
            unit="ms",
            fmt="{:.1f} ms",
            ratio="ours/theirs",
            meaning="(validation step + the analysis) time / plain validation step time "
            "in the same round; 1 means free",
            note=(
                f"{args.tandem} rounds; view.run(background=True) as the trainer runs it: "
                "what the training thread waits for; its figure, file and artifact go to the "
                f"publishing thread ({statistics.median(backlog[name]) * 1e3:.0f} ms of work "
                "there per validation, drained untimed after each sample)"
            ),
        )
        rows.append(row)
        print(
            f"{name:<28}{row.ours:>10}{statistics.median(row.ratios):>10.2f}"
            f"{statistics.median(backlog[name]) * 1e3:>9.0f} ms"
        )
    print(f"{'plain':<28}{statistics.median(totals['plain']) * 1e3:>7.1f} ms")
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    scratch = Path(tempfile.mkdtemp(prefix="library-"))
    try:
        root = args.trained.resolve() if args.trained else scratch / "root"
        settings = train(root, args)
        # The commands first: their processes open the accelerator, which this one opens
        # for the walks in this process and the tandem rows (and then holds).
        typed, agreed = as_commands(root, scratch, args, settings) if settings else ([], True)
        walked, same = walks(root, scratch, args) if args.rounds else ([], True)
        rows = [*walked, *typed]
        walked, same = list(rows), same and agreed
        if args.tandem:  # 0: the walks alone
            print("\ntandem cost ...", flush=True)
            twin(root, scratch / "tandem")  # the kept root stays as trained
            rows += tandem(scratch / "tandem", args)
        _report.write(args.json, "library", args.quick, rows, {"model": model_text(args)})
        return _report.exit_status(
            walked,
            checks=[(same, "the one walk and the seven wrote different values, or it retraced")],
        )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
