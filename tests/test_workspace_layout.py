"""Every package's shape, read from its sources: modules under 500 lines, no import cycle.

The import graph is the one `packages/theseus-core/tests/test_trainer_modules.py` builds
(every import statement counted: at the top, inside a function or under TYPE_CHECKING),
here over each of the four packages: none may have a cycle.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from theseus.registry import import_module_or_file

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ["theseus-plot", "theseus-store", "theseus-core", "theseus-analysis"]
LIMIT = 500
GRAPH = import_module_or_file(str(ROOT / "packages/theseus-core/tests/test_trainer_modules.py"))


@pytest.mark.parametrize("package", PACKAGES)
def test_every_module_is_under_500_lines(package: str) -> None:
    source = ROOT / "packages" / package / "src"
    lengths = {
        str(path.relative_to(source)): len(path.read_text().splitlines())
        for path in source.rglob("*.py")
    }
    assert lengths, source
    assert {name: n for name, n in lengths.items() if n >= LIMIT} == {}


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_cycle(package: str) -> None:
    modules = GRAPH._modules(ROOT / "packages" / package / "src")
    assert modules, package
    graph = {name: GRAPH._imports(name, path, modules) for name, path in modules.items()}
    assert GRAPH._cycles(graph) == []
