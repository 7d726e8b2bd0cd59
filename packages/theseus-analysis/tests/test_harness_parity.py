"""`theseus eval`'s model against lm-evaluation-harness's own `hf` model (torch session).

A small GPT-2 built and briefly trained with transformers (theseus-core's transformers
test builds it) is saved as a Hugging Face folder and imported; the same local tasks then
run through `lm_eval --model hf` on the folder and through `TheseusLM` on the imported
node. Per request: multiple-choice loglikelihoods within 1e-4 absolute, rolling
loglikelihoods within 1e-5 relative, the same `is_greedy`, the same generated text;
`acc`, `acc_norm` and `exact_match` identical.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")
lm_eval = pytest.importorskip("lm_eval")

from lm_eval.tasks import TaskManager  # noqa: E402

from theseus.analysis.evaluation import TheseusLM  # noqa: E402
from theseus.analysis.evaluation._harness import open_trainer_at  # noqa: E402
from theseus.experiments.models.gpt2 import import_gpt2  # noqa: E402
from theseus.registry import import_module_or_file  # noqa: E402

pytestmark = pytest.mark.torch

CORE_TESTS = Path(__file__).resolve().parents[2] / "theseus-core" / "tests"
ABSOLUTE, RELATIVE = 1e-4, 1e-5


def _tasks(folder: Path, text: str) -> list[str]:
    """A multiple-choice, a perplexity and a generation task over `text`'s lines."""
    lines = [line for line in text.splitlines() if line.strip()]
    choices = []
    for number, line in enumerate(lines):
        words = line.split()
        cut = max(2, len(words) // 2)
        gold = number % 3
        options = [" ".join(words[cut : cut + 3]), "the lazy dogs", "a river of water"]
        options[0], options[gold] = options[gold], options[0]
        choices.append({"query": " ".join(words[:cut]), "choices": options, "gold": gold})
    rows = {
        "choices": choices,
        "texts": [{"text": " ".join(lines[i : i + 3])} for i in range(0, len(lines), 3)],
        "prompts": [{"prompt": " ".join(line.split()[:4]), "answer": " " + line.split()[4]}
                    for line in lines],
    }  # fmt: skip
    for name, items in rows.items():
        (folder / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in items))
    head = "dataset_path: json\ntest_split: test\nmetadata:\n  version: 1.0\ndataset_kwargs:\n"
    files = "  data_files:\n    test: {}\n"
    (folder / "parity_mc.yaml").write_text(
        "task: parity_mc\n" + head + files.format(folder / "choices.jsonl")
        + "output_type: multiple_choice\ndoc_to_text: '{{query}}'\n"
        "doc_to_choice: '{{choices}}'\ndoc_to_target: '{{gold}}'\n"
        "metric_list:\n  - metric: acc\n  - metric: acc_norm\n"
    )  # fmt: skip
    (folder / "parity_ppl.yaml").write_text(
        "task: parity_ppl\n" + head + files.format(folder / "texts.jsonl")
        + "output_type: loglikelihood_rolling\ndoc_to_text: ''\ndoc_to_target: '{{text}}'\n"
        "metric_list:\n  - metric: word_perplexity\n  - metric: bits_per_byte\n"
    )  # fmt: skip
    (folder / "parity_gen.yaml").write_text(
        "task: parity_gen\n" + head + files.format(folder / "prompts.jsonl")
        + "output_type: generate_until\ndoc_to_text: '{{prompt}}'\ndoc_to_target: '{{answer}}'\n"
        "generation_kwargs:\n  until: ['\\n', '.']\n  max_gen_toks: 8\n  do_sample: false\n"
        "metric_list:\n  - metric: exact_match\n"
    )  # fmt: skip
    return ["parity_mc", "parity_ppl", "parity_gen"]


def test_theseus_and_the_harness_hf_model_agree_request_by_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    built = import_module_or_file(str(CORE_TESTS / "test_gpt2_transformers.py"))
    no_dropout = {"resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}
    folder, _, _ = built._folder(tmp_path, train=True, **no_dropout)
    root = tmp_path / "root"
    import_gpt2(folder, root, run="gpt2")
    tasks = _tasks(tmp_path, built.TEXT)
    manager = TaskManager(include_path=str(tmp_path), include_defaults=False)
    common = {"tasks": tasks, "task_manager": manager, "log_samples": True,
              "torch_random_seed": None, "bootstrap_iters": 0}  # fmt: skip
    theirs = lm_eval.simple_evaluate(
        model="hf", model_args=f"pretrained={folder},dtype=float32,device=cpu", batch_size=4,
        **common,
    )  # fmt: skip
    ours = lm_eval.simple_evaluate(
        model=TheseusLM(trainer=open_trainer_at(root, "gpt2"), batch_size=4), **common
    )
    for task in tasks:
        mine, reference = ours["samples"][task], theirs["samples"][task]
        assert len(mine) == len(reference) > 3
        for a, b in zip(mine, reference, strict=True):
            assert a["doc_id"] == b["doc_id"]
            for got, want in zip(a["resps"], b["resps"], strict=True):
                got, want = got[0], want[0]
                if task == "parity_mc":
                    assert abs(got[0] - want[0]) <= ABSOLUTE and got[1] == want[1], (a, b)
                elif task == "parity_ppl":
                    assert abs(got - want) <= RELATIVE * abs(want), (got, want)
                else:
                    assert got == want, (a["arguments"], got, want)
    for metric, task in (("acc,none", "parity_mc"), ("acc_norm,none", "parity_mc"),
                         ("exact_match,none", "parity_gen")):  # fmt: skip
        assert ours["results"][task][metric] == theirs["results"][task][metric], metric
    assert ours["results"]["parity_ppl"]["bits_per_byte,none"] == pytest.approx(
        theirs["results"]["parity_ppl"]["bits_per_byte,none"], rel=RELATIVE
    )
    # the generations say something: the trained model continues some prompts as taught
    assert any(s["resps"][0][0].strip() for s in ours["samples"]["parity_gen"])
