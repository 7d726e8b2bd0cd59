"""The store browser (``theseus-store ui``) at scale: page latency over a large store.

Run: ``uv run python benchmarks/ui.py [--lineages 1000] [--long 100000] [--quick] [--json PATH]``

Builds a store of ``--lineages`` lineages of 20 nodes each (``val/loss``, ``train/step``,
``job/status``), one of them ``--long`` nodes long, and a node holding a one-page PDF.
Then, through Starlette's TestClient (in process: the server's own work, no socket),
measures the wall time of:

* the **runs page** (``/``, 50 lineages a page, their status and last values);
* a **filtered runs page** (``/?q=...``: the filter is applied on the server);
* a **node page** and a **lineage page**;
* the **series** of the long lineage (``/api/series``: every point read, stitched and
  downsampled to at most 2,000);
* a **PDF page rendered to PNG** (``/png``; each sample a new PDF, so no cache helps).

Each prints p50 and p99 against a target (the page must feel immediate: 250 ms; the
series and the PDF 1 s). ``--quick`` builds 100 lineages, a 20,000-node lineage and takes
20 samples.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlencode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file or with -m
from benchmarks import _report
from theseus.store import Node, Store

QUICK = {"lineages": 100, "long": 20_000, "samples": 20}


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
    parser.add_argument("--long", type=int, default=100_000, help="nodes of the long lineage")
    parser.add_argument("--samples", type=int, default=50)
    _report.add_arguments(parser)
    args = parser.parse_args()
    if args.quick:
        args.lineages, args.long, args.samples = QUICK["lineages"], QUICK["long"], QUICK["samples"]
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
        store = open_readonly(root)
        lineage = f"{last.name}~{last.nonce}"
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
            (
                f"series of a {args.long:,}-node lineage (to <= 2,000 points)",
                ["/api/series?" + urlencode({"l": lineage, "key": "val/loss"})] * n,
                1.0,
            ),
            (
                "PDF page rendered to PNG (1400 px)",
                [
                    "/png?" + urlencode({"node": holder.serialize(), "name": f"figure{i}"})
                    for i in range(n)
                ],
                1.0,
            ),
        ]
        rows = []
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
        _report.write(args.json, "ui", args.quick, rows)


def _nonce(store: Store) -> str:
    (row,) = store.read_one("SELECT nonce FROM nodes WHERE name = 'scale.g0.run0000' LIMIT 1", ())
    return str(row[0])


if __name__ == "__main__":
    main()
