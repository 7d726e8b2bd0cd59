"""The store browser (``theseus-store ui``) at scale: page latency over a large store.

Run: ``uv run python benchmarks/ui.py [--lineages 1000] [--long 100000] [--quick] [--json PATH]``

Builds a store of ``--lineages`` lineages of 20 nodes each (``val/loss``, ``train/step``,
``job/status``), one of them ``--long`` nodes long, and a node holding a one-page PDF.
Then, through Starlette's TestClient (in process: the server's own work, no socket),
measures the wall time of:

* the **runs page** (``/``, 50 lineages a page, their status and last values);
* a **filtered runs page** (``/?q=...``: the filter is applied on the server);
* a **node page** and a **lineage page**;
* a **PDF page rendered to PNG** (``/png``; each sample a new PDF, so no cache helps).

Each prints p50 and p99 against a target (the page must feel immediate: 250 ms; the PDF
1 s; the long lineage's series is measured cold, warm and live below). ``--quick`` builds 100 lineages, a 20,000-node lineage and takes
20 samples.

Then the issue's targets (``--no-targets`` skips them):

* **runs page at store scale** (``store_scale.build``: 10,000 nodes, 100,000 artifacts,
  10,000 checkpoints): the first request of a fresh server (cold), repeated views of an
  unchanged store (warm), and polls while a writer adds a node between requests (live).
  Goal: p95 < 100 ms warm and live (server time: Starlette's TestClient in process).
* **a curve of a million points** (the long lineage, ``--long``): cold (a fresh
  server's first request, twice), warm and live (a node appended between requests).
  Goal: p95 < 150 ms warm and live.
* **first paint of the runs page in Chromium** (``/usr/bin/chromium`` headless through
  Playwright, the store-scale store served by ``theseus-store ui`` in a subprocess):
  ``first-contentful-paint`` of the Paint Timing API over several loads, a new page
  each. Goal: p95 < 1 s.
* **listing 1,000 runs vs MLflow's server**: 1,000 lineages of 20 nodes (``val/loss``,
  ``train/step``, ``job/status``) against 1,000 MLflow runs (the same values as metric
  histories, two params, a status tag) in ``mlflow server`` on SQLite, both servers
  subprocesses on 127.0.0.1; ``GET /api/runs?per_page=1000`` against ``POST
  /api/2.0/mlflow/runs/search`` with ``max_results=1000``, alternating over one
  keep-alive connection each. Goal: MLflow's time / ours >= 10 (median of paired ratios).
"""

from __future__ import annotations

import argparse
import http.client
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file or with -m
from benchmarks import _report
from theseus.store import Node, Store

QUICK = {"lineages": 100, "long": 20_000, "samples": 20, "scale_runs": 10, "loads": 3}


def _pdf(label: int) -> bytes:
    stream = f"BT /F1 24 Tf 20 40 Td ({label}) Tj ET 0.2 0.4 0.8 rg 120 20 60 60 re f".encode()
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 200 100] /Contents 4 0 R "
        b"/Resources << /Font << /F1 5 0 R >> >> >>",
        b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream",
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for i, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % i + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % o for o in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (
        len(objects) + 1,
        xref,
    )
    return bytes(out)


def build(root: Path, lineages: int, long: int, pdfs: int) -> Node:
    """Fill the store; return the long lineage's last node (it holds the PDFs too)."""
    with Store(root) as store:
        for r in range(lineages):
            node = Node.new(f"run{r:04d}", project="scale", group=f"g{r % 5}")
            with store.batch():
                for seq in range(20):
                    store.log(node, {"val/loss": 1.0 / (seq + 1), "train/step": 10 * seq})
                    node = node.next() if seq < 19 else node
                store.log(node, {"job/status": "finished" if r % 3 else "running"})
        node = Node.new("long", project="scale", group="long")
        with store.batch():
            for seq in range(long):
                store.log(node, {"val/loss": 1.0 / (seq + 1) + (seq % 97) * 1e-4})
                node = node.next() if seq < long - 1 else node
            for i in range(pdfs):
                store.put(node, f"figure{i}", "figure.pdf", _pdf(i))
        return node


def _measure(client, urls: list[str]) -> list[float]:
    samples = []
    for url in urls:
        start = time.perf_counter()
        response = client.get(url)
        samples.append(time.perf_counter() - start)
        assert response.status_code == 200, (url, response.status_code)
    return samples


def main() -> None:
    """Build, measure, print."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lineages", type=int, default=1000)
    parser.add_argument("--long", type=int, default=1_000_000, help="nodes of the long lineage")
    parser.add_argument("--samples", type=int, default=50)
    parser.add_argument("--scale-runs", type=int, default=100, help="store_scale runs (x100 nodes)")
    parser.add_argument("--loads", type=int, default=10, help="Chromium page loads")
    parser.add_argument("--no-targets", action="store_true", help="only the page latencies")
    _report.add_arguments(parser)
    args = parser.parse_args()
    if args.quick:
        args.lineages, args.long, args.samples = QUICK["lineages"], QUICK["long"], QUICK["samples"]
        args.scale_runs, args.loads = QUICK["scale_runs"], QUICK["loads"]
    from starlette.testclient import TestClient

    from theseus.store.ui import create_app, open_readonly

    with tempfile.TemporaryDirectory(prefix="ui-bench-") as tmp:
        root = Path(tmp) / "store"
        start = time.perf_counter()
        last = holder = build(root, args.lineages, args.long, args.samples + 2)
        print(
            f"built {args.lineages} lineages + one of {args.long:,} nodes in "
            f"{time.perf_counter() - start:.1f} s"
        )
        rows: list[_report.Row] = []
        series_url = "/api/series?" + urlencode(
            {"l": f"{last.name}~{last.nonce}", "key": "val/loss"}
        )
        if not args.no_targets:
            rows += target_curve(root, last, series_url, args.long, args.samples)
        store = open_readonly(root)
        n = args.samples
        cases = [
            (f"runs page (50 of {args.lineages + 1} lineages)", ["/"] * n, 0.25),
            (
                "filtered runs page",
                ["/?" + urlencode({"q": "run00", "status": "running"})] * n,
                0.25,
            ),
            ("node page", [f"/node/{last.serialize()}"] * n, 0.25),
            ("lineage page (20 nodes)", [f"/lineage/scale.g0.run0000~{_nonce(store)}"] * n, 0.25),
            # The long lineage's series: cold, warm and live in `target_curve`'s rows (here
            # the first of its requests would be a fresh store's cold read inside the p99).
            (
                "PDF page rendered to PNG (1400 px)",
                [
                    "/png?" + urlencode({"node": holder.serialize(), "name": f"figure{i}"})
                    for i in range(n)
                ],
                1.0,
            ),
        ]
        with TestClient(create_app(store)) as client:
            _measure(client, ["/", f"/node/{last.serialize()}"])  # warm up
            for label, urls, target in cases:
                wall = _measure(client, urls)
                ordered = sorted(wall)
                p50 = statistics.median(ordered) * 1e3
                p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] * 1e3
                met = p99 < target * 1e3
                print(
                    f"{label:55s} p50 {p50:8.2f} ms  p99 {p99:8.2f} ms  "
                    f"target p99 < {target * 1e3:.0f} ms: {'ok' if met else 'MISSED'}"
                )
                rows.append(
                    _report.info_row(
                        f"ui {label}",
                        f"p99 {p99:.1f} ms (p50 {p50:.1f} ms)",
                        [x * 1e3 for x in wall],
                        unit="ms",
                        goal=("<", target * 1e3),
                        met=met,
                        note=f"wall time of {len(wall)} requests through Starlette's TestClient",
                    )
                )
        store.close()
        if not args.no_targets:
            rows += target_runs_page(Path(tmp) / "scale", args.scale_runs, args.samples)
            rows += target_first_paint(Path(tmp) / "scale" / "store", args.loads)
            rows += target_versus_mlflow(Path(tmp) / "vs", min(args.samples, 15))
        _report.write(args.json, "ui", args.quick, rows)


def _percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _summary(samples: list[float]) -> str:
    return f"p95 {_percentile(samples, 0.95):.1f} ms (p50 {statistics.median(samples):.1f} ms)"


def _timed(client: Any, url: str) -> float:
    start = time.perf_counter()
    response = client.get(url)
    took = (time.perf_counter() - start) * 1e3
    assert response.status_code == 200, (url, response.status_code)
    return took


def _three_rows(
    what: str, url: str, root: Path, grow: Any, samples: int, goal: float, note: str
) -> list[_report.Row]:
    """Cold (a fresh server's first request, twice), warm and live samples of ``url``."""
    from starlette.testclient import TestClient

    from theseus.store.ui import create_app, open_readonly

    cold = []
    for _ in range(2):
        store = open_readonly(root)
        with TestClient(create_app(store)) as client:
            cold.append(_timed(client, url))
        store.close()
    store = open_readonly(root)
    with TestClient(create_app(store)) as client, Store(root) as writer:
        _timed(client, url)
        warm = [_timed(client, url) for _ in range(samples)]
        live = []
        for i in range(samples):
            grow(writer, i)  # another connection commits: the memory must catch up
            live.append(_timed(client, url))
    store.close()
    rows = []
    for label, got in (("warm: repeated views", warm), ("live: a write before each", live)):
        p95 = _percentile(got, 0.95)
        print(f"{what}, {label:28s} {_summary(got)}  goal p95 < {goal:.0f} ms")
        rows.append(
            _report.info_row(
                f"ui {what}, {label}",
                _summary(got),
                got,
                unit="ms",
                goal=("<", goal),
                met=p95 < goal,
                note=f"{note}; cold (a fresh server's first request): "
                + ", ".join(f"{c:.0f} ms" for c in cold),
            )
        )
    print(f"{what}, cold: " + ", ".join(f"{c:.0f} ms" for c in cold))
    rows.append(
        _report.info_row(
            f"ui {what}, cold: a fresh server's first request",
            " / ".join(f"{c:.0f} ms" for c in cold),
            cold,
            unit="ms",
            note="information: everything read once into the browser's memory",
        )
    )
    return rows


def target_curve(root: Path, last: Node, url: str, long: int, samples: int) -> list[_report.Row]:
    """A curve of ``long`` points: cold, warm, and while the lineage grows."""
    state = {"node": last}

    def grow(writer: Store, i: int) -> None:
        state["node"] = state["node"].next()
        writer.log(state["node"], {"val/loss": 0.5 + (i % 7) * 0.01})

    return _three_rows(
        f"curve of a {long:,}-point lineage (to <= 2,000 points)",
        url,
        root,
        grow,
        samples,
        150.0,
        "server time (TestClient); min/max per bucket from the memory's block summary",
    )


def target_runs_page(folder: Path, runs: int, samples: int) -> list[_report.Row]:
    """The runs page over ``store_scale``'s store: cold, warm, and while a run grows."""
    from benchmarks import store_scale

    start = time.perf_counter()
    made = store_scale.build(folder, runs, 100, 10)
    print(f"built the store-scale store ({runs} runs) in {time.perf_counter() - start:.1f} s")
    heads = {run: nodes[-1] for run, nodes in made.items()}
    names = sorted(heads)

    def grow(writer: Store, i: int) -> None:
        run = names[i % len(names)]
        heads[run] = heads[run].next()
        writer.log(heads[run], {"train/loss": 0.1, "train/step": heads[run].seq})

    with Store(folder / "store", readonly=True) as store:
        nodes, artifacts = (
            store.read_one(f"SELECT COUNT(*) FROM {t}", ())[0][0] for t in ("nodes", "artifacts")
        )
    return _three_rows(
        f"runs page at store scale ({nodes:,} nodes, {artifacts:,} artifacts)",
        "/",
        folder / "store",
        grow,
        samples,
        100.0,
        "server time (TestClient), 50 lineages a page",
    )


def _serve(root: Path) -> tuple[subprocess.Popen[bytes], int]:
    """``theseus-store ui`` on a free loopback port, in its own process."""
    port = _free_port()
    code = f"from theseus.store.ui import serve; serve({str(root)!r}, port={port})"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL)
    _wait(f"http://127.0.0.1:{port}/static/app.css", proc)
    return proc, port


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait(url: str, proc: subprocess.Popen[bytes], limit: float = 120.0) -> None:
    deadline = time.monotonic() + limit
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the server for {url} did not start")
        time.sleep(0.2)


def target_first_paint(root: Path, loads: int) -> list[_report.Row]:
    """First contentful paint of the runs page in headless Chromium, ``loads`` times."""
    chromium = Path("/usr/bin/chromium")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        print("first paint: playwright is not installed; skipped")
        return []
    if not chromium.exists():
        print("first paint: no /usr/bin/chromium; skipped")
        return []
    proc, port = _serve(root)
    paints, loaded = [], []
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(
                executable_path=str(chromium), args=["--no-sandbox", "--disable-gpu"]
            )
            for i in range(loads + 1):
                page = browser.new_page()
                page.goto(f"http://127.0.0.1:{port}/", wait_until="load")
                fcp = load = None
                deadline = time.monotonic() + 10  # the paint entry can come after load
                while fcp is None or not load:
                    assert time.monotonic() < deadline, "no first-contentful-paint entry"
                    fcp, load = page.evaluate(
                        "() => [performance.getEntriesByName('first-contentful-paint')[0]"
                        "?.startTime ?? null, performance.getEntriesByType('navigation')[0]"
                        ".loadEventEnd]"
                    )
                    if fcp is None or not load:
                        time.sleep(0.05)
                page.close()
                if i:  # the first load starts Chromium's own caches and processes
                    paints.append(float(fcp))
                    loaded.append(float(load))
            browser.close()
    finally:
        proc.terminate()
        proc.wait(20)
    p95 = _percentile(paints, 0.95)
    print(f"first paint of the runs page: {_summary(paints)}; load event {_summary(loaded)}")
    return [
        _report.info_row(
            "ui runs page at store scale: first contentful paint in Chromium",
            _summary(paints),
            paints,
            unit="ms",
            goal=("<", 1000.0),
            met=p95 < 1000.0,
            note=f"headless /usr/bin/chromium via Playwright, a new page per load, {loads} loads "
            f"after one uncounted; load event {_summary(loaded)}",
        )
    ]


def _mlflow_runs(db: Path, lineages: int) -> None:
    """``lineages`` MLflow runs holding what ``build`` writes: metric histories, params, tag."""
    from mlflow.entities import Metric, Param, RunTag
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{db}")
    experiment = client.create_experiment("scale")
    now = int(time.time() * 1000)
    for r in range(lineages):
        run = client.create_run(experiment, run_name=f"run{r:04d}")
        metrics = [
            Metric(key, value, now, seq)
            for seq in range(20)
            for key, value in (("val/loss", 1.0 / (seq + 1)), ("train/step", 10.0 * seq))
        ]
        params = [Param("project", "scale"), Param("group", f"g{r % 5}")]
        tags = [RunTag("job/status", "finished" if r % 3 else "running")]
        client.log_batch(run.info.run_id, metrics=metrics, params=params, tags=tags)
    client.set_experiment_tag(experiment, "built", "yes")


def target_versus_mlflow(folder: Path, samples: int) -> list[_report.Row]:
    """Listing 1,000 runs over HTTP: ours against ``mlflow server``, paired."""
    try:
        import mlflow  # noqa: F401
    except ImportError:
        print("versus MLflow: mlflow is not installed (the bench group has it); skipped")
        return []
    count = 1000
    folder.mkdir(parents=True)
    start = time.perf_counter()
    build(folder / "store", count, 0, 0)
    _mlflow_runs(folder / "mlflow.db", count)
    print(f"built {count} lineages and {count} MLflow runs in {time.perf_counter() - start:.1f} s")
    ours, ours_port = _serve(folder / "store")
    port = _free_port()
    theirs = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mlflow",
            "server",
            "--backend-store-uri",
            f"sqlite:///{folder / 'mlflow.db'}",
            "--default-artifact-root",
            str(folder / "mlruns"),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait(f"http://127.0.0.1:{port}/health", theirs)
        a = http.client.HTTPConnection("127.0.0.1", ours_port)
        b = http.client.HTTPConnection("127.0.0.1", port)
        (experiment,) = [
            e["experiment_id"]
            for e in _post(b, "/api/2.0/mlflow/experiments/search", {"max_results": 10})[
                "experiments"
            ]
            if e["name"] == "scale"
        ]
        query = "/api/runs?" + urlencode({"per_page": count, "keys": "val/loss,train/step"})
        body = {"experiment_ids": [experiment], "max_results": count}

        def ours_once() -> float:
            nonlocal a
            try:  # uvicorn closes a connection idle for 5 s (MLflow's warm-up can take that)
                a.request("GET", "/static/app.css")
                a.getresponse().read()
            except (http.client.HTTPException, ConnectionError):
                a.close()
                a = http.client.HTTPConnection("127.0.0.1", ours_port)
            start = time.perf_counter()
            a.request("GET", query)
            data = json.loads(a.getresponse().read())
            took = (time.perf_counter() - start) * 1e3
            assert data["total"] == count and len(data["rows"]) == count
            return took

        def theirs_once() -> float:
            start = time.perf_counter()
            data = _post(b, "/api/2.0/mlflow/runs/search", body)
            took = (time.perf_counter() - start) * 1e3
            assert len(data["runs"]) == count
            return took

        ours_once(), theirs_once()  # warm up both (our first request reads the store)
        mine, other = [], []
        for i in range(samples):
            if i % 2:
                other.append(theirs_once())
                mine.append(ours_once())
            else:
                mine.append(ours_once())
                other.append(theirs_once())
        a.close()
        b.close()
    finally:
        for proc in (ours, theirs):
            proc.terminate()
            proc.wait(30)
    row = _report.compare(
        f"ui: list {count:,} runs over HTTP vs mlflow server (SQLite) runs/search",
        mine,
        other,
        unit="ms",
        fmt="{:.1f} ms",
        ratio="theirs/ours",
        meaning="MLflow's time / ours; above 1: ours faster",
        goal=(">=", 10.0),
        note=f"GET /api/runs?per_page={count} vs POST runs/search max_results={count}; "
        "alternating, one keep-alive connection each, both servers subprocesses "
        "(mlflow --workers 1)",
    )
    print(
        f"list {count} runs: ours {row.ours}, MLflow {row.theirs}, ratio "
        f"{statistics.median(row.ratios):.1f}x (range {min(row.ratios):.1f}-{max(row.ratios):.1f})"
    )
    return [row]


def _post(conn: http.client.HTTPConnection, path: str, body: dict[str, Any]) -> Any:
    conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    response = conn.getresponse()
    data = response.read()
    assert response.status == 200, (path, response.status, data[:200])
    return json.loads(data)


def _nonce(store: Store) -> str:
    (row,) = store.read_one("SELECT nonce FROM nodes WHERE name = 'scale.g0.run0000' LIMIT 1", ())
    return str(row[0])


if __name__ == "__main__":
    main()
