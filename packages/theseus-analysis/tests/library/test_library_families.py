"""The library's analyses on every family, over an imported training suite.

Each family (GPT-2; GPT-NeoX: parallel residual, partial rotary, untied; Llama:
RMSNorm, SwiGLU, grouped-query heads) is written as two random revisions with the
tests' Hugging Face folder writers (no torch), imported as one lineage
(`import_suite`), given text prepared with the imported tokenizer, and walked by
`FirstAnalyses` (all five analyses, `library/dataset=text`). References on the last
revision: the logit lens against `library_reference` (float64 NumPy of the residuals
Flax records, through the family's own final norm and unembedding weights), 1e-5; the
induction and previous-token scores against each head's attention written in float64
NumPy from the family's definition over the revision's own tensors (GPT-2:
`gpt2_folder.reference_forward`, GPT-NeoX: `suite_folders.neox_attention`), 1e-5.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from theseus.analysis.library import FirstAnalyses
from theseus.data.datasets import TextFiles
from theseus.experiments.models.suite import import_suite
from theseus.quick import quick
from theseus.registry import import_module_or_file

pytestmark = [pytest.mark.tokenizers, pytest.mark.slow]  # ~10 s a family

CORE = Path(__file__).parents[3] / "theseus-core" / "tests"
if not (CORE / "gpt2_folder.py").is_file():  # nox -s isolated: core's tests are not beside
    pytest.skip("needs theseus-core's test helpers (the workspace)", allow_module_level=True)
gpt2 = import_module_or_file(str(CORE / "gpt2_folder.py"))
hf = import_module_or_file(str(CORE / "hf_folder.py"))
suites = import_module_or_file(str(CORE / "suite_folders.py"))
ref = import_module_or_file(str(Path(__file__).with_name("library_reference.py")))

WORDS = [
    "the",
    "model",
    "reads",
    "tokens",
    "and",
    "predicts",
    "the",
    "next",
    "one",
    "while",
    "a",
    "fox",
    "jumps",
    "over",
    "a",
    "lazy",
    "dog",
    "near",
    "the",
    "river",
    "bank",
    "where",
    "seven",
    "quiet",
    "herons",
    "wait",
    "for",
    "the",
    "morning",
    "light",
]


def write_revision(family: str, folder: Path, seed: int) -> Path:
    if family == "gpt2":
        return gpt2.write_gpt2_folder(folder, n_layer=2, n_embd=32, n_head=4, seed=seed)
    return hf.write_folder(family, folder, seed=seed)


def write_documents(folder: Path, count: int = 60) -> Path:
    """`count` text files of shuffled words (every 20th is held out for validation)."""
    folder.mkdir()
    rng = np.random.default_rng(0)
    for i in range(count):
        words = rng.choice(WORDS, size=160)
        (folder / f"doc{i:03d}.txt").write_text(" ".join(words) + ".")
    return folder


def attention(family: str, folder: Path, ids: list[int]) -> list[np.ndarray]:
    """Each layer's `[heads, query, key]` probabilities of the family, in NumPy."""
    if family == "gpt2":
        return gpt2.reference_forward(folder, ids)[1]
    return suites.neox_attention(folder, ids)


@pytest.mark.parametrize("family", ["gpt2", "gpt_neox", "llama"])
def test_every_family_over_an_imported_suite(family: str, tmp_path: Path) -> None:
    revisions = {
        name: write_revision(family, tmp_path / "src" / name, seed)
        for name, seed in (("step0", 0), ("step1000", 1))
    }
    root = tmp_path / "root"
    import_suite(tmp_path / "src", root, "tiny")
    (tokenizer,) = (p.name for p in (root / "tokenizers").iterdir())
    TextFiles.prepare(root, source=str(write_documents(tmp_path / "docs")), tokenizer=tokenizer)
    with quick(root) as q:
        q.build(FirstAnalyses, "first")
        settings: dict[str, Any] = {
            "library/dataset": "text",
            "library/batches": 2,
            "library/induction/length": 12,
            "library/induction/rows": 4,
            "library/icl/early": 4,
            "library/icl/late": 60,
        }
        for key, value in settings.items():
            q.config[key] = value
        nodes = q.find().spec(run="tiny").over()
        job = q.create()
        result = job()
    assert [n.seq for n in nodes] == [0, 1000] and job.traces == 1
    last = result.results[-1].values
    for name in ("induction", "icl", "logit-lens", "loss-by-position", "loss-by-frequency"):
        assert name in last
    batches = job.validation_batches()
    ran = ref.forwards(job.state, batches)
    lens = ref.lens(job.state, job.configuration, batches, ran)
    np.testing.assert_allclose(last["logit-lens"]["loss"], lens["loss"], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(last["logit-lens"]["kl"], lens["kl"], atol=1e-5)
    assert last["logit-lens"]["loss"][-1] == pytest.approx(lens["final_loss"], abs=1e-5)
    total, count = ref.position_sums(batches, ran)
    np.testing.assert_allclose(last["loss-by-position"]["loss"], total / count, rtol=1e-5)
    if family == "llama":
        return  # no NumPy attention of Llama in the tests' helpers; its lens is checked above
    rows = np.asarray(job.repeated_batch()["x"])
    patterns = [attention(family, revisions["step1000"], row.tolist()) for row in rows]
    n = rows.shape[1] // 2
    later, after = np.arange(n, 2 * n), np.arange(1, 2 * n)
    for layer in range(len(patterns[0])):
        w = np.stack([p[layer] for p in patterns])  # [rows, heads, query, key]
        induction = w[:, :, later, later - n + 1].mean(axis=(0, 2))
        previous = w[:, :, after, after - 1].mean(axis=(0, 2))
        np.testing.assert_allclose(last["induction"]["induction"][layer], induction, atol=1e-5)
        np.testing.assert_allclose(last["induction"]["previous_token"][layer], previous, atol=1e-5)
