"""Registries that map names to classes: ``JOBS``, ``ANALYSES``, ``DATASETS``.

``@job("name")`` registers a job class, ``@analysis("name")`` an analysis (and,
with it, a job of the same name), ``@dataset("name")`` a dataset for
``theseus data prepare``. Built-in entries are registered lazily, by importing
the modules in ``BUILTIN_MODULES`` that exist and, for jobs and analyses, the modules
other installed packages name in the ``theseus.jobs`` entry-point group (theseus-analysis
names its library of analyses there), on the first lookup of a name that is not
registered yet (or the first listing). User modules are loaded with
:func:`import_module_or_file` (``--import`` on the command line).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from collections.abc import Callable, Iterator, Mapping
from importlib.metadata import entry_points
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol, TypeVar

from theseus.config._errors import suggest
from theseus.errors import TheseusError

__all__ = [
    "ANALYSES",
    "BUILTIN_MODULES",
    "DATASETS",
    "JOBS",
    "JOB_ENTRY_POINTS",
    "ImportFailedError",
    "PreparableDataset",
    "Registry",
    "RegistryError",
    "UnknownNameError",
    "analysis",
    "dataset",
    "import_module_or_file",
    "job",
    "job_key",
    "resolve_job",
]

T = TypeVar("T", bound=type)

# Modules whose import registers the built-in jobs and datasets (when they exist).
BUILTIN_MODULES = ("theseus.experiments", "theseus.data.datasets")
# The entry-point group of modules other packages register jobs and analyses in
# (`[project.entry-points."theseus.jobs"]`; each entry's value a module to import).
JOB_ENTRY_POINTS = "theseus.jobs"


class PreparableDataset(Protocol):
    """What ``theseus data prepare NAME`` needs of a class registered with ``@dataset``."""

    @classmethod
    def prepare(cls, root: Path, **options: Any) -> Any:
        """Write the prepared dataset under ``root`` (options come from ``--name value``)."""
        ...


class RegistryError(TheseusError, ValueError):
    """A name registered twice with different classes, or another misuse of a registry."""


class UnknownNameError(RegistryError, KeyError):
    """A lookup of a name that nothing registered (a ``KeyError`` too)."""

    def __str__(self) -> str:  # KeyError would quote the message.
        return str(self.args[0]) if self.args else ""


class ImportFailedError(RegistryError, ImportError):
    """``--import`` named a module or file that could not be imported."""


def _same(a: type, b: type) -> bool:
    # Re-importing a module (or re-running a file) makes a new class object with the same name.
    return a is b or (a.__module__, a.__qualname__) == (b.__module__, b.__qualname__)


class Registry(Mapping[str, type]):
    """A name-to-class mapping that loads the built-in modules on first lookup.

    Args:
        kind: what it holds, for messages (``"job"``).
        builtins: modules imported (when importable) before the first lookup.
        hint: the last sentence of an unknown-name error (how to fix it).
        plugins: an entry-point group whose modules are imported with the built-ins.
    """

    def __init__(
        self,
        kind: str,
        builtins: tuple[str, ...] = BUILTIN_MODULES,
        hint: str = "If it is yours, import its module first (Python: import it; "
        "command line: --import MODULE_OR_FILE).",
        plugins: str | None = None,
    ) -> None:
        self.kind = kind
        self.hint = hint
        self._builtins = builtins
        self._plugins = plugins
        self._loaded = False
        self._entries: dict[str, type] = {}

    def register(self, name: str, cls: type) -> None:
        """Register ``cls`` under ``name``.

        Raises:
            RegistryError: ``name`` is not a non-empty string, or it is taken by a
                different class.
        """
        if not isinstance(name, str) or not name.strip():
            raise RegistryError(
                f"A {self.kind} name must be a non-empty string like 'my/gpt/train'; got {name!r}."
            )
        taken = self._entries.get(name)
        if taken is not None and not _same(taken, cls):
            raise RegistryError(
                f"The {self.kind} name {name!r} is already registered to "
                f"{taken.__module__}.{taken.__qualname__}; cannot register "
                f"{cls.__module__}.{cls.__qualname__} under it. Choose another name."
            )
        self._entries[name] = cls

    def _load_builtins(self) -> None:
        if self._loaded:
            return
        self._loaded = True
        for module in self._builtins:
            try:
                found = importlib.util.find_spec(module) is not None
            except ModuleNotFoundError:  # a parent package does not exist
                found = False
            if found:
                importlib.import_module(module)
        if self._plugins is not None:
            for entry in entry_points(group=self._plugins):
                try:
                    entry.load()
                except Exception as exc:
                    raise ImportFailedError(
                        f"The {self._plugins!r} entry point {entry.name!r} of "
                        f"{entry.dist.name if entry.dist else 'an installed package'} names "
                        f"{entry.value!r}, whose import raised {type(exc).__name__}: {exc}. "
                        "Reinstall that package, or uninstall it."
                    ) from exc

    def __getitem__(self, name: str) -> type:
        if name in self._entries:  # registered already: no need to import the built-ins
            return self._entries[name]
        self._load_builtins()
        try:
            return self._entries[name]
        except KeyError:
            known = sorted(self._entries)
            listing = ", ".join(known) if known else "none"
            raise UnknownNameError(
                f"No {self.kind} is registered as {name!r}.{suggest(name, known)} Registered: "
                f"{listing}. {self.hint}"
            ) from None

    def __iter__(self) -> Iterator[str]:
        self._load_builtins()
        return iter(sorted(self._entries))

    def __len__(self) -> int:
        self._load_builtins()
        return len(self._entries)

    def __contains__(self, name: object) -> bool:
        self._load_builtins()
        return name in self._entries

    def name_of(self, cls: type) -> str | None:
        """Return the name ``cls`` is registered under, or ``None``."""
        for name, registered in self._entries.items():
            if registered is cls:
                return name
        return None

    def unregister(self, name: str) -> None:
        """Remove ``name`` (for tests and interactive sessions); unknown names are ignored."""
        self._entries.pop(name, None)


JOBS = Registry("job", plugins=JOB_ENTRY_POINTS)
ANALYSES = Registry("analysis", plugins=JOB_ENTRY_POINTS)
DATASETS = Registry(
    "dataset",
    hint="Prepare one of those (`theseus data prepare NAME --root ROOT`), or register "
    "yours with @dataset(NAME) and load it with --import MODULE_OR_FILE.",
)


def _decorator(registries: tuple[Registry, ...], name: str) -> Callable[[T], T]:
    def register(cls: T) -> T:
        if not isinstance(cls, type):
            raise RegistryError(f"@{registries[0].kind}({name!r}) decorates a class; got {cls!r}.")
        for registry in registries:
            registry.register(name, cls)
        return cls

    return register


def job(name: str) -> Callable[[T], T]:
    """Class decorator: register a job under ``name`` (``@job("my/gpt/train")``).

    Raises:
        RegistryError: the name is taken by a different class.
    """
    return _decorator((JOBS,), name)


def analysis(name: str) -> Callable[[T], T]:
    """Class decorator: register an analysis under ``name``, and a job of the same name.

    Raises:
        RegistryError: the name is taken by a different class in either registry.
    """
    return _decorator((ANALYSES, JOBS), name)


def dataset(name: str) -> Callable[[T], T]:
    """Class decorator: register a dataset for ``theseus data prepare NAME``.

    The class must provide ``prepare(root, **options)`` callable on the class
    (a classmethod or staticmethod).
    """
    return _decorator((DATASETS,), name)


def job_key(cls: type) -> str:
    """The name a job class is recorded under: its registry name, else ``module:QualName``."""
    return JOBS.name_of(cls) or f"{cls.__module__}:{cls.__qualname__}"


def resolve_job(name_or_class: str | type) -> type:
    """Return the job class for a registry name, a ``module:QualName`` key, or a class.

    Raises:
        UnknownNameError: no such job (no registered name, or the module has no such class).
        ImportFailedError: the module of a ``module:QualName`` key failed to import; the
            message carries the real error (a missing module, or one the module raised).
        RegistryError: ``QualName`` names something that is not a class.
    """
    if isinstance(name_or_class, type):
        return name_or_class
    if not isinstance(name_or_class, str):
        raise RegistryError(
            f"expected a job: a registered name (a str, as `theseus jobs` lists them), a "
            f"'module:QualName' key or a job class; got {type(name_or_class).__name__} "
            f"{name_or_class!r}"
        )
    if ":" not in name_or_class or name_or_class in JOBS:
        return JOBS[name_or_class]
    module, _, qualname = name_or_class.partition(":")
    try:
        obj: Any = importlib.import_module(module)
    except Exception as exc:
        absent = exc.name if isinstance(exc, ModuleNotFoundError) else None
        missing = absent is not None and (module == absent or module.startswith(f"{absent}."))
        cause = (
            f"there is no module {absent!r} in this environment"
            if missing
            else f"importing {module!r} raised {type(exc).__name__}: {exc}"
        )
        raise ImportFailedError(
            f"Job {name_or_class!r}: {cause}. "
            + (
                "Check the module name, or --import the file that defines the job."
                if missing
                else "Fix the module (pass --debug for the traceback)."
            )
        ) from exc
    for depth, part in enumerate(qualname.split(".")):
        if not hasattr(obj, part):
            where = ".".join([module, *qualname.split(".")[:depth]])
            names = [n for n in dir(obj) if not n.startswith("_")]
            raise UnknownNameError(
                f"Job {name_or_class!r}: {where} has no attribute {part!r}.{suggest(part, names)}"
            )
        obj = getattr(obj, part)
    if not isinstance(obj, type):
        raise RegistryError(
            f"Job {name_or_class!r} names {obj!r}, which is not a class; name the job class."
        )
    return obj


def _importable_as(path: Path) -> str | None:
    """The file's stem, when `import <stem>` would load exactly this file; else None."""
    stem = path.stem
    if not stem.isidentifier():
        return None
    loaded = sys.modules.get(stem)
    if loaded is not None:
        origin = getattr(loaded, "__file__", None)
        return stem if origin and Path(origin).resolve() == path else None
    try:
        spec = importlib.util.find_spec(stem)
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin is None:
        return None
    return stem if Path(spec.origin).resolve() == path else None


def import_module_or_file(target: str) -> ModuleType:
    """Import a module by dotted name, or a Python file by path, to run its registrations.

    A file's folder is put on ``sys.path`` (so it can import its neighbours) and
    the file is imported as the module of its stem (``my_jobs.py`` as ``my_jobs``)
    when that name loads exactly this file; otherwise under a stable name derived
    from its absolute path. Importing it twice does not register anything twice.

    Args:
        target: ``"my_pkg.jobs"`` or ``"path/to/jobs.py"``.

    Returns:
        The imported module.

    Raises:
        ImportFailedError: the file does not exist or the import raised.
    """
    path = Path(target)
    if target.endswith(".py") or path.exists():
        path = path.resolve()
        if not path.is_file():
            raise ImportFailedError(
                f"--import {target!r}: no such file. Pass a Python file that exists or a "
                "dotted module name importable from the current environment."
            )
        if str(path.parent) not in sys.path:
            sys.path.insert(0, str(path.parent))
        by_stem = _importable_as(path)
        if by_stem is not None:
            # `my_jobs.py` becomes module `my_jobs`, so its classes have the same job key
            # (`my_jobs:Class`) from the command line as from Python.
            try:
                return importlib.import_module(by_stem)
            except Exception as exc:
                sys.modules.pop(by_stem, None)
                raise ImportFailedError(
                    f"Importing {str(path)!r} raised {type(exc).__name__}: {exc}. Fix the file "
                    "(run it with python to see the traceback, or pass --debug)."
                ) from exc
        digest = hashlib.sha1(str(path).encode()).hexdigest()[:8]
        name = f"theseus_user_{path.stem.replace('-', '_')}_{digest}"
        if name in sys.modules:
            return sys.modules[name]
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except Exception as exc:
            del sys.modules[name]
            raise ImportFailedError(
                f"Importing {str(path)!r} raised {type(exc).__name__}: {exc}. Fix the file "
                "(run it with python to see the traceback, or pass --debug)."
            ) from exc
        return module
    try:
        return importlib.import_module(target)
    except ImportError as exc:
        raise ImportFailedError(
            f"--import {target!r}: {exc}. Pass a dotted module name importable from this "
            "environment, or the path of a .py file."
        ) from exc
