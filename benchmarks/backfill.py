"""Backfill: one analysis over every checkpoint (`--over`) vs one `--resume` run per checkpoint.

Run: ``uv run python benchmarks/backfill.py [--checkpoints 20 --rounds 3] [--quick]
[--json PATH]`` (about 8-10 minutes on the shared 2-core CPU machine; ``--quick``: one
round over 6 checkpoints, about 1.5 minutes).

A tiny GPT (2 layers, n_embd 32, 2 heads, block 32, batch 8) trains ``--checkpoints``
steps with a checkpoint after every step, in-process, once. Then, as a user would type
them, each a ``theseus`` subprocess (the console script of this environment, one CPU
device, no persistent compilation cache):

* ours: ``theseus run backfill stats.yaml ROOT --over trained --force``: one process
  walks every checkpoint, compiled once, reading the next checkpoint while the current
  one is analyzed;
* theirs: ``theseus run backfill stats.yaml ROOT --resume trained~NONCE~SEQ`` for each
  checkpoint, one after another.

Both write the same JSON result to every node (``--force`` makes ours recompute what
the previous round wrote; each ``--resume`` run writes a new version too), so both do
the same work per node; theirs also starts Python, imports JAX and compiles once per
node. A round runs both sides in alternating order; the row's ratios are theirs / ours
per round (goal >= 10). The overlap is read from the ``--over`` run's own closing line
(how long reading checkpoints took, and how much of it ran behind the analysis).

Before timing, one ``--over`` and one ``--resume`` of the same node must leave
byte-identical artifacts (the check of the walk against the single run).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file or with -m
from benchmarks import _report
from theseus.analysis import AnalysisBase
from theseus.experiments.models.gpt import PretrainGPT
from theseus.model.attention.base import SelfAttention
from theseus.registry import analysis

GOAL = 10.0
QUICK = {"checkpoints": 6, "rounds": 1}
TINY = {
    "architecture/n_layers": 2,
    "architecture/n_embd": 32,
    "architecture/n_head": 2,
    "architecture/block_size": 32,
    "training/batch_size": 8,
    "training/validation_steps": 1,
    "training/analyze": False,
    "logging/report_interval": 5,
    "logging/validation_interval": 1000,
    "logging/checkpoint_interval": 1,
}


@analysis("benchmarks/backfill/stats")
class BackfillStats(AnalysisBase, PretrainGPT):
    """The last attention's input: a crop and its mean, as JSON."""

    TARGET = SelfAttention
    NAME = "stats"

    def select(self, paths: list[str]) -> str:
        return paths[-1]

    def analyze(self, layer: Any, inputs: Any) -> Any:
        return {"x": inputs.x[:, :4, :8], "mean": inputs.x.mean()}

    def plot(self, results: Any) -> Any:
        return {key: value.tolist() for key, value in results.items()}


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoints", type=int, default=20, help="checkpoints in the lineage")
    p.add_argument("--rounds", type=int, default=3, help="paired rounds (ours and theirs)")
    _report.add_arguments(p)
    args = p.parse_args(argv)
    if args.quick:
        args.checkpoints, args.rounds = QUICK["checkpoints"], QUICK["rounds"]
    return args


def train(root: Path, steps: int) -> tuple[str, str]:
    """Train the tiny GPT with a checkpoint at every step; `(name, nonce)` of its lineage."""
    from theseus.data.datasets import Synthetic
    from theseus.quick import quick

    Synthetic.prepare(root, tokens=40_000, val_tokens=6_000)
    with quick(root) as q:
        q.build(PretrainGPT, "trained")
        for key, value in TINY.items():
            q.config[key] = value
        q.config["training/tokens"] = steps * 8 * 32
        trainer = q.create()
        trainer()
    return trainer.node.name, trainer.node.nonce


def theseus(*argv: str) -> tuple[float, str]:
    """Run the `theseus` console script as a user would; `(seconds, output)`."""
    command = [str(Path(sys.executable).with_name("theseus")), *argv, "--import", __file__]
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    env.pop("XLA_FLAGS", None)  # one CPU device, as a plain `theseus run` gets
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - start
    output = done.stdout + done.stderr
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}):\n{output[-3000:]}")
    return seconds, output


def over_vs_resume(
    over: list[str], run: list[str], nodes: list[str], rounds: int, *extra: str
) -> tuple[list[float], list[float], list[str]]:
    """Time `theseus *over` against `theseus *run --resume NODE *extra` for every node.

    The rounds alternate which side goes first. Returns the seconds of ours (the one
    `--over` process) and theirs (the sum of the `--resume` processes) per round, and
    ours' outputs.
    """
    ours: list[float] = []
    theirs: list[float] = []
    outputs: list[str] = []

    def measure_ours() -> None:
        seconds, output = theseus(*over)
        ours.append(seconds)
        outputs.append(output)
        print(f"  --over: {seconds:.1f} s", flush=True)

    def measure_theirs() -> None:
        seconds = sum(theseus(*run, "--resume", node, *extra)[0] for node in nodes)
        theirs.append(seconds)
        print(f"  {len(nodes)} x --resume: {seconds:.1f} s", flush=True)

    for index in range(rounds):
        print(f"round {index + 1}/{rounds}", flush=True)
        sides = [measure_ours, measure_theirs]
        for side in sides if index % 2 == 0 else sides[::-1]:
            side()
    return ours, theirs, outputs


def same_as_resume(scratch: Path, config: Path, over: list[str], node: str, *extra: str) -> bool:
    """Whether `theseus *over` and a `--resume` of `node` (`name~nonce~seq`, in a copy of
    the root) leave byte-identical `stats` artifacts on it: the walk checked against the
    single run."""
    root, reference = scratch / "root", scratch / "reference"
    shutil.copytree(root, reference)
    theseus("run", "backfill", str(config), str(reference), "--resume", node, *extra)
    theseus(*over)
    name, nonce, seq = node.split("~")
    same = artifact(root, name, nonce, int(seq)) == artifact(reference, name, nonce, int(seq))
    print(f"check: --over and --resume artifacts byte-identical: {same}", flush=True)
    return same


def artifact(root: Path, name: str, nonce: str, seq: int) -> bytes:
    from theseus.store import Node, Store

    with Store(root / "store") as store:
        return store.get(Node(name, nonce, seq))["stats"].content


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    scratch = Path(tempfile.mkdtemp(prefix="backfill-"))
    try:
        root = scratch / "root"
        print(f"training {args.checkpoints} steps, a checkpoint after each ...", flush=True)
        name, nonce = train(root, args.checkpoints)
        config = scratch / "stats.yaml"
        theseus("configure", "benchmarks/backfill/stats", str(config))
        run = ["run", "backfill", str(config), str(root)]
        over = [*run, "--over", f"{name}~{nonce}", "--force"]
        nodes = [f"{name}~{nonce}~{seq}" for seq in range(args.checkpoints)]

        same = same_as_resume(scratch, config, over, nodes[-1])

        ours, theirs, outputs = over_vs_resume(over, run, nodes, args.rounds)
        hidden = []
        for output in outputs:
            found = re.search(r"reading checkpoints took ([\d.]+) s, (\d+)% of it", output)
            if found:
                hidden.append(float(found.group(2)))
        overlap = f"{statistics.median(hidden):.0f}%" if hidden else "not reported"
        row = _report.compare(
            f"backfill: --over vs {args.checkpoints} x --resume (tiny GPT, subprocesses)",
            ours,
            theirs,
            unit="s",
            fmt="{:.1f} s",
            ratio="theirs/ours",
            meaning="theirs time / ours time; above 1: --over faster",
            goal=(">=", GOAL),
            note=(
                f"one `theseus run --over LINEAGE --force` over {args.checkpoints} checkpoints "
                f"against {args.checkpoints} `theseus run --resume NODE` processes, each a "
                "fresh Python + JAX + compile; byte-identical artifacts checked: "
                f"{same}; checkpoint reading hidden behind the analysis (median over "
                f"rounds): {overlap}"
            ),
        )
        ratio = statistics.median(row.ratios)
        print(
            f"--over {row.ours}, {args.checkpoints} x --resume {row.theirs}: {ratio:.1f}x "
            f"(goal >= {GOAL:g}, {'met' if row.met else 'NOT met'}); overlap {overlap}"
        )
        _report.write(args.json, "backfill", args.quick, [row])
        return _report.exit_status(
            [row], checks=[(same, "--over and --resume wrote different values")]
        )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
