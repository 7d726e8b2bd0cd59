"""One module owns Flax's method interception: `theseus.model.hooks`.

The debugger, the analysis engine's forward and the inspector's Flax recorder all
listen through it; a second `nn.intercept_methods` in the sources (or a second restart
exception) would be a second copy of how a module call is named and replayed.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HOOKS = ROOT / "packages/theseus-core/src/theseus/model/hooks.py"


def _sources() -> list[Path]:
    packages = sorted((ROOT / "packages").glob("*/src"))
    assert len(packages) == 4, packages
    return sorted(path for src in packages for path in src.rglob("*.py"))


def test_intercept_methods_appears_in_exactly_one_source_module() -> None:
    found = [path for path in _sources() if "intercept_methods" in path.read_text()]
    assert found == [HOOKS], [str(path.relative_to(ROOT)) for path in found]


def test_one_restart_exception_and_core_never_imports_analysis() -> None:
    restarts = [
        path for path in _sources() if re.search(r"^class _Restart\b", path.read_text(), re.M)
    ]
    assert restarts == [HOOKS], [str(path.relative_to(ROOT)) for path in restarts]
    assert not re.search(r"^\s*(from|import) theseus\.analysis", HOOKS.read_text(), re.M)
