"""A PostgreSQL store's URL: ``postgresql://USER@HOST:PORT/DB?files=/shared/folder``.

The URL says how to reach the database (psycopg connects with it, a password included)
and where the store's files go (``files``: a folder every host sees). What is printed,
and what a store's marker records, is the URL without its password and without
``files`` (:attr:`DatabaseURL.shown`).
"""

from __future__ import annotations

import os
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

from theseus.store._errors import StoreError

__all__ = ["SCHEMES", "DatabaseURL", "is_database_url"]

SCHEMES = ("postgresql://", "postgres://")
_FORM = "postgresql://USER@HOST:PORT/DB?files=/shared/folder"


def is_database_url(root: object) -> bool:
    """Whether ``root`` is a database URL (``postgresql://...``) rather than a folder."""
    return isinstance(root, str) and root.lower().startswith(SCHEMES)


@dataclass(frozen=True)
class DatabaseURL:
    """A parsed ``postgresql://`` URL.

    Attributes:
        conninfo: what psycopg connects with (the URL without ``files``; a password kept).
        shown: the URL without its password and without ``files``: what is printed
            and what the store's marker records.
        files: the folder of the store's files (absolute), or None where the URL has none.
    """

    conninfo: str
    shown: str
    files: Path | None

    @classmethod
    def parse(cls, text: str, *, need_files: bool = True) -> DatabaseURL:
        """Parse ``text``; a missing database name or ``files`` folder is a one-line error.

        Raises:
            StoreError: naming what is missing and the expected form.
        """
        parts = urllib.parse.urlsplit(text)
        query = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
        files = [v for k, v in query if k == "files"]
        rest = [(k, v) for k, v in query if k != "files"]
        netloc = parts.netloc
        hidden = netloc
        if "@" in netloc:
            userinfo, host = netloc.rsplit("@", 1)
            user = userinfo.split(":", 1)[0]
            hidden = f"{user}@{host}"
        shown_query = urllib.parse.urlencode(rest)
        shown = urllib.parse.urlunsplit(("postgresql", hidden, parts.path, shown_query, ""))
        if not parts.path.strip("/"):
            raise StoreError(f"The store URL {shown} names no database; expected {_FORM}.")
        if need_files and (not files or not files[-1]):
            raise StoreError(
                f"The store URL {shown} has no files folder; expected {_FORM} (a folder "
                "every host sees, for checkpoints and large artifacts)."
            )
        folder = None
        if files and files[-1]:
            folder = Path(os.path.expanduser(files[-1]))
            if not folder.is_absolute():
                raise StoreError(
                    f"The files folder of {shown} is {files[-1]!r}, a relative path; give an "
                    f"absolute one ({_FORM})."
                )
        conninfo = urllib.parse.urlunsplit(
            ("postgresql", netloc, parts.path, urllib.parse.urlencode(rest), "")
        )
        return cls(conninfo, shown, folder)

    @property
    def user(self) -> str:
        """The user the URL names ("" where it names none: libpq's default user)."""
        netloc = urllib.parse.urlsplit(self.shown).netloc
        return netloc.rsplit("@", 1)[0] if "@" in netloc else ""

    def as_user(self, user: str) -> str:
        """:attr:`shown` with ``user`` as its user (the place the same, the spelling of the
        user filled in)."""
        parts = urllib.parse.urlsplit(self.shown)
        host = parts.netloc.rsplit("@", 1)[-1]
        netloc = f"{urllib.parse.quote(user, safe='')}@{host}" if user else host
        return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, parts.query, ""))
