"""Analyses, interventions, the debugger, the recorder and generation under every strategy.

One checkpoint of a tiny GPT (trained with `dp`) is set up again with each
`training/strategy` (and `fsdp` on a 2 x 2 mesh with `training/shard=2`) on the suite's
four virtual devices; what each tool returns must equal what it returns under `dp`
(float32, rtol 1e-5; greedy tokens exactly).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest

from theseus.analysis.inspector import read_from_safetensors, tail
from theseus.data.datasets import Synthetic
from theseus.experiments.models.gpt import PretrainGPT
from theseus.quick import quick
from theseus.registry import import_module_or_file

HERE = Path(__file__).resolve().parent
jobs = import_module_or_file(str(HERE / "analysis_jobs.py"))
ivjobs = import_module_or_file(str(HERE / "intervention_jobs.py"))


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("strategies")
    Synthetic.prepare(root, tokens=40_000, val_tokens=6_000)
    with quick(root) as q:
        q.build(PretrainGPT, "trained")
        jobs.tiny(q.config, steps=4)
        q.create()()
    return root


def _on(root: Path, cls: type, strategy: str, shard: int) -> Any:
    with quick(root) as q:
        q.build(cls, f"{cls.__name__.lower()}-{strategy}-{shard}")
        q.find().spec(run="trained").checkpoint().latest().resume()
        q.config["training/strategy"], q.config["training/shard"] = strategy, shard
        job = q.create()
    assert job.sharding.strategy == strategy
    return job


def _results(root: Path, strategy: str, shard: int, tmp: Path) -> dict[str, Any]:
    stats = _on(root, jobs.Stats, strategy, shard)
    if strategy == "fsdp":  # the parameters really are split over the data-parallel devices
        kernel = stats.state.params["blocks_0"]["attn"]["c_attn"]["kernel"]
        assert kernel.addressable_shards[0].data.size * 4 == kernel.size
    found = {f"stats/{k}": v for k, v in stats.compute().items()}
    sweep = _on(root, ivjobs.HeadAblationTokens, strategy, shard)
    found["sweep"] = sweep.compute()
    with stats.debug("blocks_1/attn") as (layer, inputs):
        found["debug"] = np.asarray(layer(inputs.x))
    found["tokens"] = np.asarray(stats.generate([[1, 2, 3, 4], [5, 6, 7, 8]], 8, temperature=0))
    folder = tmp / f"recording-{strategy}-{shard}"
    batch = stats.inspection_batch()
    with tail(stats.model, folder, filter_=lambda path, m: path == "blocks_0.mlp") as fm:
        jax.jit(fm.apply)({"params": stats.state.params}, batch["x"])
    found.update({f"recorded/{k}": v for k, v in read_from_safetensors(folder).items()})
    return found


@pytest.mark.slow  # each layout: two jobs, generation and a recording compiled (~10 s)
@pytest.mark.parametrize("layout", [("fsdp", 2), ("fsdp", 1), ("zero1", 1)])
def test_every_tool_gives_the_same_results_under_every_strategy(
    root: Path, tmp_path: Path, layout: tuple[str, int]
) -> None:
    results = {where: _results(root, *where, tmp_path) for where in (("dp", 1), layout)}
    want = results[("dp", 1)]
    assert "recorded/blocks_0.mlp.__call__" in want and want["sweep"].shape == (2, 2, 8, 32)
    for layout, got in results.items():
        assert sorted(got) == sorted(want), layout
        for name, value in want.items():
            if name == "tokens":
                np.testing.assert_array_equal(got[name], value, err_msg=f"{layout} {name}")
            else:
                np.testing.assert_allclose(
                    got[name], value, rtol=1e-5, atol=1e-6, err_msg=f"{layout} {name}"
                )
