"""safetensors files mapped one tensor at a time, against the safetensors package's reader."""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from theseus.model.hf._safetensors import SafetensorsError, map_tensor, read_header

safetensors_numpy = pytest.importorskip("safetensors.numpy")


def _tensors() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "a.weight": rng.normal(size=(3, 5)).astype(np.float32),  # odd sizes: unaligned offsets
        "b.half": rng.normal(size=(7,)).astype(np.float16),
        "c.bf16": rng.normal(size=(2, 3, 4)).astype(ml_dtypes.bfloat16),
        "d.large": rng.normal(size=(300, 70)).astype(np.float32),  # spans pages
        "e.empty": np.zeros((0, 4), np.float32),
    }


def test_each_mapped_tensor_holds_the_files_values(tmp_path: Path) -> None:
    file = tmp_path / "model.safetensors"
    tensors = _tensors()
    safetensors_numpy.save_file(tensors, str(file))
    reference = safetensors_numpy.load_file(str(file))
    for name, info in read_header(file).items():
        mapped = map_tensor(info)
        assert mapped.dtype == reference[name].dtype and mapped.shape == reference[name].shape
        np.testing.assert_array_equal(mapped, reference[name])
        assert not mapped.flags.writeable  # the file's pages are never written through
        np.testing.assert_array_equal(reference[name], tensors[name])


def test_a_file_that_shrank_after_its_header_was_read_is_one_error(tmp_path: Path) -> None:
    file = tmp_path / "model.safetensors"
    safetensors_numpy.save_file(_tensors(), str(file))
    infos = read_header(file)
    with open(file, "r+b") as handle:
        handle.truncate(infos["d.large"].start + 16)
    with pytest.raises(SafetensorsError, match="data ended early"):
        map_tensor(infos["d.large"])


def test_the_hf_extra_holds_what_an_hf_import_imports() -> None:
    """`pip install "theseus-core[hf]"` gives the one package an import needs beyond the
    core's own dependencies (the weights are read by the module above)."""
    import ast
    import tomllib

    core = Path(__file__).resolve().parents[1]
    project = tomllib.loads((core / "pyproject.toml").read_text())["project"]
    extra = {req.split(">")[0].split("=")[0] for req in project["optional-dependencies"]["hf"]}
    base = {req.split(">")[0].split("=")[0].split("[")[0] for req in project["dependencies"]}
    src = core / "src" / "theseus"
    needed = set()
    for module in [*(src / "model" / "hf").glob("*.py"), src / "data" / "tokenizer.py"]:
        for node in ast.walk(ast.parse(module.read_text())):
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = (
                    [a.name for a in node.names]
                    if isinstance(node, ast.Import)
                    else [node.module or ""]
                )
                needed |= {name.split(".")[0] for name in names}
    stdlib = set(__import__("sys").stdlib_module_names)
    third_party = {n for n in needed if n and n not in stdlib and n not in {"theseus"}}
    # ml_dtypes comes with jax (a core dependency), numpy too
    assert third_party - base - extra <= {"ml_dtypes", "numpy"}, third_party - base - extra
    assert extra == {"tokenizers"}
