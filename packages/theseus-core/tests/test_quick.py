"""quick(): build, config, find().resume()/branch(), create; the seeds' snippets verbatim."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from theseus.config import ConfigTypeError, UnknownKeyError
from theseus.job import Mode
from theseus.quick import QuickError, init, quick
from theseus.registry import import_module_or_file

jobs = import_module_or_file(str(Path(__file__).with_name("core_jobs.py")))
Counter, Inspect = jobs.Counter, jobs.Inspect


def train(root: Path | str, run: str = "training-run", steps: int = 2, start: float = 1.0) -> Any:
    with quick(root) as q:
        q.build(Counter, run)
        q.config["counter/steps"] = steps
        q.config.counter.start = start
        job = q.create()
        job()
        return job.node


def test_seed_000_snippet_runs_verbatim(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    trained = train("./results", "training-run", steps=2, start=1.5)
    InspectActivation = Inspect  # stands in for the seed's analysis class
    # --- seeds/000, verbatim ---
    from theseus.quick import quick

    with quick("./results") as q:
        q.build(InspectActivation, "inspect")
        q.find().spec(run="training-run").checkpoint().latest().resume()
        analysis_job = q.create()
        analysis_job()
    # ---
    assert analysis_job.node == trained  # resume: results attach to the checkpoint's node
    assert analysis_job.mode is Mode.RESUME
    assert analysis_job.args.steps == 2  # the checkpoint's saved configuration (default 3)
    with quick("./results") as q:
        rows = q.store.query().node(trained).artifact().select()
    assert [json.loads(r["content"]) for r in rows] == [{"target": "blocks_0/attn", "value": 6.0}]
    assert rows[0]["filename"] == "activation.json"
    saved = tmp_path / "results/analyses/general/default/inspect/activation.json"
    assert saved.read_bytes() == rows[0]["content"]
    # every folder of the root is named for what it holds: no results/results/
    assert sorted(p.name for p in (tmp_path / "results").iterdir()) == [
        "analyses", "store"
    ]  # fmt: skip


def test_seed_001_snippet_runs_verbatim(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    train("./results", "train-gpt", steps=3)
    train("./results", "train-gpt", steps=1)  # a second lineage with the same name
    Activations = Inspect
    # --- seeds/001, verbatim ---
    from theseus.quick import quick

    with quick("./results") as q:
        q.build(Activations, "inspect")
        q.find().spec(run="train-gpt").checkpoint().latest().resume()
        analysis_job = q.create()
        analysis_job()
    # ---
    # latest() is the most recently recorded checkpoint: the second lineage's only one.
    assert analysis_job.node.seq == 1
    assert analysis_job.args.steps == 1  # its saved configuration was loaded
    assert analysis_job() == 2.0


def test_find_works_without_a_job(tmp_path: Path) -> None:
    train(tmp_path)
    with quick(tmp_path) as q:
        assert q.find().count() == 3
        assert q.find().spec(run="training-run").has("counter/value").count() == 2
        first = q.find().seq(0).first()
        assert first is not None and first.seq == 0
        assert [
            v["counter/value"] for v in q.find().has("counter/value").sort("counter/value").select()
        ] == [2.0, 4.0]
        assert q.base is None


def test_create_returns_a_set_up_job_that_has_not_run(tmp_path: Path) -> None:
    with quick(tmp_path) as q:
        q.build(Counter, "fresh")
        job = q.create()
        assert job.mode is Mode.FRESH and job.node.seq == 0
        assert job.setups == 1
        recorded = q.store.values(job.node)  # set up, not run: its status and nothing else
        assert recorded["job/status"] == "ready" and all(k.startswith("job/") for k in recorded)
        assert job() == 8.0
        assert job.setups == 1  # __call__ did not set up again
        assert q.store.values(job.node)["job/status"] == "finished"


def test_build_by_registered_name_and_unregistered_class(tmp_path: Path) -> None:
    class Unregistered(Counter):
        """Not registered anywhere."""

    with quick(tmp_path) as q:
        tree = q.build("tests/counter", "by-name", project="proj", group="grp")
        assert tree is q.config and tree.job == "tests/counter"
        assert q.create().node.name == "proj.grp.by-name"
        q.build(Unregistered, "loose")
        job = q.create()
        assert isinstance(job, Unregistered)
        assert q.store.job_of(job.node) == f"{__name__}:{Unregistered.__qualname__}"


def test_quick_errors_say_what_to_do(tmp_path: Path) -> None:
    with quick(tmp_path) as q:
        with pytest.raises(QuickError, match=r"call q.build\(JobClass, run_name\) first"):
            _ = q.config
        with pytest.raises(QuickError, match=r"q.create\(\) needs a job"):
            q.create()
        with pytest.raises(QuickError, match=r"subclass of theseus\.job\.BasicJob"):
            q.build(int, "x")  # type: ignore[arg-type]
        q.build(Counter, "x")
        with pytest.raises(UnknownKeyError, match="Did you mean 'counter/steps'"):
            q.config["counter/step"] = 2
        with pytest.raises(UnknownKeyError, match="Did you mean 'counter/steps'"):
            q.config.counter.stepz = 2
        with pytest.raises(ConfigTypeError, match="'counter/steps' must be int"):
            q.config.counter.steps = "many"


def test_resume_needs_exactly_one_node(tmp_path: Path) -> None:
    train(tmp_path)
    with quick(tmp_path) as q:
        with pytest.raises(QuickError) as info:
            q.find().spec(run="training-run").checkpoint().resume()
        message = str(info.value)
        assert "matched 2" in message and ".latest()" in message
        assert "find().spec(run='training-run').checkpoint()" in message
        with pytest.raises(QuickError) as info:
            q.find().spec(run="no-such-run").checkpoint().latest().branch()
        message = str(info.value)
        assert "selected no node" in message
        assert "find().spec(run='no-such-run').checkpoint().latest()" in message
        assert q.base is None


def test_saved_values_win_and_user_assignments_win_over_both(tmp_path: Path) -> None:
    base = train(tmp_path, steps=2, start=0.25)
    for build_first in (True, False):
        with quick(tmp_path) as q:
            if build_first:
                q.build(Counter, "again")
                q.config["counter/start"] = 9.0  # before find: still wins over the saved value
            q.find().node(base).resume()
            if not build_first:
                q.build(Counter, "again")
                q.config["counter/start"] = 9.0
            assert q.config["counter/steps"] == 2  # saved (default is 3)
            assert q.config["counter/start"] == 9.0  # the user's assignment
            q.config["counter/steps"] = 1
            job = q.create()
            assert job.args.steps == 1 and job.args.start == 9.0
            assert job.node == base


def test_branch_through_quick(tmp_path: Path) -> None:
    base = train(tmp_path, steps=2)
    with quick(tmp_path) as q:
        q.build(Counter, "branch")
        assert q.find().spec(run="training-run").checkpoint().latest().branch() == base
        job = q.create()
        assert job.mode is Mode.BRANCH
        assert q.store.parents(job.node) == [base]
        assert job() == 16.0
        assert job.node.nonce != base.nonce and job.node.seq == 2


def test_init_and_close_for_notebooks(tmp_path: Path) -> None:
    q = init(tmp_path)
    q.build(Counter, "nb")
    q.config.counter.steps = 1
    job = q.create()
    assert job() == 2.0
    q.close()
    with quick(tmp_path) as again:
        assert again.find().spec(run="nb").count() == 2
