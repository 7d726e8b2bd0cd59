"""Where a root named on a command line (or in Python) lives: its Theseus root and its store.

A user names a store in three ways, and every command takes each of them:

- a Theseus root, the project folder (``ROOT``: ``ROOT/store``, ``ROOT/checkpoints``,
  ``ROOT/data``, ...);
- its store folder (``ROOT/store``, the folder that holds ``theseus-store.json``), or any
  other spelling of either (a trailing slash, ``./``, ``..``, a symlink);
- ``postgresql://USER@HOST:PORT/DB?files=DIR``, a PostgreSQL store whose files folder
  ``DIR`` is its Theseus root (``DIR/store`` holds the marker that names the database).

:func:`locate` alone decides which is which, before any folder is made, so that no
spelling makes a second store inside the first (``ROOT/store/store``) or a folder
named ``postgresql:``:

1. a URL is parsed (never taken for a path) and its files folder is the root;
2. a folder that holds the marker is a store folder; its root is the folder above it
   when the store folder is named ``store`` (as spelled, or once symlinks are
   resolved), else it is a store of its own (``Store("/some/folder")``) with no root;
3. a folder whose ``store/`` holds the marker is a root (a root named ``store`` that an
   earlier version made, ``store/store``, included);
4. where no store is yet, a folder named ``store`` is the store folder of the root above
   it, and any other folder is a root whose store is to be ``ROOT/store``.

Example:
    >>> import tempfile
    >>> from pathlib import Path
    >>> from theseus.store import Store, locate
    >>> root = Path(tempfile.mkdtemp())
    >>> Store(root / "store").close()
    >>> locate(root / "store").root == locate(root).root == root
    True
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from theseus.store._errors import NotAStoreError
from theseus.store._paths import canonical_path
from theseus.store._postgres._url import DatabaseURL, is_database_url
from theseus.store._root import MARKER, STORE_FOLDER

__all__ = ["FORMS", "Location", "bind_root", "locate"]

#: The forms a ROOT takes, as a command's help says them.
FORMS = (
    "a Theseus root folder, its store folder (ROOT/store), or "
    "postgresql://USER@HOST:PORT/DB?files=DIR (a PostgreSQL store whose files are in DIR)"
)


@dataclasses.dataclass(frozen=True)
class Location:
    """A located store.

    Attributes:
        root: the Theseus root (the folder that holds ``store/``, ``checkpoints/``,
            ``data/``), as spelled; None for a store folder of its own (one not named
            ``store``), which has no root.
        store: the store's folder (it holds ``theseus-store.json`` once the store exists).
        opens: what ``Store(...)`` opens: the URL as given (a password in it kept), else
            the store folder.
        exists: whether the store is there already (its marker is).
    """

    root: Path | None
    store: Path
    opens: str | Path
    exists: bool

    def theseus_root(self) -> Path:
        """The Theseus root; a store of its own, which has none, is a one-line error.

        Raises:
            NotAStoreError: the store folder is not named ``store`` (not a root's).
        """
        if self.root is None:
            raise NotAStoreError(
                f"{self.store} is a store folder of its own, not a Theseus root's (a root "
                f"keeps its store in ROOT/{STORE_FOLDER}, beside checkpoints/ and data/). Pass a "
                "Theseus root (a new folder starts one); theseus-store reads this store as it is."
            )
        return self.root


def locate(spelled: str | os.PathLike[str], *, create: bool = False) -> Location:
    """Where the store that ``spelled`` names lives (see the module's rules).

    Nothing is made for a folder. A URL's store is opened, to check that its folder and
    database belong together, and made (bound to the URL's files folder) if ``create``.

    Args:
        spelled: a Theseus root, a store folder, or a ``postgresql://`` URL.
        create: whether a store that is not there yet may be named (a command that
            starts one); else its absence is a one-line error.

    Raises:
        NotAStoreError: ``spelled`` is a file; or (``create=False``) no store is there;
            or a new folder ``store/store``, which could be either.
        StoreError: a malformed URL, or a server that does not answer (one line each).
    """
    if is_database_url(spelled):
        return _locate_url(str(spelled), create)
    path = Path(spelled)
    if path.exists() and not path.is_dir():
        raise NotAStoreError(
            f"{path} is a file, not a store folder or a Theseus root. Pass {FORMS}."
        )
    if (path / MARKER).is_file():
        return Location(_root_of(path), path, path, True)
    inner = path / STORE_FOLDER
    if (inner / MARKER).is_file():
        return Location(path, inner, inner, True)
    if not create:
        raise NotAStoreError(_absent(path))
    if path.name != STORE_FOLDER:
        return Location(path, inner, inner, False)
    if path.parent.name == STORE_FOLDER:
        raise NotAStoreError(
            f"{path} holds no store, and a new folder store/store could be a root named "
            f"'store' or that root's store folder. Pass {path.parent.parent} (the root), or "
            "name the root something other than 'store'."
        )
    return Location(path.parent, path, path, False)


def bind_root(root: str | os.PathLike[str], *, create: bool = True) -> Path:
    """The Theseus root that ``root`` names: the root itself, its store folder, or a URL.

    A URL is recognised before any path is made of it: its store is opened (made, and
    bound to the URL's files folder, if ``create``) and the files folder is returned; from
    there on the folder alone names the store (its marker names the database). A store
    folder gives the root that holds it, so no store is ever made inside a store.

    Raises:
        StoreError: a malformed URL or a server that does not answer (one line each).
        NotAStoreError: the files folder holds another store, or (``create=False``) none;
            a store folder of its own (not a root's).
    """
    return locate(root, create=create).theseus_root()


def _root_of(store: Path) -> Path | None:
    """The root above a store folder: its parent when it is named ``store``, as spelled or
    once symlinks are resolved; None for a store of its own."""
    if store.name == STORE_FOLDER:
        return store.parent
    real = canonical_path(store)
    return real.parent if real.name == STORE_FOLDER else None


def _absent(path: Path) -> str:
    """The one line for a folder that holds no store where one must be."""
    if not path.exists():
        return f"{path} does not exist. Pass {FORMS}, one that a run or an import wrote."
    return (
        f"{path} holds no store (no {MARKER} in it or in {path / STORE_FOLDER}). Pass {FORMS}, "
        "one that a run or an import wrote; this command does not create a store."
    )


def _locate_url(text: str, create: bool) -> Location:
    """A URL's files folder (its root) and store, opened to check they belong together."""
    from theseus.store._store import Store

    url = DatabaseURL.parse(text)
    assert url.files is not None  # parse() insists on it
    store = url.files / STORE_FOLDER
    if not create and not (store / MARKER).is_file():
        raise NotAStoreError(
            f"{url.shown} has no store with the files folder {url.files} (no "
            f"{store / MARKER}). Pass the URL and files folder a run or an import made "
            "(`theseus run ... URL` makes one)."
        )
    with Store(text, create=create):
        pass
    return Location(url.files, store, text, True)
