"""theseus-store on PostgreSQL at a team's scale, and against MLflow's server on the same server.

Run: ``uv run --group bench python benchmarks/store_postgres.py [--runs 30000] [--quick]
[--json PATH]``

One private PostgreSQL server (Debian's ``postgresql``, started in a temporary folder as
the tests start it) holds two databases: a theseus-store and the backend store of an
``mlflow server`` (its own schema, made by MLflow). Both hold the same runs: ``--small``
(1,000) and then ``--runs`` (30,000) runs of ``--nodes`` (30) steps with ``--keys`` (50)
values each (1,500 values per run; in MLflow, a metric per key logged at each step). The
rows are generated inside the server (``generate_series``), in the shape each tool's own
writes leave, so building 45 million values takes minutes, not days.

Rows:

* **listing the runs** (1,000 and 30,000): theseus-store's ``Store.runs()`` (a new
  connection each time: open, list, close) vs MLflow's ``search_runs`` through its REST
  server, every page, over the same PostgreSQL; alternating, paired. Goal >= 10x.
* **`theseus-store runs`**: the command (a fresh process) at 30,000 runs, p95 < 1 s.
* **the runs page** of ``theseus-store ui`` at 30,000 runs: requests after the first (the
  browser keeps what it read and asks the database what changed), p95 < 1 s; the first
  request is in the note.
* **one run's curve** (``/api/series`` of one key over one lineage): p95 < 150 ms.
* **write a value / an artifact**: ``Store.log`` / ``Store.put`` (durable on return) vs
  MLflow's ``log_metric`` / ``log_artifact`` through its server; alternating, paired,
  goal >= 2x.

``--quick`` uses 300 and 1,000 runs of 10 steps x 5 keys and fewer samples.
"""

from __future__ import annotations

import argparse
import atexit
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # run as a file or with -m
sys.path.insert(0, str(HERE.parent / "packages" / "theseus-store" / "tests"))
from _postgres_server import running_server  # noqa: E402  (the tests' private server)

from benchmarks import _report  # noqa: E402
from theseus.store import Node, Store  # noqa: E402

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

FULL = {"small": 1000, "runs": 30000, "nodes": 30, "keys": 50, "samples": 20, "writes": 200}
QUICK = {"small": 300, "runs": 1000, "nodes": 10, "keys": 5, "samples": 5, "writes": 30}
# MLflow lists 30,000 runs (with their 1.5 million latest metrics) in minutes: 3 pairs
LARGE_LISTINGS = 3
NONCE = "0badcafe"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# -- filling both stores inside the server ---------------------------------------------------


def _fill_ours(store: Store, first: int, last: int, nodes: int, keys: int) -> None:
    """Runs ``first..last-1``: a lineage of ``nodes`` nodes, ``keys`` float values each."""

    def fill(conn: Any) -> None:
        conn.execute(
            "INSERT INTO nodes(name, nonce, seq, project, grp, run, created, written) "
            "SELECT 'bench.scale.r' || r, ?, s, 'bench', 'scale', 'r' || r, "
            "1.7e9 + r + s * 1e-3, 1.7e9 + r + s * 1e-3 "
            "FROM generate_series(?, ?) r, generate_series(0, ?) s ORDER BY r, s",
            (NONCE, first, last - 1, nodes - 1),
        )
        conn.execute(
            "INSERT INTO edges(child, parent) SELECT c.id, p.id FROM nodes c JOIN nodes p "
            "ON p.name = c.name AND p.nonce = c.nonce AND p.seq = c.seq - 1 "
            "WHERE c.run IN (SELECT 'r' || r FROM generate_series(?, ?) r) AND c.seq > 0",
            (first, last - 1),
        )
        # a float as the store writes one: jsonb with a decimal point
        conn.execute(
            "INSERT INTO vals(node, key, value, kind) SELECT n.id, 'k' || k, "
            "to_jsonb(round((n.seq + 1.5 + k * 0.001)::numeric, 4)), 'v' "
            "FROM nodes n, generate_series(0, ?) k "
            "WHERE n.run IN (SELECT 'r' || r FROM generate_series(?, ?) r)",
            (keys - 1, first, last - 1),
        )
        conn.execute("ANALYZE")

    store.write(fill)


def _fill_mlflow(conn: Any, experiment: int, template: str, first: int, last: int,
                 nodes: int, keys: int) -> None:  # fmt: skip
    """The same runs in MLflow's tables, copying the columns of a run MLflow made."""
    cols = [
        r[0]
        for r in conn.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_name = 'runs' "
            "ORDER BY ordinal_position"
        )
    ]
    chosen = {
        "run_uuid": "md5('r' || r)",
        "name": "'r' || r",
        "start_time": "1700000000000 + r",
        "experiment_id": str(experiment),
        "artifact_uri": f"'mlflow-artifacts:/{experiment}/' || md5('r' || r) || '/artifacts'",
        "status": "'FINISHED'",
    }
    select = ", ".join(chosen.get(c, c) for c in cols)
    conn.execute(
        f"INSERT INTO runs ({', '.join(cols)}) SELECT {select} FROM runs, "
        "generate_series(%s::int, %s::int) r WHERE run_uuid = %s",
        (first, last - 1, template),
    )
    conn.execute(
        "INSERT INTO tags(key, value, run_uuid) SELECT 'mlflow.runName', 'r' || r, md5('r' || r) "
        "FROM generate_series(%s::int, %s::int) r",
        (first, last - 1),
    )
    conn.execute(
        "INSERT INTO metrics(key, value, timestamp, run_uuid, step, is_nan) "
        "SELECT 'k' || k, round((s + 1.5 + k * 0.001)::numeric, 4), 1700000000000 + s, "
        "md5('r' || r), s, false FROM generate_series(%s::int, %s::int) r, generate_series(0, %s::int) s, "
        "generate_series(0, %s::int) k",
        (first, last - 1, nodes - 1, keys - 1),
    )
    conn.execute(
        "INSERT INTO latest_metrics(key, value, timestamp, step, is_nan, run_uuid) "
        "SELECT 'k' || k, round((%s + 0.5 + k * 0.001)::numeric, 4), 1700000000000 + %s, %s, "
        "false, md5('r' || r) FROM generate_series(%s::int, %s::int) r, generate_series(0, %s::int) k",
        (nodes, nodes - 1, nodes - 1, first, last - 1, keys - 1),
    )
    conn.execute("ANALYZE")


# -- MLflow's server -------------------------------------------------------------------------


class MlflowServer:
    def __init__(self, uri: str, artifacts: Path) -> None:
        self.port = _free_port()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", uri,
             "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1",
             "--artifacts-destination", str(artifacts)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 180
        while True:
            try:
                urllib.request.urlopen(self.url + "/health", timeout=5)
                return
            except OSError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError("mlflow server did not start") from None
                time.sleep(0.5)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=60)


def _list_mlflow(client: Any, experiment: str) -> int:
    found, token = 0, None
    while True:
        page = client.search_runs([experiment], max_results=1000, page_token=token)
        found += len(page)
        token = page.token
        if not token:
            return found


def _alternate(
    ours: Callable[[], Any], theirs: Callable[[], Any], n: int
) -> tuple[list[float], list[float]]:
    a, b = [], []
    for _ in range(n):
        start = time.perf_counter()
        ours()
        a.append(time.perf_counter() - start)
        start = time.perf_counter()
        theirs()
        b.append(time.perf_counter() - start)
    return a, b


def _p95(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    _report.add_arguments(parser)
    parser.add_argument("--runs", type=int, help="runs of the large store (default 30,000)")
    args = parser.parse_args()
    # a runner's timeout (SIGTERM) still stops the servers and removes their folders
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    size = dict(QUICK if args.quick else FULL)
    if args.runs:
        size["runs"] = args.runs
    import logging

    import mlflow
    import psycopg
    from mlflow.tracking import MlflowClient
    from starlette.testclient import TestClient

    from theseus.store.ui import create_app

    logging.getLogger("mlflow").setLevel(logging.ERROR)
    rows = []
    with running_server() as server, tempfile.TemporaryDirectory(prefix="store-pg-") as tmp:
        work = Path(tmp)
        ours_db = server.create_database("theseus")
        theirs_db = server.create_database("mlflow")
        url = f"{server.url(ours_db)}?files={work / 'files'}"
        store = Store(url)
        mlserver = MlflowServer(
            f"postgresql+psycopg://{server.user}@127.0.0.1:{server.port}/{theirs_db}",
            work / "mlartifacts",
        )
        atexit.register(mlserver.stop)  # whatever ends the script
        client = MlflowClient(tracking_uri=mlserver.url)
        experiment = client.create_experiment("bench")
        template = client.create_run(experiment).info.run_id
        ml = psycopg.connect(server.url(theirs_db), autocommit=True)
        ml.execute("DELETE FROM tags WHERE run_uuid = %s", (template,))

        def listing(count: int, samples: int) -> None:
            def ours() -> None:
                with Store(url) as fresh:
                    assert len(fresh.runs()) == count

            def theirs() -> None:
                assert _list_mlflow(client, experiment) == count + 1  # and the template run

            a, b = _alternate(ours, theirs, samples)
            rows.append(
                _report.compare(
                    f"store on PostgreSQL: list {count:,} runs vs MLflow server on PostgreSQL",
                    a, b, unit="s", fmt="{:.3f} s", ratio="theirs/ours",
                    meaning="MLflow time / theseus-store time; above 1: theseus-store faster",
                    goal=(">=", 10.0),
                    note=f"{size['nodes']} steps x {size['keys']} values per run; ours: "
                    "open, Store.runs(), close; MLflow: search_runs, every 1,000-run page, "
                    f"over REST; n={samples} alternating",
                )
            )  # fmt: skip
            print(f"list {count} runs: ours p50 {statistics.median(a):.3f} s, "
                  f"MLflow p50 {statistics.median(b):.3f} s")  # fmt: skip

        started = time.perf_counter()
        _fill_ours(store, 0, size["small"], size["nodes"], size["keys"])
        _fill_mlflow(ml, int(experiment), template, 0, size["small"], size["nodes"], size["keys"])
        print(f"filled {size['small']} runs in {time.perf_counter() - started:.0f} s")
        listing(size["small"], size["samples"])
        started = time.perf_counter()
        _fill_ours(store, size["small"], size["runs"], size["nodes"], size["keys"])
        _fill_mlflow(
            ml, int(experiment), template, size["small"], size["runs"], size["nodes"], size["keys"]
        )
        print(f"filled {size['runs']} runs in {time.perf_counter() - started:.0f} s")
        listing(size["runs"], min(size["samples"], LARGE_LISTINGS))

        command = [
            str(Path(sys.executable).with_name("theseus-store")),
            "runs",
            str(work / "files" / "store"),
        ]
        cli = []
        for _ in range(size["samples"]):
            start = time.perf_counter()
            subprocess.run(command, check=True, capture_output=True)
            cli.append(time.perf_counter() - start)
        rows.append(
            _report.info_row(
                f"`theseus-store runs` at {size['runs']:,} runs on PostgreSQL (p95)",
                f"{_p95(cli):.3f} s", cli, unit="s", goal=("<", 1.0), met=_p95(cli) < 1.0,
                note="a fresh process each time (Python start-up included)",
            )
        )  # fmt: skip

        reader = Store(work / "files" / "store", readonly=True)
        with TestClient(create_app(reader)) as browser:
            start = time.perf_counter()
            assert browser.get("/").status_code == 200
            first = time.perf_counter() - start
            page = []
            for _ in range(size["samples"]):
                start = time.perf_counter()
                assert browser.get("/").status_code == 200
                page.append(time.perf_counter() - start)
            curve = []
            for k in range(size["samples"]):
                lineage = f"bench.scale.r{(k * 7919) % size['runs']}~{NONCE}"
                start = time.perf_counter()
                got = browser.get("/api/series", params={"key": "k0", "l": lineage})
                curve.append(time.perf_counter() - start)
                assert got.status_code == 200, got.text[:200]
        reader.close()
        rows.append(
            _report.info_row(
                f"runs page at {size['runs']:,} runs on PostgreSQL (p95)",
                f"{_p95(page):.3f} s", page, unit="s", goal=("<", 1.0), met=_p95(page) < 1.0,
                note=f"requests after the first; the first (reads every run) took {first:.2f} s",
            )
        )  # fmt: skip
        rows.append(
            _report.info_row(
                f"one run's curve at {size['runs']:,} runs on PostgreSQL (p95)",
                f"{_p95(curve) * 1e3:.1f} ms", [c * 1e3 for c in curve], unit="ms",
                goal=("<", 150.0), met=_p95(curve) < 0.150,
                note=f"/api/series of one key over one {size['nodes']}-node lineage",
            )
        )  # fmt: skip

        node = Node.new("writes", project="bench", group="io")
        run = client.create_run(experiment).info.run_id
        counter = iter(range(10**9))
        blob = work / "artifact.bin"
        blob.write_bytes(os.urandom(4096))
        content = blob.read_bytes()

        def ours_value() -> None:
            store.log(node, {f"w{next(counter)}": 0.5})

        def theirs_value() -> None:
            client.log_metric(run, "w", 0.5, step=next(counter))

        def ours_artifact() -> None:
            store.put(node, f"a{next(counter)}", "artifact.bin", content)

        def theirs_artifact() -> None:
            client.log_artifact(run, str(blob), artifact_path=f"a{next(counter)}")

        for what, pair in (
            ("a value", _alternate(ours_value, theirs_value, size["writes"])),
            ("a 4 KiB artifact", _alternate(ours_artifact, theirs_artifact, size["writes"])),
        ):
            rows.append(
                _report.compare(
                    f"store on PostgreSQL: write {what} vs MLflow server on PostgreSQL",
                    [x * 1e3 for x in pair[0]], [x * 1e3 for x in pair[1]], unit="ms",
                    fmt="{:.2f} ms", ratio="theirs/ours",
                    meaning="MLflow time / theseus-store time; above 1: theseus-store faster",
                    goal=(">=", 2.0),
                    note="ours durable on return (a transaction each); MLflow through its "
                    f"REST server; n={size['writes']} alternating",
                )
            )  # fmt: skip
        ml.close()
        store.close()
        mlserver.stop()
    for row in rows:
        print(f"{row.what}: ours {row.ours} theirs {row.theirs} goal {row.goal} met {row.met}")
    print(f"MLflow {mlflow.__version__}")
    _report.write(args.json, "store_postgres", args.quick, rows)


if __name__ == "__main__":
    main()
