"""The trainer's helper modules use its public interface, never its private fields.

`_restore` and `_tandem` receive what they need as arguments or read what `BaseTrainer`
documents, so a private field of the trainer can change without them (the reference
here is the modules' own source, read as a syntax tree).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import theseus.training._restore
import theseus.training._tandem


@pytest.mark.parametrize("module", [theseus.training._restore, theseus.training._tandem])
def test_a_helper_module_reads_no_private_field_of_the_trainer(module: object) -> None:
    tree = ast.parse(Path(module.__file__).read_text())  # type: ignore[attr-defined]
    reached = sorted(
        f"line {node.lineno}: trainer.{node.attr}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "trainer"
        and node.attr.startswith("_")
    )
    assert reached == []
