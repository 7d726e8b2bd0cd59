"""``inspector.jit``: recorded values leave the compiled program as outputs.

Every recording is compared key by key with the submodules called by hand, and with
the same forward recorded through ``jax.jit`` (host callbacks).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from theseus.analysis.inspector import (
    InspectorOptionError,
    _callback,
    jit,
    read_from_safetensors,
    tail,
)

pytestmark = pytest.mark.safetensors

JIT = {"rtol": 1e-6, "atol": 1e-6}


def by_hand(model, x):
    first = model.first(x)
    return {"first.__call__": first, "second.__call__": model.second(jnp.tanh(first))}


def assert_recording(folder, expected, tol):
    data = read_from_safetensors(folder)
    assert list(data) == list(expected)
    for key, value in expected.items():
        np.testing.assert_allclose(data[key], value, err_msg=key, **tol)


@pytest.fixture
def no_callbacks(monkeypatch):
    """Fail if anything stages a host callback."""

    def refuse(*args, **kwargs):
        raise AssertionError("a host callback was staged")

    monkeypatch.setattr("theseus.analysis.inspector._emit.send", refuse)


def test_same_recording_as_jax_jit_without_a_callback(two_layer, x, tmp_path, no_callbacks):
    traces = []

    def run(m, v):
        traces.append(1)
        return m(v, twice=True)

    forward = jit(run)
    for session in range(3):
        with tail(two_layer, tmp_path / str(session), record="both") as fm:
            out = forward(fm, x + session)
            forward(fm, x[:2])
        np.testing.assert_allclose(out, two_layer(x + session, twice=True), **JIT)
        h = [x + session, (x + session) * 2.0, x[:2], x[:2] * 2.0]
        data = read_from_safetensors(tmp_path / str(session))
        assert list(data) == [
            "first.__call__.x",
            "first.__call__",
            "second.__call__.x",
            "second.__call__",
        ]
        order = [h[0], h[1], h[2], h[3]]  # first: twice per call, two calls
        np.testing.assert_allclose(data["first.__call__.x"], np.concatenate(order), **JIT)
        np.testing.assert_allclose(
            data["first.__call__"], np.concatenate([two_layer.first(v) for v in order]), **JIT
        )
        assert data["second.__call__"].shape == (7, 2)
    assert len(traces) == 2  # one trace per input shape, reused by every session


def test_matches_the_host_callback_recording(two_layer, x, tmp_path):
    with tail(two_layer, tmp_path / "outputs") as fm:
        jit(lambda m, v: m(v))(fm, x)
    with tail(two_layer, tmp_path / "callback") as fm:
        jax.jit(lambda m, v: m(v))(fm, x)
    expected = read_from_safetensors(tmp_path / "callback")
    assert_recording(tmp_path / "outputs", expected, JIT)
    assert_recording(tmp_path / "outputs", by_hand(two_layer, x), JIT)


def test_two_recorders_in_one_function(two_layer, doc_model, x, tmp_path, no_callbacks):
    ones = jnp.ones((3, 2))
    forward = jit(lambda a, b, v, w: (a(v), b(w)))
    with (
        tail(two_layer, tmp_path / "two", filter_=lambda p, n: p == "first") as fm_two,
        tail(doc_model, tmp_path / "doc") as fm_doc,
    ):
        forward(fm_two, fm_doc, x, ones)
    assert_recording(tmp_path / "two", {"first.__call__": two_layer.first(x)}, JIT)
    linear = doc_model.sub_model.linear(ones)
    expected = {"sub_model.linear.__call__": linear, "sub_model.__call__": linear}
    assert_recording(tmp_path / "doc", expected, JIT)


def test_values_inside_vmap_still_travel_by_callback(two_layer, x, tmp_path, monkeypatch):
    sent = []
    send = _callback.send

    def counting(deliver, values):
        sent.append(len(values))
        send(deliver, values)

    monkeypatch.setattr("theseus.analysis.inspector._emit.send", counting)
    with tail(two_layer, tmp_path) as fm:
        jit(lambda m, v: (m(v), jax.vmap(m.first)(v)))(fm, x)
    assert sent == [1]  # only the vmapped call; the outer call left as outputs
    data = read_from_safetensors(tmp_path)
    assert list(data) == ["first.__call__", "second.__call__"]
    first = two_layer.first(x)
    np.testing.assert_allclose(data["first.__call__"], np.concatenate([first, first]), **JIT)


def test_traced_before_the_recording_opens(two_layer, x, tmp_path):
    forward = jit(lambda m, v: m(v))
    with (
        pytest.warns(UserWarning, match="nothing was recorded"),
        tail(two_layer, tmp_path / "a") as fm,
    ):
        pass
    forward(fm, x)  # no recording holds the slot: delivered nowhere
    with tail(two_layer, tmp_path / "b") as fm_b:
        forward(fm_b, x * 2.0)
    assert_recording(tmp_path / "b", by_hand(two_layer, x * 2.0), JIT)


def test_out_shardings_is_refused():
    with pytest.raises(InspectorOptionError, match="out_shardings"):
        jit(lambda m, v: m(v), out_shardings=None)


def test_static_arguments_by_name_and_position(two_layer, x, tmp_path):
    def run(m, v, twice=False):
        return m(v, twice=twice)

    by_name = jit(run, static_argnames="twice")
    by_position = jit(run, static_argnums=2)
    with tail(two_layer, tmp_path) as fm:
        by_name(fm, x, twice=True)
        by_position(fm, x, False)
    data = read_from_safetensors(tmp_path)
    first = [two_layer.first(x), two_layer.first(x * 2.0), two_layer.first(x)]
    np.testing.assert_allclose(data["first.__call__"], np.concatenate(first), **JIT)
