"""`program(name)`: how the user's shell calls a program of this environment afterwards.

Checked with real files: folders of executable scripts, PATH, the interpreter's folder
and the running command's script set per case, and the printed word resolved the way a
shell resolves it (a plain name through PATH, a path as it is)."""

from __future__ import annotations

import shlex
import shutil
import sys
from pathlib import Path

import pytest

from theseus.cli._next import program


def _script(folder: Path, name: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(0o755)
    return path


def _resolved(printed: str, path: str) -> str | None:
    """Which file a shell runs for the printed command, with PATH = `path`."""
    (word,) = shlex.split(printed)
    return shutil.which(word, path=path) if "/" not in word else word


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv("UV_RUN_RECURSION_DEPTH", raising=False)
    monkeypatch.setattr(sys, "executable", str(tmp_path / "venv" / "bin" / "python3"))
    monkeypatch.setattr(sys, "argv", [str(tmp_path / "elsewhere" / "pytest")])
    return tmp_path


def test_started_by_uv_run_it_is_uv_run(world: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UV_RUN_RECURSION_DEPTH", "1")
    monkeypatch.delenv("VIRTUAL_ENV", raising=False)
    assert program("theseus-store") == "uv run theseus-store"


def test_outside_the_project_uv_run_names_it(world: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`uv run --project DIR theseus ...` from another folder: pasted there, a plain
    `uv run theseus` finds no project ("Failed to spawn: theseus"), as a new user met."""
    project = world / "my project"
    (project / ".venv").mkdir(parents=True)
    (project / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    (project / "sub").mkdir()
    monkeypatch.setenv("UV_RUN_RECURSION_DEPTH", "1")
    monkeypatch.setenv("VIRTUAL_ENV", str(project / ".venv"))
    monkeypatch.chdir(world)
    assert program("theseus") == f"uv run --project '{project}' theseus"
    for inside in (project, project / "sub"):
        monkeypatch.chdir(inside)
        assert program("theseus") == "uv run theseus"
    (project / "pyproject.toml").unlink()  # an environment that is no project's: as before
    monkeypatch.chdir(world)
    assert program("theseus") == "uv run theseus"


def test_the_plain_name_where_path_finds_this_environments_program(
    world: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mine = _script(world / "venv" / "bin", "theseus-store")
    path = f"{world / 'venv' / 'bin'}:/usr/bin"
    monkeypatch.setenv("PATH", path)
    printed = program("theseus-store")
    assert printed == "theseus-store" and _resolved(printed, path) == str(mine)


def test_the_full_path_where_path_finds_another_or_none(
    world: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mine = _script(world / "a b" / "bin", "theseus-store")  # a space: quoted
    monkeypatch.setattr(sys, "executable", str(world / "a b" / "bin" / "python3"))
    other = _script(world / "other", "theseus-store")
    for path in (str(other.parent), "/nonexistent"):
        monkeypatch.setenv("PATH", path)
        printed = program("theseus-store")
        assert printed == shlex.quote(str(mine)) and _resolved(printed, path) == str(mine)


def test_an_install_with_pip_target_is_found_beside_the_running_command(
    world: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A TPU host: `pip install --target SITE`, SITE/bin on PATH, the host's python3
    (whose folder holds no theseus-store). The demo printed that folder's path, which
    did not exist there."""
    site = world / "site" / "bin"
    running = _script(site, "theseus")
    mine = _script(site, "theseus-store")
    monkeypatch.setattr(sys, "argv", [str(running), "demo"])
    monkeypatch.setattr(sys, "executable", str(_script(world / "host" / "bin", "python3")))
    path = f"{site}:{world / 'host' / 'bin'}"
    monkeypatch.setenv("PATH", path)
    printed = program("theseus-store")
    assert printed == "theseus-store" and _resolved(printed, path) == str(mine)
    monkeypatch.setenv("PATH", str(world / "host" / "bin"))  # SITE/bin not exported
    assert program("theseus-store") == shlex.quote(str(mine))


def test_the_plain_name_where_no_folder_of_this_environment_holds_it(
    world: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    assert program("theseus-store") == "theseus-store"
