"""The library tests' data and jobs: a dataset with a few planted sequences, and the
trainer and analyses that read it (loaded with `import_module_or_file`, as `--import` would).

`plant(root)` writes the dataset under the name `synthetic` (the byte tokenizer's ids):
its training documents are `PLANTED` sequences, each `COPIES` times, among `UNIQUE`
random sequences that appear once, every document `LENGTH` tokens and an end-of-text,
shuffled; its validation documents are more random ones. `Planted` trains on one
document per row (`padded`), so each row of a batch is one document from its start: the
planted ones come back often enough for a small GPT to learn them by heart.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from theseus.analysis.library.drift import DriftBase
from theseus.analysis.library.memorization import MemorizationBase
from theseus.data.datasets import Synthetic
from theseus.data.prepared import dataset_dir, write_prepared
from theseus.data.tokenizer import ByteTokenizer
from theseus.experiments.models.gpt import PretrainGPT
from theseus.training.flywheel.strategy import Sampling

LENGTH = 64  # tokens of a document before its end-of-text: one row of block_size 64
PLANTED = 4
COPIES = 300
UNIQUE = 1500
VALIDATION = 64

SETTINGS = {
    "architecture/n_layers": 2,
    "architecture/n_embd": 64,
    "architecture/n_head": 2,
    "architecture/block_size": LENGTH,
    "training/batch_size": 8,
    "training/validation_steps": 1,
    "optimization/lr": 1e-2,
    "logging/report_interval": 50,
}


def documents(seed: int = 0) -> dict[str, np.ndarray]:
    """`train`: every training document in file order `[docs, LENGTH]`; `planted`:
    whether each is a planted one; `val`: the validation documents."""
    rng = np.random.default_rng(seed)
    planted = rng.integers(0, 200, size=(PLANTED, LENGTH))
    unique = rng.integers(0, 200, size=(UNIQUE, LENGTH))
    docs = np.concatenate([np.repeat(planted, COPIES, axis=0), unique])
    marks = np.concatenate([np.ones(PLANTED * COPIES, bool), np.zeros(UNIQUE, bool)])
    order = rng.permutation(docs.shape[0])
    return {
        "train": docs[order],
        "planted": marks[order],
        "val": rng.integers(0, 200, size=(VALIDATION, LENGTH)),
    }


def plant(root: Path, seed: int = 0) -> dict[str, np.ndarray]:
    """Write the planted dataset as `synthetic` under `root`; returns `documents(seed)`."""
    tokenizer = ByteTokenizer()
    docs = documents(seed)

    def stream(rows: np.ndarray) -> np.ndarray:
        ends = np.full((rows.shape[0], 1), tokenizer.eot)
        return np.concatenate([rows, ends], axis=1).ravel()

    splits = {"train": stream(docs["train"]), "val": stream(docs["val"])}
    write_prepared(dataset_dir(root, Synthetic.NAME), splits, tokenizer=tokenizer)
    return docs


def steps_config(config, steps: int, **extra):  # type: ignore[no-untyped-def]
    """The small settings, `steps` updates long, and `extra`."""
    for key, value in {**SETTINGS, **extra}.items():
        config[key] = value
    config["training/tokens"] = steps * config["training/batch_size"] * LENGTH
    return config


class Planted(PretrainGPT):
    """Trains on the planted dataset, one document per row."""

    DATASET = Sampling(Synthetic, 1.0, "padded")


class PlantedDrift(DriftBase, Planted):
    """Representation drift over the planted lineage."""


class PlantedMemorization(MemorizationBase, Planted):
    """Memorization over the planted lineage."""


class Custom(PretrainGPT):
    """A trainer that makes its own batches (`DATASET = []`): there is no plan to replay."""

    DATASET = []  # type: ignore[assignment]

    def batch(self, slice: str = "train") -> dict[str, np.ndarray]:
        x = np.arange(8 * self.block_size, dtype=np.int32).reshape(8, -1) % 200
        return {"x": x, "y": x, "padding_mask": np.ones_like(x, bool)}


class CustomMemorization(MemorizationBase, Custom):
    """Memorization on a trainer whose batches cannot be replayed."""
