"""`theseus eval` on the accelerator: the harness's scores are the plain forward's.

`theseus eval --debug ROOT trained --tasks synthetic_ppl,synthetic_mc --limit 4` (a failure
shows its traceback) scores the
shared run's latest checkpoint (batched rows through `theseus.model.scoring`) under
`precise()`. References, as `test_eval_cli.py` computes them: bits per byte from the
trainer's plain forward on each rolling window alone (its logits' log-softmax in float64,
where the harness's is float32 on the platform), within `reference`; the multiple-choice
accuracy from the same forward's choice scores.
"""

from __future__ import annotations

import traceback
from pathlib import Path
from typing import Any

import _run
import pytest
from _tolerances import assert_close, precise

pytest.importorskip("lm_eval")

from click.testing import CliRunner

from theseus.analysis.evaluation import TheseusLM
from theseus.cli import main
from theseus.data.datasets import Synthetic
from theseus.registry import import_module_or_file
from theseus.store import Store

pytestmark = pytest.mark.accelerator

LIMIT = 4


def test_theseus_eval_scores_what_the_forward_scores(trained: tuple[Path, Any]) -> None:
    root, trainer = trained
    cli = import_module_or_file(str(_run.ANALYSIS_TESTS / "test_eval_cli.py"))
    command = ["eval", "--debug", str(root), _run.RUN, "--tasks", "synthetic_ppl,synthetic_mc"]
    with precise():
        done = CliRunner().invoke(main, [*command, "--limit", str(LIMIT)])
        assert done.exit_code == 0, "".join(traceback.format_exception(*done.exc_info))
        with Store(root / "store") as store:
            values = store.values(trainer.node)
        language = Synthetic.language(root)
        texts = [d["text"] for d in cli.tasks_module.document_rows(language)[:LIMIT]]
        bits = cli._bits_per_byte(trainer, texts)
        rows = cli.tasks_module.choice_rows(language)[:LIMIT]
        encode = TheseusLM(trainer=trainer).tok_encode
        accuracy = cli.helpers.reference_accuracy(trainer, encode, rows, delimiter="")
    assert_close(
        values["eval/synthetic_ppl/bits_per_byte"], bits, "reference", what="bits per byte"
    )
    assert values["eval/synthetic_mc/acc"] == accuracy
