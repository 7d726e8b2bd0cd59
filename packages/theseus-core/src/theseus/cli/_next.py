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
    command is prefixed with `uv run` (and `--project DIR` where the shell is outside
    the project uv ran: `uv run --project DIR` from another folder). Otherwise `name` is
    looked for where this environment keeps its programs (`_script_folders`): the plain
    name is printed when PATH finds that one, its full path (quoted) when PATH finds
    another or none, and the plain name where neither folder holds it.
    """
    if os.environ.get("UV_RUN_RECURSION_DEPTH"):
        return " ".join(["uv", "run", *_uv_project(), name])
    found = shutil.which(name)
    for folder in _script_folders():
        here = folder / name
        if here.is_file() and os.access(here, os.X_OK):
            same = found is not None and os.path.samefile(found, here)
            return name if same else shlex.quote(str(here))
    return name


def _uv_project() -> list[str]:
    """`--project DIR` (quoted) where the current folder is outside the project whose
    environment `uv run` started this process in (`VIRTUAL_ENV`, the project's `.venv`):
    pasted here, a plain `uv run` would look for a project from this folder up and not
    find that one. None where it is inside, or where the environment is not a project's."""
    venv = os.environ.get("VIRTUAL_ENV")
    project = Path(venv).parent.resolve() if venv else None
    if project is None or not (project / "pyproject.toml").is_file():
        return []
    here = Path.cwd().resolve()
    if here == project or project in here.parents:
        return []
    return ["--project", shlex.quote(str(project))]


def _script_folders() -> list[Path]:
    """Where this environment's programs are: beside the running command's own script
    first (`pip install --target DIR` puts them in `DIR/bin`, not beside the
    interpreter, as `tools/tpu/install.sh` does on a TPU host), then beside the
    interpreter (a virtual environment's `bin`)."""
    folders = []
    started = Path(sys.argv[0]) if sys.argv and sys.argv[0] else None
    if started is not None and started.name.startswith("theseus") and started.is_file():
        folders.append(started.absolute().parent)
    folders.append(Path(sys.executable).parent)
    return folders


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
