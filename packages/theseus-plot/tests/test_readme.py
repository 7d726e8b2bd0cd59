"""The README's Python examples run as written."""

from __future__ import annotations

import re
from pathlib import Path

import matplotlib as mpl
import numpy as np
import pytest

README = Path(__file__).parents[1] / "README.md"


def test_readme_python_blocks_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    pytest.importorskip("jax")
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)
    assert len(blocks) == 2
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    with mpl.rc_context():  # the notebook session calls apply_theme()
        for block in blocks:
            exec(compile(block, str(README), "exec"), namespace)
    assert (tmp_path / "activations.pdf").read_bytes().startswith(b"%PDF-")
    fig = namespace["MyAnalysis"]().plot(np.ones((2, 2)))
    assert fig.axes[0].get_xlabel() == "Feature"
