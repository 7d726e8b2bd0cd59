"""One root for every error of the four packages, and no error class name defined twice.

The walk imports every module of theseus-plot, theseus-store, theseus-core and
theseus-analysis (a module whose optional extra is not installed is skipped, and named
in the skip list the first test checks is short), collects every exception class they
define, and checks each against `theseus.errors.TheseusError`. The reference is the
interpreter's own MRO (`issubclass`), not a list kept by the code under test. A second,
static walk reads every source file's class statements, so a class in a module that
could not be imported here still counts toward the unique names.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
from pathlib import Path

import pytest

from theseus.errors import TheseusError

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted((ROOT / "packages").glob("*/src"))

# Exceptions that are control flow, not errors: a user's `except TheseusError` must never
# swallow them. Each is named with its reason.
CONTROL_FLOW = {
    # SIGTERM's exit: a SystemExit, so it unwinds like `sys.exit` and `except Exception` passes it.
    "theseus.job._signals.Terminated",
    # The scheduler's warning signal: a Terminated whose exit code asks for a requeue.
    "theseus.job._signals.Preempted",
    # Ctrl-C's stop at a step boundary: a KeyboardInterrupt, as Ctrl-C raises anywhere else.
    "theseus.job._signals.Interrupted",
    # The hooks' private signals: stop a forward at the last listened call, restart it.
    "theseus.model.hooks._Stop",
    "theseus.model.hooks._Restart",
}


def _module_names() -> list[str]:
    names: list[str] = []
    for src in SOURCES:
        top = src / "theseus"
        for child in sorted(top.iterdir()):
            if not child.is_dir() or not (child / "__init__.py").exists():
                continue
            names.append(f"theseus.{child.name}")
            for info in pkgutil.walk_packages([str(child)], prefix=f"theseus.{child.name}."):
                if not info.name.endswith("__main__"):
                    names.append(info.name)
    return names


def _imported() -> tuple[list[object], list[str]]:
    modules, skipped = [], []
    for name in _module_names():
        try:
            modules.append(importlib.import_module(name))
        except ImportError as err:  # an optional extra (comet, torch, psycopg, ...) is missing
            missing = getattr(err, "name", None) or ""
            if missing.startswith("theseus"):
                raise
            skipped.append(f"{name} (needs {missing or err})")
    return modules, skipped


def _exception_classes() -> dict[str, type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    modules, _ = _imported()
    for module in modules:
        for _, value in inspect.getmembers(module, inspect.isclass):
            if issubclass(value, BaseException) and value.__module__.startswith("theseus."):
                found[f"{value.__module__}.{value.__qualname__}"] = value
    return found


def test_the_walk_imports_nearly_every_module() -> None:
    names = _module_names()
    modules, skipped = _imported()
    assert len(names) > 150 and len(modules) + len(skipped) == len(names), len(names)
    # Only optional extras may be missing; most of every package imports on a dev install.
    assert len(skipped) <= len(names) // 10, skipped


def test_every_error_class_derives_from_the_one_root() -> None:
    classes = _exception_classes()
    errors = {
        name: cls
        for name, cls in classes.items()
        if not issubclass(cls, Warning) and name not in CONTROL_FLOW
    }
    # Each package's errors are among them (the walk saw all four packages).
    for package in ("theseus.plot", "theseus.store", "theseus.config", "theseus.analysis"):
        assert any(name.startswith(package) for name in errors), package
    orphans = sorted(name for name, cls in errors.items() if not issubclass(cls, TheseusError))
    assert orphans == [], orphans
    for name in CONTROL_FLOW:
        assert name in classes, f"{name} is gone: drop it from CONTROL_FLOW"
        assert not issubclass(classes[name], TheseusError), name


def test_no_error_class_name_is_defined_twice() -> None:
    classes = _exception_classes()
    by_name: dict[str, list[str]] = {}
    for where, cls in classes.items():
        by_name.setdefault(cls.__name__, []).append(where)
    twice = {name: where for name, where in by_name.items() if len(where) > 1}
    assert twice == {}, twice


def _defined_exception_names(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ClassDef):
            bases = [ast.unparse(base) for base in node.bases]
            if any(base.endswith(("Error", "Exception", "Exit", "Warning")) for base in bases):
                names.append(node.name)
    return names


def test_no_error_class_name_is_written_twice_in_the_sources() -> None:
    where: dict[str, list[str]] = {}
    for src in SOURCES:
        for path in sorted(src.rglob("*.py")):
            for name in _defined_exception_names(path):
                where.setdefault(name, []).append(str(path.relative_to(ROOT)))
    assert len(where) > 50, len(where)
    twice = {name: paths for name, paths in where.items() if len(paths) > 1}
    assert twice == {}, twice


@pytest.mark.parametrize(
    ("name", "builtin"),
    [
        ("theseus.store.StoreError", RuntimeError),
        ("theseus.store.MissingBlobError", FileNotFoundError),
        ("theseus.store.UnknownNodeError", KeyError),
        ("theseus.store.UnknownKeyError", KeyError),
        ("theseus.config.UnknownKeyError", AttributeError),
        ("theseus.config.ConfigError", ValueError),
        ("theseus.plot.PlotValueError", ValueError),
        ("theseus.plot.PlotTypeError", TypeError),
        ("theseus.data.DataNotPreparedError", FileNotFoundError),
    ],
)
def test_builtin_bases_stay(name: str, builtin: type[BaseException]) -> None:
    module, _, attr = name.rpartition(".")
    cls = getattr(importlib.import_module(module), attr)
    assert issubclass(cls, builtin) and issubclass(cls, TheseusError), cls.__mro__


# Classes no caller told apart, folded into the class callers catch; each old name is
# that class itself, so `except OLD` and `isinstance(err, OLD)` hold for what is raised now.
@pytest.mark.parametrize(
    ("old", "new", "builtin"),
    [
        ("theseus.job.HostZeroError", "theseus.job.JobError", RuntimeError),
        ("theseus.job.ClusterJoinError", "theseus.job.JobError", RuntimeError),
        ("theseus.job.JobTypeError", "theseus.job.JobError", RuntimeError),
        ("theseus.training.CheckpointMismatchError", "theseus.training.TrainerError", ValueError),
        ("theseus.model.loss.LossInputError", "theseus.model.ModelInputError", ValueError),
    ],
)
def test_folded_names_catch_what_is_raised_now(
    old: str, new: str, builtin: type[BaseException]
) -> None:
    def named(name: str) -> type[BaseException]:
        module, _, attr = name.rpartition(".")
        return getattr(importlib.import_module(module), attr)

    alias, cls = named(old), named(new)
    assert alias is cls, (alias, cls)
    assert issubclass(cls, builtin) and issubclass(cls, TheseusError), cls.__mro__
    with pytest.raises(alias):
        raise cls("raised under the new name")
