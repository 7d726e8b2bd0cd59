"""The SAE defaults on the demo's model (`theseus demo`'s settings and its 600 steps, a
checkpoint every 150): what a new user gets with no setting changed but `ARCHITECTURE`.

The references are the targets the settings state, not the code under test: jumprelu's
mean L0 on the held-out tokens against its target `K` (the thresholds start at it; the
training must not carry it away), relu's FVU at each node of a chain against the chain's
first node, and the held-out FVU of one SAE on disjoint sets of `EVAL_BATCHES` held-out
batches (draws of the held-out data) against each other.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from theseus.analysis._demo_cli import DEMO_SETTINGS
from theseus.analysis.sae import SAEBase
from theseus.data.datasets import Synthetic
from theseus.experiments.models.gpt import PretrainGPT
from theseus.model.models import Block
from theseus.quick import quick
from theseus.store import Store

pytestmark = pytest.mark.slow  # the demo trained, three chains: minutes

STEPS = 600  # a 40-step model (near its initialization) fails all three: see below


class Demo(SAEBase, PretrainGPT):
    """The demo's SAE (`theseus.analysis.demo.Features`) with the defaults otherwise."""

    TARGET = Block
    NAME = "defaults"
    EXPANSION = 8
    K = 8
    TOKENS = 1 << 16

    def select(self, paths: list[str]) -> list[str]:
        return paths


class JumpReLU(Demo):
    NAME = "jumprelu"
    ARCHITECTURE = "jumprelu"


class ReLU(Demo):
    NAME = "relu"
    ARCHITECTURE = "relu"


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("demo")
    Synthetic.prepare(root)  # the demo's language
    with quick(root) as q:
        q.build(PretrainGPT, "demo")
        for key, value in DEMO_SETTINGS.items():
            q.config[key] = value
        q.config["training/analyze"] = False
        q.config["training/tokens"] = STEPS * 16 * 64
        q.config["logging/checkpoint_interval"] = STEPS // 4
        q.config["logging/validation_interval"] = STEPS // 4
        q.create()()
    return root


def _chain(root: Path, cls: type) -> list[dict[str, dict[str, Any]]]:
    """`cls` over the demo's checkpoints: per node, each SAE's measures."""
    with quick(root) as q:
        q.build(cls, cls.NAME)
        q.find().spec(run="demo").over()
        result = q.create()()
    prefix = f"sae/{cls.NAME}/"
    out = []
    with Store(root / "store") as store:
        for node in result.nodes:
            values = store.values(node)
            labels = {
                k[len(prefix) : -len("/fvu")]
                for k in values
                if k.startswith(prefix) and k.endswith("/fvu")
            }
            out.append(
                {
                    label: {m: values[f"{prefix}{label}/{m}"] for m in ("l0", "fvu", "dead")}
                    for label in sorted(labels)
                }
            )
    assert len(out) == 4
    return out


def test_jumprelu_keeps_its_l0_near_the_target_k(root: Path) -> None:
    """Measured: L0 7.1 to 8.9 (K = 8) at d = 64, width 512; before, 195 to 240 (the
    thresholds started at 1e-3 and Adam moved their logarithm 1e-3 a step)."""
    for node in _chain(root, JumpReLU):
        for label, m in node.items():
            assert abs(m["l0"] - JumpReLU.K) <= 0.25 * JumpReLU.K, (label, m)


def test_relu_reconstructs_no_worse_along_the_chain(root: Path) -> None:
    """Measured: FVU 0.19, 0.20, 0.13, 0.08 (each node's SAE from the previous one's);
    before (L1 = 5.0), 0.55 rising to 0.82. Tolerance: 0.05 above the first node's, about
    twice the spread of the held-out FVU across draws (the next test)."""
    chain = _chain(root, ReLU)
    for label, first in chain[0].items():
        for node in chain[1:]:
            assert node[label]["fvu"] <= first["fvu"] + 0.05, (label, [n[label] for n in chain])
        assert 0 < first["fvu"] < 0.5


class Shifted(Demo):
    """The held-out measures read from `val` batch `OFFSET` on: another draw of the
    held-out data (the SAE trained is the same: the same seed and training batches)."""

    NAME = "shifted0"
    OFFSET = 0

    def _held_out(self) -> Any:
        every = self.accumulate_steps
        for index in range(self.settings().eval_batches):
            rows = self.read_batch(self.OFFSET + index, "val")
            yield self.sharding.place_batch({k: v[0::every] for k, v in rows.items()})


class Shifted1(Shifted):
    NAME = "shifted1"
    OFFSET = 16


class Shifted2(Shifted):
    NAME = "shifted2"
    OFFSET = 32


def test_the_held_out_fvu_varies_little_across_draws(root: Path) -> None:
    """One SAE (the last checkpoint's) measured on three disjoint sets of `EVAL_BATCHES`
    (16) held-out batches, 16,384 tokens each: (max - min) / mean below 0.1. (On a
    40-step model it was 0.17, and there jumprelu's L0 fell to 1.9 and relu's FVU was
    1.2: the defaults are checked on a trained model, as the demo's.)"""
    fvu: dict[str, list[float]] = {}
    for cls in (Shifted, Shifted1, Shifted2):
        with quick(root) as q:
            q.build(cls, cls.NAME)
            q.find().spec(run="demo").checkpoint().latest().resume()
            job = q.create()
        job()
        with Store(root / "store") as store:
            values = store.values(job.node)
        prefix = f"sae/{cls.NAME}/"
        for key, value in values.items():
            if key.startswith(prefix) and key.endswith("/fvu"):
                fvu.setdefault(key[len(prefix) :], []).append(value)
    assert len(fvu) == 2
    for label, draws in fvu.items():
        spread = (max(draws) - min(draws)) / np.mean(draws)
        assert len(draws) == 3 and spread < 0.1, (label, draws)
