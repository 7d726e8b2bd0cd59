"""Running on a TPU host: what `tools/tpu/pack.py` packs, and `pytest --accelerator` here.

Packing itself needs the network and the install a TPU host (both were run by hand:
docs in README.md, "On a TPU"); here, the pack's choice of packages from the lock's
export, and that the accelerator set, on a machine without an accelerator, is left out
with one line and passes, so CI stays green.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from theseus.registry import import_module_or_file

ROOT = Path(__file__).resolve().parents[1]
pack = import_module_or_file(str(ROOT / "tools" / "tpu" / "pack.py"))

EXPORTED = """\
click==8.5.1
flax==0.12.8 ; python_full_version < '3.12'
flax==0.12.12 ; python_full_version >= '3.12'
hf-xet==1.8.0 ; platform_machine == 'x86_64' or platform_machine == 'aarch64'
jax==0.10.2 ; python_full_version < '3.12'
jax==0.12.0.1 ; python_full_version >= '3.12'
nest-asyncio==1.6.0 ; sys_platform == 'win32'
Markdown_It.py==4.3.0
"""


def test_pins_are_the_exports_lines_that_apply_to_the_host() -> None:
    host = pack.target_environment("3.11")
    assert pack.pins(EXPORTED, host) == {
        "click": "8.5.1",
        "flax": "0.12.8",
        "hf-xet": "1.8.0",
        "jax": "0.10.2",
        "markdown-it-py": "4.3.0",
    }
    assert pack.pins(EXPORTED, pack.target_environment("3.13"))["jax"] == "0.12.0.1"
    assert "hf-xet" not in pack.pins(EXPORTED, pack.target_environment("3.11", "armv7l"))


def test_the_host_has_its_jax_and_the_index_its_packages() -> None:
    closure = pack.pins(EXPORTED, pack.target_environment("3.11"))
    packed, from_index = pack.split(closure, ["flax", "Markdown-It-Py"])
    assert packed == {"click": "8.5.1", "hf-xet": "1.8.0"}
    assert from_index == {"flax": "0.12.8", "markdown-it-py": "4.3.0"}


def test_the_host_takes_the_workspaces_ranges_from_its_index(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "theseus-x"\ndependencies = ["theseus-core==0.1.0", "flax>=0.11.0",'
        ' "seaborn"]\n[project.optional-dependencies]\ngpt2 = ["tokenizers>=0.15"]\n'
        'torch = ["torch>=2.5"]\n'
    )
    ranges = pack.declared([tmp_path / "pyproject.toml"], ["gpt2"])
    assert ranges == {"flax": ">=0.11.0", "tokenizers": ">=0.15"}
    text = pack.host_requirements({"flax": "0.12.8", "pandas": "3.1.1"}, ranges)
    assert text.splitlines()[2:] == ["flax>=0.11.0  # uv.lock: 0.12.8", "pandas  # uv.lock: 3.1.1"]


def _pytest(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "THESEUS_ACCELERATOR_ALLOW_CPU"}
    env["JAX_PLATFORMS"] = "cpu"  # whatever this machine has, JAX sees no accelerator
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.slow  # a pytest of its own: the default suite's budget
def test_a_tools_closure_follows_the_locks_dependencies_markers_and_extras() -> None:
    lock = {
        "package": [
            {"name": "nox", "dependencies": [
                {"name": "Colorlog"}, {"name": "tomli", "marker": "python_full_version < '3.11'"},
                {"name": "virtualenv", "extra": ["fast"]}]},
            {"name": "colorlog", "dependencies": [
                {"name": "colorama", "marker": "sys_platform == 'win32'"}]},
            {"name": "virtualenv", "dependencies": [{"name": "distlib"}],
             "optional-dependencies": {"fast": [{"name": "uv"}], "slow": [{"name": "tox"}]}},
            {"name": "virtualenv", "version": "2", "dependencies": [{"name": "filelock"}]},
            {"name": "distlib"}, {"name": "tomli"}, {"name": "uv"}, {"name": "filelock"},
        ]
    }  # fmt: skip
    got = pack.closure(lock, ["nox"], pack.target_environment("3.11"))
    assert got == {"nox", "colorlog", "virtualenv", "distlib", "uv", "filelock"}
    assert "tomli" in pack.closure(lock, ["nox"], pack.target_environment("3.10"))


def test_without_an_accelerator_the_set_is_one_line_and_passes() -> None:
    done = _pytest("--accelerator")
    assert done.returncode == 0, done.stdout + done.stderr
    [notice] = [line for line in done.stdout.splitlines() if "accelerator" in line]
    assert notice.startswith("accelerator set left out: JAX sees no TPU or GPU here, only ")
    assert notice.endswith("(THESEUS_ACCELERATOR_ALLOW_CPU=1 runs it on the CPU)")
    assert " deselected in " in done.stdout.splitlines()[-1] and "passed" not in done.stdout
    refused = _pytest("--accelerator", "-n", "2")
    assert refused.returncode == 4
    assert "pytest --accelerator runs in one process" in refused.stderr


def test_the_install_script_is_valid_bash() -> None:
    subprocess.run(["bash", "-n", str(ROOT / "tools" / "tpu" / "install.sh")], check=True)


def test_the_install_refuses_a_noexec_site_in_one_line(tmp_path: Path) -> None:
    """A TPU VM's /dev/shm is mounted noexec: the install would succeed and the first
    compiled module fail later (tensorstore's, at the first checkpoint). Here a private
    tmpfs mounted noexec in a user and mount namespace of its own (`unshare -rm`)."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    python = "{}.{}".format(*sys.version_info[:2])
    (wheels / "packed.json").write_text(json.dumps({"python": python, "host": [], "wheels": []}))
    (wheels / "requirements-host.txt").write_text("")
    mounted = tmp_path / "noexec"
    mounted.mkdir()
    script = ROOT / "tools" / "tpu" / "install.sh"
    command = (
        f"mount -t tmpfs -o noexec none {mounted} || exit 97; "
        f"PYTHON={sys.executable} bash {script} {wheels} {mounted}/site"
    )
    done = subprocess.run(["unshare", "-rm", "sh", "-c", command], capture_output=True, text=True)
    if done.returncode == 97 or "unshare:" in done.stderr:
        pytest.skip(f"no private noexec mount here: {done.stderr.strip().splitlines()[-1]}")
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr.splitlines() == [
        f"install.sh: {mounted}/site is on a filesystem mounted noexec, where compiled "
        f"modules cannot be loaded; give another SITE (bash tools/tpu/install.sh {wheels} "
        "/tmp/theseus-site)"
    ]
    assert done.stdout == ""  # refused before anything was installed
