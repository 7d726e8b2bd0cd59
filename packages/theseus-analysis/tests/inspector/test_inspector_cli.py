"""The command line: `show` numbers against NumPy, `diff` statuses and exit codes."""

from __future__ import annotations

import re
import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner

from theseus.analysis.inspector import KeyCollisionError, compare_recordings, save_recording
from theseus.analysis.inspector.cli import inspect

pytestmark = pytest.mark.safetensors


@pytest.fixture
def recording(rng, tmp_path):
    a = rng.normal(size=(4, 3)).astype(np.float32)
    a[0, 0] = np.nan
    a[1, 1] = np.inf
    data = {"layer.forward": a, "head.forward": rng.normal(size=(2,)).astype(np.float32)}
    save_recording(data, tmp_path / "file")
    return tmp_path / "file", data


def test_show_prints_statistics(recording):
    folder, data = recording
    result = CliRunner().invoke(inspect, ["show", str(folder), "--meta"])
    assert result.exit_code == 0, result.output
    assert "#   0: layer.forward" in result.output
    line = next(row for row in result.output.splitlines() if row.startswith("layer.forward"))
    finite = data["layer.forward"][np.isfinite(data["layer.forward"])].astype(np.float64)
    numbers = [float(v) for v in re.findall(r"-?\d\.\d{3}e[+-]\d\d", line)]
    np.testing.assert_allclose(
        numbers, [finite.mean(), finite.std(), finite.min(), finite.max()], rtol=1e-3
    )
    assert line.split()[-2:] == ["1", "1"]  # one NaN, one Inf
    assert "(4, 3)" in line and "float32" in line


def test_show_key_pattern(recording):
    folder, _ = recording
    result = CliRunner().invoke(inspect, ["show", str(folder), "--key-pattern", "^head"])
    assert result.exit_code == 0
    assert "head.forward" in result.output and "layer.forward" not in result.output


def _write(tmp_path, name, data):
    save_recording(data, tmp_path / name)
    return str(tmp_path / name)


def test_diff_close_then_perturbed(rng, tmp_path):
    ref = {"a.__call__": rng.normal(size=(10, 10)).astype(np.float32)}
    same = {"a.forward": ref["a.__call__"] * (1 + 1e-7)}
    perturbed = {"a.forward": ref["a.__call__"].copy()}
    perturbed["a.forward"][:3, 0] += 1.0
    key_map = ["--key-map", r"\.forward$", ".__call__"]
    ok = CliRunner().invoke(
        inspect, ["diff", _write(tmp_path, "same", same), _write(tmp_path, "ref", ref), *key_map]
    )
    assert ok.exit_code == 0, ok.output
    assert "a.__call__  close" in ok.output and "0/100 exceed" in ok.output
    bad = CliRunner().invoke(
        inspect, ["diff", _write(tmp_path, "bad", perturbed), str(tmp_path / "ref"), *key_map]
    )
    assert bad.exit_code == 1
    assert "DIFFERS" in bad.output and "3/100 exceed" in bad.output
    assert "max abs 1.000e+00" in bad.output


def test_diff_reports_one_sided_keys_and_shapes(rng, tmp_path):
    file = {"a": np.zeros((2, 3), np.float32), "only_here": np.zeros(1, np.float32)}
    ref = {"a": np.zeros((3, 2), np.float32), "only_there": np.zeros(1, np.float32)}
    result = CliRunner().invoke(
        inspect, ["diff", _write(tmp_path, "f", file), _write(tmp_path, "r", ref)]
    )
    assert result.exit_code == 1
    assert "shape mismatch: (2, 3) vs (3, 2)" in result.output
    assert "only in FILE" in result.output and "only in REF" in result.output


def test_key_map_collision_is_an_error(tmp_path):
    data = {"x.0": np.zeros(1, np.float32), "x.1": np.zeros(1, np.float32)}
    with pytest.raises(KeyCollisionError, match="sends both"):
        compare_recordings(data, data, key_map=[(r"\d", "n")])
    folder = _write(tmp_path, "d", data)
    result = CliRunner().invoke(inspect, ["diff", folder, folder, "--key-map", r"\d", "n"])
    assert result.exit_code == 2 and "sends both" in result.output


def test_relative_error_is_measured_against_the_reference():
    (result,) = compare_recordings(
        {"k": np.array([1.1, 2.0])}, {"k": np.array([1.0, 2.0])}, rtol=0.05, atol=0.0
    )
    assert result.status == "differs" and result.exceed == 1 and result.total == 2
    np.testing.assert_allclose([result.max_abs, result.max_rel], [0.1, 0.1], rtol=1e-9)


def test_python_dash_m(recording):
    folder, _ = recording
    done = subprocess.run(
        [sys.executable, "-m", "theseus.analysis.inspector", "diff", str(folder), str(folder)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "2 close, 0 differ" in done.stdout


def test_unreadable_input_exits_2(tmp_path):
    (tmp_path / "empty").mkdir()
    missing = CliRunner().invoke(inspect, ["show", str(tmp_path / "missing")])
    assert missing.exit_code == 2
    empty = CliRunner().invoke(inspect, ["diff", str(tmp_path / "empty"), str(tmp_path / "empty")])
    assert empty.exit_code == 2 and "holds no .safetensors file" in empty.output
