"""Record every open of a store database file by this process (test helper).

Put this folder on PYTHONPATH and set THESEUS_WATCH_DATABASE=ROOT/store/store.sqlite and
THESEUS_WATCH_LOG=FILE: each open (Python's `open`/`os.open`, `sqlite3.connect`) of the
database or its -wal/-shm/-journal files is appended to FILE as one line. The
multi-host tests check that no host other than zero ever opens it.
"""

import os
import sys

_database = os.environ.get("THESEUS_WATCH_DATABASE")
_log = os.environ.get("THESEUS_WATCH_LOG")

if _database and _log:
    _database = os.path.abspath(_database)

    def _watch(event: str, args: tuple) -> None:
        if event not in ("open", "sqlite3.connect") or not isinstance(
            args[0], str | bytes | os.PathLike
        ):
            return
        path = os.path.abspath(os.fsdecode(args[0]))
        if path.startswith(_database):
            with open(_log, "a") as out:  # the log is not the database: no recursion
                out.write(f"{event} {path}\n")

    sys.addaudithook(_watch)
