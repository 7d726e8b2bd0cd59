"""The foundations import without JAX, so `theseus --help` and `theseus jobs PREFIX` start fast."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


def test_foundation_modules_do_not_import_jax() -> None:
    code = (
        "import sys\n"
        "import theseus.config, theseus.registry, theseus.job, theseus.quick, theseus.cli\n"
        "heavy = sorted(m for m in ('jax', 'flax', 'optax', 'orbax') if m in sys.modules)\n"
        "print(','.join(heavy))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == ""


@pytest.mark.parametrize(
    "name",
    ["theseus.data", "theseus.model", "theseus.training", "theseus.registry", "theseus.job"],
)
def test_each_public_area_lists_its_api_and_every_name_resolves(name: str) -> None:
    import importlib

    module = importlib.import_module(name)
    missing = [n for n in module.__all__ if not hasattr(module, n)]
    assert not missing, f"{name}.__all__ names {missing}, which it does not define"
    assert len(set(module.__all__)) == len(module.__all__)
    folder = Path(module.__file__).parent  # type: ignore[arg-type]
    assert (folder / "py.typed").is_file(), f"{name} ships no py.typed marker"


def test_every_public_error_class_has_the_one_root() -> None:
    import importlib

    from theseus.errors import TheseusError

    areas = ["config", "registry", "job", "quick", "cli", "data", "model", "training"]
    errors = {
        f"theseus.{area}.{name}": getattr(importlib.import_module(f"theseus.{area}"), name)
        for area in areas
        for name in importlib.import_module(f"theseus.{area}").__all__
        if name.endswith("Error")
    }
    assert len(errors) >= 20, sorted(errors)
    rootless = [name for name, cls in errors.items() if not issubclass(cls, TheseusError)]
    assert not rootless, f"not TheseusError subclasses: {rootless}"
    # and each still refines the built-in it always was, so `except ValueError` keeps working
    from theseus.config import ConfigError
    from theseus.data import DataNotPreparedError
    from theseus.model import UnknownArgumentError

    assert issubclass(ConfigError, ValueError)
    assert issubclass(DataNotPreparedError, FileNotFoundError)
    assert issubclass(UnknownArgumentError, KeyError)
