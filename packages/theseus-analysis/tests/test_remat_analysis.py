"""Analyses, interventions, the debugger and the recorder on a GPT with `training/remat = block`.

Each blocks' call runs under `nn.remat` (`jax.checkpoint`); the sites selected here
(`blocks_i/attn`, `blocks_i` itself) are inside it, and interventions replace their
outputs inside the transform. The reference is the same checkpoint analyzed with
`training/remat = none` (the checkpoint was trained without remat: it restores under
both). Rematerialization runs the block's own float32 operations, so results agree
within 1e-6 relative (a few ulps of float32 from how XLA fuses the copy; measured: 0);
an intervention's change is checked to be ten times larger than that, so a sweep
that did nothing fails.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest

from theseus.analysis import inspector
from theseus.data.datasets import Synthetic
from theseus.experiments.models.gpt import PretrainGPT
from theseus.model.attention.base import SelfAttention
from theseus.quick import quick
from theseus.registry import import_module_or_file

HERE = Path(__file__).resolve().parent
jobs = import_module_or_file(str(HERE / "analysis_jobs.py"))
ivjobs = import_module_or_file(str(HERE / "intervention_jobs.py"))

RTOL = 1e-6
REMAT = {"training/remat": "block"}


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny GPT (2 blocks) trained 4 steps without remat (run `trained`)."""
    root = tmp_path_factory.mktemp("remat")
    Synthetic.prepare(root, tokens=40_000, val_tokens=6_000)
    with quick(root) as q:
        q.build(PretrainGPT, "trained")
        jobs.tiny(q.config, steps=4, **{"optimization/lr": 3e-3})
        q.create()()
    return root


def _on(root: Path, cls: type, **settings: Any) -> Any:
    """`cls` set up on the latest checkpoint of `trained` (a trainer: resuming it, unrun)."""
    with quick(root) as q:
        q.build(cls, f"{cls.NAME}-run" if hasattr(cls, "NAME") else "trained")
        q.find().spec(run="trained").checkpoint().latest().resume()
        for key, value in settings.items():
            q.config[key] = value
        return q.create()


def _both(root: Path, cls: type) -> tuple[Any, Any, Any]:
    """`(remat=none's values, remat=block's values, the remat=block job)`."""
    want = _on(root, cls)().values
    job = _on(root, cls, **REMAT)
    assert job.model.config.remat == "block"
    return want, job().values, job


def _same(got: Any, want: Any) -> None:
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        a, b = np.asarray(a), np.asarray(b)
        np.testing.assert_allclose(a, b, rtol=RTOL, atol=RTOL * float(np.max(np.abs(b))))


def _remat_eqns(job: Any) -> int:
    """How many `remat` equations the job's compiled analysis has (its sites inside them)."""
    batch = job.inspection_batch()
    jaxpr = job._compiled_analysis().trace(job.state, batch, None).jaxpr
    return str(jaxpr).count("remat")


def test_a_head_ablation_sweep_inside_remat_blocks_equals_remat_none(root: Path) -> None:
    want, got, job = _both(root, ivjobs.HeadAblationTokens)
    assert job.traces == 1
    _same(got, want)
    assert np.abs(np.asarray(want)).max() > 10 * RTOL  # the heads' ablations changed losses
    assert _remat_eqns(job) > 0


@pytest.mark.slow  # a forward and a backward through the remat'd blocks: about 15 s
def test_attribution_patching_through_remat_blocks_equals_remat_none(root: Path) -> None:
    want, got, job = _both(root, ivjobs.AttributeHeads)
    _same(got, want)
    assert np.abs(np.asarray(want["change"])).max() > 1e-4
    assert _remat_eqns(job) > 0


@pytest.mark.slow  # two sweeps with a source batch: about 10 s
def test_patching_a_whole_remat_block_equals_remat_none(root: Path) -> None:
    want, got, _ = _both(root, ivjobs.PatchLastBlock)  # the site is the block itself
    _same(got, want)
    np.testing.assert_array_equal(got["intervened"], got["source"])


@pytest.mark.slow  # two analyses, two debug sessions, two recordings: about 10 s
def test_observation_debugger_and_recorder_equal_remat_none(root: Path, tmp_path: Path) -> None:
    want, got, _ = _both(root, jobs.Stats)
    _same(got, want)

    plain, remat = _on(root, PretrainGPT), _on(root, PretrainGPT, **REMAT)
    assert (
        remat.find(SelfAttention)
        == plain.find(SelfAttention)
        == [
            "blocks_0/attn",
            "blocks_1/attn",
        ]
    )
    with plain.debug("blocks_1/attn") as (layer, inputs):
        want_out = np.asarray(layer(inputs.x))
    with remat.debug("blocks_1/attn") as (layer, inputs):
        got_out = np.asarray(layer(inputs.x))
    _same(got_out, want_out)

    recorded = {}
    for name, job in (("none", plain), ("block", remat)):  # on one device, from host copies
        x, params = jax.device_get((job.inspection_batch()["x"], job.state.params))
        with inspector.tail(job.model, tmp_path / name) as fm:
            jax.jit(lambda v, x: fm.apply(v, x))({"params": params}, x)
        recorded[name] = inspector.read_from_safetensors(tmp_path / name)
    assert sorted(recorded["block"]) == sorted(recorded["none"])
    assert "blocks_1.attn.__call__" in recorded["block"]
    _same(recorded["block"], {k: recorded["none"][k] for k in recorded["block"]})
