"""`training/strategy`: dp, zero1 and fsdp train the same model, keep 1/N of what they split,
and restore each other's checkpoints on any device count.

The reference is `dp` on ONE device, trained in its own process
(`strategy_worker.py` with one virtual device); the strategies run here on the suite's
four virtual devices (and, marked slow, on eight in a process of their own). After 20
steps every parameter and optimizer-state leaf must be within 1e-5 of the reference's,
as |got - want| / |want| over the leaf (float32; the strategies reduce in other orders,
and Adam turns a gradient entry near zero into a step of about the learning rate
whatever its size, so single entries can differ by 1e-5 of the leaf's largest). Bytes are read from the arrays' own shards (`addressable_shards[0]`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest

from theseus.config import ConfigError
from theseus.data.datasets import Synthetic
from theseus.quick import quick
from theseus.registry import import_module_or_file

HERE = Path(__file__).resolve().parent
jobs = import_module_or_file(str(HERE / "trainer_jobs.py"))

STEPS = 20
RTOL = 1e-5
SETTINGS = {"logging/checkpoint_interval": 10, "logging/validation_interval": 10}


def _worker(
    root: Path, devices: int, *args: object, settings: dict[str, Any] | None = None
) -> dict[str, Any]:
    """`strategy_worker.py` in a process with `devices` virtual CPU devices; its npz."""
    out = root / f"worker-{'-'.join(map(str, args[:3]))}-{devices}.npz"
    env = dict(os.environ)
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    env["STRATEGY_WORKER_SETTINGS"] = json.dumps(settings or {})
    done = subprocess.run(
        [
            sys.executable,
            str(HERE / "strategy_worker.py"),
            str(root),
            *map(str, args[:4]),
            str(out),
            *map(str, args[4:]),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return dict(np.load(out))


def _state_leaves(state: Any) -> dict[str, np.ndarray]:
    found = {}
    for prefix, tree in (("params", state.params), ("opt", state.opt_state)):
        for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
            found[prefix + jax.tree_util.keystr(path)] = np.asarray(leaf)
    return found


def _assert_same_state(got: dict[str, np.ndarray], want: dict[str, Any]) -> None:
    names = {k for k in want if k.startswith(("params", "opt"))}
    have = {k for k in got if k.startswith(("params", "opt"))}
    assert have == names, (sorted(have - names), sorted(names - have))
    worst = {}
    for name in names:
        diff = np.linalg.norm((got[name] - want[name]).ravel())
        worst[name] = diff / max(float(np.linalg.norm(want[name].ravel())), 1e-30)
    name = max(worst, key=worst.__getitem__)
    assert worst[name] <= RTOL, f"{name}: relative error {worst[name]:.2e}"


def _kept(tree: Any) -> tuple[int, int]:
    leaves = jax.tree.leaves(tree)
    return (
        sum(leaf.addressable_shards[0].data.nbytes for leaf in leaves),
        sum(leaf.nbytes for leaf in leaves),
    )


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("strategies")
    Synthetic.prepare(root, tokens=60_000, val_tokens=8_000)
    return root


@pytest.fixture(scope="module")
def reference(root: Path) -> dict[str, Any]:
    """`dp` on one device, 20 steps (checkpoints at 10 and 20)."""
    ref = _worker(root, 1, "reference", "dp", 1, STEPS)
    assert int(ref["devices"]) == 1
    return ref


def _train(root: Path, run: str, steps: int = STEPS, **settings: Any) -> Any:
    with quick(root) as q:
        q.build(jobs.SyntheticTrainer, run)
        jobs.tiny(q.config, steps=steps, **SETTINGS, **settings)
        trainer = q.create()
        trainer()
    return trainer


@pytest.mark.parametrize(
    ("strategy", "shard", "params_share", "opt_share"),
    [
        pytest.param("dp", 1, 1.0, 1.0, marks=pytest.mark.slow),  # 4 devices vs 1: the base
        pytest.param("zero1", 1, 1.0, 0.25, marks=pytest.mark.slow),
        pytest.param("fsdp", 1, 0.25, 0.25, marks=pytest.mark.slow),
        ("fsdp", 2, 0.25, 0.25),  # a 2 x 2 mesh: tensor parallel x fully sharded
        pytest.param("dp", 2, None, None, marks=pytest.mark.slow),
    ],
)
def test_each_strategy_trains_dp_one_devices_model_and_keeps_its_share(
    root: Path,
    reference: dict[str, Any],
    strategy: str,
    shard: int,
    params_share: float | None,
    opt_share: float | None,
) -> None:
    assert jax.device_count() == 4
    trainer = _train(
        root, f"{strategy}-{shard}", **{"training/strategy": strategy, "training/shard": shard}
    )
    _assert_same_state(_state_leaves(trainer.state), reference)
    for tree, share in ((trainer.state.params, params_share), (trainer.state.opt_state, opt_share)):
        if share is None:
            continue
        kept, whole = _kept(tree)
        assert kept / whole == pytest.approx(share, rel=0.05), (kept, whole)


@pytest.mark.slow  # three processes with eight virtual devices: about 40 s
@pytest.mark.parametrize(("strategy", "shard"), [("zero1", 1), ("fsdp", 1), ("fsdp", 2)])
def test_on_eight_devices_too(
    root: Path, reference: dict[str, Any], strategy: str, shard: int
) -> None:
    got = _worker(root, 8, f"eight-{strategy}-{shard}", strategy, shard, STEPS)
    assert int(got["devices"]) == 8
    _assert_same_state(got, reference)
    if strategy == "fsdp":  # (with shard=2, 4 ways over batch x 2 over shard)
        assert got["kept_params"] / got["whole_params"] == pytest.approx(1 / 8, rel=0.05)
    else:
        assert got["kept_params"] == got["whole_params"]
    assert got["kept_opt"] / got["whole_opt"] == pytest.approx(1 / 8, rel=0.05)


@pytest.mark.slow  # two trainings and a restore across layouts: about 15 s
def test_a_tensor_parallel_checkpoint_restores_as_fsdp_and_trains_on(
    root: Path, reference: dict[str, Any]
) -> None:
    """`shard=2` x `dp=2` for 10 steps, then the lineage resumed with `fsdp` on 4."""
    first = _train(root, "tp-then-fsdp", steps=10, **{"training/shard": 2})
    saved = _state_leaves(first.state)
    with quick(root) as q:
        q.build(jobs.SyntheticTrainer, "tp-then-fsdp")
        q.find().spec(run="tp-then-fsdp").checkpoint().latest().resume()
        q.config["training/strategy"], q.config["training/shard"] = "fsdp", 1
        q.config["training/tokens"] = STEPS * 8 * 32
        resumed = q.create()
        assert resumed.sharding.strategy == "fsdp" and resumed.sharding.mesh.shape["shard"] == 1
        restored = _state_leaves(resumed.state)
        for name, value in saved.items():  # the restore itself is exact
            np.testing.assert_array_equal(restored[name], value, err_msg=name)
        assert _kept(resumed.state.params)[0] * 4 == _kept(resumed.state.params)[1]
        resumed()
    _assert_same_state(_state_leaves(resumed.state), reference)


@pytest.mark.slow  # two processes: about 20 s
def test_an_fsdp_checkpoint_restores_on_one_device_as_dp(
    root: Path, reference: dict[str, Any]
) -> None:
    first = _train(root, "fsdp-then-dp", steps=10, **{"training/strategy": "fsdp"})
    node = first.store.query().spec(run="fsdp-then-dp").checkpoint().latest().first()
    got = _worker(root, 1, "fsdp-then-dp", "dp", 1, STEPS, node.serialize())
    assert int(got["devices"]) == 1 and got["kept_params"] == got["whole_params"]
    _assert_same_state(got, reference)


def test_a_width_the_data_parallel_devices_cannot_split_is_a_config_error(root: Path) -> None:
    with quick(root) as q:
        q.build(jobs.SyntheticTrainer, "uneven")
        jobs.tiny(
            q.config,
            steps=2,
            **{"training/strategy": "fsdp", "architecture/n_embd": 30, "architecture/n_head": 3},
        )
        with pytest.raises(ConfigError) as caught:
            q.create()
    message = str(caught.value)
    assert "training/strategy = fsdp splits logical axis 'embed' (size 30" in message
    assert "over the 4 data-parallel devices" in message and "training/strategy = dp" in message
    assert "\n" not in message


def test_an_unknown_strategy_is_refused_when_the_configuration_is_read(root: Path) -> None:
    with quick(root) as q:
        q.build(jobs.SyntheticTrainer, "unknown")
        with pytest.raises(Exception, match="zero3") as caught:
            q.config["training/strategy"] = "zero3"
            q.create()
    assert "dp" in str(caught.value) and "fsdp" in str(caught.value)


# A Llama-like block: grouped-query heads (2 key/value heads for 4 query heads), RMSNorm,
# SwiGLU of its own width, an untied head.
LLAMA_LIKE = {
    "architecture/n_head": 4,
    "architecture/n_kv_head": 2,
    "architecture/norm": "rmsnorm",
    "architecture/activation": "silu",
    "architecture/gated_mlp": True,
    "architecture/mlp_width": 48,
    "architecture/tie_embeddings": False,
}


@pytest.mark.slow  # a process of its own and a training: about 15 s
def test_a_grouped_query_llama_like_block_trains_with_fsdp_and_shard_as_dp_on_one(
    root: Path,
) -> None:
    want = _worker(root, 1, "gqa-reference", "dp", 1, 5, settings=LLAMA_LIKE)
    assert int(want["devices"]) == 1
    trainer = _train(
        root,
        "gqa-fsdp-2",
        steps=5,
        **{**LLAMA_LIKE, "training/strategy": "fsdp", "training/shard": 2},
    )
    assert trainer.state.params["blocks_0"]["attn"]["c_attn"]["kernel"].shape == (32, 64)
    kept, whole = _kept(trainer.state.params)
    assert kept / whole == pytest.approx(0.25, rel=0.05), (kept, whole)
    _assert_same_state(_state_leaves(trainer.state), want)


def test_a_shard_count_that_cannot_split_the_key_value_heads_is_one_line(root: Path) -> None:
    with quick(root) as q:
        q.build(jobs.SyntheticTrainer, "gqa-uneven")
        jobs.tiny(q.config, steps=2, **{**LLAMA_LIKE, "architecture/n_kv_head": 1})
        q.config["training/shard"] = 4
        with pytest.raises(ConfigError) as caught:
            q.create()
    message = str(caught.value)
    assert "'training/shard' must split architecture/n_kv_head (1)" in message
    assert "got 4" in message and "\n" not in message
