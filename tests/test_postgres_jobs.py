"""`quick(URL)` and `theseus run --over` on a PostgreSQL store, against the same on a folder;
`theseus sample` on a SQLite root's copy into PostgreSQL, against the same on the root.

A tiny GPT is trained through ``quick("postgresql://...?files=DIR")`` and, beside it,
through ``quick(FOLDER)`` with the same configuration; an analysis then walks every
checkpoint of each lineage with ``theseus run ... --over``, and a ``quick`` session
resumes the latest checkpoint as the seeds do. The folder root is the reference: every
node's values and artifacts must be the same on both (the trained weights too, through
the analysis that reads them). Runs in ``nox -s postgres`` (``pytest --postgres``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "packages" / "theseus-store" / "tests"))
from _postgres_server import running_server  # noqa: E402

from theseus.cli import main  # noqa: E402
from theseus.data.datasets import Synthetic  # noqa: E402
from theseus.quick import quick  # noqa: E402
from theseus.registry import import_module_or_file  # noqa: E402
from theseus.store import Node, Store  # noqa: E402
from theseus.store.cli import main as store_main  # noqa: E402

pytestmark = [pytest.mark.postgres]

JOBS_FILE = str(HERE.parent / "packages" / "theseus-analysis" / "tests" / "analysis_jobs.py")
jobs = import_module_or_file(JOBS_FILE)
STEPS = 3


@pytest.fixture(scope="module")
def server() -> Any:
    with running_server() as started:
        yield started


def _train(root: str | Path) -> Node:
    with quick(root) as q:
        q.build(jobs.PretrainGPT, "trained")
        jobs.tiny(q.config, steps=STEPS, **{"training/analyze": False,
                                            "logging/checkpoint_interval": 1})  # fmt: skip
        trainer = q.create()
        trainer()
        return trainer.node


def _by_seq(store: Store, lineage: Node, key_prefix: str) -> dict[int, Any]:
    """seq -> (the node's values under ``key_prefix``, its artifacts' names, versions, bytes)."""
    found = {}
    for seq in range(lineage.seq + 1):
        node = Node(lineage.name, lineage.nonce, seq)
        values = {k: v for k, v in store.values(node).items() if k.startswith(key_prefix)}
        held = {k: (a.version, a.content) for k, a in store.get(node).items()}
        found[seq] = (values, held)
    return found


def test_quick_and_over_on_a_postgresql_root_match_a_folder_root(
    server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # a URL mistaken for a path would leave a folder here
    files, folder = tmp_path / "files", tmp_path / "folder"
    for root in (files, folder):
        Synthetic.prepare(root, tokens=40_000, val_tokens=6_000)
    url = f"{server.url(server.create_database())}?files={files}"

    on_pg, on_folder = _train(url), _train(folder)
    assert on_pg.seq == on_folder.seq == STEPS - 1

    runner, config = CliRunner(), tmp_path / "stats.yaml"
    made = runner.invoke(main, ["configure", "analysis-tests/stats", str(config), "--import", JOBS_FILE])  # fmt: skip
    assert made.exit_code == 0, made.output
    for root, lineage in ((url, on_pg), (str(folder), on_folder)):
        ran = runner.invoke(
            main, ["run", "inspect", str(config), root, "--import", JOBS_FILE, "--over", "trained"]
        )
        assert ran.exit_code == 0, ran.output
        assert f"it walked the {STEPS} checkpoints of {lineage.name}~{lineage.nonce}" in ran.output

    with Store(url) as pg, Store(folder / "store") as ref:
        got, want = _by_seq(pg, on_pg, "analysis/"), _by_seq(ref, on_folder, "analysis/")
        assert got == want
        assert json.loads(got[STEPS - 1][1]["stats"][1])  # a real result, not empty
        steps = [c.step for n in pg.query().spec(run="trained").all() for c in pg.checkpoints(n)]
        assert sorted(steps) == list(range(1, STEPS + 1))

    # seeds/000 on the URL: a quick session resumes the latest checkpoint
    with quick(url) as q:
        q.build(jobs.Stats, "again")
        q.find().spec(run="trained").checkpoint().latest().resume()
        job = q.create()
        job()
    assert job.node == on_pg
    with Store(url) as pg:
        latest = pg.get(on_pg)["stats"]
        assert (latest.version, latest.content) == (2, got[STEPS - 1][1]["stats"][1])
    assert not (files / "store" / "store.sqlite").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["files", "folder", "stats.yaml"]


def test_a_roots_copy_into_postgresql_samples_as_the_root_does(
    server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A trainer with tandem analyses (which find their site in a batch of the prepared
    data when a node is set up, sampling included) on a folder root; `theseus-store copy`
    into PostgreSQL; `theseus sample` on the copy, greedy, against the same on the root."""
    monkeypatch.chdir(tmp_path)
    folder, files = tmp_path / "folder", tmp_path / "files"
    Synthetic.prepare(folder, tokens=40_000, val_tokens=6_000)
    with quick(folder) as q:
        q.build(jobs.GPTWithAnalysis, "trained")
        jobs.tiny(q.config, steps=2, **{"logging/checkpoint_interval": 1})
        assert q.config["training/analyze"]  # the views are made wherever the node is set up
        q.create()()
    url = f"{server.url(server.create_database())}?files={files}"
    assert store_main(["copy", str(folder), url]) == 0
    runner = CliRunner()
    said = {}
    for root in (str(folder), url):
        sampled = runner.invoke(main, ["sample", root, "trained", "abc", "--max-new-tokens", "6",
                                       "--temperature", "0", "--import", JOBS_FILE])  # fmt: skip
        assert sampled.exit_code == 0, sampled.output
        said[root] = sampled.stdout
    assert said[url] == said[str(folder)] and said[url].startswith("abc")
    header = (folder / "data" / "synthetic" / "header.json").read_bytes()
    assert (files / "data" / "synthetic" / "header.json").read_bytes() == header


def test_data_prepare_on_a_url_root_writes_under_its_files_folder(
    server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`theseus data prepare synthetic --root URL` (and ROOT after DATASET) puts the data
    where the URL's files= says, the same bytes as a folder root's; the working folder
    gets no folder named after the URL."""
    monkeypatch.chdir(tmp_path)
    reference = tmp_path / "folder"
    Synthetic.prepare(reference, tokens=20_000, val_tokens=4_000)
    header = (reference / "data" / "synthetic" / "header.json").read_bytes()
    runner = CliRunner()
    for n, spelled in enumerate(("--root", None)):
        files = tmp_path / f"files{n}"
        url = f"{server.url(server.create_database())}?files={files}"
        where = ["--root", url] if spelled else [url]
        done = runner.invoke(main, ["data", "prepare", "synthetic", *where,
                                    "--tokens", "20000", "--val-tokens", "4000"])  # fmt: skip
        assert done.exit_code == 0, done.output
        assert f"Prepared synthetic under {files}: 20,000 training" in done.output, done.output
        assert (files / "data" / "synthetic" / "header.json").read_bytes() == header
    assert not [p for p in tmp_path.rglob("*") if p.name.startswith("postgres")]
