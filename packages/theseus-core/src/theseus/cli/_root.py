"""ROOT on the command line: a Theseus root, its store folder, or a PostgreSQL store's URL.

Every verb that takes a root takes it through :class:`RootPath`, which asks
``theseus.store.bind_root`` (``theseus.store.locate``'s rules, the same that
``theseus-store`` follows) for the Theseus root: ``ROOT`` and ``ROOT/store`` name the
same root, and ``postgresql://USER@HOST:PORT/DB?files=DIR`` is the folder DIR (``click.Path``
would have made it the relative folder ``postgresql:/...``). Nothing is made before the
verb runs but a URL's store where the verb creates one.

A root that cannot be one (a file, a store of its own, no store where one must be, a URL
whose server does not answer) raises the store's one-line error, which ``theseus``
prints as ``Error (NotAStoreError): ...``.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from theseus.store import bind_root

__all__ = ["EXISTING_ROOT", "ROOT", "ROOT_HELP", "RootPath", "root_argument", "with_root_help"]

F = TypeVar("F", bound=Callable[..., Any])

#: What every verb's --help says of ROOT.
ROOT_HELP = (
    "ROOT is a Theseus root folder or its store folder (ROOT/store), or "
    "postgresql://USER@HOST:PORT/DB?files=DIR for a PostgreSQL store whose files are in DIR."
)


class RootPath(click.ParamType):
    """A Theseus root: its folder, its store folder, or ``postgresql://...?files=DIR``.

    Args:
        create: the verb starts a store where there is none (``theseus run``, ``demo``,
            imports, ``data prepare``; a URL's store is made there and then); without it
            a root that holds no store is an error (``sample``, ``eval``).
    """

    name = "root"

    def __init__(self, create: bool = True) -> None:
        self.create = create

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Path:
        """The Theseus root ``value`` names.

        Raises:
            theseus.store.StoreError: one line: a file, a store of its own, no store
                (``create=False``), a bad URL or a server that does not answer.
        """
        return bind_root(value if isinstance(value, str) else os.fspath(value), create=self.create)


ROOT = RootPath(create=True)
EXISTING_ROOT = RootPath(create=False)


def root_argument(*, create: bool = True, **attrs: Any) -> Callable[[F], F]:
    """The ROOT argument of a verb, with :data:`ROOT_HELP` added to the verb's help.

    Args:
        create: as :class:`RootPath`'s.
        **attrs: passed to ``click.argument`` (``default=``, for example: the usage line
            then shows ``[ROOT]``, as optional).
    """

    def decorate(f: F) -> F:
        kind = ROOT if create else EXISTING_ROOT
        metavar = "[ROOT]" if "default" in attrs else "ROOT"
        return click.argument("root", metavar=metavar, type=kind, **attrs)(with_root_help(f))

    return decorate


def with_root_help(f: F) -> F:
    """Add :data:`ROOT_HELP` to the help of the verb ``f`` (below its ``@command``)."""
    f.__doc__ = f"{inspect.cleandoc(f.__doc__ or '')}\n\n{ROOT_HELP}"
    return f
