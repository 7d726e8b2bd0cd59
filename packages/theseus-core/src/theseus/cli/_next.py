"""What to type next: the exact `theseus` commands a verb prints, quoted for a shell.

A verb that ends by saying what comes next (a stopped run's resume, an import's
analysis) prints a command that can be pasted as it is: the real run name, lineage and
paths (absolute, each quoted with `shlex.quote`), and the `--import` targets this
invocation was given, never a template such as `theseus run NAME ...`.

Each starts with `theseus` as the user's shell calls it afterwards (`program`):
`uv run theseus` where `uv run` started this command.

Example:
    >>> command("run", "my run", "/tmp/a b/c.yaml", "--resume", "p.g.r~abcd1234")  # doctest: +ELLIPSIS
    "...theseus run 'my run' '/tmp/a b/c.yaml' --resume 'p.g.r~abcd1234'"
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from pathlib import Path

import click

from theseus.cli._app import IMPORTS

__all__ = ["command", "imports", "program", "resume_command"]


def program(name: str) -> str:
    """How the user's shell calls `name`, a program of this environment, afterwards.

    Started by `uv run`, the environment is on PATH only for this process, so the
    command is prefixed with `uv run`; otherwise the plain name is printed when it
    resolves to this environment's program, and its full path (quoted) when it does not.
    """
    if os.environ.get("UV_RUN_RECURSION_DEPTH"):
        return f"uv run {name}"
    here = Path(sys.executable).parent / name
    return name if shutil.which(name) == str(here) else shlex.quote(str(here))


def command(*words: str | os.PathLike[str]) -> str:
    """`theseus` as the shell calls it (`program`) followed by `words`, each quoted for a
    POSIX shell where it needs it."""
    return " ".join([program("theseus"), shlex.join(os.fspath(word) for word in words)])


def imports() -> list[str]:
    """`--import TARGET` for each target this invocation imported (a file as an absolute
    path, so the command works from any folder); empty outside a command."""
    context = click.get_current_context(silent=True)
    targets = context.meta.get(IMPORTS, []) if context is not None else []
    found = [str(Path(t).resolve()) if Path(t).is_file() else t for t in targets]
    return [word for target in found for word in ("--import", target)]


def resume_command(run: str, config: Path, root: Path, lineage: str) -> str:
    """The command that continues `lineage` (`name~nonce`) of run `run` from its latest
    checkpoint, as `theseus run` was started (its saved configuration holds the
    overrides it was given)."""
    return command(
        "run", run, Path(config).resolve(), Path(root).resolve(), "--resume", lineage, *imports()
    )
