"""Recorders open at the same time: each file holds exactly what its own recorder saw.

Two ``tail`` contexts, one entered inside the other, record the same model or two
models, with different filters, eagerly and under ``jit``. Every file is checked key
by key and array by array against the submodules called by hand (eagerly: bit for
bit), and every recording under ``jit`` against the same recording made alone.
"""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from theseus.analysis.inspector import read_from_safetensors, tail

pytestmark = pytest.mark.safetensors

EXACT = {"rtol": 0, "atol": 0}
JIT = {"rtol": 1e-6, "atol": 1e-6}


def only(name: str):
    """A filter that keeps the submodule called ``name``."""
    return lambda path, node: path == name


def by_hand(model, x):
    """Every submodule output of ``TwoLayer`` on ``x``, eagerly."""
    first = model.first(x)
    return {"first.__call__": first, "second.__call__": model.second(jnp.tanh(first))}


def assert_recording(folder: Path, expected: dict, tol: dict) -> None:
    data = read_from_safetensors(folder)
    assert list(data) == list(expected)
    for key, value in expected.items():
        assert data[key].dtype == np.asarray(value).dtype, key
        np.testing.assert_allclose(data[key], value, err_msg=key, **tol)


def concat(*parts):
    return np.concatenate([np.asarray(p) for p in parts])


def test_two_recorders_of_one_model_eagerly(two_layer, x, tmp_path):
    with tail(two_layer, tmp_path / "a", filter_=only("first")) as fm_a:
        with tail(two_layer, tmp_path / "b") as fm_b:
            fm_a(x)
            fm_b(x * 2.0)
        fm_a(x * 3.0)
    a3, b2 = by_hand(two_layer, x), by_hand(two_layer, x * 2.0)
    a3 = {"first.__call__": concat(a3["first.__call__"], two_layer.first(x * 3.0))}
    assert_recording(tmp_path / "a", a3, EXACT)
    assert_recording(tmp_path / "b", b2, EXACT)


def test_two_recorders_of_one_model_under_jit(two_layer, x, tmp_path):
    forward = jax.jit(lambda m, v: m(v))
    with (
        tail(two_layer, tmp_path / "a", filter_=only("first")) as fm_a,
        tail(two_layer, tmp_path / "b", filter_=only("second")) as fm_b,
    ):
        forward(fm_a, x)
        forward(fm_b, x * 2.0)
        forward(fm_a, x * 3.0)
    with tail(two_layer, tmp_path / "a-alone", filter_=only("first")) as fm_a:
        forward(fm_a, x)
        forward(fm_a, x * 3.0)
    with tail(two_layer, tmp_path / "b-alone", filter_=only("second")) as fm_b:
        forward(fm_b, x * 2.0)
    expected_a = {"first.__call__": concat(two_layer.first(x), two_layer.first(x * 3.0))}
    expected_b = {"second.__call__": by_hand(two_layer, x * 2.0)["second.__call__"]}
    assert_recording(tmp_path / "a", expected_a, JIT)
    assert_recording(tmp_path / "b", expected_b, JIT)
    for name in ("a", "b"):  # overlapping or alone, the same program gives the same bits
        alone = read_from_safetensors(tmp_path / f"{name}-alone")
        assert_recording(tmp_path / name, alone, EXACT)
    # a (slot 0, first wrapped) and b (slot 1, second wrapped); "a-alone" reuses a's
    # program; "b-alone" holds slot 0 with second wrapped: a third structure
    assert forward._cache_size() == 3


def test_two_models_side_by_side_and_nested_inside_each_other(two_layer, doc_model, x, tmp_path):
    ones = jnp.ones((3, 2))
    for mode, run in (("eager", lambda m, v: m(v)), ("jit", jax.jit(lambda m, v: m(v)))):
        with (
            tail(two_layer, tmp_path / mode / "two", filter_=only("second")) as fm_two,
            tail(doc_model, tmp_path / mode / "doc") as fm_doc,
            tail(fm_two, tmp_path / mode / "inner") as fm_inner,  # records through fm_two
        ):
            run(fm_doc, ones)
            run(fm_inner, x)
            run(fm_two, x * 2.0)
        tol = EXACT if mode == "eager" else JIT
        hand, hand2 = by_hand(two_layer, x), by_hand(two_layer, x * 2.0)
        expected_two = {
            "second.__call__": concat(hand["second.__call__"], hand2["second.__call__"])
        }
        assert_recording(tmp_path / mode / "two", expected_two, tol)
        assert_recording(tmp_path / mode / "inner", hand, tol)
        linear = doc_model.sub_model.linear(ones)
        expected_doc = {"sub_model.linear.__call__": linear, "sub_model.__call__": linear}
        assert_recording(tmp_path / mode / "doc", expected_doc, tol)


def test_jitted_forward_compiles_once_per_slot_across_overlapping_sessions(two_layer, x, tmp_path):
    forward = jax.jit(lambda m, v: m(v))
    for session in range(3):
        with (
            tail(two_layer, tmp_path / f"{session}-a") as fm_a,
            tail(two_layer, tmp_path / f"{session}-b") as fm_b,
        ):
            forward(fm_a, x + session)
            forward(fm_b, x - session)
        assert_recording(tmp_path / f"{session}-a", by_hand(two_layer, x + session), JIT)
        assert_recording(tmp_path / f"{session}-b", by_hand(two_layer, x - session), JIT)
    assert forward._cache_size() == 2  # one program per slot, reused by every session


def test_program_traced_while_no_recording_holds_the_slot_still_records_later(
    two_layer, x, tmp_path
):
    forward = jax.jit(lambda m, v: m(v))
    with (
        pytest.warns(UserWarning, match="nothing was recorded"),
        tail(two_layer, tmp_path / "empty") as fm,
    ):
        pass
    forward(fm, x)  # traced and run with the slot free: delivered nowhere
    with tail(two_layer, tmp_path / "next") as fm_next:
        forward(fm_next, x * 2.0)  # the same program (same slot): it must record here
    assert forward._cache_size() == 1
    assert_recording(tmp_path / "next", by_hand(two_layer, x * 2.0), JIT)
    assert not (tmp_path / "empty").exists()


def test_one_callback_per_model_call_under_jit(two_layer, x, tmp_path, monkeypatch):
    from theseus.analysis.inspector import _emit

    delivered = []
    deliver = _emit._deliver

    def counting(slot, keys, sites, arrays):
        delivered.append(tuple(keys))
        deliver(slot, keys, sites, arrays)

    monkeypatch.setattr(_emit, "_deliver", counting)
    with tail(two_layer, tmp_path, record="both") as fm:
        jax.jit(lambda m, v: m(v, twice=True))(fm, x)
    assert delivered == [
        (
            "first.__call__.x",
            "first.__call__",
            "first.__call__.x",
            "first.__call__",
            "second.__call__.x",
            "second.__call__",
        )
    ]
    data = read_from_safetensors(tmp_path)
    np.testing.assert_allclose(
        data["first.__call__"], concat(two_layer.first(x), two_layer.first(x * 2.0)), **JIT
    )


@pytest.mark.torch
def test_torch_recorders_of_two_models_and_of_one_model_twice(tmp_path):
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    nets = [
        torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2))
        for _ in range(2)
    ]
    x = torch.from_numpy(np.random.default_rng(2).normal(size=(5, 4)).astype(np.float32))
    linear = lambda path, module: isinstance(module, torch.nn.Linear)  # noqa: E731
    with (
        tail(nets[0], tmp_path / "linear", filter_=linear) as fm_linear,
        tail(nets[1], tmp_path / "other", filter_=only("2")) as fm_other,
        tail(nets[0], tmp_path / "tanh", filter_=only("1")) as fm_tanh,  # the same net again
    ):
        fm_linear(x)
        fm_other(x * 2.0)
        fm_tanh(x * 3.0)  # nets[0] once more: both of its recorders see this call
    with torch.no_grad():
        h, h3 = nets[0][0](x), nets[0][0](x * 3.0)
        expected_linear = {
            "0.__call__": torch.cat([h, h3]),
            "2.__call__": torch.cat([nets[0][2](torch.tanh(h)), nets[0][2](torch.tanh(h3))]),
        }
        expected_other = {"2.__call__": nets[1](x * 2.0)}
        expected_tanh = {"1.__call__": torch.cat([torch.tanh(h), torch.tanh(h3)])}
    for name, expected in (
        ("linear", expected_linear),
        ("other", expected_other),
        ("tanh", expected_tanh),
    ):
        data = read_from_safetensors(tmp_path / name, framework="torch")
        assert list(data) == list(expected), name
        for key, value in expected.items():
            torch.testing.assert_close(data[key], value, rtol=0, atol=0)
    assert not any(m._forward_hooks or m._forward_pre_hooks for n in nets for m in n.modules())
