"""The time-travel debugger: `trainer.find(Type)` and `trainer.debug(path)`.

References are computed independently with Flax's own `capture_intermediates`
(every module's output), so the debugger's captured inputs and bound layers are
checked against numbers it did not produce. Tolerances: float32 on CPU, 1e-6.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from theseus.data.datasets import Synthetic
from theseus.job import JobError, JobSpec
from theseus.model import debug
from theseus.model.attention.base import SelfAttention
from theseus.model.debug import (
    DebugClosedError,
    DebugInputs,
    DebugLayer,
    UnknownPathError,
)
from theseus.model.models import GPT, MLP, Block
from theseus.quick import quick
from theseus.registry import import_module_or_file

jobs = import_module_or_file(str(Path(__file__).with_name("trainer_jobs.py")))

RTOL = 1e-6


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("debug")
    Synthetic.prepare(root, tokens=40_000, val_tokens=6_000)
    return root


def _trainer(root: Path, run: str, **extra: object):
    """A set-up trainer at its first node (initialized weights; nothing is trained)."""
    with quick(root) as q:
        q.build(jobs.SyntheticTrainer, run)
        jobs.tiny(q.config, **{"architecture/n_layers": 2, **extra})
        return q.create()


@pytest.fixture(scope="module")
def trained(root: Path):
    return _trainer(root, "debugged")


def _intermediates(trainer, rows: dict[str, np.ndarray]) -> dict:
    """Every module's output on `rows`, from Flax itself."""
    _, state = trainer.model.apply(
        {"params": trainer.state.params},
        rows["x"],
        capture_intermediates=True,
        mutable=["intermediates"],
    )
    return state["intermediates"]


def test_find_lists_paths_by_type_in_call_order(trained) -> None:
    assert trained.find(SelfAttention) == ["blocks_0/attn", "blocks_1/attn"]
    assert trained.find(MLP) == ["blocks_0/mlp", "blocks_1/mlp"]
    assert trained.find(GPT) == [""]
    assert trained.find((Block, MLP)) == ["blocks_0", "blocks_0/mlp", "blocks_1", "blocks_1/mlp"]
    dense = trained.find(nn.Dense)
    assert dense[:2] == ["blocks_0/attn/c_attn", "blocks_0/attn/c_proj"]
    everything = trained.find(nn.Module)  # subclasses match: every module
    assert everything[0] == "" and len(everything) == len(set(everything))
    assert all(isinstance(p, str) for p in everything)


def test_debug_returns_the_bound_layer_and_its_real_inputs(trained) -> None:
    layer, inputs = trained.debug("blocks_1/attn")
    reference = _intermediates(trained, trained.batch("train"))
    expected_x = reference["blocks_1"]["ln_1"]["__call__"][0]
    expected_out = reference["blocks_1"]["attn"]["__call__"][0]
    assert isinstance(layer, DebugLayer) and isinstance(inputs, DebugInputs)
    assert isinstance(layer.module, SelfAttention) and layer.path == "blocks_1/attn"
    assert sorted(inputs) == ["cache", "deterministic", "prefixes", "segments", "x"]  # defaults
    assert inputs.deterministic is True and inputs.cache is None
    assert inputs["x"] is inputs.x
    np.testing.assert_allclose(inputs.x, expected_x, rtol=RTOL, atol=RTOL)
    np.testing.assert_allclose(layer(inputs.x), expected_out, rtol=RTOL, atol=RTOL)
    np.testing.assert_allclose(layer(**inputs), expected_out, rtol=RTOL, atol=RTOL)
    # Submodules are reachable as attributes and bound to the real parameters.
    kernel = trained.state.params["blocks_1"]["attn"]["c_attn"]["kernel"]
    np.testing.assert_allclose(layer.c_attn(inputs.x), inputs.x @ kernel, rtol=1e-5, atol=1e-6)
    assert isinstance(inputs.x, jax.Array)  # device arrays, not host copies


def test_debug_the_root_and_a_nested_module(trained) -> None:
    layer, inputs = trained.debug("")
    np.testing.assert_array_equal(inputs.x, trained.batch("train")["x"])
    logits, loss = layer(inputs.x, inputs.y, inputs.padding_mask)
    reference_logits, reference_loss = trained.model.apply(
        {"params": trained.state.params}, inputs.x, inputs.y, inputs.padding_mask
    )
    np.testing.assert_allclose(logits, reference_logits, rtol=RTOL, atol=RTOL)
    np.testing.assert_allclose(loss, reference_loss, rtol=RTOL)
    fc, fc_inputs = trained.debug("blocks_0/mlp/c_fc")
    reference = _intermediates(trained, trained.batch("train"))
    np.testing.assert_allclose(
        fc(fc_inputs.inputs),
        reference["blocks_0"]["mlp"]["c_fc"]["__call__"][0],
        rtol=RTOL,
        atol=RTOL,
    )


def test_debug_replays_the_first_micro_batch(root: Path) -> None:
    trainer = _trainer(root, "micro", **{"training/per_device_batch_size": 1})
    assert trainer.accumulate_steps == 2  # 8 rows over 4 devices, 1 per device
    _, inputs = trainer.debug("blocks_0/attn")
    rows = {k: v[::2] for k, v in trainer.batch("train").items()}  # train_step's micro-step 0
    reference = _intermediates(trainer, rows)
    assert inputs.x.shape == (4, 32, 32)
    np.testing.assert_allclose(
        inputs.x, reference["blocks_0"]["ln_1"]["__call__"][0], rtol=RTOL, atol=RTOL
    )


def test_debug_session_closes(trained) -> None:
    with trained.debug("blocks_0/attn") as (layer, inputs):
        x = inputs.x
        layer(x)
    with pytest.raises(DebugClosedError, match=r"close\(\)"):
        layer(x)
    with pytest.raises(DebugClosedError, match=r"trainer\.debug"):
        inputs.x  # noqa: B018
    session = trained.debug("blocks_0/attn")
    session.close()
    with pytest.raises(DebugClosedError):
        session.layer.c_attn  # noqa: B018
    assert "closed" in repr(session)


def test_inputs_are_read_only(trained) -> None:
    _, inputs = trained.debug("blocks_0/attn")
    with pytest.raises(AttributeError, match="read-only"):
        inputs.x = 1
    with pytest.raises(TypeError):
        inputs["x"] = 1  # type: ignore[index]
    with pytest.raises(AttributeError, match="not an argument"):
        inputs.y  # noqa: B018


def test_unknown_paths_list_the_discovered_ones(trained) -> None:
    with pytest.raises(UnknownPathError, match=r"'blocks_0/attn'.*'blocks_1/attn'"):
        trained.debug("blocks_9/attn")
    with pytest.raises(UnknownPathError, match="strings like 'blocks_0/attn'"):
        trained.debug(("blocks_0", "attn"))  # type: ignore[arg-type]
    with pytest.raises(UnknownPathError, match=r"Did you mean 'blocks_0/attn'\?"):
        trained.debug("blocks_0.attn")  # the recorder's dotted form
    with pytest.raises(TypeError, match="module class such as SelfAttention"):
        trained.find("SelfAttention")  # type: ignore[arg-type]
    assert issubclass(UnknownPathError, ValueError)


def test_debug_with_a_key_runs_dropout(root: Path) -> None:
    trainer = _trainer(root, "dropout", **{"architecture/dropout": 0.5})
    layer, inputs = trainer.debug("blocks_0/mlp")
    deterministic = np.asarray(layer(inputs.x))
    np.testing.assert_array_equal(layer(inputs.x), deterministic)  # no key: no dropout
    layer, inputs = trainer.debug("blocks_0/mlp", key=jax.random.key(3))
    assert inputs.deterministic is False
    noisy = np.asarray(layer(inputs.x, deterministic=False))
    assert not np.allclose(noisy, deterministic)


def test_find_and_debug_need_setup(root: Path) -> None:
    trainer = jobs.SyntheticTrainer(JobSpec("unset", root=root))
    with pytest.raises(JobError, match="setup"):
        trainer.find(SelfAttention)
    with pytest.raises(JobError, match="setup"):
        trainer.debug("blocks_0/attn")


def test_capture_names_a_misspelt_path_and_refuses_a_path_that_is_not_a_string() -> None:
    class Two(nn.Module):
        @nn.compact
        def __call__(self, x: jax.Array) -> jax.Array:
            return nn.Dense(3, name="head")(nn.Dense(4, name="body")(x))

    model, x = Two(), jnp.ones((2, 5))
    variables = model.init(jax.random.key(0), x)

    def run() -> jax.Array:
        return model.apply(variables, x)

    with pytest.raises(UnknownPathError, match=r"'bdy', which the trace never calls\. Did you "
                       r"mean 'body'\?.*Discovered paths: '', 'body', 'head'"):  # fmt: skip
        debug.capture(run, ["bdy"])
    for wrong in ("body", [["body"]], [0]):
        with pytest.raises(UnknownPathError, match="list of module paths as strings"):
            debug.capture(run, wrong)  # type: ignore[arg-type]
    ((body, inputs),) = debug.capture(run, ["body"])
    expected = x @ variables["params"]["body"]["kernel"] + variables["params"]["body"]["bias"]
    np.testing.assert_allclose(body(inputs["inputs"]), expected, rtol=1e-6)


class _Scaled(nn.Module):
    """A dense layer whose output doubles when not deterministic (a keyword a call passes)."""

    @nn.compact
    def __call__(self, x: jax.Array, deterministic: bool = True) -> jax.Array:
        return nn.Dense(3, name="d")(x) * (1.0 if deterministic else 2.0)

    def shifted(self, x: jax.Array, *, by: float = 0.0) -> jax.Array:
        return self(x) + by


class _Step(nn.Module):
    @nn.compact
    def __call__(self, h: jax.Array, _: None) -> tuple[jax.Array, None]:
        return jnp.tanh(_Scaled(name="inner")(h, deterministic=True)), None


class _Scanned(nn.Module):
    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        scan = nn.scan(_Step, variable_axes={"params": 0}, split_rngs={"params": True}, length=3)
        return scan(name="layers")(x, None)[0]


def test_a_layer_captured_below_nn_scan_is_called_like_any_other() -> None:
    model, x = _Scanned(), jax.random.normal(jax.random.key(1), (2, 3))
    variables = model.init(jax.random.key(0), x)
    ((layer, inputs),) = debug.capture(lambda: model.apply(variables, x), ["layers/inner"])
    assert isinstance(layer, _Scaled) and sorted(inputs) == ["deterministic", "x"]
    # reference: the iterations by hand, each with its own slice of the stacked kernel
    dense = variables["params"]["layers"]["inner"]["d"]
    h = np.asarray(x, np.float64)
    for i in range(3):
        kernel, bias = np.asarray(dense["kernel"][i]), np.asarray(dense["bias"][i])
        out = h @ kernel + bias  # iteration i of the scan: its inner call's output
        np.testing.assert_allclose(inputs.x[i], h, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(layer(**inputs)[i], out, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(layer(inputs.x)[i], out, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(layer(inputs.x, False)[i], 2 * out, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(
            layer(x=inputs.x, deterministic=False)[i], 2 * out, rtol=1e-5, atol=1e-6
        )
        np.testing.assert_allclose(layer.shifted(inputs.x, by=1.5)[i], out + 1.5, rtol=1e-5)
        h = np.tanh(out)

    # and under jax.jit, as the analysis engine calls it
    def compiled(variables: dict, x: jax.Array) -> jax.Array:
        run = lambda: model.apply(variables, x)  # noqa: E731
        ((layer, inputs),) = debug.capture(run, ["layers/inner"])
        return layer(**inputs)

    np.testing.assert_allclose(
        jax.jit(compiled)(variables, x), layer(**inputs), rtol=1e-5, atol=1e-6
    )


class _Cell(nn.Module):
    @nn.compact
    def __call__(self, carry: jax.Array, x: jax.Array, scale: float) -> tuple[jax.Array, jax.Array]:
        h = nn.Dense(4, name="dense")(carry + x) * scale
        return h, h.sum(-1)


class _Recurrent(nn.Module):
    @nn.compact
    def __call__(self, xs: jax.Array) -> tuple[jax.Array, jax.Array]:
        scan = nn.scan(
            _Cell,
            variable_broadcast="params",
            split_rngs={"params": False},
            in_axes=(1, nn.broadcast),
            out_axes=1,
        )
        return scan(name="rnn")(jnp.zeros((xs.shape[0], 4)), xs, 0.5)


class _Member(nn.Module):
    @nn.compact
    def __call__(self, x: jax.Array, *, gain: float = 1.0) -> jax.Array:
        return nn.Dense(3, name="d")(x) * gain


class _Ensemble(nn.Module):
    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        vmap = nn.vmap(
            _Member,
            variable_axes={"params": 0},
            split_rngs={"params": True},
            in_axes=None,
            out_axes=0,
            axis_size=4,
        )
        return vmap(name="ens")(x)


@pytest.mark.parametrize(
    ("model", "x", "path", "positional"),
    [
        (_Recurrent(), jax.random.normal(jax.random.key(1), (2, 5, 4)), "rnn", ["carry", "x", "scale"]),
        (_Ensemble(), jax.random.normal(jax.random.key(1), (2, 5)), "ens", ["x"]),
    ],
)  # fmt: skip
def test_a_selected_nn_scan_or_nn_vmap_module_is_called_by_keyword_like_its_class(
    model: nn.Module, x: jax.Array, path: str, positional: list[str]
) -> None:
    variables = model.init(jax.random.key(0), x)
    reference = jax.tree.leaves(model.apply(variables, x))  # the model's own output
    ((layer, inputs),) = debug.capture(lambda: model.apply(variables, x), [path])

    def check(out: Any, tolerance: float = 1e-6) -> None:
        leaves = jax.tree.leaves(out)
        assert len(leaves) == len(reference)
        for ours, expected in zip(leaves, reference, strict=True):
            np.testing.assert_allclose(ours, expected, rtol=tolerance, atol=1e-6)

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # Flax warns when a transform drops keywords
        check(layer(**inputs))
    check(layer(*(inputs[name] for name in positional)))

    # and under jax.jit, as the analysis engine calls it
    def compiled(variables: dict, x: jax.Array) -> Any:
        ((layer, inputs),) = debug.capture(lambda: model.apply(variables, x), [path])
        return layer(**inputs)

    check(jax.jit(compiled)(variables, x), 1e-5)
