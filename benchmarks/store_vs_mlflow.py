"""theseus-store against MLflow's local tracking (SQLite backend), side by side.

Run: ``uv run --group bench python benchmarks/store_vs_mlflow.py [--n 200] [--quick]
[--json PATH]``

Both sides do the same work in the same process on the same disk, alternating
operation by operation so that both meet the same machine load, with the garbage
collector paused (as ``timeit`` does); before each timed write ``os.sync()``
flushes what the previous operation left dirty (see ``_interleaved``):

* **write**: record one artifact (4 KiB of bytes) at a new address. For
  theseus-store the address is a new node (``store.put(node, ...)``, durable
  on return). For MLflow it is a new run (``create_run`` with the node as a
  tag, then ``log_artifact`` of the bytes written to a file, as MLflow needs).
* **write (existing)**, for information: the same bytes under a new name at an
  address that already exists (one node / one run). MLflow then only copies a
  file into its artifact folder, without any fsync: it is not durable on return,
  while theseus-store still fsyncs its database log.
* **query+read**: find the address by query and read the artifact's bytes back
  (``store.query().node(n).artifact("result").select()`` against
  ``search_runs(filter_string="tags.node = ...")`` + ``download_artifacts``),
  measured twice: alternating (each call follows the other library's work, so
  it starts with cold CPU caches, as a query in a notebook does) and back to
  back (a warm loop of each side, as ``timeit`` measures).

Every read is checked byte-exact against what was written. Targets: theseus-store
at least 5x faster per write and 100x faster per query+read, judged on the median of
the paired ratios (MLflow's time over theseus-store's for the i-th operation of each
side; adjacent in time when alternating); the ratio of the medians is printed too.
``--quick`` measures 30 operations after 5 warm-up ones; ``--json PATH`` also writes
the rows of the benchmarks table (``benchmarks/_report.py``).
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import random
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("DO_NOT_TRACK", "true")
os.environ.setdefault("GIT_PYTHON_REFRESH", "quiet")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file or with -m

from benchmarks import _report
from theseus.store import Node, Store

QUICK = {"n": 30, "warmup": 5}


def _phase(fn: Callable[[], tuple[list[float], list[float]]]) -> tuple[list[float], list[float]]:
    """Run one measurement from a clean start, like ``timeit``: the garbage collector is
    off while it runs, and the disk has no dirty pages left by the previous phase (an
    fsync commits the whole ext4 journal, so one side would pay for the other's I/O)."""
    os.sync()
    gc.collect()
    gc.disable()
    try:
        return fn()
    finally:
        gc.enable()


def _interleaved(
    ours: Callable[[int], object],
    theirs: Callable[[int], object],
    n: int,
    warmup: int,
    sync: bool = False,
) -> tuple[list[float], list[float]]:
    """Time ``ours(i)`` and ``theirs(i)`` alternately, so both meet the same machine load.

    With ``sync`` (for writes), ``os.sync()`` runs before each timed call: an fsync
    commits the whole ext4 journal, so without it one side's deferred writes
    (MLflow does not fsync its artifact copies) would be paid by the other's next fsync.
    """

    def run() -> tuple[list[float], list[float]]:
        a: list[float] = []
        b: list[float] = []
        for i in range(n + warmup):
            for fn, out in ((ours, a), (theirs, b)):
                if sync:
                    os.sync()
                start = time.perf_counter()
                fn(i)
                out.append(time.perf_counter() - start)
        return a[warmup:], b[warmup:]

    return _phase(run)


def _back_to_back(
    ours: Callable[[int], object], theirs: Callable[[int], object], n: int, warmup: int
) -> tuple[list[float], list[float]]:
    """Time all calls of ``ours``, then all of ``theirs`` (a warm loop, as ``timeit`` does)."""

    def loop(fn: Callable[[int], object]) -> list[float]:
        out = []
        for i in range(n + warmup):
            start = time.perf_counter()
            fn(i)
            out.append(time.perf_counter() - start)
        return out[warmup:]

    return _phase(lambda: (loop(ours), []))[0], _phase(lambda: ([], loop(theirs)))[1]


def _ms(samples: list[float]) -> str:
    p50 = statistics.median(samples) * 1e3
    mean = statistics.fmean(samples) * 1e3
    return f"p50 {p50:8.3f} ms  mean {mean:8.3f} ms"


def main() -> None:
    """Run both sides and print the timings and ratios."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=200, help="counted operations per measurement")
    parser.add_argument("--size", type=int, default=4096, help="artifact size in bytes")
    parser.add_argument("--warmup", type=int, default=20, help="uncounted operations first")
    _report.add_arguments(parser)
    args = parser.parse_args()
    if args.quick:
        args.n, args.warmup = QUICK["n"], QUICK["warmup"]
    n = args.n
    rng = random.Random(0)
    total = n + args.warmup
    payloads = [rng.randbytes(args.size) for _ in range(total)]

    warnings.filterwarnings("ignore")
    for name in ("mlflow", "alembic", "sqlalchemy", "urllib3", "git"):
        logging.getLogger(name).setLevel(logging.ERROR)
    import mlflow
    import mlflow.artifacts
    from mlflow.tracking import MlflowClient

    logging.getLogger("mlflow").setLevel(logging.ERROR)  # mlflow sets INFO on import

    with tempfile.TemporaryDirectory(prefix="store-vs-mlflow-") as tmp:
        work = Path(tmp)
        store = Store(work / "store")
        mlflow.set_tracking_uri(f"sqlite:///{work / 'mlflow.db'}")
        client = MlflowClient()
        experiment = client.create_experiment(
            "bench", artifact_location=(work / "mlartifacts").as_uri()
        )
        staging = work / "staging"
        staging.mkdir()
        download = work / "download"
        nodes = [Node.new(f"run{i}") for i in range(total)]
        fixed = Node.new("fixed")
        store.touch(fixed)
        fixed_run = client.create_run(experiment, tags={"node": fixed.serialize()}).info.run_id

        def ours_write(i: int) -> None:
            store.put(nodes[i], "result", "result.bin", payloads[i])

        def ml_write(i: int) -> None:
            run = client.create_run(experiment, tags={"node": nodes[i].serialize()})
            local = staging / "result.bin"
            local.write_bytes(payloads[i])
            client.log_artifact(run.info.run_id, str(local))

        write = _interleaved(ours_write, ml_write, n, args.warmup, sync=True)

        def ours_write_fixed(i: int) -> None:
            store.put(fixed, f"result{i}", "result.bin", payloads[i][::-1])

        def ml_write_fixed(i: int) -> None:
            local = staging / f"result{i}.bin"
            local.write_bytes(payloads[i][::-1])
            client.log_artifact(fixed_run, str(local))

        write_existing = _interleaved(ours_write_fixed, ml_write_fixed, n, args.warmup, sync=True)

        order = list(range(total))
        rng.shuffle(order)

        def ours_read(i: int) -> None:
            rows = store.query().node(nodes[order[i]]).artifact("result").select()
            assert rows[0]["content"] == payloads[order[i]]

        def ml_read(i: int) -> None:
            node = nodes[order[i]].serialize()
            found = client.search_runs([experiment], filter_string=f"tags.node = '{node}'")
            path = mlflow.artifacts.download_artifacts(
                run_id=found[0].info.run_id, artifact_path="result.bin", dst_path=str(download)
            )
            assert Path(path).read_bytes() == payloads[order[i]]

        query = _interleaved(ours_read, ml_read, n, args.warmup)
        query_warm = _back_to_back(ours_read, ml_read, n, args.warmup)
        store.close()

    print(
        f"theseus-store vs MLflow {mlflow.__version__} (SQLite backend, file: artifacts), "
        f"n={n} (+{args.warmup} warm-up), artifact {args.size} bytes"
    )
    rows: list[tuple[str, list[float], list[float], float | None]] = [
        ("write (new node / new run)", *write, 5.0),
        ("write (existing; info only)", *write_existing, None),
        ("query + read, alternating", *query, 100.0),
        ("query + read, back to back", *query_warm, 100.0),
    ]
    ok = True
    table = []
    for label, ours, theirs, target in rows:
        paired = [b / a for a, b in zip(ours, theirs, strict=True)]
        ratio = statistics.median(paired)
        of_medians = statistics.median(theirs) / statistics.median(ours)
        verdict = ""
        if target is not None:
            passed = ratio >= target
            ok &= passed
            verdict = f" (target >= {target:.0f}x: {'ok' if passed else 'MISSED'})"
        print(
            f"{label:28s} theseus-store {_ms(ours)} | MLflow {_ms(theirs)} | "
            f"ratio {ratio:6.1f}x (of the medians {of_medians:6.1f}x){verdict}"
        )
        table.append(_row(label, ours, theirs, target, n, args.warmup))
    print("ratio: median of the paired ratios, MLflow time / theseus-store time")
    print("all targets met" if ok else "SOME TARGETS MISSED")
    _report.write(args.json, "store_vs_mlflow", args.quick, table)


NOTES = {
    "write (new node / new run)": "one 4 KiB artifact at a new address, durable on return "
    "for theseus-store; os.sync() before each call",
    "write (existing; info only)": "information: MLflow only copies a file (no fsync), "
    "theseus-store still fsyncs its log",
    "query + read, alternating": "find by query, read back, check; each call follows the "
    "other library's work (cold caches)",
    "query + read, back to back": "a warm loop of each side, as timeit measures; pairs "
    "are i-th calls of the two loops, not adjacent in time",
}


def _row(
    label: str, ours: list[float], theirs: list[float], target: float | None, n: int, warmup: int
) -> _report.Row:
    return _report.compare(
        f"store {label} vs MLflow",
        [x * 1e3 for x in ours],
        [x * 1e3 for x in theirs],
        unit="ms",
        fmt="{:.3f} ms",
        ratio="theirs/ours",
        meaning="MLflow time / theseus-store time for the i-th operation; above 1 means "
        "theseus-store is faster",
        goal=None if target is None else (">=", target),
        note=f"{NOTES[label]}; n={n} after {warmup} warm-up",
    )


if __name__ == "__main__":
    main()
