"""Multiple choice and bits per byte in tandem with training, against lm-evaluation-harness.

Reference: the same rows, as task YAML over the same JSON Lines files, run by the harness
(`theseus eval`) on each checkpoint the validations wrote; `acc` and `acc_norm` equal,
bits per byte within 1e-5 relative.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

lm_eval = pytest.importorskip("lm_eval")

from theseus.analysis._eval_cli import evaluate_node  # noqa: E402
from theseus.analysis.evaluation import TASKS  # noqa: E402
from theseus.config import ConfigError  # noqa: E402
from theseus.data.datasets import Synthetic  # noqa: E402
from theseus.model import scoring  # noqa: E402
from theseus.quick import quick  # noqa: E402
from theseus.registry import import_module_or_file, job  # noqa: E402
from theseus.store import Store  # noqa: E402
from theseus.training import BitsPerByte, MultipleChoice  # noqa: E402

jobs = import_module_or_file(str(Path(__file__).with_name("analysis_jobs.py")))
tasks_module = import_module_or_file(str(TASKS / "synthetic.py"))


@job("test/gpt/evaluated")
class Evaluated(jobs.PretrainGPT):
    EVALUATION = [MultipleChoice, BitsPerByte]


def _files(root: Path) -> tuple[Path, Path]:
    """The synthetic language's questions and documents as JSON Lines, and task YAML over
    the same files for the harness."""
    language = Synthetic.language(root)
    choices, texts = root / "choices.jsonl", root / "texts.jsonl"
    rows = tasks_module.choice_rows(language, count=12)
    choices.write_text("".join(json.dumps(r) + "\n" for r in rows))
    texts.write_text(
        "".join(json.dumps(d) + "\n" for d in tasks_module.document_rows(language, count=3))
    )
    common = "dataset_path: json\ntest_split: test\nmetadata:\n  version: 1.0\n"
    (root / "same_mc.yaml").write_text(
        f"task: same_mc\n{common}dataset_kwargs:\n  data_files:\n    test: {choices}\n"
        "output_type: multiple_choice\ndoc_to_text: '{{query}}'\ndoc_to_choice: '{{choices}}'\n"
        "doc_to_target: '{{gold}}'\ntarget_delimiter: ''\n"
        "metric_list:\n  - metric: acc\n  - metric: acc_norm\n"
    )
    (root / "same_text.yaml").write_text(
        f"task: same_text\n{common}dataset_kwargs:\n  data_files:\n    test: {texts}\n"
        "output_type: loglikelihood_rolling\ndoc_to_text: ''\ndoc_to_target: '{{text}}'\n"
        "metric_list:\n  - metric: bits_per_byte\n"
    )
    return choices, texts


def test_tandem_evaluations_equal_the_harness_on_each_checkpoint(tmp_path: Path) -> None:
    Synthetic.prepare(tmp_path, tokens=40_000, val_tokens=6_000)
    choices, texts = _files(tmp_path)
    scoring._score.clear_cache()
    with quick(tmp_path) as q:
        q.build(Evaluated, "evaluated")
        jobs.tiny(q.config, steps=4, **{"training/analyze": False})
        q.config["evaluation/multiple_choice/file"] = str(choices)
        q.config["evaluation/multiple_choice/delimiter"] = ""
        q.config["evaluation/held_out/file"] = str(texts)
        q.create()()
    # the questions (up to 35 tokens, cut to the 33 the model reads) and the documents'
    # windows share the 32-token bucket: one program for every validation
    assert scoring._score._cache_size() == 1
    with Store(tmp_path / "store") as store:
        nodes = sorted({c.node for c in store.query().checkpoints()}, key=lambda n: n.seq)
        tandem = {n: store.values(n) for n in nodes}
    assert len(nodes) == 2
    for node in nodes:
        [harness] = evaluate_node(
            tmp_path, node.serialize(), ["same_mc", "same_text"], include_path=str(tmp_path)
        ).values()
        ours = tandem[node]
        assert ours["eval/multiple_choice/acc"] == harness["same_mc"]["eval/same_mc/acc"]
        assert ours["eval/multiple_choice/acc_norm"] == harness["same_mc"]["eval/same_mc/acc_norm"]
        assert ours["eval/held_out/bits_per_byte"] == pytest.approx(
            harness["same_text"]["eval/same_text/bits_per_byte"], rel=1e-5
        )
    assert (
        tandem[nodes[0]]["eval/held_out/bits_per_byte"]
        != tandem[nodes[1]]["eval/held_out/bits_per_byte"]
    )


def test_a_missing_or_malformed_file_is_one_line(tmp_path: Path) -> None:
    Synthetic.prepare(tmp_path, tokens=20_000, val_tokens=4_000)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"query": "ab", "choices": ["c"]}\n')
    for file, message in (("", "needs a file"), (str(tmp_path / "none.jsonl"), "no such file"),
                          (str(bad), "has no gold")):  # fmt: skip
        with quick(tmp_path) as q:
            q.build(Evaluated, "broken")
            jobs.tiny(q.config, steps=2, **{"training/analyze": False})
            q.config["evaluation/multiple_choice/file"] = file
            trainer = q.create()
            with pytest.raises(ConfigError, match=message) as info:
                MultipleChoice().evaluate(trainer)
            assert "\n" not in str(info.value)
