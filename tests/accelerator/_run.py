"""The accelerator set's shared run: its settings, how it is trained and reopened.

Run `trained` of `PretrainGPT` on the synthetic language: grouped-query heads (4 query
heads, 2 key/value heads), 2 layers of width 64, context 32, batch 8, `STEPS` = 50 steps
at learning rate 3e-3 at the platform's default precision (as users train),
checkpointed at steps 20, 40 and 50. `conftest.py`'s `trained` fixture trains it once
for the session.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from theseus.data.datasets import Synthetic
from theseus.experiments.models.gpt import PretrainGPT
from theseus.quick import quick

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
CORE_TESTS = ROOT / "packages" / "theseus-core" / "tests"
ANALYSIS_TESTS = ROOT / "packages" / "theseus-analysis" / "tests"

STEPS = 50
CHECKPOINTS = [20, 40, 50]
RUN = "trained"
SETTINGS: dict[str, Any] = {
    "architecture/n_layers": 2,
    "architecture/n_embd": 64,
    "architecture/n_head": 4,
    "architecture/n_kv_head": 2,
    "architecture/block_size": 32,
    "training/batch_size": 8,
    "training/validation_steps": 1,
    "training/analyze": False,
    "logging/report_interval": 10,
    "logging/validation_interval": STEPS,
    "logging/checkpoint_interval": 20,
    "optimization/lr": 3e-3,
    "training/tokens": STEPS * 8 * 32,
}


def configure(config: Any, **extra: Any) -> Any:
    """Apply `SETTINGS` (and `extra`) to a composed configuration (`q.config`)."""
    for key, value in {**SETTINGS, **extra}.items():
        config[key] = value
    return config


def prepare(root: Path) -> Path:
    """The synthetic language's data under `root` (60,000 training tokens)."""
    Synthetic.prepare(root, tokens=60_000, val_tokens=8_000)
    return root


def train(root: Path, cls: type = PretrainGPT, run: str = RUN, **extra: Any) -> Any:
    """Train `run` of `cls` with `SETTINGS` under a prepared `root`; the trainer."""
    with quick(root) as q:
        q.build(cls, run)
        configure(q.config, **extra)
        trainer = q.create()
        trainer()
    return trainer


def open_at(root: Path, cls: type, name: str, seq: int | None = None, **config: Any) -> Any:
    """`cls` set up on run `trained`'s latest checkpoint (or the one at node `seq`)."""
    with quick(root) as q:
        q.build(cls, name)
        found = q.find().spec(run=RUN).checkpoint()
        (found.latest() if seq is None else found.seq(seq)).resume()
        for key, value in config.items():
            q.config[key] = value
        return q.create()
