"""A store on a real PostgreSQL server: the URL, the binding of folder and database, values
exactly, many writers at once, a server restarted under load, a writer killed mid-write.

Run with ``pytest --postgres`` (nox -s postgres); the server is private to the session.
"""

from __future__ import annotations

import hashlib
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from theseus.store import Node, NotAStoreError, Store, StoreError, ValueTypeError

pytestmark = pytest.mark.postgres

HERE = Path(__file__).parent


def _tree_digest(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def test_the_folder_alone_opens_the_store_and_no_password_is_kept(
    pg_server: Any, tmp_path: Path
) -> None:
    database = pg_server.create_database()
    secret = "s3cret-pw"  # trust authentication ignores it; it must be used, never kept
    url = (
        f"postgresql://{pg_server.user}:{secret}@127.0.0.1:{pg_server.port}/{database}"
        f"?files={tmp_path}"
    )
    node = Node.new("run", project="p", group="g")
    with Store(url) as store:
        assert store.root == tmp_path.resolve() / "store"
        assert secret not in store.database and secret not in repr(store)
        store.log(node, {"loss": 1.5})
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), path
    with Store(tmp_path / "store", create=False) as again:
        assert (
            again.database == f"postgresql://{pg_server.user}@127.0.0.1:{pg_server.port}/{database}"
        )
        assert again.query().node(node).select() == [{"loss": 1.5}]
        assert not (tmp_path / "store" / "store.sqlite").exists()


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("postgresql://u@h:5432/db", "has no files folder"),
        ("postgresql://u@h:5432/db?files=relative/dir", "relative path"),
        ("postgresql://u@h:5432/?files=/x", "names no database"),
    ],
)
def test_a_bad_url_is_one_line(url: str, expected: str, tmp_path: Path) -> None:
    with pytest.raises(StoreError) as caught:
        Store(url)
    assert expected in str(caught.value) and "\n" not in str(caught.value)
    assert "files=/shared/folder" in str(caught.value)


def test_a_server_that_is_down_at_start_is_one_line_without_the_password(tmp_path: Path) -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    started = time.monotonic()
    with pytest.raises(StoreError) as caught:
        Store(f"postgresql://me:hidden@127.0.0.1:{port}/db?files={tmp_path}")
    message = str(caught.value)
    assert time.monotonic() - started < 15
    assert f"postgresql://me@127.0.0.1:{port}/db" in message
    assert "hidden" not in message and "\n" not in message
    assert "Start the server" in message


def test_no_store_takes_another_stores_files(pg_url: Any, tmp_path: Path) -> None:
    sqlite_root = tmp_path / "sqlite"
    with Store(sqlite_root / "store") as store:
        store.log(Node.new("a"), {"x": 1})
    pg_root = tmp_path / "pg"
    url = pg_url(pg_root)
    with Store(url) as store:
        store.log(Node.new("b"), {"x": 2})
    before = {p: _tree_digest(p) for p in (sqlite_root, pg_root)}
    # a URL whose files folder holds a SQLite store
    with pytest.raises(NotAStoreError, match="holds a SQLite store"):
        Store(pg_url(sqlite_root))
    # a second database named for the first one's files folder
    with pytest.raises(NotAStoreError, match="belongs to the store in"):
        Store(pg_url(pg_root))
    # the first database named with another files folder: it already holds nodes
    with pytest.raises(NotAStoreError, match="already holds the store whose files"):
        Store(url.split("?")[0] + f"?files={tmp_path / 'other'}")
    assert {p: _tree_digest(p) for p in (sqlite_root, pg_root)} == before


def test_values_come_back_exactly_and_compare_as_numbers(store_pg: Store) -> None:
    written = {
        "int": 7,
        "big": 2**63 - 1,
        "small": -(2**63),
        "float": 0.1,
        "huge": 1e300,
        "tiny": 5e-324,
        "neg_zero": -0.0,
        "whole_float": 3.0,
        "inf": math.inf,
        "minus_inf": -math.inf,
        "text": 'héllo "quoted" \\ %s ?',
        "true": True,
        "none": None,
    }
    node = Node.new("values")
    store_pg.log(node, {**written, "nan": math.nan})
    (read,) = store_pg.query().node(node).select()
    assert math.isnan(read.pop("nan"))
    assert read == written
    for key, value in written.items():
        assert type(read[key]) is type(value), key
    assert math.copysign(1.0, read["neg_zero"]) == -1.0
    # the numbers of several nodes order as Python orders them
    numbers = [3, 2.5, -1, 10**18, 1e-9, math.inf, -math.inf, 7.0]
    nodes = [Node.new(f"n{i}") for i in range(len(numbers))]
    for node, number in zip(nodes, numbers, strict=True):
        store_pg.log(node, {"m": number})
    for op, threshold in ((">", 2.5), ("<=", 3), (">=", 7), ("<", -1e308), ("=", 7)):
        expected = sorted(
            n.run
            for n, x in zip(nodes, numbers, strict=True)
            if {">": x > threshold, "<=": x <= threshold, ">=": x >= threshold,
                "<": x < threshold, "=": x == threshold}[op]
        )  # fmt: skip
        got = sorted(n.run for n in store_pg.query().where("m", op, threshold).all())
        assert got == expected, (op, threshold)
    ordered = [n.run for n in store_pg.query().has("m").sort("m").all()]
    assert ordered == [
        n.run for _, n in sorted(zip(numbers, nodes, strict=True), key=lambda p: p[0])
    ]


@pytest.fixture
def store_pg(pg_url: Any, tmp_path: Path) -> Any:
    with Store(pg_url(tmp_path)) as store:
        yield store


def _writers(url: str, count: int, rounds: int) -> list[subprocess.Popen[str]]:
    return [
        subprocess.Popen(
            [sys.executable, str(HERE / "_pg_writer.py"), url, f"w{i}", str(rounds)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(count)
    ]


def _finish_writers(url: str, writers: list[subprocess.Popen[str]], rounds: int) -> None:
    """Wait for every writer to say done, then check the store holds each round once."""
    for proc in writers:
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0 and out.endswith("done\n"), err[-2000:]
    with Store(url) as store:
        _check_writers(store, [f"w{i}" for i in range(len(writers))], rounds)


def _check_writers(store: Store, names: list[str], rounds: int) -> None:
    for who in names:
        node = Node("load.writers." + who, "0000abcd", 0)
        (values,) = store.query().node(node).select()
        assert values == {f"v{k}": k for k in range(rounds)}, who
        history = store.history(node, "round")
        assert [a.version for a in history] == list(range(1, rounds + 1)), who
        assert [a.content for a in history] == [f"{who}:{k}".encode() for k in range(rounds)]
        assert sorted(c.step for c in store.checkpoints(node)) == list(range(rounds)), who


def test_sixteen_writers_lose_nothing_and_double_nothing(pg_url: Any, tmp_path: Path) -> None:
    url = pg_url(tmp_path)
    Store(url).close()
    writers = _writers(url, 16, 500)
    _finish_writers(url, writers, 500)


def test_writers_wait_for_a_restarted_server_and_go_on(
    pg_server: Any, pg_url: Any, tmp_path: Path
) -> None:
    url = pg_url(tmp_path)
    Store(url).close()
    writers = _writers(url, 4, 200)
    # every writer is under way before the server goes away
    for proc in writers:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "0"
    pg_server.halt("fast")
    time.sleep(1.5)
    pg_server.resume()
    _finish_writers(url, writers, 200)


def test_a_writer_killed_mid_transaction_loses_only_that_transaction(
    pg_url: Any, tmp_path: Path
) -> None:
    url = pg_url(tmp_path)
    node = Node.new("killed")
    with Store(url) as store:
        store.log(node, {"kept": 1})
    script = (
        "import os, sys, time\n"
        "from theseus.store import Node, Store\n"
        f"store = Store({url!r})\n"
        f"node = Node({node.name!r}, {node.nonce!r}, 0)\n"
        "with store.batch():\n"
        "    store.log(node, {'lost': 2})\n"
        "    store.put(node, 'lost', 'lost.txt', b'x')\n"
        "    print('inside', flush=True)\n"
        "    time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "inside"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    proc.stdout.close()
    with Store(url) as store:
        assert store.query().node(node).select() == [{"kept": 1}]
        assert store.get(node) == {}
        store.log(node, {"after": 3})  # the killed writer's lock went with it
        assert store.query().node(node).select() == [{"after": 3, "kept": 1}]


def test_every_entry_point_takes_the_url(pg_url: Any, tmp_path: Path) -> None:
    """JobSpec, quick, store_root and theseus-store read the URL before making any path."""
    from theseus.job import JobSpec, store_root
    from theseus.store.cli import main

    url = pg_url(tmp_path / "files")
    spec = JobSpec("run", url)
    assert spec.root == tmp_path / "files"
    assert store_root(url) == tmp_path / "files" / "store"
    assert not any(p.name.startswith("postgresql:") for p in Path.cwd().iterdir())
    node = Node.new("run")
    with Store(url) as store:
        store.log(node, {"loss": 0.5})
    assert main(["show", url, node.serialize()]) == 0
    assert main(["show", url.split("?")[0] + f"?files={tmp_path / 'nothing'}", "x"]) == 2


def test_many_processes_create_one_store_at_once(pg_url: Any, tmp_path: Path) -> None:
    """The schema is made once (advisory lock) and every creator binds to the same id."""
    url = pg_url(tmp_path)
    script = (
        "import sys\n"
        "from theseus.store import Node, Store\n"
        "with Store(sys.argv[1]) as store:\n"
        "    store.log(Node('p.g.r', '0000beef', int(sys.argv[2])), {'x': int(sys.argv[2])})\n"
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", script, url, str(k)], stderr=subprocess.PIPE)
        for k in range(8)
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err.decode()[-2000:]
    marker = (tmp_path / "store" / "theseus-store.json").read_text()
    with Store(url) as store:
        assert store.query().count() == 8
        ids = store.read_one("SELECT value FROM meta WHERE key = 'id'", ())
        tables = store.read_one(
            "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = 'public'", ()
        )
    assert ids[0][0] in marker and len(ids) == 1
    assert tables == [(9,)]  # meta nodes edges vals checkpoints artifacts jobs inline txns


def test_text_with_a_nul_is_refused_in_one_line_and_nothing_is_written(store_pg: Store) -> None:
    node = Node.new("nul")
    store_pg.log(node, {"before": 1})
    with pytest.raises(
        ValueTypeError, match=r"holds a NUL character, which PostgreSQL cannot store"
    ):
        store_pg.log(node, {"fine": 2, "bad": "a\x00b"})
    assert store_pg.values(node) == {"before": 1}  # the whole call was refused
