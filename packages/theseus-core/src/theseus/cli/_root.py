"""ROOT on the command line: a folder, or a PostgreSQL store's URL read before any path.

``click.Path`` would turn ``postgresql://USER@HOST:PORT/DB?files=DIR`` into the relative
folder ``postgresql:/USER@HOST:PORT/DB?files=DIR``. :class:`RootPath` recognises the URL
first and gives the folder DIR (``theseus.store.bind_root``: the store is opened there,
made and bound to the database where ``create``); a folder is checked as ``click.Path``
checks it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from theseus.store import StoreError, bind_root, is_database_url

__all__ = ["EXISTING_ROOT", "ROOT", "RootPath"]


class RootPath(click.ParamType):
    """A Theseus root: a folder (not a file), or ``postgresql://...?files=DIR``.

    Args:
        create: make the store a URL names when it has none (``theseus run``, ``demo``,
            imports); without it such a URL is an error (``sample``, ``eval``).
    """

    name = "root"

    def __init__(self, create: bool = True) -> None:
        self.create = create
        self._folder = click.Path(file_okay=False, path_type=Path)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Path:
        if isinstance(value, Path):
            return value
        if is_database_url(value):
            try:
                return bind_root(value, create=self.create)
            except StoreError as err:
                self.fail(str(err), param, ctx)
        return Path(self._folder.convert(value, param, ctx))


ROOT = RootPath(create=True)
EXISTING_ROOT = RootPath(create=False)
