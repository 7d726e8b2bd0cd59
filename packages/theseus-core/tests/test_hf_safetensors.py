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
    core's own dependencies (the weights are read by the module above). Read from the
    installed distribution's metadata and modules, as a user's environment has them."""
    import ast
    import importlib.metadata
    import re
    import sys

    import theseus.data.tokenizer
    import theseus.model.hf

    def name(requirement: str) -> str:
        return re.split(r"[\s<>=!~;\[]", requirement, maxsplit=1)[0].replace("-", "_")

    requires = importlib.metadata.requires("theseus-core") or []
    extra = {name(r) for r in requires if re.search(r"extra\s*==\s*['\"]hf['\"]", r)}
    base = {name(r) for r in requires if "extra" not in r}
    modules = [
        *Path(theseus.model.hf.__path__[0]).glob("*.py"),
        Path(theseus.data.tokenizer.__file__),
    ]
    needed = set()
    for module in modules:
        for node in ast.walk(ast.parse(module.read_text())):
            if isinstance(node, ast.Import):
                needed |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                needed.add(node.module.split(".")[0])
    third_party = needed - set(sys.stdlib_module_names) - {"theseus"}
    # ml_dtypes comes with jax (a core dependency), numpy too
    assert third_party - base - extra <= {"ml_dtypes", "numpy"}, third_party - base - extra
    assert extra == {"tokenizers"}
