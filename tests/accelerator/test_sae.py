"""An SAE chain on the accelerator: `SAEBase` over the shared run's three checkpoints.

A top-k SAE of width 64 on the last MLP's output walks the checkpoints at steps 20, 40
and 50 (`q.find().spec(run=...).over()`), each warm-started from the one before. At
every node it records its measures (`sae/features/<site>/<width>/...`) and features.json;
the spliced reconstruction recovers most of the loss that zeroing the site loses, and
after the third node its FVU is below 1. Reference for the clean loss at the last node:
the trainer's model applied eagerly to the same validation batches under `precise()`,
within `recompiled`.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import _run
import jax
import numpy as np
import pytest
from _tolerances import assert_close, precise

from theseus.analysis.sae import SAEBase
from theseus.experiments.models.gpt import PretrainGPT
from theseus.model.mlp import MLP
from theseus.quick import quick
from theseus.store import Store

pytestmark = [pytest.mark.accelerator, pytest.mark.safetensors]

LABEL = "blocks_1/mlp/64"


class Features(SAEBase, PretrainGPT):
    TARGET = MLP
    NAME = "features"
    WIDTH = 64
    K = 4
    TOKENS = 2048
    BUFFER = 4
    EVAL_BATCHES = 2
    CONTEXTS = 3
    WINDOW = (4, 2)

    def select(self, paths: list[str]) -> str:
        return paths[-1]


def test_a_chain_over_three_checkpoints_records_its_measures(trained: tuple[Path, Any]) -> None:
    root, trainer = trained
    with precise(), quick(root) as q:
        q.build(Features, "chain")
        q.find().spec(run=_run.RUN).over()
        job = q.create()
        result = job()
    nodes = result.nodes
    assert [n.seq + 1 for n in nodes] == _run.CHECKPOINTS
    prefix = f"sae/features/{LABEL}/"
    with Store(root / "store") as store:
        measures = [
            {k[len(prefix) :]: v for k, v in store.values(n).items() if k.startswith(prefix)}
            for n in nodes
        ]
        documents = [
            json.loads(store.get(n)[f"features/{LABEL}/features.json"].content) for n in nodes
        ]
    for i, (got, doc) in enumerate(zip(measures, documents, strict=True)):
        assert got["tokens"] == Features.TOKENS
        for key in ("fvu", "l0", "loss_clean", "loss_zeroed", "loss_spliced", "train_mse"):
            assert math.isfinite(got[key]), (i, key, got[key])
        assert got["fvu"] > 0 and 0 < got["l0"] <= Features.K, got
        # the reconstruction spliced in recovers most of what zeroing the site loses (an
        # SAE of 2,048 tokens a node can still explain about none of the variance just
        # after the activations moved: FVU 1.008 at the middle node on a CPU)
        assert got["loss_clean"] <= got["loss_spliced"] < got["loss_zeroed"], got
        recovered = (got["loss_zeroed"] - got["loss_spliced"]) / (
            got["loss_zeroed"] - got["loss_clean"]
        )
        assert recovered > 0.5, (i, recovered)
        assert doc["width"] == 64 and len(doc["features"]) == 64
        if i == 0:
            assert got["matched"] is None and doc["previous"] is None
        else:
            assert 0 <= got["matched"] <= 1 and doc["previous"] == nodes[i - 1].serialize()

    with precise():
        losses = []
        for index in range(Features.EVAL_BATCHES):
            batch = jax.device_get(trainer.read_batch(index, "val"))
            _, loss = trainer.model.apply(
                {"params": trainer.state.params},
                batch["x"],
                batch["y"],
                batch["padding_mask"],
                deterministic=True,
            )
            losses.append(float(loss))
    assert_close(measures[-1]["loss_clean"], np.mean(losses), "recompiled", what="loss_clean")
    assert measures[-1]["fvu"] < 1, measures[-1]  # after three nodes of training
