"""The files of a recording: roll-over, stale files, warnings, formats, reading back."""

from __future__ import annotations

import json
import struct

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from theseus.analysis.inspector import (
    EmptyRecordingWarning,
    InspectorOptionError,
    KeyCollisionError,
    RecordingExistsError,
    RecordingNotFoundError,
    RecordingShapeError,
    capture,
    magnify,
    read_from_safetensors,
    save_recording,
    tail,
    unflatten_dict,
)

pytestmark = pytest.mark.safetensors


def _header(path):
    raw = path.read_bytes()
    (size,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8 : 8 + size]), len(raw)


def test_file_is_plain_safetensors_with_order_metadata(doc_model, tmp_path):
    from safetensors.numpy import load_file

    with tail(doc_model, tmp_path) as recorder_model:
        recorder_model(jnp.ones((3, 2)))
    (file,) = tmp_path.iterdir()
    assert file.name == "activations-000.safetensors"
    header, _ = _header(file)
    assert header["__metadata__"] == {"0": "sub_model.linear.__call__", "1": "sub_model.__call__"}
    loaded = load_file(str(file))
    np.testing.assert_array_equal(loaded["sub_model.__call__"], doc_model(jnp.ones((3, 2))))


def test_roll_over_at_max_size_mb(two_layer, tmp_path):
    # a call caches 64 x 4 + 64 x 2 float32 = 1024 + 512 bytes; allow 2560 bytes per file
    x = jnp.ones((64, 3))
    recorder = tail(two_layer, tmp_path, max_size_mb=2560 / 2**20)
    with recorder as fm:
        for scale in range(4):
            fm(x * scale)
    assert [f.name for f in recorder.files] == [
        f"activations-{i:03d}.safetensors" for i in range(len(recorder.files))
    ]
    sizes = []
    for file in recorder.files:
        header, _ = _header(file)
        sizes.append(max(v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"))
    # 1024+512+1024 | 512+1024+512 | 1024+512: each file stops before passing 2560
    assert sizes == [2560, 2048, 1536]
    data = read_from_safetensors(tmp_path)
    expected = np.concatenate([two_layer.first(x * s) for s in range(4)])
    np.testing.assert_array_equal(data["first.__call__"], expected)
    assert list(data) == ["first.__call__", "second.__call__"]


def test_second_recording_leaves_no_stale_files(two_layer, tmp_path):
    x = jnp.ones((64, 3))
    with tail(two_layer, tmp_path, max_size_mb=1024 / 2**20) as fm:
        for _ in range(3):
            fm(x)
    assert len(list(tmp_path.glob("*.safetensors"))) >= 4
    (tmp_path / "notes.txt").write_text("kept")
    with tail(two_layer, tmp_path) as fm:
        fm(x[:1])
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "activations-000.safetensors",
        "notes.txt",
    ]
    assert read_from_safetensors(tmp_path)["first.__call__"].shape == (1, 4)
    with pytest.raises(RecordingExistsError, match="already holds a recording"):
        tail(two_layer, tmp_path, exist="error").__enter__()


def test_folder_with_files_of_another_pattern_is_refused(two_layer, x, tmp_path):
    with tail(two_layer, tmp_path) as fm:
        fm(x)
    with pytest.raises(RecordingExistsError, match=r"activations-000\.safetensors"):
        tail(two_layer, tmp_path, filename_pattern="part-{idx}.safetensors").__enter__()
    assert [p.name for p in tmp_path.iterdir()] == ["activations-000.safetensors"]


def test_recording_folders_named_like_files_sit_side_by_side(two_layer, x, tmp_path):
    # seed 004 records into ".clouseau/trace-jax.safetensors" (a folder), then the default path
    with tail(two_layer, tmp_path / "trace-jax.safetensors") as fm:
        fm(x)
    with tail(two_layer, tmp_path) as fm:
        fm(x)
    nested = read_from_safetensors(tmp_path / "trace-jax.safetensors")["first.__call__"]
    np.testing.assert_array_equal(read_from_safetensors(tmp_path)["first.__call__"], nested)


def test_key_map_renames_and_refuses_collisions(two_layer, x, tmp_path):
    with tail(two_layer, tmp_path / "renamed", key_map=[(r"^first", "layer0")]) as fm:
        fm(x)
    assert list(read_from_safetensors(tmp_path / "renamed")) == [
        "layer0.__call__",
        "second.__call__",
    ]
    with (
        pytest.raises(KeyCollisionError, match="sends both"),
        tail(two_layer, tmp_path / "clash", key_map=[(r"^\w+", "layer")]) as fm,
    ):
        fm(x)
    _, got = capture(two_layer, key_map=[(r"\.__call__$", "")])(x)
    assert list(got) == ["first", "second"]
    with pytest.raises(InspectorOptionError, match="valid regular expressions"):
        capture(two_layer, key_map=[("(", "")])


def test_path_that_is_a_file_is_refused(doc_model, tmp_path):
    target = tmp_path / "trace.safetensors"
    target.write_bytes(b"x")
    with pytest.raises(RecordingExistsError, match="is a file"), tail(doc_model, target) as fm:
        fm(jnp.ones((1, 2)))


def test_empty_recording_warns_with_available_paths(doc_model, tmp_path):
    with (
        pytest.warns(EmptyRecordingWarning, match=r"sub_model\.linear\.__call__"),
        tail(doc_model, tmp_path, filter_=lambda p, n: "nothing" in p) as fm,
    ):
        fm(jnp.ones((1, 2)))
    assert not list(tmp_path.glob("*.safetensors"))


def test_concatenation_mismatch_says_use_separate(two_layer, tmp_path):
    with (
        pytest.raises(RecordingShapeError, match="stack='separate'"),
        tail(two_layer, tmp_path) as fm,
    ):
        fm(jnp.ones((2, 3)))
        fm(jnp.ones((2, 1, 3)))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"record": "weights"}, "record must be one of"),
        ({"stack": "stack"}, "stack must be one of"),
        ({"max_size_mb": 0}, "max_size_mb must be a positive"),
        ({"filename_pattern": "trace.safetensors"}, "one field named idx"),
        ({"exist": "skip"}, "exist must be one of"),
    ],
)
def test_invalid_options(doc_model, tmp_path, options, message):
    with pytest.raises(InspectorOptionError, match=message):
        tail(doc_model, tmp_path, **options).__enter__()


def test_custom_pattern_and_read_options(two_layer, x, tmp_path):
    with tail(two_layer, tmp_path, filename_pattern="run{idx}.safetensors") as fm:
        fm(x)
    assert [p.name for p in tmp_path.iterdir()] == ["run0.safetensors"]
    only = read_from_safetensors(tmp_path / "run0.safetensors", key_pattern=r"^second")
    assert list(only) == ["second.__call__"]
    as_jax = read_from_safetensors(tmp_path, framework="jax", device=jax.devices()[1])
    assert isinstance(as_jax["first.__call__"], jax.Array)
    assert as_jax["first.__call__"].devices() == {jax.devices()[1]}
    with pytest.raises(InspectorOptionError, match="framework must be one of"):
        read_from_safetensors(tmp_path, framework="tensorflow")
    with pytest.raises(InspectorOptionError, match="not a valid regular expression"):
        read_from_safetensors(tmp_path, key_pattern="(")
    with pytest.raises(RecordingNotFoundError, match="no recording at"):
        read_from_safetensors(tmp_path / "missing")


def test_bfloat16_round_trip(rng, tmp_path):
    values = rng.normal(size=(3, 4)).astype(ml_dtypes.bfloat16)
    save_recording({"a.__call__": jnp.asarray(values), "s": jnp.float32(2.5)}, tmp_path)
    data = read_from_safetensors(tmp_path)
    assert data["a.__call__"].dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(data["a.__call__"], values)
    assert data["s"].shape == () and float(data["s"]) == 2.5


def test_capture_saved_like_tail(two_layer, x, tmp_path):
    out, captured = jax.jit(lambda m, v: m(v, twice=True))(capture(two_layer), x)
    save_recording(captured, tmp_path / "captured")
    with tail(two_layer, tmp_path / "tailed") as fm:
        fm(x, twice=True)
    captured_back = read_from_safetensors(tmp_path / "captured")
    tailed = read_from_safetensors(tmp_path / "tailed")
    assert list(captured_back) == list(tailed) == ["first.__call__", "second.__call__"]
    for key in tailed:
        np.testing.assert_allclose(captured_back[key], tailed[key], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(out, two_layer(x, twice=True), rtol=1e-6, atol=1e-6)


def test_unflatten_and_magnify(two_layer, x, tmp_path, capsys):
    with tail(two_layer, tmp_path, record="both") as fm:
        fm(x)
    tree = unflatten_dict(read_from_safetensors(tmp_path))
    assert set(tree) == {"first", "second"}
    assert set(tree["first"]["__call__"]) == {"x", "(value)"}
    magnify(tmp_path / "activations-000.safetensors")
    printed = capsys.readouterr().out
    assert "first" in printed and "__call__" in printed


def test_documented_import_line_works():
    from theseus.analysis import inspector, magnifier

    assert magnifier.magnify is inspector.magnify
    assert magnifier.read_from_safetensors is inspector.read_from_safetensors
