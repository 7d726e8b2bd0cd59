"""Nox sessions: tests per (Python, JAX) pair, each package installed alone, slow tests,
PyTorch tests, lint, types, and the suite on an accelerator.

Run `uv run nox -l` to list them, `uv run nox -s isolated` for the packaging proof,
`uv run nox -s "tests(newest)"` for the newest JAX on the newest Python.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import socket
import sys
import tempfile
import tomllib
from pathlib import Path

import nox

nox.options.default_venv_backend = "uv"
nox.options.reuse_existing_virtualenvs = False
nox.options.sessions = ["lint", "types", "isolated", "tests"]
# Each session's fresh venv gets its modules' bytecode at install time: where
# PYTHONDONTWRITEBYTECODE is set (CI machines), Python would otherwise compile jax, flax
# and seaborn from source in every interpreter the tests start.
os.environ.setdefault("UV_COMPILE_BYTECODE", "1")

ROOT = Path(__file__).parent
PACKAGES = ["theseus-plot", "theseus-store", "theseus-core", "theseus-analysis"]
# Workspace siblings each package needs installed beside it (its own wheel first).
SIBLINGS = {
    "theseus-plot": [],
    "theseus-store": [],
    "theseus-core": ["theseus-store"],
    "theseus-analysis": ["theseus-store", "theseus-plot", "theseus-core"],
}
# What each package's test suite needs beyond the package itself.
TEST_DEPS = {
    "theseus-plot": ["pytest", "pytest-timeout", "pandas"],
    # The store browser's tests (the [ui] extra's; they skip where it is not installed):
    # Starlette's TestClient runs on httpx2 (newer Starlette warns on plain httpx, older
    # ones know only httpx), playwright drives Chromium, numpy is their reference.
    "theseus-store": [
        *("pytest", "pytest-timeout", "hypothesis"),
        *("httpx", "httpx2", "playwright", "numpy"),
    ],
    "theseus-core": ["pytest", "pytest-timeout", "pytest-xdist", "filelock", "hypothesis"],
    "theseus-analysis": [
        *("pytest", "pytest-timeout", "pytest-xdist", "filelock", "equinox", "hypothesis"),
    ],
}
# What the whole suite (every package's tests at once, as the README runs it) needs.
SUITE_DEPS = sorted({dep for deps in TEST_DEPS.values() for dep in deps})
# The JAX packages' suites are spread over the cores, as the README's command does
# (filelock lets their processes share one compilation cache; see conftest.py).
SPREAD = {"theseus-core", "theseus-analysis"}
XDIST = ("-n", "auto", "--dist", "loadfile")
EXTRAS = {"theseus-store": "[ui]", "theseus-core": "[gpt2]", "theseus-analysis": "[inspect,eval]"}
# theseus-store alone must pull nothing but the standard library: `isolated` installs it
# bare first, then adds its [ui] extra from the same wheel and runs the browser's tests.
BARE = {"theseus-store"}
# Modules that must import from the installed wheel.
MODULES = {
    "theseus-plot": ["theseus.plot"],
    "theseus-store": ["theseus.errors", "theseus.store", "theseus.store.cli"],
    "theseus-core": [
        "theseus.config",
        "theseus.registry",
        "theseus.job",
        "theseus.quick",
        "theseus.cli",
        "theseus.data",
        "theseus.model",
        "theseus.training",
        "theseus.training.base",
        "theseus.model.debug",
        "theseus.model.gpt2",
        "theseus.model.hf",
        "theseus.experiments.models.hf",
        "theseus.experiments.models.suite",
    ],
    "theseus-analysis": [
        "theseus.analysis",
        "theseus.analysis._base",
        "theseus.analysis.demo",
        "theseus.analysis.inspector",
    ],
}
# (Python, JAX) pairs for `tests`: the oldest JAX the packages declare (theseus-core:
# jax>=0.9.0; on 0.8 the forward recorder records nothing under jit) on the oldest Python
# we declare (requires-python >= 3.11), the newest JAX that installs on that Python, and
# the newest JAX on the newest Python (what most users install today). The root
# conftest.py compiles without most of XLA's optimizations (fast compiles for tiny test
# programs); the oldest pair runs with them, as users compile, so both paths are tested.
OPTIMIZED = {"oldest"}
TEST_MATRIX = {
    "oldest": ("3.11", "0.9.0"),
    "py311-newest": ("3.11", "0.10.2"),
    "newest": ("3.13", "0.12.0.1"),
}
TORCH_VERSION = "2.13.0"


def _editable_packages() -> list[str]:
    args: list[str] = []
    for name in PACKAGES:
        args += ["-e", f"packages/{name}{EXTRAS.get(name, '')}"]
    return args


@nox.session(python=False)
def lint(session: nox.Session) -> None:
    """ruff check and ruff format --check over the whole workspace."""
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session(python=False)
def types(session: nox.Session) -> None:
    """mypy over every package's sources (settings in pyproject.toml)."""
    session.run("mypy", *(f"packages/{name}/src" for name in PACKAGES))


def _interpreter(version: str) -> str:
    """`version`, or the path of a pyenv-installed interpreter of it when one exists.

    pyenv's shims answer only for the versions pyenv has activated, so uv would not
    find a 3.13 that pyenv installed; pointing at the interpreter itself always works.
    """
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    found = sorted(root.glob(f"{version}.*/bin/python{version}")) if root.is_dir() else []
    return str(found[-1]) if found else version


@nox.session
@nox.parametrize(
    "python,jax,optimized",
    [(_interpreter(py), jax, name in OPTIMIZED) for name, (py, jax) in TEST_MATRIX.items()],
    ids=list(TEST_MATRIX),
)
def tests(session: nox.Session, jax: str, optimized: bool) -> None:
    """The default suite on one (Python, JAX) pair of TEST_MATRIX, spread over the cores
    as the README's command does."""
    session.install(
        *_editable_packages(),
        f"jax=={jax}",
        f"jaxlib=={jax}",
        *SUITE_DEPS,
    )
    session.run(
        "python", "-c", "import sys, jax; print(sys.version.split()[0], 'jax', jax.__version__)"
    )
    env = {"JAX_DISABLE_MOST_OPTIMIZATIONS": "0" if optimized else "1"}
    session.run("python", "-m", "pytest", "-q", *XDIST, *session.posargs, env=env)


def _accelerator(session: nox.Session, extra: str, platform: str) -> None:
    """Install `jax[extra]`, check that JAX sees `platform`, train and analyze on it, run
    the accelerator set on it (`pytest --accelerator`, one process), then the default
    suite (which pins itself to virtual CPU devices) beside that JAX.

    On a TPU host without network (`TPU_SITE`: what `tools/tpu/install.sh` installed
    there, with nox, beside the host's JAX) nothing is installed: the same steps run on
    the python3 this runs on, the suite only where the machine lets a test connect to
    a socket on 127.0.0.1 (its multi-process and server tests need one)."""
    offline = platform == "tpu" and TPU_SITE
    if offline:
        _check_tpu_site(session)
        # a host's own python3 may carry pytest-benchmark, whose warning under xdist fails
        # the suite, which turns warnings into errors (also in the pytest runs tests start)
        addopts = os.environ.get("PYTEST_ADDOPTS", "")
        session.env["PYTEST_ADDOPTS"] = f"{addopts} -p no:benchmark".strip()
        if os.environ.get("THESEUS_ACCELERATOR_ALLOW_CPU") == "1":  # as install.sh takes it
            session.log("THESEUS_ACCELERATOR_ALLOW_CPU=1: every step on the CPU (a rehearsal)")
            platform = "cpu"
    else:
        session.install(*_editable_packages(), f"jax[{extra}]", *SUITE_DEPS)
    python = sys.executable if offline else "python"
    probe = (
        "import jax, sys\n"
        "try:\n"
        "    kinds = sorted({d.platform for d in jax.devices()})\n"
        "except RuntimeError as exc:  # JAX_PLATFORMS names a backend that cannot start\n"
        "    kinds = ['no device: ' + str(exc).splitlines()[0]]\n"
        f"if {platform!r} not in kinds:\n"
        f"    sys.exit('No {platform.upper()} is visible to JAX (it sees ' + ', '.join(kinds) + "
        "'). Run this session on a machine that has one; on this machine use nox -s tests.')\n"
        "print('JAX sees', jax.device_count(), 'device(s):', jax.devices())\n"
    )
    session.run(python, "-c", probe, env={"JAX_PLATFORMS": platform})
    root = Path(session.create_tmp()) / "accelerator-demo"
    shutil.rmtree(root, ignore_errors=True)
    session.run("theseus", "demo", str(root), "--steps", "40", env={"JAX_PLATFORMS": platform})
    session.run(python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--accelerator",
                env={"JAX_PLATFORMS": platform})  # fmt: skip
    if offline and not _loopback():
        session.log("the default suite is left out: this machine lets no test connect to a "
                    "socket on 127.0.0.1; run it where one can (CI runs it)")  # fmt: skip
        return
    suite = XDIST if offline else ()
    session.run(python, "-m", "pytest", "-q", "-p", "no:cacheprovider", *suite, *session.posargs)


def _loopback() -> bool:
    """Whether a connection to a socket listening on 127.0.0.1 gets through here."""
    try:
        with socket.socket() as server, socket.socket() as client:
            server.bind(("127.0.0.1", 0))
            server.listen()
            client.settimeout(5)
            client.connect(server.getsockname())
            server.accept()[0].close()
    except OSError:
        return False
    return True


def _check_tpu_site(session: nox.Session) -> None:
    """Refuse, in one line, a `TPU_SITE` that does not hold the Theseus this runs from."""
    site = Path(TPU_SITE).resolve()
    found = importlib.util.find_spec("theseus.cli")
    origin = Path(found.origin).resolve() if found and found.origin else None
    if origin is None or site not in origin.parents:
        where = origin or "nowhere"
        session.error(
            f"THESEUS_TPU_SITE is {site}, but theseus imports from {where}; run the export "
            "lines tools/tpu/install.sh printed, then python3 -m nox -s tpu"
        )


@nox.session
def gpu(session: nox.Session) -> None:
    """On an NVIDIA GPU machine: jax[cuda12], a GPU check, the demo, the accelerator set, the suite."""
    _accelerator(session, "cuda12", "gpu")


#: Set by the export lines `tools/tpu/install.sh` prints: the folder it installed Theseus
#: (and nox) into beside a TPU host's own JAX, where `nox -s tpu` installs nothing.
TPU_SITE = os.environ.get("THESEUS_TPU_SITE", "")


@nox.session(venv_backend="none" if TPU_SITE else None)
def tpu(session: nox.Session) -> None:
    """On a Cloud TPU VM: jax[tpu], a TPU check, the demo, the accelerator set, the suite
    (offline, after tools/tpu/install.sh: the host's JAX and what that installed)."""
    _accelerator(session, "tpu", "tpu")


@nox.session(python=False)
def postgres(session: nox.Session) -> None:
    """The store's tests on PostgreSQL: a private server (Debian's postgresql) they start."""
    session.run(
        "pytest", "-q", "-p", "no:cacheprovider", "packages/theseus-store/tests",
        "tests/test_postgres_cluster.py", "tests/test_postgres_jobs.py", "--postgres",
        "-m", "",  # the slow ones too: with --postgres only the PostgreSQL tests are collected
        "-n", "2", *session.posargs,
    )  # fmt: skip


@nox.session(python=False)
def slurm(session: nox.Session) -> None:
    """The tests marked slurm, on a private one-node SLURM cluster (Debian's slurm-wlm and
    munge) that the session starts once and stops; no xdist: one cluster for the run."""
    session.run("pytest", "-q", "-p", "no:cacheprovider", "tests/", "--slurm", "-m", "",
                *session.posargs)  # fmt: skip


# The slow set's longest single tests are the store's (the root state machine at 5,000
# examples, a hundred SIGKILL trials), and the store's folder comes last in testpaths (its
# default tests are short). pytest-xdist hands out files in collection order (conftest.py),
# so a test of minutes handed out last runs alone while the other worker waits: the slow
# session lists the store's folder first, then the rest of testpaths in their order.
SLOW_FIRST = "packages/theseus-store/tests"


def _slow_paths(posargs: list[str]) -> list[str]:
    """testpaths with `SLOW_FIRST` first; none where the arguments name a path themselves."""
    if any(Path(arg.split("::")[0]).exists() for arg in posargs if not arg.startswith("-")):
        return []
    pytest_settings = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]
    paths: list[str] = pytest_settings["ini_options"]["testpaths"]
    return sorted(paths, key=lambda path: path != SLOW_FIRST)


@nox.session(python=False)
def slow(session: nox.Session) -> None:
    """Only the tests marked slow (long crash-safety loops, long training runs), spread
    over the cores as the README's command spreads the default suite."""
    paths = _slow_paths(session.posargs)
    session.run("pytest", "-q", "-m", "slow", *XDIST, *paths, *session.posargs)


def _clouseau_sdist(session: nox.Session, version: str = "0.2") -> str:
    """Download clouseau's source distribution (it ships its tests) into the session's
    scratch folder and return its path; the tests are never copied into this repository."""
    where = Path(session.create_tmp()) / "clouseau-sdist"
    shutil.rmtree(where, ignore_errors=True)
    session.run(
        "python", "-m", "pip", "download", "--no-binary", ":all:", "--no-deps", "--quiet",
        f"clouseau=={version}", "--dest", str(where),
    )  # fmt: skip
    (sdist,) = where.glob(f"clouseau-{version}.tar.gz")
    return str(sdist)


@nox.session(venv_backend="venv")
def torch(session: nox.Session) -> None:
    """Tests that need PyTorch, with the CPU wheel installed by pip (never by uv), and
    clouseau's own test suite from its sdist run against theseus's recorder."""
    session.install(f"torch=={TORCH_VERSION}")
    session.install(*_editable_packages(), *SUITE_DEPS)
    # The GPT-2 import's reference (tests/test_gpt2_transformers.py), installed after
    # torch so pip keeps the CPU wheel: transformers (5.x asks torch>=2.6 only in its
    # extras, so pip never touches torch) and the tokenizers it saves with.
    # lm-evaluation-harness's `hf` model, the parity reference of `theseus eval`
    # (test_harness_parity.py), needs accelerate too. SAELens, the reference of the SAE
    # files (test_sae_saelens_parity.py), asks torch>=2.6 through transformer-lens, so pip
    # keeps the CPU wheel here too (41 packages, about 240 MB more: wandb, plotly,
    # statsmodels, transformer-lens).
    session.install("transformers", "tokenizers", "safetensors", "accelerate", "sae-lens")
    kept = (
        "import torch, transformers; print('torch', torch.__version__, 'transformers', "
        f"transformers.__version__); assert torch.__version__.split('+')[0] == {TORCH_VERSION!r}"
    )
    session.run("python", "-c", kept)
    env = {"THESEUS_CLOUSEAU_SDIST": _clouseau_sdist(session)}
    session.run("python", "-m", "pytest", "-q", "-m", "torch", *session.posargs, env=env)


def _build_wheels(session: nox.Session, names: list[str], out: Path) -> list[str]:
    wheels = []
    for name in names:
        session.run(
            "uv",
            "build",
            "--wheel",
            "--no-sources",
            "--package",
            name,
            "--out-dir",
            str(out),
            external=True,
            silent=True,
        )
        (wheel,) = out.glob(name.replace("-", "_") + "-*.whl")
        wheels.append(str(wheel))
    return wheels


def _installed(session: nox.Session) -> set[str]:
    """Distribution names installed in the session's virtual environment."""
    listing = session.run(
        "python",
        "-c",
        "import importlib.metadata as m, json; "
        "print(json.dumps(sorted({d.metadata['Name'].lower() for d in m.distributions()})))",
        silent=True,
    )
    assert isinstance(listing, str)
    return set(json.loads(listing.strip().splitlines()[-1]))


def _downstream_typing(session: nox.Session, package: str) -> None:
    """mypy, as a user's project sees the installed wheel: typed (py.typed), no stubs missing."""
    session.install("mypy")
    where = Path(session.create_tmp()) / "downstream"
    shutil.rmtree(where, ignore_errors=True)
    where.mkdir()
    (where / "use_theseus.py").write_text("".join(f"import {m}\n" for m in MODULES[package]))
    (where / "mypy.ini").write_text("[mypy]\nwarn_unused_ignores = True\n")
    with session.chdir(where):
        session.run("mypy", "--no-incremental", "use_theseus.py")


@nox.session
@nox.parametrize("package", PACKAGES)
def isolated(session: nox.Session, package: str) -> None:
    """Build one package's wheel, install it alone in a fresh venv, import it, test it."""
    out = Path(tempfile.mkdtemp(prefix=f"{package}-wheels-"))
    try:
        own, *siblings = _build_wheels(session, [package, *SIBLINGS[package]], out)
        extra = "" if package in BARE else EXTRAS.get(package, "")
        session.install(f"{package}{extra} @ {Path(own).as_uri()}", *siblings)
        installed = _installed(session)
        expected = {package, *SIBLINGS[package]}
        if package == "theseus-store" and installed != expected:
            session.error(f"theseus-store must install nothing else; found {sorted(installed)}")
        for module in MODULES[package]:
            session.run(
                "python",
                "-c",
                f"import {module} as m; "
                f"assert 'site-packages' in m.__file__, m.__file__; print(m.__name__, m.__file__)",
            )
        if package == "theseus-plot":
            session.run(
                "python",
                "-c",
                "import importlib.util as u, theseus.plot, sys; "
                "assert u.find_spec('jax') is None, 'jax is importable'; "
                "assert 'jax' not in sys.modules; print('jax is absent')",
            )
        _downstream_typing(session, package)
        session.install(*TEST_DEPS[package])
        env = {"THESEUS_ISOLATED": package}
        # Run from a scratch copy of the tests so nothing resolves to the source tree.
        scratch = Path(session.create_tmp()) / "tests-run"
        shutil.rmtree(scratch, ignore_errors=True)
        scratch.mkdir()
        shutil.copy(ROOT / "pyproject.toml", scratch / "pyproject.toml")
        shutil.copy(ROOT / "conftest.py", scratch / "conftest.py")
        shutil.copytree(ROOT / "packages" / package / "tests", scratch / "tests")
        # Tests that check the package's README read it beside their folder, as in the repo.
        shutil.copy(ROOT / "packages" / package / "README.md", scratch / "README.md")
        with session.chdir(scratch):
            session.run(
                "python",
                "-m",
                "pytest",
                "-q",
                "tests",
                "-p",
                "no:cacheprovider",
                *(XDIST if package in SPREAD else ()),
                *session.posargs,
                env=env,
                success_codes=[0],
            )
            if package in BARE and package in EXTRAS:
                # The extra from the wheel: its templates and static files must be inside.
                session.install(f"{package}{EXTRAS[package]} @ {Path(own).as_uri()}")
                session.run(
                    "python", "-m", "pytest", "-q", "-p", "no:cacheprovider",
                    *sorted(str(p) for p in Path("tests").glob("test_ui*.py")),
                    *session.posargs, env=env, success_codes=[0],
                )  # fmt: skip
    finally:
        shutil.rmtree(out, ignore_errors=True)
