"""Test environment shared by every package's tests.

Sets four virtual CPU devices before JAX is imported, compiles without most of XLA's
optimizations, keeps matplotlib off any display, gives the test process a compilation
cache of its own, and skips tests of optional extras that are not installed; warnings
are errors (pyproject.toml).

``pytest --slurm`` (nox's ``slurm`` session) runs only the tests marked ``slurm``, on a
private one-node SLURM cluster that the ``slurm_cluster`` fixture starts once for the
session (``tests/_slurm_cluster.py``); without it those tests are left out.

``pytest --accelerator`` runs only the accelerator set (``tests/accelerator/``, marked
``accelerator``) on the machine's TPU or GPU, as users run: JAX picks its own platform
(nothing is pinned to the CPU), XLA compiles with its optimizations, and everything runs
in this one process (one program holds a TPU at a time, so ``-n`` is refused). Where JAX
sees no accelerator the set is left out with one line and pytest exits 0;
``THESEUS_ACCELERATOR_ALLOW_CPU=1`` runs it on the CPU instead. Without the option the set
is not collected.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from itertools import takewhile
from pathlib import Path
from typing import Any

import pytest

# Matplotlib must never try to open a window in tests.
os.environ.setdefault("MPLBACKEND", "Agg")

ROOT = Path(__file__).resolve().parent
ACCELERATOR_SET = ROOT / "tests" / "accelerator"
ALLOW_CPU = "THESEUS_ACCELERATOR_ALLOW_CPU"
# The line that said why the accelerator set was left out (set only then).
_LEFT_OUT = pytest.StashKey[str]()


def _pin_to_virtual_cpus() -> None:
    """The default suite's platform: four virtual CPU devices, fast compiles.

    Runs in `pytest_configure`, before any test module imports JAX. Compile for the
    tests' tiny programs, not for speed: JAX's own switch (LLVM at -O0, XLA's expensive
    passes off) halves the CPU time of each compilation, which is most of the suite's
    time; the programs, their shardings and IEEE float semantics are unchanged (every
    tolerance in the suite holds either way). Exported, so the `theseus` processes tests
    start inherit it. `JAX_DISABLE_MOST_OPTIMIZATIONS=0` runs the suite as users compile
    (nox -s "tests(oldest)" does); the benchmarks never pass through here.

    With that switch on, two XLA CPU settings cut each compilation's CPU time further
    (the suite is bound by it: its CPU time went from about 735 s to about 610 s): one LLVM
    module per program instead of several compiled on threads the two workers' cores do
    not have (`xla_cpu_parallel_codegen_split_count`), and, where jaxlib is known to have
    it (0.9 and 0.10; 0.12 dropped the flag, and XLA aborts on a flag it does not know),
    XLA's element-wise emitters instead of its MLIR fusion emitters
    (`xla_cpu_use_fusion_emitters`): a third less compilation time. The programs are the
    same HLO; only how XLA emits their element-wise loops changes (a transcendental may
    round differently in its last bit, as between XLA releases; every tolerance in the
    suite holds either way). nox's oldest session compiles as users do, and the newest
    JAX has only the fusion emitters.
    """
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = (
            os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
        ).strip()
    os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")
    if os.environ["JAX_DISABLE_MOST_OPTIMIZATIONS"].lower() not in _TRUE:
        return
    fast = {"xla_cpu_parallel_codegen_split_count": "1"}
    if _jaxlib_before((0, 11)):
        fast["xla_cpu_use_fusion_emitters"] = "false"
    for flag, value in fast.items():
        if flag not in os.environ["XLA_FLAGS"]:
            os.environ["XLA_FLAGS"] += f" --{flag}={value}"


_TRUE = ("y", "yes", "t", "true", "on", "1")  # what JAX's own boolean settings accept


def _jaxlib_before(version: tuple[int, int]) -> bool:
    """Whether the installed jaxlib is older than `version` (False where it is absent)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        release = installed("jaxlib").split(".")[:2]
    except PackageNotFoundError:
        return False
    return tuple(int("0" + "".join(takewhile(str.isdigit, part))) for part in release) < version


_OPTIONAL = {
    "torch": "torch",
    "equinox": "equinox",
    "safetensors": "safetensors",
    "tokenizers": "tokenizers",
    "treescope": "treescope",
    "comet": "comet_ml",
}


_CACHE_PREFIX = "theseus-tests-xla-"


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
    folder = tempfile.mkdtemp(prefix=_CACHE_PREFIX)
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


def _skip_the_caches_eviction_scan(config: pytest.Config) -> None:
    """Write to this run's compilation cache without JAX's size check before each write.

    With a maximum size set, JAX's cache (`jax._src.lru_cache.LRUCache`) lists the whole
    folder, stats every entry and reads its access time before each write, under the
    file lock, so the other workers wait: a cost that grows with the folder (110 ms a
    write at the 2,500 entries the default suite ends with). Without it the suite's
    summed test time went from 1,016 s to 754 s on two cores. The folder is this run's
    and holds about 45 MB, far below the 8 GiB cap, so the check never evicts anything;
    the lock, which makes the folder safe to share, stays. Only in the test processes
    (the `theseus` processes tests start check as JAX does; pytest-xdist's controller
    compiles nothing), and only where JAX's cache still has that method.
    """
    if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
        return  # the controller of pytest-xdist's workers: it compiles nothing
    folder = os.environ.get("JAX_COMPILATION_CACHE_DIR", "")
    if not Path(folder).name.startswith(_CACHE_PREFIX):
        return  # no cache, or the user's own: left as JAX runs it
    if importlib.util.find_spec("filelock") is None:
        return  # no size cap was set: JAX never scans
    try:
        from jax._src.lru_cache import LRUCache
    except ImportError:
        return
    if callable(getattr(LRUCache, "_evict_if_needed", None)):
        LRUCache._evict_if_needed = lambda self, *args, **kwargs: None


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--slurm",
        action="store_true",
        default=False,
        help="run only the tests marked slurm, on a private SLURM cluster (Debian's slurm-wlm)",
    )
    parser.addoption(
        "--accelerator",
        action="store_true",
        default=False,
        help="run only the accelerator set (tests/accelerator/) on this machine's TPU or GPU, "
        f"in one process; without one it is left out with one line ({ALLOW_CPU}=1: on the CPU)",
    )


def _on_accelerator(config: pytest.Config) -> bool:
    return bool(config.getoption("--accelerator", default=False))


def _accelerator_line() -> tuple[str, bool]:
    """One line on what the accelerator set runs on, and whether it runs at all."""
    import jax

    try:
        devices = jax.devices()
    except RuntimeError as error:  # JAX_PLATFORMS names a backend that cannot start
        return (
            f"accelerator set left out: JAX could not start its backend "
            f"({str(error).splitlines()[0]}); pytest --accelerator runs it on a TPU or GPU",
            False,
        )
    platform = devices[0].platform
    seen = f"{len(devices)} {platform} device(s) ({devices[0].device_kind})"
    if platform != "cpu":
        return f"accelerator set on {seen}", True
    if os.environ.get(ALLOW_CPU) == "1":
        return f"accelerator set on {seen}: {ALLOW_CPU}=1", True
    return (
        f"accelerator set left out: JAX sees no TPU or GPU here, only {seen}; run "
        f"pytest --accelerator on a machine with one ({ALLOW_CPU}=1 runs it on the CPU)",
        False,
    )


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Without --accelerator, never enter tests/accelerator/; with it, enter nothing else."""
    inside = collection_path == ACCELERATOR_SET or ACCELERATOR_SET in collection_path.parents
    if not _on_accelerator(config):
        return True if inside else None
    return None if inside or collection_path in ACCELERATOR_SET.parents else True


def pytest_configure(config: pytest.Config) -> None:
    if _on_accelerator(config):
        workers = getattr(config.option, "numprocesses", None)
        if workers not in (None, 0) or hasattr(config, "workerinput"):
            raise pytest.UsageError(
                f"pytest --accelerator runs in one process, but -n {workers} asks for "
                "pytest-xdist workers; one program holds a TPU at a time: drop -n"
            )
    else:
        _pin_to_virtual_cpus()
        _skip_the_caches_eviction_scan(config)
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


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """The accelerator set left out for want of an accelerator is a pass (CI stays green)."""
    if _LEFT_OUT in session.config.stash and exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED:
        session.exitstatus = pytest.ExitCode.OK


def pytest_unconfigure(config: pytest.Config) -> None:
    if _CACHE_FOLDER is not None:
        shutil.rmtree(_CACHE_FOLDER, ignore_errors=True)


def _keep(
    config: pytest.Config, items: list[pytest.Item], wanted: Callable[[pytest.Item], bool]
) -> None:
    """Keep the items for which `wanted(item)` holds; report the others deselected."""
    left = [item for item in items if not wanted(item)]
    if left:
        config.hook.pytest_deselected(items=left)
        items[:] = [item for item in items if wanted(item)]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Leave out the slurm tests, or all others under --slurm; the accelerator set, or all
    others under --accelerator (and the set too where there is no accelerator, with one
    line); skip tests marked with an optional extra whose package is absent."""
    on_slurm = config.getoption("--slurm", default=False)
    _keep(config, items, lambda item: bool(item.get_closest_marker("slurm")) == on_slurm)
    on_accelerator = _on_accelerator(config)
    _keep(
        config, items, lambda item: bool(item.get_closest_marker("accelerator")) == on_accelerator
    )
    if on_accelerator and items:
        line, runs = _accelerator_line()
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(line)
        if not runs:
            config.stash[_LEFT_OUT] = line
            _keep(config, items, lambda item: False)
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
