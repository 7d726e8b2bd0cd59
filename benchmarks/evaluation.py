"""Tandem evaluations: the validation step with a multiple-choice evaluation vs without.

Run: ``uv run python benchmarks/evaluation.py [--rounds 30] [--questions 8]
[--validation-steps 16] [--quick] [--json PATH]`` (about a minute on 2 CPU cores).

The default ``PretrainGPT`` (4 layers, n_embd 128, block 128, batch 16) validates on
``--validation-steps`` batches (16 x 128 tokens each). ``plain`` is what the trainer
does at validation cadence without evaluations (``validate()``); ``+multiple choice`` is
the same with ``MultipleChoice`` (``--questions`` questions of the synthetic language's
task, four choices each, scored on the live parameters). Each round times both, in a
random order (seeded); the ratio is taken within the round. The evaluation's cost is
its rows' forward: the note gives the tokens it reads against the validation's, the
fraction that sets the ratio.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file or with -m
from benchmarks import _report
from theseus.analysis.evaluation import TASKS
from theseus.data.datasets import Synthetic
from theseus.experiments.models.gpt import PretrainGPT
from theseus.quick import quick
from theseus.registry import import_module_or_file
from theseus.training import MultipleChoice
from theseus.training.local_evaluations import _choice_pairs, _Plain, _stamp

GOAL = 1.05


class Evaluated(PretrainGPT):
    EVALUATION = [MultipleChoice]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--questions", type=int, default=8)
    p.add_argument("--validation-steps", type=int, default=16)
    _report.add_arguments(p)
    args = p.parse_args(argv)
    if args.quick:
        args.rounds = 4
    tasks = import_module_or_file(str(TASKS / "synthetic.py"))
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        Synthetic.prepare(root, tokens=200_000, val_tokens=100_000)
        questions = root / "choices.jsonl"
        rows = tasks.choice_rows(Synthetic.language(root), count=args.questions)
        questions.write_text("".join(json.dumps(r) + "\n" for r in rows))
        with quick(root) as q:
            q.build(Evaluated, "bench")
            q.config["training/tokens"] = 16 * 128
            q.config["training/validation_steps"] = args.validation_steps
            q.config["evaluation/multiple_choice/file"] = str(questions)
            q.config["evaluation/multiple_choice/delimiter"] = ""
            trainer = q.create()
            evaluation = MultipleChoice()
            trainer.validate()
            evaluation.evaluate(trainer)  # compiled once, before timing
            pairs = _choice_pairs(
                str(questions), _stamp(str(questions)), _Plain(trainer.tokenizer), "", 0
            )[0]
            read = sum(min(len(a) + len(b), 129) - 1 for a, b in pairs)
            validated = args.validation_steps * 16 * 128
            order = random.Random(0)
            plain: list[float] = []
            evaluated: list[float] = []
            for _ in range(args.rounds):
                for variant in order.sample(["plain", "evaluated"], 2):
                    began = time.perf_counter()
                    trainer.validate()
                    if variant == "evaluated":
                        evaluation.evaluate(trainer)
                    took = time.perf_counter() - began
                    (plain if variant == "plain" else evaluated).append(took)
    rows_out = [
        _report.compare(
            f"tandem multiple choice ({args.questions} questions x 4 choices) in the validation "
            f"step vs the plain validation step ({args.validation_steps} batches)",
            evaluated,
            plain,
            unit="s",
            fmt="{:.3f} s",
            ratio="ours/theirs",
            meaning="validation + evaluation time / validation time in the same round",
            goal=("<=", GOAL),
            note=(
                f"{args.rounds} rounds, random order; the evaluation reads {read:,} tokens "
                f"({len(pairs)} rows) against the validation's {validated:,} "
                f"({read / validated:.1%}); median plain {statistics.median(plain):.3f} s"
            ),
        )
    ]
    _report.write(args.json, "evaluation", args.quick, rows_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
