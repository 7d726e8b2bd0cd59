"""``theseus-store ui`` checks where it listens before it says where it listens.

The real command in a subprocess: a port out of range, a host that is no address (of
this machine: then without the warning meant for a host others can reach), and a port
another socket holds each fail in one line naming the option (status 2) and never print
the "at http://..." line; a good one announces the port it really listens on,
checked by fetching the page from it.
"""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("starlette", reason="the ui extra is not installed (theseus-store[ui])")
pytest.importorskip("uvicorn", reason="the ui extra is not installed (theseus-store[ui])")

from theseus.store import Node, Store


def _command() -> list[str]:
    script = Path(sys.executable).with_name("theseus-store")
    return [str(script)] if script.exists() else [sys.executable, "-m", "theseus.store.cli"]


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("serve") / "store"
    with Store(folder) as store:
        store.log(Node.new("train"), {"val/loss": 1.0})
    return folder


def _fails(root: Path, *options: str) -> str:
    result = subprocess.run(
        [*_command(), "ui", str(root), *options],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result
    assert "at http://" not in result.stdout, result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("theseus-store: error: "), result.stderr
    return lines[0]


@pytest.mark.parametrize("port", ["99999", "-1", "65536"])
def test_a_port_out_of_range_fails_in_one_line(root: Path, port: str) -> None:
    line = _fails(root, "--port", port)
    assert "--port must be a whole number from 0 to 65535" in line
    assert f"got {port}" in line


def test_a_host_that_is_no_address_fails_in_one_line(root: Path) -> None:
    line = _fails(root, "--host", "no-such-host.invalid", "--port", "0")
    assert "--host" in line and "'no-such-host.invalid'" in line
    assert "--host 127.0.0.1" in line


def test_a_host_of_another_machine_fails_without_the_warning(root: Path) -> None:
    # 192.0.2.1 (TEST-NET-1, RFC 5737) is a valid address that no machine of ours has: the
    # host check refuses it before the "readable by anyone" warning is printed.
    line = _fails(root, "--host", "192.0.2.1", "--port", "0")
    assert "--host '192.0.2.1' is not an address of this machine" in line


def test_a_busy_port_says_to_pass_another(root: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        line = _fails(root, "--port", str(port))
    assert f"port {port} on 127.0.0.1 is in use" in line
    assert "pass --port to choose another" in line


def test_the_announced_port_is_the_one_it_listens_on(root: Path) -> None:
    with subprocess.Popen(
        [*_command(), "ui", str(root), "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as server:
        try:
            assert server.stdout is not None
            line = server.stdout.readline()
            found = re.search(r"at http://127\.0\.0\.1:(\d+)/", line)
            assert found is not None, line
            port = int(found[1])
            assert port != 0
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=20) as page:
                assert page.status == 200
                assert b"Runs" in page.read()
        finally:
            server.terminate()
            server.wait(timeout=20)
