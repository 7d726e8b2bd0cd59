"""An imported training suite: one `--over` run vs one `--resume` run per revision.

Run: ``uv run python benchmarks/suite_over.py [--revisions 10 --rounds 3] [--quick]
[--json PATH]`` (about 5 minutes on the shared 2-core CPU machine; ``--quick``: one
round over 4 revisions, about a minute).

A suite of ``--revisions`` random GPT-2 revisions (2 layers, n_embd 32, 2 heads,
context 64; `step0`, `step1000`, ...) is written as a Hugging Face cache folder and
imported once, in-process (`import_suite`, what ``theseus import hf --revisions all``
runs). Then, as a user would type them, each a ``theseus`` subprocess (as in
backfill.py: this environment's console script, one CPU device):

* ours: ``theseus run backfill stats.yaml ROOT --over LINEAGE --force
  inspection/prompt=...``: one process walks every revision, compiled once;
* theirs: ``theseus run backfill stats.yaml ROOT --resume LINEAGE~STEP
  inspection/prompt=...`` for each revision, one after another.

Both write the same JSON result to every node, so both do the same work per node;
theirs also starts Python, imports JAX and compiles once per revision. A walk costs
what one ``--resume`` run costs (the same start, setup and compile, and one node) plus
each further node's reading, analysis and writing, so theirs / ours stays below the
number of revisions N: a ratio of N would need the N - 1 further nodes to cost nothing.
The goal is therefore 0.9 x N (9 at 10 revisions): the walk costs at most what one
``--resume`` run costs plus a ninth of one for the further nodes together. The row's note
gives the measured cost of one further node against a whole ``--resume`` run. A round
runs both sides in alternating order; the row's ratios are theirs / ours per round. Before timing, one ``--over`` and one ``--resume`` of the same revision must
leave byte-identical artifacts.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file or with -m
from benchmarks import _report
from benchmarks.backfill import over_vs_resume, same_as_resume, theseus

GOAL_SHARE = 0.9  # of the number of revisions (the ratio's ceiling)
QUICK = {"revisions": 4, "rounds": 1}
PROMPT = "inspection/prompt=The quick brown fox jumps over the lazy dog. The quick brown fox"
CORE_TESTS = Path(__file__).resolve().parents[1] / "packages" / "theseus-core" / "tests"


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--revisions", type=int, default=10, help="revisions in the suite")
    p.add_argument("--rounds", type=int, default=3, help="paired rounds (ours and theirs)")
    _report.add_arguments(p)
    args = p.parse_args(argv)
    if args.quick:
        args.revisions, args.rounds = QUICK["revisions"], QUICK["rounds"]
    return args


def imported(scratch: Path, count: int) -> tuple[str, str]:
    """Write and import a suite of `count` random revisions; `(name, nonce)` of its lineage."""
    from theseus.experiments.models.suite import import_suite
    from theseus.registry import import_module_or_file

    folders = import_module_or_file(str(CORE_TESTS / "gpt2_folder.py"))
    suites = import_module_or_file(str(CORE_TESTS / "suite_folders.py"))
    revisions = {
        f"step{1000 * i}": folders.write_gpt2_folder(
            scratch / "src" / f"step{1000 * i}", n_layer=2, n_embd=32, n_head=2, seed=i
        )
        for i in range(count)
    }
    cache = suites.hf_cache(scratch / "models--bench--suite", revisions)
    lineage = import_suite(cache, scratch / "root", "suite").lineage
    name, nonce = lineage.split("~")
    return name, nonce


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    scratch = Path(tempfile.mkdtemp(prefix="suite-over-"))
    try:
        print(f"importing a suite of {args.revisions} revisions ...", flush=True)
        name, nonce = imported(scratch, args.revisions)
        root = scratch / "root"
        config = scratch / "stats.yaml"
        theseus("configure", "benchmarks/backfill/stats", str(config))
        run = ["run", "backfill", str(config), str(root)]
        over = [*run, "--over", f"{name}~{nonce}", "--force", PROMPT]
        steps = [1000 * i for i in range(args.revisions)]
        nodes = [f"{name}~{nonce}~{step}" for step in steps]

        same = same_as_resume(scratch, config, over, nodes[-1], PROMPT)

        ours, theirs, _ = over_vs_resume(over, run, nodes, args.rounds, PROMPT)
        each = statistics.median(theirs) / len(nodes)  # one --resume run, start to end
        extra = (statistics.median(ours) - each) / max(1, len(nodes) - 1)
        row = _report.compare(
            f"suite: --over an imported {args.revisions}-revision suite vs "
            f"{args.revisions} x --resume (random GPT-2 2x32, subprocesses)",
            ours,
            theirs,
            unit="s",
            fmt="{:.1f} s",
            ratio="theirs/ours",
            meaning="theirs time / ours time; above 1: --over faster",
            goal=(">=", GOAL_SHARE * args.revisions),
            note=(
                f"one `theseus run --over LINEAGE --force` over the {args.revisions} nodes "
                "`import_suite` wrote (seq = step) against one `theseus run --resume NODE` "
                "process per revision, each a fresh Python + JAX + compile, on a prompt "
                f"(`inspection/prompt`); byte-identical artifacts checked: {same}; each "
                f"further node of the walk cost {extra:.3f} s against {each:.2f} s for a "
                f"whole --resume run, so the ratio's ceiling at {args.revisions} revisions "
                f"is {args.revisions} (a walk costs one --resume plus its further nodes)"
            ),
        )
        ratio = statistics.median(row.ratios)
        print(
            f"--over {row.ours}, {args.revisions} x --resume {row.theirs}: {ratio:.1f}x "
            f"(goal >= {GOAL_SHARE * args.revisions:g}, {'met' if row.met else 'NOT met'})"
        )
        _report.write(args.json, "suite_over", args.quick, [row])
        return _report.exit_status(
            [row], checks=[(same, "--over and --resume wrote different values")]
        )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
