"""The store package's shape, read from its sources: sizes, imports, one place per backend.

- every module of theseus-store is under 500 lines;
- the modules of ``theseus.store`` import one another without a cycle, counting every
  import statement (at the top, inside a function, or under ``TYPE_CHECKING``): the
  graph is built from the sources with ``ast``, not from what Python happened to load;
- nothing outside the backends (``_sqlite.py``, the ``_postgres`` package and
  ``_backends.py``, the one module that chooses) asks which backend it has: no
  ``isinstance`` on a database, connection or dialect, no comparison of a dialect, no
  import of a backend's modules (a ``postgresql://`` URL's form, ``_postgres._url``,
  excepted: naming a root is not asking a backend), no ``sqlite3`` or ``psycopg``.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import theseus.store

# The sources of the package as installed: the workspace's src/ (an editable install) or
# a wheel's site-packages (nox -s isolated runs these tests away from the sources).
PACKAGE = Path(theseus.store.__file__).resolve().parent
SOURCES = PACKAGE.parents[1]
LIMIT = 500
BACKENDS = ("_sqlite.py", "_postgres/", "_backends.py")


def _modules() -> dict[str, Path]:
    """Dotted module name -> its file, for every module of the package."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(SOURCES).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules that ``name`` imports anywhere in its source.

    ``from a.b import c`` is an import of ``a.b.c`` where that is a module, and of ``a.b``
    for every other name it takes (Python imports a package's ``__init__`` before its
    submodules in every case, so that edge is left implicit).
    """
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name in modules)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            subs = {f"{source}.{a.name}" for a in node.names} & modules.keys()
            found.update(subs)
            if source in modules and len(subs) < len(node.names):
                found.add(source)
    found.discard(name)
    return found


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path that returns to its start, or None."""
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = 1
        path.append(module)
        for imported in sorted(graph[module]):
            if state.get(imported) == 1:
                return [*path[path.index(imported) :], imported]
            if imported not in state and (found := visit(imported)) is not None:
                return found
        path.pop()
        state[module] = 2
        return None

    for module in sorted(graph):
        if module not in state and (found := visit(module)) is not None:
            return found
    return None


def test_every_module_is_under_500_lines() -> None:
    sizes = {
        str(path.relative_to(SOURCES)): len(path.read_text().splitlines())
        for path in sorted(PACKAGE.rglob("*.py"))
    }
    assert len(sizes) > 40  # the walk found the package
    assert {p: n for p, n in sizes.items() if n >= LIMIT} == {}


def test_the_cycle_finder_finds_a_cycle_and_the_import_reader_a_typing_import() -> None:
    # the checks below are only as good as these two helpers
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None
    modules = _modules()
    reading = _imports("theseus.store._reading", modules["theseus.store._reading"], modules)
    assert {"theseus.store._query", "theseus.store._browse"} <= reading


def test_the_store_package_imports_without_a_cycle() -> None:
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    assert "theseus.store._postgres._database" in graph["theseus.store._backends"] | {
        m for m in graph["theseus.store._postgres"]
    }
    assert _cycle(graph) is None


def _outside_backends() -> dict[str, str]:
    return {
        str(path.relative_to(PACKAGE)): path.read_text()
        for path in sorted(PACKAGE.rglob("*.py"))
        if not str(path.relative_to(PACKAGE)).startswith(BACKENDS) and path.name != "_backend.py"
    }


#: What asking for a backend looks like in source text.
ASKING = {
    "isinstance on a database, connection or dialect": re.compile(
        r"isinstance\([^)]*(Database|Connection|Dialect|_db\b|dialect)"
    ),
    "a dialect compared": re.compile(
        r"dialect(\([^)]*\))?(\.name)?\s*(is|==|!=)\s|(==|!=|\bis)\s*[\w.]*dialect\b"
    ),
    "a backend's name": re.compile(
        r"\b(SQLITE|POSTGRES|SqliteDatabase|PostgresDatabase|PgConnection|SqliteConnection)\b"
    ),
    "a backend's module": re.compile(
        r"from theseus\.store\._(sqlite|postgres)(\._(?!url\b)\w+)?\s+import|"
        r"from theseus\.store import[^\n]*\b_(sqlite|postgres)\b"
    ),
    "a driver": re.compile(r"^\s*(import|from)\s+(sqlite3|psycopg)\b", re.MULTILINE),
}


def test_nothing_outside_the_backends_asks_which_backend_it_has() -> None:
    sources = _outside_backends()
    assert "_store.py" in sources and "ui/_data.py" in sources
    found = [
        f"{module}: {what}: {match.group(0)!r}"
        for module, text in sources.items()
        for what, pattern in ASKING.items()
        for match in pattern.finditer(text)
    ]
    assert found == []


def test_the_grep_sees_what_it_looks_for() -> None:
    # each pattern against a line that asks, so a pattern that matches nothing fails here
    asking = {
        "isinstance on a database, connection or dialect": "isinstance(self._db, PgDatabase)",
        "a dialect compared": "if dialect(conn) is SQLITE_D:",
        "a backend's name": "self._db = PostgresDatabase(url)",
        "a backend's module": "from theseus.store._postgres._database import X",
        "a driver": "import sqlite3\n",
    }
    for what, line in asking.items():
        assert ASKING[what].search(line), what
    assert not ASKING["a backend's module"].search("from theseus.store._postgres._url import X")
    assert not ASKING["a dialect compared"].search("d = dialect(conn)")
