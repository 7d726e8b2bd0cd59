"""Test environment shared by every package's tests.

Sets four virtual CPU devices before JAX is imported, compiles without most of XLA's
optimizations, keeps matplotlib off any display, gives the test process a compilation
cache of its own, and skips tests of optional extras that are not installed; warnings
are errors (pyproject.toml).

``pytest --slurm`` (nox's ``slurm`` session) runs only the tests marked ``slurm``, on a
private one-node SLURM cluster that the ``slurm_cluster`` fixture starts once for the
session (``tests/_slurm_cluster.py``); without it those tests are left out.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("JAX_PLATFORMS", "cpu")
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
    ).strip()
# Matplotlib must never try to open a window in tests.
os.environ.setdefault("MPLBACKEND", "Agg")
# Compile for the tests' tiny programs, not for speed: JAX's own switch (LLVM at -O0,
# XLA's expensive passes off) halves the CPU time of each compilation, which is most of
# the suite's time; the programs, their shardings and IEEE float semantics are unchanged
# (every tolerance in the suite holds either way). Exported, so the `theseus` processes
# tests start inherit it. `JAX_DISABLE_MOST_OPTIMIZATIONS=0` runs the suite as users
# compile (nox -s "tests(oldest)" does); the benchmarks never pass through here.
os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")

_OPTIONAL = {
    "torch": "torch",
    "equinox": "equinox",
    "safetensors": "safetensors",
    "tokenizers": "tokenizers",
    "treescope": "treescope",
    "comet": "comet_ml",
}


def _share_a_compilation_cache() -> str | None:
    """Give this test run, and the interpreters its tests start, one XLA compilation cache.

    Many tests train the same tiny models and every trainer jits new functions, so the
    same programs compile again and again, in this process and in the `theseus`
    processes tests start. JAX's persistent cache, keyed by the program, turns a repeat
    into a load (about 40% of the suite's CPU time here). The folder is new for each run,
    so nothing carries over between runs. Setting a maximum size makes JAX read and
    write entries under a file lock (the `filelock` package), which is what makes one
    folder safe for several processes at once; without `filelock` the cache stays in
    this process. Tests that SIGKILL a process on purpose start it without the cache
    (a write cut short would leave a broken entry). In-memory recompilation checks
    (`_cache_size()`) are unaffected. `THESEUS_TEST_XLA_CACHE=0` turns it off.

    Returns the folder when this process created it (and removes it at the end).
    """
    if os.environ.get("THESEUS_TEST_XLA_CACHE", "1") == "0":
        return None
    if importlib.util.find_spec("jax") is None:
        return None  # theseus-store and theseus-plot alone (nox -s isolated) have no JAX
    if os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        return None  # the user's own cache, or one a parent run (pytest-xdist) shares
    folder = tempfile.mkdtemp(prefix="theseus-tests-xla-")
    settings = {
        "JAX_COMPILATION_CACHE_DIR": folder,
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
        "JAX_COMPILATION_CACHE_MAX_SIZE": str(8 << 30),
    }
    if importlib.util.find_spec("filelock") is not None:
        os.environ.update(settings)
    else:
        _CACHE_IN_THIS_PROCESS.update(settings)
    return folder


_CACHE_IN_THIS_PROCESS: dict[str, str] = {}
_CACHE_FOLDER = _share_a_compilation_cache()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--slurm",
        action="store_true",
        default=False,
        help="run only the tests marked slurm, on a private SLURM cluster (Debian's slurm-wlm)",
    )


def pytest_configure(config: pytest.Config) -> None:
    # pytest-xdist hands out whole files (--dist loadfile) and by default the files with
    # the most tests first, which leaves the few-but-long ones (crash trials, two-host
    # runs, the demo) for the end, when one worker runs them while the other waits. Keep
    # the collection order instead: testpaths lists the longest folders first.
    if getattr(config.option, "loadscopereorder", None):
        config.option.loadscopereorder = False
    if _CACHE_IN_THIS_PROCESS:
        import jax

        jax.config.update(
            "jax_compilation_cache_dir", _CACHE_IN_THIS_PROCESS["JAX_COMPILATION_CACHE_DIR"]
        )
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)


def pytest_unconfigure(config: pytest.Config) -> None:
    if _CACHE_FOLDER is not None:
        shutil.rmtree(_CACHE_FOLDER, ignore_errors=True)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Leave out the slurm tests, or all others under --slurm; skip tests marked with an
    optional extra whose package is absent."""
    on_slurm = config.getoption("--slurm", default=False)
    left = [item for item in items if bool(item.get_closest_marker("slurm")) != on_slurm]
    if left:
        config.hook.pytest_deselected(items=left)
        items[:] = [item for item in items if bool(item.get_closest_marker("slurm")) == on_slurm]
    for item in items:
        for marker, module in _OPTIONAL.items():
            if item.get_closest_marker(marker) and importlib.util.find_spec(module) is None:
                item.add_marker(pytest.mark.skip(reason=f"{module} is not installed"))


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[Any]:
    """A private one-node SLURM cluster for the session (``tests/_slurm_cluster.py``):
    ``.env`` to merge into a subprocess's environment, ``.submit``, ``.state``, ``.wait``."""
    module = sys.modules.get("_slurm_cluster")
    if module is None:
        path = Path(__file__).parent / "tests" / "_slurm_cluster.py"
        spec = importlib.util.spec_from_file_location("_slurm_cluster", path)
        assert spec is not None and spec.loader is not None, path
        module = importlib.util.module_from_spec(spec)
        sys.modules["_slurm_cluster"] = module
        spec.loader.exec_module(module)
    with module.running_cluster() as cluster:
        yield cluster
