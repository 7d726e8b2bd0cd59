"""Write `data/checkpoint-0.1.0-f16d084/`: a run trained and checkpointed by an earlier version.

Run it with that version's sources first on the path (the folder holds what it wrote; the
test `test_old_checkpoint.py` restores it with today's code)::

    git worktree add --detach /tmp/old f16d084
    PYTHONPATH=$(ls -d /tmp/old/packages/*/src | paste -sd:) uv run python \\
        packages/theseus-core/tests/make_old_checkpoint.py packages/theseus-core/tests/data

It trains a 2-layer GQA GPT (rotary, 4 heads over 2 key/value heads) for 6 steps on the
synthetic language, saves the checkpoint at step 6, and writes the logits of the first 2
validation rows (`logits.npy`, float32) and those rows (`x.npy`).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np

from theseus.data.datasets import Synthetic
from theseus.experiments.models.gpt import PretrainGPT
from theseus.quick import quick


def main(out: Path) -> None:
    import theseus.model.models as models

    target = out / "checkpoint-0.1.0-f16d084"
    shutil.rmtree(target, ignore_errors=True)
    root = target / "root"
    Synthetic.prepare(str(root), tokens=40_000, val_tokens=4_096)
    with quick(root) as q:
        q.build(PretrainGPT, "old")
        for key, value in {
            "architecture/n_layers": 2, "architecture/n_embd": 32, "architecture/n_head": 4,
            "architecture/n_kv_head": 2, "architecture/block_size": 32,
            "training/batch_size": 4, "training/tokens": 6 * 4 * 32,
            "logging/checkpoint_interval": 6, "logging/validation_interval": 6,
        }.items():  # fmt: skip
            q.config[key] = value
        trainer = q.create()
        trainer()
        x = np.asarray(trainer.batch("val")["x"])[:2]
        logits, _ = trainer.model.apply({"params": trainer.state.params}, x)
    np.save(target / "x.npy", x)
    np.save(target / "logits.npy", np.asarray(logits, np.float32))
    (target / "written-by.txt").write_text(f"{models.__file__}\n")
    print(target)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
