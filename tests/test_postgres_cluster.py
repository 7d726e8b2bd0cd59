"""Two `theseus run` processes on a PostgreSQL store, then a resume: as a folder store would.

Two jax.distributed processes (2 CPU devices each, gloo) train on ROOT given as
``postgresql://...?files=DIR``; one process then resumes the lineage from the store's
latest checkpoint to twice the steps. The parameters equal those of an uninterrupted
one-process run on a SQLite folder, the lineage is in the database (not in a SQLite
file), and `theseus-store lineage` reads it through the URL. Runs in ``nox -s postgres``
(``pytest --postgres``), which starts a private server.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "packages" / "theseus-store" / "tests")]
from _postgres_server import running_server  # noqa: E402
from test_multihost_cli import (  # noqa: E402
    JOBS,
    MORE,
    SETTINGS,
    STEPS,
    _assert_same,
    _finish,
    _free_port,
    _ok,
    _params,
    _start,
    tokens,
)

from theseus.data.datasets import Synthetic  # noqa: E402
from theseus.store import Store  # noqa: E402
from theseus.store.cli import main as store_main  # noqa: E402

pytestmark = [pytest.mark.postgres, pytest.mark.multiprocess]


@pytest.fixture(scope="module")
def server() -> Any:
    with running_server() as started:
        yield started


def test_two_hosts_then_a_resume_on_postgresql(
    server: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    files, reference = tmp_path / "files", tmp_path / "reference"
    for folder in (files, reference):
        Synthetic.prepare(folder, tokens=40_000, val_tokens=6_000)
    url = f"{server.url(server.create_database())}?files={files}"
    config = tmp_path / "tiny.yaml"
    settings = [f"{key}={value}" for key, value in SETTINGS.items()]
    _ok("--import", JOBS, "configure", "test/synthetic/train", str(config), *settings,
        tokens(STEPS))  # fmt: skip
    port = _free_port()
    hosts = [
        _start(
            [
                "run",
                "two",
                str(config),
                url,
                "--import",
                JOBS,
                "--coordinator",
                f"127.0.0.1:{port}",
                "--num-processes",
                "2",
                "--process-id",
                str(i),
            ],
            devices=2,
            log=tmp_path / f"host{i}.log",
        )
        for i in range(2)
    ]
    try:
        _ok("--import", JOBS, "run", "one", str(config), str(reference), tokens(MORE))
    finally:
        logs = _finish(hosts)
    assert [h.popen.returncode for h in hosts] == [0, 0], "\n---\n".join(logs)
    with Store(url) as store:
        (lineage,) = {f"{n.name}~{n.nonce}" for n in store.query().spec(run="two").all()}
    resume = _start(
        ["run", "two", str(config), url, "--import", JOBS, "--resume", lineage, tokens(MORE)],
        devices=1, log=tmp_path / "resume.log",
    )  # fmt: skip
    (log,) = _finish([resume])
    assert resume.popen.returncode == 0, log

    _assert_same(_params(files, "two", MORE), _params(reference, "one", MORE))
    assert not (files / "store" / "store.sqlite").exists()
    with Store(files / "store") as store:
        nodes = sorted(store.query().spec(run="two").all(), key=lambda n: n.seq)
        assert [n.seq for n in nodes] == list(range(MORE))
        steps = sorted(c.step for n in nodes for c in store.checkpoints(n))
        assert steps == [3, 6, 9, 12]
        assert store.values(nodes[-1])["job/status"] == "finished"
    capsys.readouterr()
    assert store_main(["lineage", url, f"{lineage}~{MORE - 1}"]) == 0
    assert lineage in capsys.readouterr().out
