"""The trainer's modules keep their shape: no private field read from outside, no cycle.

The references are the sources themselves, read as syntax trees: which attributes a
module reads of a trainer, what `BaseTrainer`'s class body binds, which modules import
which (typing-only and function-level imports included), and how long each module and
the loop's `run` are.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

import theseus.training
from theseus.training._loop import TrainingLoop

PACKAGES = Path(__file__).resolve().parents[2]
CORE = PACKAGES / "theseus-core" / "src"
if not (CORE / "theseus" / "training").is_dir():  # nox -s isolated: the tests away from src/
    pytest.skip(
        "reads the workspace's sources, not found beside the tests", allow_module_level=True
    )
TRAINING = CORE / "theseus" / "training"
SOURCES = sorted((CORE / "theseus").rglob("*.py")) + sorted(
    (PACKAGES / "theseus-analysis" / "src" / "theseus").rglob("*.py")
)
# Names under which code holds a trainer (or a job) that is not its own `self`.
HOLDERS = {"trainer", "job", "owner"}


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def test_no_module_reads_a_private_field_of_a_trainer() -> None:
    """Before, `_loop`, `_validation` and others read ten private fields of the trainer
    (`trainer._keeper`, `trainer._next_cursor`, ...) and set `trainer._val_index`."""
    reached = sorted(
        f"{path.relative_to(PACKAGES)}:{node.lineno}: {node.value.id}.{node.attr}"
        for path in SOURCES
        for node in ast.walk(_tree(path))
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id in HOLDERS
        and node.attr.startswith("_")
        and not node.attr.startswith("__")
    )
    assert len(SOURCES) > 100 and reached == []


def test_the_trainer_binds_no_module_function_as_a_method() -> None:
    """Before, `find = _inspection.find`, `_after_step = _loop.after_step`, ... (six)."""
    [trainer] = [
        node
        for node in _tree(TRAINING / "base.py").body
        if isinstance(node, ast.ClassDef) and node.name == "BaseTrainer"
    ]
    bound = [
        f"line {node.lineno}: {ast.unparse(node)}"
        for node in trainer.body
        if isinstance(node, ast.Assign | ast.AnnAssign)
        and not all(
            isinstance(target, ast.Name) and target.id.isupper()  # CONFIG, MODEL, ...
            for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
        )
    ]
    assert bound == []


def _modules(root: Path) -> dict[str, Path]:
    modules = {}
    for path in root.rglob("*.py"):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The modules of `modules` that `name` imports anywhere (typing-only, inside a
    function, or at the top); `from package import module` counts the module."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name in modules}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            for alias in node.names:
                full = f"{base}.{alias.name}"
                found.add(full if full in modules else base)
    return (found & modules.keys()) - {name}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of `graph` with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in sorted(graph[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_theseus_core_has_no_import_cycle() -> None:
    """Before, seven training modules formed one cycle through typing-only imports of
    `BaseTrainer` (`_loop`, `_validation`, `_tandem`, `_inspection`, `_restore`,
    `evaluation` and `base`), and `quick` and `config` had one each."""
    modules = _modules(CORE)
    assert {"theseus.training.base", "theseus.training._loop", "theseus.job"} <= modules.keys()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    assert "theseus.training._loop" in graph["theseus.training.base"]  # the graph is real
    assert _cycles(graph) == []


def test_the_graph_finds_a_typing_only_cycle(tmp_path: Path) -> None:
    """The check itself, on a package made here: `a` imports `b`, `b` imports `a` only
    for typing."""
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from pkg import b\n")
    (package / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a import A\n"
    )
    modules = _modules(tmp_path)
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    assert _cycles(graph) == [["pkg.a", "pkg.b"]]


def test_every_module_of_theseus_training_is_under_500_lines() -> None:
    installed = Path(theseus.training.__file__).parent  # the sources, or a wheel made of them
    lengths = {path.name: len(path.read_text().splitlines()) for path in installed.rglob("*.py")}
    assert "base.py" in lengths and {n: k for n, k in lengths.items() if k >= 500} == {}


def test_the_loop_reads_top_to_bottom_on_one_screen() -> None:
    lines = inspect.getsource(TrainingLoop.run).splitlines()
    assert len(lines) <= 45, len(lines)
