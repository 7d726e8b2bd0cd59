"""clouseau's own test suite, run against theseus with ``clouseau`` aliased to our recorder.

The tests come from clouseau's source distribution on the package index (it ships
``tests/``); this repository does not copy them. The nox ``torch`` session downloads
the sdist (``pip download --no-binary :all: --no-deps clouseau==VERSION``) and points
``THESEUS_CLOUSEAU_SDIST`` at it; a folder holding clouseau's ``tests/`` (a checkout
of its repository) works too. The tests are extracted into a scratch folder beside a
``conftest.py`` that registers ``theseus.analysis.inspector`` as ``clouseau.inspector``
(and ``clouseau``'s other submodule names its tests import) before they are
collected, marks the tests whose expectations theseus does not share as ``xfail``
with the reason, and says in pytest's header what it did. They run in a separate
pytest process; this test checks every outcome.

Where clouseau 0.2 differs from theseus (see ``DIFFERENCES``):

- ``test_torch`` expects a PyTorch call keyed ``path.forward``. clouseau's repository
  has since keyed it ``path.__call__``, as for a JAX module, so that a PyTorch model
  and its JAX port compare key by key; theseus follows the newer key.
- ``test_docs.py`` checks clouseau's ``docs/*.md`` with ``mktestdocs``; the sdist has
  no ``docs/`` folder (it collects no test), so it is not collected, and the header
  says so.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import textwrap
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest

pytestmark = [pytest.mark.torch, pytest.mark.safetensors, pytest.mark.equinox]

SDIST_VARIABLE = "THESEUS_CLOUSEAU_SDIST"

# Per clouseau version: test id -> why theseus does not meet its expectation.
DIFFERENCES = {
    "0.2": {
        "tests/test_inspector.py::test_torch": (
            "clouseau 0.2 keys a PyTorch call 'path.forward'; clouseau's repository has "
            "since keyed it 'path.__call__' like a JAX call, and theseus follows that so a "
            "PyTorch model and its JAX port compare key by key"
        ),
    },
}
NOT_COLLECTED = {
    "tests/test_docs.py": (
        "it runs clouseau's docs/*.md through mktestdocs, and the sdist ships no docs/ "
        "(it would collect no test)"
    ),
}
# Per clouseau version: every test id and the outcome it must have here.
EXPECTED = {
    "0.2": {
        "tests/test_inspector.py::test_jax": "passed",
        "tests/test_inspector.py::test_torch": "xfailed",
        "tests/test_inspector.py::test_equinox": "passed",
    },
}

SHIM = '''\
"""Run clouseau's tests against theseus: ``clouseau`` is theseus's recorder here."""

import sys
import types

import pytest

import theseus.analysis.inspector as inspector

package = types.ModuleType("clouseau")
package.__path__ = []  # a package, so that "import clouseau.inspector" resolves
package.inspector = inspector
sys.modules["clouseau"] = package
for name in ("inspector", "io_utils", "jax_utils", "torch_utils"):
    sys.modules["clouseau." + name] = inspector

DIFFERENCES = {differences!r}
NOT_COLLECTED = {not_collected!r}
collect_ignore = list(NOT_COLLECTED)


def pytest_report_header(config):
    lines = ["clouseau {version} tests, with clouseau = " + inspector.__name__]
    lines += ["not collected: " + path + ": " + why for path, why in NOT_COLLECTED.items()]
    return lines


def pytest_collection_modifyitems(config, items):
    assert sys.modules["clouseau"].inspector is inspector
    for item in items:
        if item.nodeid in DIFFERENCES:
            item.add_marker(pytest.mark.xfail(reason=DIFFERENCES[item.nodeid], strict=True))
'''


def _sdist_or_skip() -> Path:
    value = os.environ.get(SDIST_VARIABLE)
    if not value:
        message = (
            f"{SDIST_VARIABLE} is not set: run `uv run nox -s torch`, which downloads "
            "clouseau's sdist and sets it, or point it at clouseau-VERSION.tar.gz"
        )
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    path = Path(value)
    if not path.exists():
        pytest.fail(f"{SDIST_VARIABLE}={value!r} does not exist")
    return path


def _extract(source: Path, target: Path) -> str:
    """Copy clouseau's ``tests/*.py`` into ``target/tests``; return clouseau's version."""
    (target / "tests").mkdir(parents=True)
    if source.is_dir():
        tests = source / "tests" if (source / "tests").is_dir() else source
        for path in sorted(tests.glob("*.py")):
            (target / "tests" / path.name).write_bytes(path.read_bytes())
        return "unreleased"
    version = "unknown"
    with tarfile.open(source) as archive:
        for member in archive.getmembers():
            parts = Path(member.name).parts
            if len(parts) == 3 and parts[1] == "tests" and parts[2].endswith(".py"):
                handle = archive.extractfile(member)
                assert handle is not None
                (target / "tests" / parts[2]).write_bytes(handle.read())
            if len(parts) == 2 and parts[1] == "PKG-INFO":
                handle = archive.extractfile(member)
                assert handle is not None
                for line in handle.read().decode().splitlines():
                    if line.startswith("Version:"):
                        version = line.split(":", 1)[1].strip()
    return version


def _outcomes(report: Path) -> dict[str, str]:
    outcomes = {}
    for case in ElementTree.parse(report).getroot().iter("testcase"):
        module = case.get("classname", "").replace(".", "/")
        node = f"{module}.py::{case.get('name')}"
        kinds = {child.tag: child for child in case}
        if "failure" in kinds or "error" in kinds:
            outcome = "failed"
        elif "skipped" in kinds:
            skipped = kinds["skipped"]
            outcome = "xfailed" if skipped.get("type") == "pytest.xfail" else "skipped"
        else:
            outcome = "passed"
        outcomes[node] = outcome
    return outcomes


def test_clouseau_suite_passes_against_theseus(tmp_path):
    pytest.importorskip("torch")
    source = _sdist_or_skip()
    suite = tmp_path / "clouseau-suite"
    version = _extract(source, suite)
    assert list((suite / "tests").glob("test_*.py")), f"no test files in {source}"
    differences = DIFFERENCES.get(version, {})
    shim = SHIM.format(differences=differences, not_collected=NOT_COLLECTED, version=version)
    (suite / "conftest.py").write_text(shim)
    (suite / "pytest.ini").write_text("[pytest]\n")  # none of this repository's settings
    report = tmp_path / "report.xml"
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rxXs"]
    command += ["--junitxml", str(report), "-o", "junit_family=xunit1", "tests"]
    environment = {**os.environ, "JAX_PLATFORMS": "cpu"}
    run = subprocess.run(
        command, cwd=suite, env=environment, capture_output=True, text=True, timeout=600
    )
    output = run.stdout + run.stderr
    print(output)
    assert "with clouseau = theseus.analysis.inspector" in output, output
    outcomes = _outcomes(report)
    failed = {test: outcome for test, outcome in outcomes.items() if outcome == "failed"}
    assert not failed, textwrap.shorten(output, 4000)
    if version in EXPECTED:
        assert outcomes == EXPECTED[version], output
    else:  # a version not described here: nothing fails, nothing is xfailed unlisted
        assert any(outcome == "passed" for outcome in outcomes.values()), output
        assert {t for t, o in outcomes.items() if o == "xfailed"} <= set(differences), output
    assert run.returncode == 0, output
