"""`theseus.model.hooks`, the one hook on Flax module calls.

References are written here by hand: the argument names a call must bind (from the
signatures below), the paths in the order the model calls them, and the model's output
computed in NumPy from its variables with a replaced call substituted. Tolerances:
float32 on CPU, 1e-6 relative (eager against NumPy, and `jax.jit` against eager).
"""

from __future__ import annotations

import doctest
import threading
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from theseus.model import hooks

RTOL = 1e-6


class Scaled(nn.Module):
    """A module whose call has a default, a keyword-only default and `**extra`."""

    def setup(self) -> None:
        self.dense = nn.Dense(2, name="dense")

    def encode(self, x: jax.Array) -> jax.Array:
        return self.dense(x)

    def __call__(
        self, x: jax.Array, scale: float = 2.0, *, shift: float = 0.0, **extra: Any
    ) -> jax.Array:
        return self.encode(x) * scale + shift


class Pair(nn.Module):
    """Two `Scaled` children, called differently, under a root."""

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        return Scaled(name="left")(x, bonus=1) + Scaled(name="right")(x, 3.0, shift=0.5)


class TwoLayer(nn.Module):
    """`second(relu(first(x)))`: a replacement at `first` must reach `second`."""

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        h = nn.Dense(4, name="first")(x)
        return nn.Dense(3, name="second")(nn.relu(h))


class Mapped(nn.Module):
    """A Dense applied under `jax.vmap` inside the module (its call runs in vmap's trace)."""

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        dense = nn.Dense(2, name="inner")
        return jax.vmap(dense)(x)


@pytest.fixture(scope="module")
def x() -> jax.Array:
    return jax.random.normal(jax.random.key(1), (5, 3), jnp.float32)


@pytest.fixture(scope="module")
def two_layer(x: jax.Array) -> tuple[TwoLayer, dict[str, Any]]:
    model = TwoLayer()
    return model, model.init(jax.random.key(0), x)


def _by_hand(variables: dict[str, Any], x: np.ndarray, first: Any = None) -> np.ndarray:
    """`TwoLayer` in NumPy; `first(h)` replaces the first layer's output `h` when given."""
    p = jax.tree.map(np.asarray, variables["params"])
    h = x @ p["first"]["kernel"] + p["first"]["bias"]
    if first is not None:
        h = first(h)
    return np.maximum(h, 0) @ p["second"]["kernel"] + p["second"]["bias"]


def test_the_module_docstring_example_runs() -> None:
    result = doctest.testmod(hooks, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0


def test_arguments_are_bound_by_name_with_defaults_applied(x: jax.Array) -> None:
    model = Pair()
    variables = model.init(jax.random.key(0), x)
    seen: dict[str, dict[str, Any]] = {}

    def listen(call: hooks.ModuleCall) -> Any:
        seen[call.path] = call.arguments
        return call.proceed()

    with hooks.intercept(listen):
        model.apply(variables, x)
    # From the signatures: `Scaled(x, scale=2.0, *, shift=0.0, **extra)`, `Dense(inputs)`.
    assert sorted(seen) == ["", "left", "left/dense", "right", "right/dense"]
    assert {k: v for k, v in seen["left"].items() if k != "x"} == {
        "scale": 2.0,
        "shift": 0.0,
        "bonus": 1,
    }
    assert {k: v for k, v in seen["right"].items() if k != "x"} == {"scale": 3.0, "shift": 0.5}
    assert seen["left"]["x"] is x and seen[""]["x"] is x
    assert list(seen["left/dense"]) == ["inputs"]


def test_nested_paths_in_call_order_and_methods_by_name(x: jax.Array) -> None:
    model = Pair()
    variables = model.init(jax.random.key(0), x)
    run = lambda: model.apply(variables, x)  # noqa: E731
    every = hooks.discover(run, lambda call: True)
    assert every == ["", "left", "left/dense", "right", "right/dense"]
    assert hooks.discover(run, lambda call: isinstance(call.module, Scaled)) == ["left", "right"]
    assert hooks.discover(run, lambda call: isinstance(call.module, nn.Dense)) == [
        "left/dense",
        "right/dense",
    ]
    methods: list[tuple[str, str]] = []

    def listen(call: hooks.ModuleCall) -> Any:
        methods.append((call.path, call.method))
        return call.proceed()

    with hooks.intercept(listen, methods=("encode",)):
        run()
    assert methods == [("left", "encode"), ("right", "encode")]


def test_a_replaced_output_changes_downstream_as_by_hand(two_layer, x: jax.Array) -> None:
    model, variables = two_layer
    run = lambda: model.apply(variables, x)  # noqa: E731
    out, calls = hooks.record(run, ["first", "second"], {"first": lambda rec: rec.output * -2.0})
    expected = _by_hand(variables, np.asarray(x), first=lambda h: h * -2.0)
    np.testing.assert_allclose(np.asarray(out), expected, rtol=RTOL, atol=1e-6)
    assert not np.allclose(expected, _by_hand(variables, np.asarray(x)))  # it did change
    # The record keeps the call's own output and its arguments; second saw the replacement.
    p = jax.tree.map(np.asarray, variables["params"])
    h = np.asarray(x) @ p["first"]["kernel"] + p["first"]["bias"]
    np.testing.assert_allclose(np.asarray(calls["first"].output), h, rtol=RTOL, atol=1e-6)
    np.testing.assert_allclose(
        np.asarray(calls["second"].arguments["inputs"]), np.maximum(-2.0 * h, 0), rtol=RTOL
    )
    # The recorded module, bound to its variables, is the layer itself.
    layer = calls["first"].module.bind(calls["first"].variables)
    np.testing.assert_allclose(np.asarray(layer(x)), h, rtol=RTOL, atol=1e-6)


def test_a_replaced_input_changes_downstream_as_by_hand(two_layer, x: jax.Array) -> None:
    model, variables = two_layer
    ones = jnp.ones((5, 4), jnp.float32)

    def listen(call: hooks.ModuleCall) -> Any:
        return call.proceed(inputs=ones) if call.path == "second" else call.proceed()

    with hooks.intercept(listen):
        out = model.apply(variables, x)
    p = jax.tree.map(np.asarray, variables["params"])
    expected = np.ones((5, 4)) @ p["second"]["kernel"] + p["second"]["bias"]
    np.testing.assert_allclose(np.asarray(out), expected, rtol=RTOL, atol=1e-6)


def test_record_under_jit_matches_eager(two_layer, x: jax.Array) -> None:
    model, variables = two_layer
    double = {"first": lambda rec: rec.output * 2.0}

    def both(v: Any, rows: jax.Array) -> tuple[jax.Array, jax.Array]:
        out, calls = hooks.record(lambda: model.apply(v, rows), ["second"], double)
        return out, calls["second"].output

    eager = both(variables, x)
    compiled = jax.jit(both)(variables, x)
    for a, b in zip(eager, compiled, strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=RTOL, atol=1e-6)
    expected = _by_hand(variables, np.asarray(x), first=lambda h: h * 2.0)
    np.testing.assert_allclose(np.asarray(compiled[0]), expected, rtol=RTOL, atol=1e-6)


def test_stop_ends_only_its_own_block(two_layer, x: jax.Array) -> None:
    model, variables = two_layer
    seen: list[str] = []

    def listen(call: hooks.ModuleCall) -> Any:
        seen.append(call.path)
        if call.path == "first":
            interception.stop()
        return call.proceed()

    with hooks.intercept(listen) as interception:
        model.apply(variables, x)
        raise AssertionError("stop() must leave the block")  # pragma: no cover
    assert seen == ["", "first"]  # `second` never ran

    # An outer block's stop passes through an inner block: the inner one does not end.
    after_inner: list[str] = []
    with hooks.intercept(listen) as interception:
        with hooks.intercept(lambda call: call.proceed()):
            model.apply(variables, x)
        after_inner.append("inner block went on")  # pragma: no cover
    assert after_inner == []


def test_listening_depth_counts_open_blocks_on_this_thread_only(two_layer, x) -> None:
    """What a module reads before it takes a path past its submodules' calls: the open
    `intercept` blocks of its own thread (as Flax keeps interceptors), back to 0 however
    a block ends: normally, by `stop()`, or by an exception."""
    model, variables = two_layer
    other: list[int] = []
    assert hooks.listening_depth() == 0
    with hooks.intercept(lambda call: call.proceed()):
        with hooks.intercept(lambda call: call.proceed()) as inner:
            assert hooks.listening_depth() == 2
            thread = threading.Thread(target=lambda: other.append(hooks.listening_depth()))
            thread.start()
            thread.join()
            inner.stop()
        assert hooks.listening_depth() == 1
    assert other == [0] and hooks.listening_depth() == 0
    with pytest.raises(ZeroDivisionError), hooks.intercept(lambda call: call.proceed()):
        model.apply(variables, x)
        raise ZeroDivisionError
    assert hooks.listening_depth() == 0


def test_restarting_runs_again_after_each_restart_and_only_its_own() -> None:
    tries: list[int] = []
    reasons: list[tuple[Any, ...]] = []

    def attempt(restart: hooks.Restart) -> str:
        tries.append(len(tries))
        if len(tries) < 3:
            restart("hook", len(tries))
        return "settled"

    assert hooks.restarting(attempt, lambda *why: reasons.append(why)) == "settled"
    assert tries == [0, 1, 2] and reasons == [("hook", 1), ("hook", 2)]

    # An inner `restarting` does not catch the outer one's restart.
    outer_reasons: list[tuple[Any, ...]] = []
    inner_reasons: list[tuple[Any, ...]] = []

    def outer(restart: hooks.Restart) -> str:
        def inner(_: hooks.Restart) -> str:
            if not outer_reasons:
                restart("outer")
            return "inner done"

        return hooks.restarting(inner, lambda *why: inner_reasons.append(why))

    assert hooks.restarting(outer, lambda *why: outer_reasons.append(why)) == "inner done"
    assert outer_reasons == [("outer",)] and inner_reasons == []


def test_bad_requests_are_one_line_errors(two_layer, x: jax.Array) -> None:
    model, variables = two_layer
    with pytest.raises(hooks.HookError, match=r"\['third'\], which the run never called"):
        hooks.record(lambda: model.apply(variables, x), ["first", "third"])

    def listen(call: hooks.ModuleCall) -> Any:
        return call.proceed(weights=0) if call.path == "first" else call.proceed()

    with (
        pytest.raises(hooks.HookError, match="no argument named 'weights'; it takes"),
        hooks.intercept(listen),
    ):
        model.apply(variables, x)

    mapped = Mapped()
    mv = mapped.init(jax.random.key(0), x)
    with pytest.raises(hooks.HookError, match="'inner': it runs inside a transform"):
        hooks.record(lambda: mapped.apply(mv, x), ["inner"])
