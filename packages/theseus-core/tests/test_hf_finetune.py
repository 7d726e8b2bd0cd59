"""Fine-tuning an imported Hugging Face model: a branch trains on text in its tokens.

A random Llama-family folder with grouped-query heads and a tokenizer whose
post-processor adds Llama 3's start token, and an OLMo-2 folder (post-norms, QK-norm),
are imported with `import_hf`; a branch of each imported node trains on text prepared
with the model's own tokenizer (every prepared document starts with the start token
where the tokenizer adds one), the first step's loss is the loss of the imported
weights computed in float64 NumPy from the Hugging Face definition (`hf_folder.py`),
every parameter moves, and a resume of the tuned lineage trains on from where it stopped.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest

from theseus.data.datasets import TextFiles
from theseus.experiments.models.hf import HF, import_hf
from theseus.quick import quick
from theseus.registry import import_module_or_file
from theseus.store import Node, Store

H = import_module_or_file(str(Path(__file__).with_name("hf_folder.py")))
G = import_module_or_file(str(Path(__file__).with_name("gpt2_folder.py")))

BATCH, BLOCK = 4, 32


def _loss(folder: Path, x: np.ndarray, y: np.ndarray) -> float:
    """Mean cross-entropy of the folder's model on a batch, float64 from HF's definition."""
    losses = []
    for row_x, row_y in zip(x, y, strict=True):
        logits = H.hf_forward(folder, [int(t) for t in row_x])  # [seq, vocab]
        logits = logits - logits.max(-1, keepdims=True)
        logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
        losses += [-logp[i, t] for i, t in enumerate(row_y) if t >= 0]
    return float(np.mean(losses))


@pytest.mark.parametrize(
    ("family", "bos"),
    [("llama", True), pytest.param("olmo2", False, marks=pytest.mark.slow)],  # ~9 s each
)
def test_a_branch_of_an_imported_model_fine_tunes_and_resumes(
    tmp_path: Path, family: str, bos: bool
) -> None:
    folder = H.write_folder(family, tmp_path / family, bos=bos, num_key_value_heads=2)
    root = tmp_path / "root"
    import_hf(folder, root, family)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(24):  # documents of ~100 tokens; some held out for validation
        (corpus / f"{i}.txt").write_text(" ".join(G.CORPUS[i % 6 :]))
    with quick(root) as q:
        q.build(HF, "look")
        q.find().spec(run=family).checkpoint().latest().resume()
        job = q.create()
        name = job.tokenizer.name
        start = jax.tree.map(np.asarray, job.state.params)
        first_token = int(job.tokenizer.encode("a")[0])
    TextFiles.prepare(root, source=corpus, tokenizer=name)
    prepared = TextFiles.open(root, tokenizer=name)
    tokens, starts = prepared.tokens("train"), prepared.doc_starts("train")
    assert len(starts) >= 20
    if bos:  # every prepared document starts with the tokenizer's start token
        assert (tokens[starts] == first_token).all() and (tokens == first_token).sum() == len(
            starts
        )
    with quick(root) as q:
        q.build(HF, "tuned")
        q.find().spec(run=family).checkpoint().latest().branch()
        q.config.update({
            "architecture/block_size": BLOCK, "training/batch_size": BATCH,
            "training/tokens": 3 * BATCH * BLOCK,
            "logging/validation_interval": 3, "logging/report_interval": 1,
        })  # fmt: skip
        tuned = q.create()
        batch: dict[str, Any] = tuned.batch("train")
        x, y = np.asarray(batch["x"]), np.asarray(batch["y"])
        assert int(x.max()) < tuned.tokenizer.vocab_size
        tuned()
        assert int(tuned.state.step) == 3
        reference = _loss(folder, x, y)
        moved = jax.tree.map(
            lambda a, b: float(np.abs(np.asarray(a) - b).max()), tuned.state.params, start
        )
        assert min(jax.tree.leaves(moved)) > 0  # every parameter was trained
        assert np.isfinite(q.store.values(tuned.node)["val/loss"])
        tuned_node = tuned.node
    first = _first_loss(root, tuned_node)
    np.testing.assert_allclose(first, reference, rtol=1e-5)
    with quick(root) as q:  # resume the tuned lineage: it trains on from step 3
        q.build(HF, "tuned")
        q.find().spec(run="tuned").checkpoint().latest().resume()
        q.config["training/tokens"] = 5 * BATCH * BLOCK
        resumed = q.create()
        assert int(resumed.state.step) == 3
        resumed()
        assert int(resumed.state.step) == 5 and resumed.node.nonce == tuned_node.nonce


def _first_loss(root: Path, node: Node) -> float:
    """`train/loss` of the tuned lineage's first step (its node seq 0)."""
    with Store(root / "store") as store:
        return float(store.values(Node(node.name, node.nonce, 0))["train/loss"])
