"""theseus-store against MLflow's local tracking (SQLite backend), side by side.

Run: ``uv run --group bench python benchmarks/store_vs_mlflow.py [--n 200]``

Both sides do the same work in the same process on the same disk:

* **write**: record one artifact (a few KiB of bytes) at a new address. For
  theseus-store the address is a new node (``store.put(node, ...)``, durable
  on return). For MLflow it is a new run (``create_run`` with the node as a
  tag, then ``log_artifact`` of the bytes written to a file, as MLflow needs).
* **write (existing)**: the same artifact bytes under a new name at an address
  that already exists (one node / one run), so run creation is not counted.
* **query+read**: find the address by query and read the artifact's bytes back
  (``store.query().node(n).artifact("result").select()`` against
  ``search_runs(filter_string="tags.node = ...")`` + ``download_artifacts``).

Every read is checked byte-exact against what was written. Targets: theseus-store
at least 5x faster per write and 100x faster per query+read.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("DO_NOT_TRACK", "true")
os.environ.setdefault("GIT_PYTHON_REFRESH", "quiet")

from theseus.store import Node, Store


def _timed(fn: Callable[[int], object], n: int) -> list[float]:
    out = []
    for i in range(n):
        start = time.perf_counter()
        fn(i)
        out.append(time.perf_counter() - start)
    return out


def _ms(samples: list[float]) -> str:
    p50 = statistics.median(samples) * 1e3
    mean = statistics.fmean(samples) * 1e3
    return f"p50 {p50:9.3f} ms  mean {mean:9.3f} ms"


def main() -> None:
    """Run both sides and print the timings and ratios."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=200, help="operations per measurement")
    parser.add_argument("--size", type=int, default=4096, help="artifact size in bytes")
    args = parser.parse_args()
    n = args.n
    rng = random.Random(0)
    payloads = [rng.randbytes(args.size) for _ in range(n)]

    warnings.filterwarnings("ignore")
    for name in ("mlflow", "alembic", "sqlalchemy", "urllib3", "git"):
        logging.getLogger(name).setLevel(logging.ERROR)
    import mlflow
    from mlflow.tracking import MlflowClient

    with tempfile.TemporaryDirectory(prefix="store-vs-mlflow-") as tmp:
        work = Path(tmp)
        # ---- theseus-store -----------------------------------------------------------
        store = Store(work / "store")
        nodes = [Node.new(f"run{i}") for i in range(n)]
        ours_write = _timed(lambda i: store.put(nodes[i], "result", "result.bin", payloads[i]), n)
        fixed = Node.new("fixed")
        store.touch(fixed)
        ours_write_existing = _timed(
            lambda i: store.put(fixed, f"result{i}", "result.bin", payloads[i]), n
        )

        def ours_read(i: int) -> None:
            rows = store.query().node(nodes[i]).artifact("result").select()
            assert rows[0]["content"] == payloads[i]

        order = list(range(n))
        rng.shuffle(order)
        ours_query = _timed(lambda i: ours_read(order[i]), n)
        store.close()

        # ---- MLflow --------------------------------------------------------------------
        mlflow.set_tracking_uri(f"sqlite:///{work / 'mlflow.db'}")
        client = MlflowClient()
        experiment = client.create_experiment(
            "bench", artifact_location=(work / "mlartifacts").as_uri()
        )
        staging = work / "staging"
        staging.mkdir()
        run_ids: list[str] = []

        def ml_write(i: int) -> None:
            run = client.create_run(experiment, tags={"node": nodes[i].serialize()})
            local = staging / "result.bin"
            local.write_bytes(payloads[i])
            client.log_artifact(run.info.run_id, str(local))
            run_ids.append(run.info.run_id)

        ml_write_new = _timed(ml_write, n)
        fixed_run = client.create_run(experiment, tags={"node": fixed.serialize()}).info.run_id

        def ml_write_fixed(i: int) -> None:
            local = staging / f"result{i}.bin"
            local.write_bytes(payloads[i])
            client.log_artifact(fixed_run, str(local))

        ml_write_existing = _timed(ml_write_fixed, n)
        download = work / "download"

        def ml_read(i: int) -> None:
            found = client.search_runs(
                [experiment], filter_string=f"tags.node = '{nodes[i].serialize()}'"
            )
            path = mlflow.artifacts.download_artifacts(
                run_id=found[0].info.run_id, artifact_path="result.bin", dst_path=str(download)
            )
            assert Path(path).read_bytes() == payloads[i]

        ml_query = _timed(lambda i: ml_read(order[i]), n)

    print(
        f"theseus-store vs MLflow {mlflow.__version__} (SQLite backend, file: artifacts), "
        f"n={n}, artifact {args.size} bytes"
    )
    rows = [
        ("write (new node/run)", ours_write, ml_write_new, 5.0),
        ("write (existing node/run)", ours_write_existing, ml_write_existing, 5.0),
        ("query + read", ours_query, ml_query, 100.0),
    ]
    ok = True
    for label, ours, theirs, target in rows:
        ratio = statistics.median(theirs) / statistics.median(ours)
        passed = ratio >= target
        ok &= passed
        print(
            f"{label:27s} theseus-store {_ms(ours)} | MLflow {_ms(theirs)} | "
            f"ratio {ratio:7.1f}x (target >= {target:.0f}x: {'ok' if passed else 'MISSED'})"
        )
    print("all targets met" if ok else "SOME TARGETS MISSED")


if __name__ == "__main__":
    main()
