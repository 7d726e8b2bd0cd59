"""The README's two opening commands are the ones CI and newcomers run."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _opening_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    block = re.search(r"```bash\n(.*?)```", text, re.S)
    assert block is not None, "README.md must open with a ```bash block of two commands"
    assert text.index("```bash") < text.index("\n## "), "the commands must come first"
    return [line for line in block.group(1).splitlines() if line.strip()]


def test_readme_opens_with_exactly_two_commands() -> None:
    commands = _opening_commands()
    assert len(commands) == 2, commands
    for command in commands:
        assert command.startswith("pip install uv && uv run "), command


def test_ci_runs_the_readme_test_command_verbatim() -> None:
    test_command = _opening_commands()[1]
    ci = (ROOT / ".ci" / "run").read_text()
    assert f"step tests bash -c '{test_command}'" in ci


def test_no_namespace_init_in_any_package() -> None:
    packages = sorted((ROOT / "packages").glob("*/src/theseus"))
    assert len(packages) == 4, packages
    for namespace in packages:
        assert not (namespace / "__init__.py").exists(), (
            f"{namespace} must stay a PEP 420 namespace"
        )
        assert any(namespace.glob("*/py.typed")), f"{namespace} has no py.typed marker"


def test_all_packages_share_one_version_and_pin_siblings() -> None:
    import tomllib

    versions = {}
    pins = []
    for pyproject in sorted((ROOT / "packages").glob("*/pyproject.toml")):
        project = tomllib.loads(pyproject.read_text())["project"]
        versions[project["name"]] = project["version"]
        pins += [dep for dep in project.get("dependencies", []) if dep.startswith("theseus-")]
    assert len(set(versions.values())) == 1, versions
    (version,) = set(versions.values())
    for pin in pins:
        assert re.fullmatch(rf"theseus-[a-z]+=={re.escape(version)}", pin), pin


def test_the_readme_commands_install_with_bytecode() -> None:
    """`uv run` installs the workspace with its bytecode written (uv's compile-bytecode),
    so on a machine whose Python does not write bytecode (PYTHONDONTWRITEBYTECODE, as on
    many clusters) a script does not compile jax, flax and seaborn again at every start."""
    import tomllib

    settings = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["uv"]
    assert settings.get("compile-bytecode") is True


def test_every_picture_the_readme_shows_is_in_the_repository() -> None:
    text = (ROOT / "README.md").read_text()
    pictures = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)
    assert pictures, "the README shows the store browser's screenshots"
    for picture in pictures:
        path = ROOT / picture
        assert path.is_file(), f"README.md shows {picture}, which is not in the repository"
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", f"{picture} is not a PNG"
