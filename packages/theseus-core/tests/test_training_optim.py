"""AdamW and WSD against hand computations; their settings declared and checked once."""

from __future__ import annotations

import dataclasses
import re

import jax.numpy as jnp
import numpy as np
import optax
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from theseus.config import ConfigRangeError, parse_overrides
from theseus.experiments.models.gpt import PretrainGPT
from theseus.training.base import BaseTrainerConfig
from theseus.training.optimization import LearningRate
from theseus.training.optimizers import AdamW, AdamWConfig, Optimizer
from theseus.training.schedules import WSD, WSDConfig, constant


def _numpy_adamw_step(p, g, lr, cfg: AdamWConfig, decay: bool):
    norm = np.sqrt(sum(float((x**2).sum()) for x in g.values()))
    scale = min(1.0, cfg.clip_norm / norm) if cfg.clip_norm else 1.0
    out = {}
    for k in p:
        gk = g[k] * scale
        m = (1 - cfg.beta1) * gk
        v = (1 - cfg.beta2) * gk**2
        m_hat, v_hat = m / (1 - cfg.beta1), v / (1 - cfg.beta2)
        update = m_hat / (np.sqrt(v_hat) + cfg.eps)
        if decay and p[k].ndim >= 2:
            update = update + cfg.weight_decay * p[k]
        out[k] = p[k] - lr * update
    return out


@pytest.mark.parametrize("clip", [0.0, 0.5])
def test_adamw_first_step_matches_numpy(clip: float) -> None:
    rng = np.random.default_rng(0)
    params = {"w": rng.normal(size=(3, 4)), "b": rng.normal(size=(4,))}
    grads = {"w": rng.normal(size=(3, 4)), "b": rng.normal(size=(4,))}
    cfg = AdamWConfig(weight_decay=0.1, clip_norm=clip)
    tx = AdamW.build(cfg, 1e-2)
    jp = {k: jnp.asarray(v, jnp.float32) for k, v in params.items()}
    jg = {k: jnp.asarray(v, jnp.float32) for k, v in grads.items()}
    updates, _ = tx.update(jg, tx.init(jp), jp)
    got = optax.apply_updates(jp, updates)
    want = _numpy_adamw_step(params, grads, 1e-2, cfg, decay=True)
    for k in params:
        np.testing.assert_allclose(np.asarray(got[k]), want[k], rtol=1e-5, atol=1e-6)
    # biases (rank 1) are not decayed: with zero gradients only matrices move
    zero = {k: jnp.zeros_like(v) for k, v in jp.items()}
    moved, _ = tx.update(zero, tx.init(jp), jp)
    assert float(jnp.abs(moved["b"]).max()) == 0.0
    np.testing.assert_allclose(np.asarray(moved["w"]), -1e-2 * 0.1 * params["w"], rtol=1e-5)


def test_optimizer_checks_its_settings_by_their_declaration() -> None:
    with pytest.raises(TypeError, match="expects settings of type AdamWConfig"):
        AdamW.build(WSDConfig(), 1e-3)  # type: ignore[arg-type]
    # settings made in Python get the configuration's own message (the declared range)
    with pytest.raises(
        ConfigRangeError,
        match=r"^Configuration value for 'optimization/clip_norm' must be a "
        r"finite number >= 0; got -1.0\.",
    ):
        AdamW.build(AdamWConfig(clip_norm=-1.0), 1e-3)
    sgd = Optimizer("sgd", AdamWConfig, lambda cfg, lr: optax.sgd(lr))
    assert sgd.build(AdamWConfig(), 0.1) is not None


def test_wsd_phases_by_hand() -> None:
    cfg = WSDConfig(warmup=0.1, stable=0.6, decay=0.3, final_ratio=0.1)
    schedule = WSD.build(cfg, peak_lr=1.0, total_steps=100)
    lrs = np.asarray([float(schedule(step)) for step in range(100)])
    # update s = step + 1; warmup 10 updates, decay over the last 30
    np.testing.assert_allclose(lrs[:10], np.arange(1, 11) / 10, rtol=1e-6)
    np.testing.assert_allclose(lrs[10:70], 1.0)
    expected_decay = 1.0 + (0.1 - 1.0) * (np.arange(71, 101) - 70) / 30
    np.testing.assert_allclose(lrs[70:], expected_decay, rtol=1e-6)
    assert lrs[-1] == pytest.approx(0.1)
    assert float(constant(3e-4)(12345)) == pytest.approx(3e-4)


def test_wsd_fractions_must_sum_to_one() -> None:
    with pytest.raises(ConfigRangeError, match=r"must sum to 1 .* got 0.5 \+ 0.5 \+ 0.5 = 1.5\."):
        WSD.build(WSDConfig(warmup=0.5, stable=0.5, decay=0.5), 1.0, 10)
    with pytest.raises(ValueError, match="at least one step"):
        WSD.build(WSDConfig(), 1.0, 0)


def test_each_optimization_key_is_declared_once_in_one_module() -> None:
    """Every optimization/* key of the built-in trainer is declared once, in
    training/optimization.py, and the keys are the ones earlier versions wrote."""
    tree = PretrainGPT.schema()
    keys = [k for k in tree if k.startswith("optimization/")]
    assert sorted(keys) == sorted(
        ["optimization/lr"]
        + [f"optimization/{k}" for k in ("weight_decay", "beta1", "beta2", "eps", "clip_norm")]
        + [f"optimization/schedule/{k}" for k in ("warmup", "stable", "decay", "final_ratio")]
    )
    declared = [
        f.metadata["theseus.path"]
        for schema in (LearningRate, AdamWConfig, WSDConfig)
        for f in dataclasses.fields(schema)
    ]
    assert sorted(declared) == sorted(keys)  # each once, all in training/optimization.py
    assert {LearningRate.__module__, AdamWConfig.__module__, WSDConfig.__module__} == {
        "theseus.training.optimization"
    }
    assert "lr" not in vars(BaseTrainerConfig)["__annotations__"]  # inherited, not declared
    assert AdamW.config is AdamWConfig and WSD.config is WSDConfig


FRACTIONS = st.floats(0, 1, allow_nan=False).map(lambda x: round(x, 3))


@given(warmup=FRACTIONS, stable=FRACTIONS, decay=FRACTIONS)
@settings(max_examples=200, deadline=None)
def test_the_schedules_suggestion_is_a_setting_that_is_accepted(
    warmup: float, stable: float, decay: float
) -> None:
    """Whatever three fractions are refused, the message's `key=value` suggestion, applied
    as the command line would, gives phases that the configuration accepts (and that
    keep the warmup asked for)."""
    tree = PretrainGPT.schema()
    tree.update(
        {
            "optimization/schedule/warmup": warmup,
            "optimization/schedule/stable": stable,
            "optimization/schedule/decay": decay,
        }
    )
    try:
        tree.validate()
    except ConfigRangeError as refused:
        message = str(refused)
        assert abs(warmup + stable + decay - 1) > 1e-6
        suggested = re.findall(r"`([^`]*)`", message)[-1].split()
        tree.update(parse_overrides(suggested))
        tree.validate()
        assert tree["optimization/schedule/warmup"] == warmup
        total = sum(tree[f"optimization/schedule/{k}"] for k in ("warmup", "stable", "decay"))
        assert total == pytest.approx(1, abs=1e-6)
    else:
        assert abs(warmup + stable + decay - 1) <= 1e-6


def test_a_long_warmup_is_refused_with_a_suggestion_that_fits() -> None:
    """The issue's case: warmup 0.9 with the default decay of 0.2 cannot keep that decay;
    the suggestion that used to be offered (stable=0) summed to 1.1 and was refused again."""
    tree = PretrainGPT.schema()
    tree["optimization.schedule.warmup"] = 0.9
    with pytest.raises(ConfigRangeError) as refused:
        tree.validate()
    assert str(refused.value).endswith(
        "e.g. `optimization.schedule.stable=0 optimization.schedule.decay=0.1`."
    )
    tree.update(
        parse_overrides(["optimization.schedule.stable=0", "optimization.schedule.decay=0.1"])
    )
    tree.validate()
