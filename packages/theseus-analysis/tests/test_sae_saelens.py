"""SAELens's two files, written and read back, against independent readings.

Each architecture's params survive ``read_saelens(saelens_files(...))``: the config equal,
every array bit for bit, except ``log_threshold``, which the file holds as
``threshold = exp(log_threshold)`` in float32 (within 2**-23 absolute; exact wherever
``|log_threshold| >= 1``). The ``safetensors`` package, a separate implementation, reads
the weights file to the same arrays, and a file it writes (F32 or F16) reads back here, as
does one of bfloat16 (widened exactly).
The folds applied to SAELens's switches (``apply_b_dec_to_input: false``;
``rescale_acts_by_decoder_norm: true`` for topk) are checked against SAELens's formulas
written out in NumPy. Malformed or foreign files are refused in one line each.
(tests/test_sae_saelens_parity.py, in the torch session, loads the files with SAELens.)
"""

from __future__ import annotations

import doctest
import json
import struct

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from theseus.analysis.sae import (
    SAEConfig,
    SAELensError,
    _saelens,
    encode,
    init_params,
    read_saelens,
    saelens_files,
)

CONFIGS = {
    "relu": SAEConfig(d_in=6, width=10, architecture="relu", l1=0.3),
    "topk": SAEConfig(d_in=6, width=10, architecture="topk", k=3),
    "jumprelu": SAEConfig(
        d_in=6, width=10, architecture="jumprelu", l0=0.1, threshold=0.2, bandwidth=0.05
    ),
}
WHERE = {
    "hook_name": "blocks_1/mlp",
    "model_name": "proj.group.run~1a2b3c4d~12",
    "context_size": 64,
}
LOG_THRESHOLD_ATOL = 2.0**-23


def random_params(config: SAEConfig, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    params = {
        "W_enc": rng.normal(size=(config.d_in, config.width)),
        "W_dec": rng.normal(size=(config.width, config.d_in)),
        "b_enc": rng.normal(size=config.width) * 0.1,
        "b_dec": rng.normal(size=config.d_in) * 0.1,
    }
    if config.architecture == "jumprelu":  # thresholds from 0.02 to 1.6, either side of 1
        params["log_threshold"] = rng.uniform(-4.0, 0.5, config.width)
    return {name: value.astype(np.float32) for name, value in params.items()}


def write_safetensors(header: dict, data: bytes) -> bytes:
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + data


@pytest.mark.parametrize("architecture", sorted(CONFIGS))
def test_round_trip(architecture: str) -> None:
    config = CONFIGS[architecture]
    params = random_params(config)
    files = saelens_files(params, config, **WHERE)
    back_config, back = read_saelens(files)
    assert back_config == config
    assert sorted(back) == sorted(params)
    for name, value in params.items():
        assert back[name].dtype == np.float32, name
        if name == "log_threshold":
            np.testing.assert_allclose(back[name], value, rtol=0, atol=LOG_THRESHOLD_ATOL)
            far = np.abs(value) >= 1
            np.testing.assert_array_equal(back[name][far], value[far])
        else:
            np.testing.assert_array_equal(back[name], value, err_msg=name)


@pytest.mark.parametrize("architecture", sorted(CONFIGS))
def test_cfg_json(architecture: str) -> None:
    config = CONFIGS[architecture]
    cfg = json.loads(saelens_files(random_params(config), config, **WHERE)["cfg.json"])
    assert cfg["architecture"] == {"relu": "standard"}.get(architecture, architecture)
    assert (cfg["d_in"], cfg["d_sae"], cfg["dtype"]) == (6, 10, "float32")
    assert cfg["apply_b_dec_to_input"] is True
    assert cfg["normalize_activations"] == cfg["reshape_activations"] == "none"
    assert ("k" in cfg) == (architecture == "topk")
    if architecture == "topk":
        assert (cfg["k"], cfg["rescale_acts_by_decoder_norm"]) == (3, False)
    metadata = cfg["metadata"]
    assert metadata["sae_lens_version"] == "6.0.0"  # the loader's 6.x layout
    assert {key: metadata[key] for key in WHERE} == WHERE


def test_jax_params_as_init_params_makes_them() -> None:
    config = CONFIGS["jumprelu"]
    params = init_params(config, jax.random.key(0))
    back_config, back = read_saelens(saelens_files(params, config, **WHERE))
    assert back_config == config
    for name, value in params.items():
        np.testing.assert_allclose(back[name], np.asarray(value), rtol=0, atol=LOG_THRESHOLD_ATOL)


@pytest.mark.parametrize("architecture", sorted(CONFIGS))
def test_safetensors_reads_what_is_written(architecture: str) -> None:
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    config = CONFIGS[architecture]
    params = random_params(config)
    files = saelens_files(params, config, **WHERE)
    loaded = safetensors_numpy.load(files["sae_weights.safetensors"])
    expected = dict(params)
    if architecture == "jumprelu":
        log_threshold = expected.pop("log_threshold").astype(np.float64)
        expected["threshold"] = np.exp(log_threshold).astype(np.float32)
    assert sorted(loaded) == sorted(expected)
    for name, value in expected.items():
        assert loaded[name].dtype == np.float32, name
        np.testing.assert_array_equal(loaded[name], value, err_msg=name)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("architecture", sorted(CONFIGS))
def test_reads_what_safetensors_writes(architecture: str, dtype: type) -> None:
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    config = CONFIGS[architecture]
    params = random_params(config)
    files = saelens_files(params, config, **WHERE)
    stored = {
        name: value.astype(dtype)
        for name, value in safetensors_numpy.load(files["sae_weights.safetensors"]).items()
    }
    files["sae_weights.safetensors"] = safetensors_numpy.save(stored, metadata={"format": "pt"})
    back_config, back = read_saelens(files)
    assert back_config == config
    for name in ("W_enc", "W_dec", "b_enc", "b_dec"):
        np.testing.assert_array_equal(back[name], stored[name].astype(np.float32), err_msg=name)
    if architecture == "jumprelu":
        threshold = stored["threshold"].astype(np.float64)
        np.testing.assert_array_equal(back["log_threshold"], np.log(threshold).astype(np.float32))


def test_bfloat16_weights_widen_exactly() -> None:
    config = CONFIGS["jumprelu"]
    files = saelens_files(random_params(config), config, **WHERE)
    weights = _saelens._unpack(files["sae_weights.safetensors"])
    stored = {name: value.astype(jnp.bfloat16) for name, value in weights.items()}
    header, data = {}, b""
    for name, value in stored.items():
        header[name] = {
            "dtype": "BF16",
            "shape": list(value.shape),
            "data_offsets": [len(data), len(data) + value.nbytes],
        }
        data += value.tobytes()
    files["sae_weights.safetensors"] = write_safetensors(header, data)
    _, back = read_saelens(files)
    for name in ("W_enc", "W_dec", "b_enc", "b_dec"):
        np.testing.assert_array_equal(back[name], stored[name].astype(np.float32), err_msg=name)
    threshold = stored["threshold"].astype(np.float64)
    np.testing.assert_array_equal(back["log_threshold"], np.log(threshold).astype(np.float32))


def test_log_threshold_of_older_files_and_thresholds_at_or_below_zero() -> None:
    config = CONFIGS["jumprelu"]
    params = random_params(config)
    files = saelens_files(params, config, **WHERE)
    old = np.log(np.full(10, 0.5, np.float32))
    weights = _saelens._unpack(files["sae_weights.safetensors"])
    weights.pop("threshold")
    weights["log_threshold"] = old
    files["sae_weights.safetensors"] = _saelens._pack(weights)
    np.testing.assert_array_equal(read_saelens(files)[1]["log_threshold"], old)

    # A threshold of 0 or below gates like 0 (SAELens: relu(pre) where pre > threshold).
    weights.pop("log_threshold")
    weights["threshold"] = np.array([0.0, -1.0] + [0.5] * 8, np.float32)
    files["sae_weights.safetensors"] = _saelens._pack(weights)
    _, back = read_saelens(files)
    assert back["log_threshold"][0] == back["log_threshold"][1] == -np.inf
    x = np.random.default_rng(1).normal(size=(32, 6)).astype(np.float32)
    pre = (x - back["b_dec"]) @ back["W_enc"] + back["b_enc"]
    features = np.asarray(encode(jax.tree.map(jnp.asarray, back), jnp.asarray(x), config))
    np.testing.assert_allclose(features[:, :2], np.maximum(pre[:, :2], 0), rtol=1e-6, atol=1e-6)


def test_apply_b_dec_to_input_false_is_folded_into_b_enc() -> None:
    config = CONFIGS["relu"]
    params = random_params(config)
    files = saelens_files(params, config, **WHERE)
    cfg = json.loads(files["cfg.json"])
    cfg["apply_b_dec_to_input"] = False
    files["cfg.json"] = json.dumps(cfg).encode()
    _, back = read_saelens(files)
    x = np.random.default_rng(1).normal(size=(32, 6)).astype(np.float32)
    reference = np.maximum(x @ params["W_enc"] + params["b_enc"], 0)  # SAELens: no b_dec on input
    ours = np.asarray(encode(jax.tree.map(jnp.asarray, back), jnp.asarray(x), config))
    np.testing.assert_allclose(ours, reference, rtol=1e-5, atol=1e-5)


def test_topk_rescaled_by_decoder_norm_is_folded() -> None:
    config = CONFIGS["topk"]
    params = random_params(config)
    files = saelens_files(params, config, **WHERE)
    cfg = json.loads(files["cfg.json"])
    cfg["rescale_acts_by_decoder_norm"] = True
    files["cfg.json"] = json.dumps(cfg).encode()
    _, back = read_saelens(files)
    np.testing.assert_allclose(np.linalg.norm(back["W_dec"], axis=1), 1, rtol=1e-6)
    # SAELens: hidden_pre scaled by the decoder norms, top k, ReLU; decode divides them out.
    x = np.random.default_rng(1).normal(size=(32, 6)).astype(np.float32)
    norms = np.linalg.norm(params["W_dec"], axis=1)
    hidden = ((x - params["b_dec"]) @ params["W_enc"] + params["b_enc"]) * norms
    top = np.argsort(-hidden, axis=1)[:, : config.k]
    reference = np.zeros_like(hidden)
    np.put_along_axis(reference, top, np.maximum(np.take_along_axis(hidden, top, 1), 0), 1)
    ours = np.asarray(encode(jax.tree.map(jnp.asarray, back), jnp.asarray(x), config))
    np.testing.assert_allclose(ours, reference, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(
        ours @ back["W_dec"], (reference / norms) @ params["W_dec"], rtol=1e-5, atol=1e-5
    )


def _files() -> dict[str, bytes]:
    return saelens_files(random_params(CONFIGS["topk"]), CONFIGS["topk"], **WHERE)


def _with_cfg(**changes: object) -> dict[str, bytes]:
    files = _files()
    cfg = json.loads(files["cfg.json"])
    for key, value in changes.items():
        if value is None:
            cfg.pop(key)
        else:
            cfg[key] = value
    files["cfg.json"] = json.dumps(cfg).encode()
    return files


def _with_weights(edit) -> dict[str, bytes]:
    files = _files()
    weights = _saelens._unpack(files["sae_weights.safetensors"])
    files["sae_weights.safetensors"] = edit(weights)
    return files


def _i32_b_enc(weights: dict[str, np.ndarray]) -> bytes:
    header, data, offset = {}, b"", 0
    for name, value in weights.items():
        stored = value.astype(np.int32) if name == "b_enc" else value
        code = "I32" if name == "b_enc" else "F32"
        header[name] = {
            "dtype": code,
            "shape": list(value.shape),
            "data_offsets": [offset, offset + stored.nbytes],
        }
        data += stored.tobytes()
        offset += stored.nbytes
    return write_safetensors(header, data)


MALFORMED = {
    "missing weights file": (
        lambda: {"cfg.json": _files()["cfg.json"]},
        "no sae_weights.safetensors",
    ),
    "cfg not JSON": (lambda: {**_files(), "cfg.json": b"{nope"}, "not UTF-8 JSON"),
    "cfg not an object": (lambda: {**_files(), "cfg.json": b"[1, 2]"}, "expected a JSON object"),
    "unknown architecture": (lambda: _with_cfg(architecture="gated"), "architecture 'gated'"),
    "no architecture": (lambda: _with_cfg(architecture=None), "architecture None"),
    "d_sae not an integer": (lambda: _with_cfg(d_sae="10"), "d_sae='10'"),
    "topk without k": (lambda: _with_cfg(k=None), "k=None"),
    "k past the width": (lambda: _with_cfg(k=11), "1 <= k <= width"),
    "normalized input": (lambda: _with_cfg(normalize_activations="layer_norm"), "layer_norm"),
    "hook_z reshaping": (lambda: _with_cfg(reshape_activations="hook_z"), "hook_z"),
    "flag not a bool": (lambda: _with_cfg(apply_b_dec_to_input="yes"), "expected true or false"),
    "empty weights": (lambda: {**_files(), "sae_weights.safetensors": b""}, "0 bytes"),
    "truncated header": (
        lambda: {**_files(), "sae_weights.safetensors": _files()["sae_weights.safetensors"][:40]},
        "runs past",
    ),
    "truncated data": (
        lambda: {**_files(), "sae_weights.safetensors": _files()["sae_weights.safetensors"][:-4]},
        "expected a range inside the data",
    ),
    "header not JSON": (
        lambda: {**_files(), "sae_weights.safetensors": struct.pack("<Q", 4) + b"{no}"},
        "header is not UTF-8 JSON",
    ),
    "header entry malformed": (
        lambda: {
            **_files(),
            "sae_weights.safetensors": write_safetensors({"W_enc": {"dtype": "F32"}}, b""),
        },
        "expected dtype, shape and data_offsets",
    ),
    "wrong dtype": (
        lambda: _with_weights(_i32_b_enc),
        "b_enc is I32; expected one of F32, F16, BF16",
    ),
    "missing tensor": (
        lambda: _with_weights(
            lambda w: _saelens._pack({k: v for k, v in w.items() if k != "b_enc"})
        ),
        "expected exactly ['W_dec', 'W_enc', 'b_dec', 'b_enc']",
    ),
    "extra tensor": (
        lambda: _with_weights(lambda w: _saelens._pack({**w, "threshold": w["b_enc"]})),
        "expected exactly",
    ),
    "wrong shape": (
        lambda: _with_weights(lambda w: _saelens._pack({**w, "b_dec": np.zeros(7, np.float32)})),
        "b_dec has shape (7,); expected (6,)",
    ),
    "wrong byte count": (
        lambda: _with_weights(
            lambda w: write_safetensors(
                {"b_dec": {"dtype": "F32", "shape": [6], "data_offsets": [0, 20]}}, bytes(24)
            )
        ),
        "spans 20 bytes; expected 24",
    ),
    "scaling factor": (
        lambda: _with_weights(
            lambda w: _saelens._pack({**w, "scaling_factor": np.full(10, 2, np.float32)})
        ),
        "scaling_factor other than 1",
    ),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_files_are_refused_in_one_line(case: str) -> None:
    make, message = MALFORMED[case]
    with pytest.raises(SAELensError) as caught:
        read_saelens(make())
    assert message in str(caught.value), str(caught.value)
    assert "\n" not in str(caught.value)
    assert isinstance(caught.value, ValueError)


def test_scaling_factor_of_ones_is_dropped() -> None:
    files = _with_weights(
        lambda w: _saelens._pack({**w, "scaling_factor": np.ones(10, np.float32)})
    )
    assert read_saelens(files)[0] == CONFIGS["topk"]


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda p: {k: v for k, v in p.items() if k != "log_threshold"}, "lack 'log_threshold'"),
        (lambda p: {**p, "W_enc": p["W_enc"].T}, "has shape (10, 6); expected (6, 10)"),
    ],
)
def test_saelens_files_refuses_params_that_do_not_fit(edit, message: str) -> None:
    config = CONFIGS["jumprelu"]
    with pytest.raises(
        SAELensError, match=message.replace("(", r"\(").replace(")", r"\)")
    ) as caught:
        saelens_files(edit(random_params(config)), config, **WHERE)
    assert "\n" not in str(caught.value)


def test_docstring_example_runs() -> None:
    result = doctest.testmod(_saelens, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
