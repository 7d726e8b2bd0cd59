"""Test environment shared by every package's tests.

Sets four virtual CPU devices before JAX is imported, keeps matplotlib off any
display, and skips tests of optional extras that are not installed; warnings are
errors (pyproject.toml).
"""

from __future__ import annotations

import importlib.util
import os

import pytest

os.environ.setdefault("JAX_PLATFORMS", "cpu")
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
    ).strip()
# Matplotlib must never try to open a window in tests.
os.environ.setdefault("MPLBACKEND", "Agg")

_OPTIONAL = {
    "torch": "torch",
    "equinox": "equinox",
    "safetensors": "safetensors",
    "treescope": "treescope",
    "comet": "comet_ml",
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip tests marked with an optional extra whose package is absent."""
    for item in items:
        for marker, module in _OPTIONAL.items():
            if item.get_closest_marker(marker) and importlib.util.find_spec(module) is None:
                item.add_marker(pytest.mark.skip(reason=f"{module} is not installed"))
