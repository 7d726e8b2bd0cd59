"""Fixtures of the accelerator set (loaded only under ``pytest --accelerator``).

The folder goes on ``sys.path`` so that the tests import ``_tolerances`` and ``_run`` by
name (pytest's importlib mode puts no test folder there).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
# A TPU VM's /tmp can be a network filesystem (9p, seen on the v5e hosts that ran the set):
# the store warns there, and warnings are errors. The set's stores are throwaway folders
# of one process, so the warning is not what it tests (the default suite tests it).
os.environ.setdefault("THESEUS_STORE_NETWORK_FS", "ok")
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))


@pytest.fixture(scope="session")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    """`(root, trainer)`: the shared run (`_run.py`) after its 50 steps."""
    import _run

    root = _run.prepare(tmp_path_factory.mktemp("accelerator"))
    return root, _run.train(root)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """The largest difference each kind of comparison showed (how close to its tolerance)."""
    tolerances = sys.modules.get("_tolerances")
    if tolerances is not None and tolerances.SEEN:
        terminalreporter.write_line(tolerances.seen_line())
