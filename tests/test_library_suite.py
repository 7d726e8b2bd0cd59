"""Memorization over an imported training suite, whose data order the user supplies.

A suite's weights were trained elsewhere: without `library/memorization/order` the analysis says
in one line that it cannot replay them, and writes nothing. With the order (a prepared
dataset of the training sequences in order), a node at step `s` tests sequences of steps
`0 .. s - 1`, each read at `(step * rows + row) * length` of the order's token stream.

Reference: those offsets computed here from the stream written here; the verdicts against
greedy decoding with the key-value cache (`generate`), and each position against the
argmax of one uncached forward of the whole sequence in float64.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from theseus.analysis import AnalysisError
from theseus.analysis.library import Memorization
from theseus.data.prepared import dataset_dir, write_prepared
from theseus.experiments.models.suite import import_suite
from theseus.model.generation import generate
from theseus.quick import quick
from theseus.registry import import_module_or_file
from theseus.store import Store

pytestmark = [pytest.mark.tokenizers, pytest.mark.slow]  # ~10 s: an import and a walk

CORE = Path(__file__).parents[1] / "packages" / "theseus-core"
folders = import_module_or_file(str(CORE / "tests" / "gpt2_folder.py"))
suites = import_module_or_file(str(CORE / "tests" / "suite_folders.py"))

ROWS, LENGTH = 2, 20  # the order: 2 sequences a step, 20 tokens each (8 + 8 tested)
SETTINGS = {
    "library/memorization/order": "tiny-order",
    "library/memorization/order_rows": ROWS,
    "library/memorization/order_length": LENGTH,
    "library/memorization/prefix": 8,
    "library/memorization/continuation": 8,
    "library/memorization/sequences": 12,
    "library/memorization/batch": 12,
}


@pytest.fixture
def suite(tmp_path: Path) -> Path:
    """Three random GPT-2 revisions (steps 0, 1000, 2000) imported as `tiny`."""
    revisions = {
        name: folders.write_gpt2_folder(tmp_path / "src" / name, n_embd=16, n_head=2, seed=seed)
        for name, seed in (("step0", 0), ("step1000", 1), ("step2000", 2))
    }
    root = tmp_path / "root"
    import_suite(suites.hf_cache(tmp_path / "models--org--tiny", revisions), root, "tiny")
    return root


def _snapshot(root: Path) -> dict[str, object]:
    with Store(root / "store") as store:
        return {
            n.serialize(): (store.values(n), {k: a.version for k, a in store.get(n).items()})
            for n in store.query().all()
        }


def test_memorization_reads_a_suites_data_order_and_refuses_without_it(suite: Path) -> None:
    before = _snapshot(suite)
    with quick(suite) as q:
        q.build(Memorization, "memorized")
        q.find().spec(run="tiny").over()
        job = q.create()
        with pytest.raises(AnalysisError, match=r"library\.memorization\.order=DATASET") as caught:
            job()
    assert "\n" not in str(caught.value) and _snapshot(suite) == before

    with quick(suite) as q:
        q.build(Memorization, "memorized")
        nodes = q.find().spec(run="tiny").over()
        for key, value in SETTINGS.items():
            q.config[key] = value
        job = q.create()
        vocab = int(job.tokenizer.vocab_size)
        stream = np.random.default_rng(0).integers(0, vocab, size=2000 * ROWS * LENGTH)
        write_prepared(
            dataset_dir(suite, "tiny-order"),
            {"train": stream, "val": stream[:0]},
            tokenizer=job.tokenizer,
        )
        walk = job()
    assert [n.seq for n in nodes] == [0, 1000, 2000]
    first, *rest = walk.results
    assert first.values["step"].size == 0  # step 0: nothing trained on yet
    for result in rest:
        steps, rows = result.values["step"], result.values["row"]
        assert steps.size == 12 and (steps < result.node.seq).all()
        starts = (steps * ROWS + rows) * LENGTH
        expected = np.stack([stream[s : s + 16] for s in starts])
        np.testing.assert_array_equal(result.values["tokens"], expected)
    with Store(suite / "store") as store:
        values = store.values(nodes[2])
        document = json.loads(store.get(nodes[2])["memorization/sequences.json"].content)
    assert values["dynamics/memorization/first_step"] == 0
    assert values["dynamics/memorization/last_step"] == 1999
    assert len(document["sequences"]) == 12

    last = rest[-1].values  # the last revision's verdicts: greedy decoding, and each position
    tokens, top = last["tokens"], last["top"]
    decoded = np.asarray(
        generate(job.model, job.state.params, tokens[:, :8].tolist(), 8, temperature=0.0,
                 vocab=vocab, cache_slots=16)
    )  # fmt: skip
    same = decoded == tokens[:, 8:]
    np.testing.assert_array_equal(np.cumprod(top, axis=1), np.cumprod(same, axis=1))
    logits, _ = job.model.apply({"params": job.state.params}, tokens)
    best = np.asarray(logits, np.float64)[:, 7:-1, :vocab].argmax(axis=-1)
    np.testing.assert_array_equal(top, best == tokens[:, 8:])
