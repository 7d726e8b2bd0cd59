"""Training on the accelerator: 50 steps learn, and a run interrupted and resumed ends
bit for bit where the uninterrupted one did.

The uninterrupted run is the shared one (`_run.py`: checkpoints at steps 20, 40, 50).
The interrupted run has the same settings and stops as Ctrl-C would when it is about to
take step 31; resumed from its latest checkpoint (step 20) in the same process, it
trains to step 50. Reference: the uninterrupted run's parameters, optimizer state and
recorded losses, compared bit for bit (the same programs on the same inputs).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import _run
import jax
import numpy as np
import pytest

from theseus.experiments.models.gpt import PretrainGPT
from theseus.quick import quick
from theseus.store import Store

pytestmark = pytest.mark.accelerator

STOP = 30  # the node whose step is interrupted (steps 1..30 done, 20 saved)


class Interrupted(PretrainGPT):
    """Stops like a KeyboardInterrupt when it is about to take step `STOP + 1`."""

    def tick(self) -> Any:
        if self.node.seq == STOP:
            raise KeyboardInterrupt
        return super().tick()


def _losses(store: Store, nonce: str) -> dict[int, float]:
    """`train/loss` at every node of the lineage that recorded one: seq -> loss."""
    nodes = store.query().nonce(nonce).all()
    found = {n.seq: store.values(n).get("train/loss") for n in nodes}
    return {seq: loss for seq, loss in found.items() if loss is not None}


def test_fifty_steps_learn_and_checkpoint(trained: tuple[Path, Any]) -> None:
    root, trainer = trained
    assert int(trainer.state.step) == _run.STEPS
    with Store(root / "store") as store:
        losses = _losses(store, trainer.node.nonce)
        saved = sorted(c.step for c in store.query().nonce(trainer.node.nonce).checkpoints())
        validation = store.values(trainer.node)["val/loss"]
    assert saved == _run.CHECKPOINTS
    assert len(losses) >= 5 and all(math.isfinite(v) for v in losses.values())
    first, last = losses[min(losses)], losses[max(losses)]
    assert last < first - 0.5, losses  # from uniform over 258 bytes toward the language
    assert math.isfinite(validation) and validation < math.log(258) - 1.0, validation


def test_an_interrupted_run_resumes_bit_for_bit(trained: tuple[Path, Any]) -> None:
    root, straight = trained
    with quick(root) as q:
        q.build(Interrupted, "interrupted")
        _run.configure(q.config)
        first = q.create()
        with pytest.raises(KeyboardInterrupt):
            first()
    with Store(root / "store") as store:
        saved = [c.step for c in store.query().nonce(first.node.nonce).checkpoints()]
    assert saved == [20]
    with quick(root) as q:
        q.build(PretrainGPT, "interrupted")
        q.find().spec(run="interrupted").checkpoint().latest().resume()
        resumed = q.create()
        assert int(resumed.state.step) == 20
        resumed()

    assert int(resumed.state.step) == int(straight.state.step) == _run.STEPS
    assert resumed.node.seq == straight.node.seq
    for (path, a), b in zip(
        jax.tree_util.tree_flatten_with_path(resumed.state.params)[0],
        jax.tree.leaves(straight.state.params),
        strict=True,
    ):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), jax.tree_util.keystr(path))
    for a, b in zip(
        jax.tree.leaves(resumed.state.opt_state),
        jax.tree.leaves(straight.state.opt_state),
        strict=True,
    ):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    with Store(root / "store") as store:
        after = _losses(store, resumed.node.nonce)
        reference = _losses(store, straight.node.nonce)
    assert after == reference  # every loss the two runs recorded, bit for bit
