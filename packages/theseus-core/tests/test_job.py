"""BasicJob lifecycle: construction, setup modes, tick, run, status records, saved config."""

from __future__ import annotations

import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from theseus.config import MissingValueError, Tree, field, load
from theseus.job import BasicJob, JobError, JobSpec, JobTypeError, Mode
from theseus.registry import import_module_or_file
from theseus.store import Node, Store
from theseus.store._errors import InvalidNodeError
from theseus.store.cli import main as store_main

jobs = import_module_or_file(str(Path(__file__).with_name("core_jobs.py")))
Counter, Inspect = jobs.Counter, jobs.Inspect


def counter(root: Path, run: str = "train", base: Node | None = None, **settings: Any) -> Any:
    tree = Counter.schema()
    tree.update(settings)
    return Counter(JobSpec(run, root=root), base=base, config=tree)


def values(store: Store, node: Node) -> dict[str, Any]:
    return store.values(node)


def test_spec_defaults_and_result_paths(tmp_path: Path) -> None:
    spec = JobSpec("run-1", root=tmp_path)
    assert (spec.project, spec.group, spec.name, spec.run) == (
        "general",
        "default",
        "run-1",
        "run-1",
    )
    out = spec.result("plots", "a.pdf")
    assert out == tmp_path / "analyses/general/default/run-1/plots/a.pdf"
    assert out.parent.is_dir()
    assert (
        JobSpec("r", root=tmp_path, project="p", group="g").result() == tmp_path / "analyses/p/g/r"
    )
    with pytest.raises(InvalidNodeError, match="run name"):
        JobSpec("bad name", root=tmp_path)


def test_construction_allocates_nothing(tmp_path: Path) -> None:
    job = counter(tmp_path)
    assert job.args.steps == 3 and job.mode is None
    assert not hasattr(job, "value")
    with pytest.raises(JobError, match=r"no node yet: call job.setup\(\)"):
        _ = job.node
    assert job.store.query().count() == 0


def test_job_without_run_is_abstract(tmp_path: Path) -> None:
    class NoRun(BasicJob):
        pass

    with pytest.raises(TypeError, match="abstract"):
        NoRun(JobSpec("x", root=tmp_path))  # type: ignore[abstract]


def test_fresh_setup_is_idempotent_and_records_the_config(tmp_path: Path) -> None:
    job = counter(tmp_path, **{"counter/steps": 5})
    node = job.setup()
    assert job.setup() == node and job.setup(resume=False) == node
    assert job.setups == 1 and job.mode is Mode.FRESH
    assert (node.name, node.seq, node.parent) == ("general.default.train", 0, None)
    store = job.store
    assert store.query().count() == 1
    assert store.job_of(node) == "tests/counter"
    saved = Counter.schema()
    saved.load(load(store.job_config(node) or ""))
    assert saved["counter/steps"] == 5 and saved.job == "tests/counter"


def test_call_runs_ticks_and_records_every_node(tmp_path: Path) -> None:
    job = counter(tmp_path, **{"counter/steps": 3, "counter/start": 1.5})

    class Holder:
        def __init__(self, held: Any) -> None:
            self.held = held

    holder = Holder(job)
    assert job() == 12.0
    assert holder.held.node.seq == 3  # the holder sees the moved node
    store = job.store
    nodes = store.query().spec(run="train").has("counter/value").sort("counter/value").all()
    assert [n.seq for n in nodes] == [1, 2, 3]
    assert [values(store, n)["counter/value"] for n in nodes] == [3.0, 6.0, 12.0]
    first = store.query().spec(run="train").seq(0).first()
    assert first is not None
    assert values(store, first)["job/status"] == "finished"
    assert values(store, job.node)["job/status"] == "finished"
    assert values(store, nodes[0]).get("job/status") is None
    assert store.parents(job.node) == [nodes[1]]
    assert store.ancestors(job.node) == [nodes[1], nodes[0], first]
    assert store.job_config(job.node) == store.job_config(first)
    assert store.query().checkpoint().count() == 3


def test_tick_before_setup_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(JobError, match="setup"):
        counter(tmp_path).tick()


def test_branch_starts_a_new_lineage_from_the_base(tmp_path: Path) -> None:
    first = counter(tmp_path, **{"counter/steps": 2})
    first()
    base = first.node
    branch = counter(tmp_path, run="branched", base=base, **{"counter/steps": 2})
    node = branch.setup(resume=False)
    assert branch.mode is Mode.BRANCH
    assert node.seq == 0 and node.nonce != base.nonce and node.name == "general.default.branched"
    assert branch.store.parents(node) == [base]
    assert branch() == 16.0  # 4.0 at the base, doubled twice
    assert branch.node.seq == 2 and branch.node.nonce == node.nonce
    assert branch.store.job_of(branch.node) == "tests/counter"


def test_resume_continues_the_base_node(tmp_path: Path) -> None:
    first = counter(tmp_path, **{"counter/steps": 2})
    first()
    base = first.node
    store = first.store
    resumed = counter(tmp_path, base=base, **{"counter/steps": 2})
    assert resumed.setup(resume=True) == base
    assert resumed.mode is Mode.RESUME
    assert resumed() == 16.0
    assert (resumed.node.nonce, resumed.node.seq) == (base.nonce, 4)
    assert [
        n.seq
        for n in store.query().nonce(base.nonce).has("counter/value").sort("counter/value").all()
    ] == [1, 2, 3, 4]
    # The same configuration: nothing new recorded.
    assert store.job_config(resumed.node) == store.job_config(base)


def test_resume_with_a_changed_config_records_it_at_the_first_tick(tmp_path: Path) -> None:
    first = counter(tmp_path, **{"counter/steps": 1})
    first()
    resumed = counter(tmp_path, base=first.node, **{"counter/steps": 2})
    resumed(resume=True)
    store = resumed.store
    at_base, after = Counter.schema(), Counter.schema()
    at_base.load(load(store.job_config(first.node) or ""))
    after.load(load(store.job_config(first.node.next()) or ""))
    assert (at_base["counter/steps"], after["counter/steps"]) == (1, 2)


def test_setup_mode_errors(tmp_path: Path) -> None:
    with pytest.raises(JobError, match=r"resume=True\) needs a base node.*base=NODE"):
        counter(tmp_path).setup(resume=True)
    first = counter(tmp_path)
    first()
    job = counter(tmp_path, base=first.node)
    job.setup(resume=True)
    with pytest.raises(JobError, match=r"already set up in resume mode.*asks for branch"):
        job.setup(resume=False)


def test_a_failing_job_records_failed_and_the_error(tmp_path: Path) -> None:
    job = counter(tmp_path, **{"counter/steps": 3, "counter/fail_at": 2})
    with pytest.raises(RuntimeError, match="planned failure at step 2"):
        job()
    store = job.store
    start = store.query().seq(0).first()
    assert start is not None and job.node.seq == 2
    for node in (start, job.node):
        recorded = values(store, node)
        assert recorded["job/status"] == "failed"
        assert recorded["job/error"] == "RuntimeError: planned failure at step 2"
    assert store.query().where("job/status", "=", "finished").count() == 0


def test_failure_in_setup_is_recorded_on_the_chosen_node(tmp_path: Path) -> None:
    class BadSetup(Counter):
        def on_setup(self, mode: Mode) -> None:
            raise OSError("disk full")

    job = BadSetup(JobSpec("bad", root=tmp_path))
    with pytest.raises(OSError, match="disk full"):
        job()
    node = job.store.query().first()
    assert node is not None
    assert values(job.store, node)["job/status"] == "failed"
    assert job.mode is None  # a later setup tries again


def test_a_new_lineage_says_setting_up_until_its_setup_is_done(tmp_path: Path) -> None:
    seen = []

    class Watched(Counter):
        def on_setup(self, mode: Mode) -> None:
            seen.append(self.store.values(self.node).get("job/status"))  # while it runs
            super().on_setup(mode)

    job = Watched(JobSpec("watched", root=tmp_path))
    node = job.setup()
    assert seen == ["setting up"] and values(job.store, node)["job/status"] == "ready"
    assert job() == 8.0 and values(job.store, node)["job/status"] == "finished"
    resumed = Watched(JobSpec("watched", root=tmp_path), base=job.node)
    resumed.setup(resume=True)  # a resumed node keeps its own record while setting up
    assert seen[-1] == "finished" and values(job.store, job.node)["job/status"] == "finished"


def test_a_failure_before_a_new_lineage_runs_is_recorded_as_a_setup_failure(
    tmp_path: Path,
) -> None:
    class Refuses(Counter):
        def before_run(self) -> None:
            raise MemoryError("no room")  # e.g. the first read of a state too big to allocate

    job = Refuses(JobSpec("refused", root=tmp_path))
    with pytest.raises(MemoryError):
        job()
    recorded = values(job.store, job.node)
    assert recorded["job/status"] == "failed" and recorded["job/failed_in"] == "setup"
    assert recorded["job/error"] == "MemoryError: no room"
    [run] = job.store.runs()
    assert job.store.never_started(run) == "MemoryError: no room"


KILLED_IN_SETUP = """
import sys, time
from theseus.job import JobSpec, Mode
from theseus.registry import import_module_or_file

jobs = import_module_or_file(sys.argv[1])

class Stuck(jobs.Counter):
    def on_setup(self, mode: Mode) -> None:  # an allocation that never returns
        print("setting up", flush=True)
        time.sleep(600)

Stuck(JobSpec("stuck", root=sys.argv[2]))()
"""


def test_a_process_killed_while_setting_up_leaves_a_node_that_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before, a run killed while setting up (the kernel's out-of-memory killer) left a
    one-node lineage with no status, listed as an ordinary run."""
    jobs_file = str(Path(__file__).with_name("core_jobs.py"))
    child = subprocess.Popen(
        [sys.executable, "-c", KILLED_IN_SETUP, jobs_file, str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == "setting up\n"
        child.kill()  # SIGKILL: nothing of the process runs again
        assert child.wait(timeout=60) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        if child.stdout is not None:
            child.stdout.close()
    with Store(tmp_path / "store") as store:
        [run] = store.runs()
        node = Node(run["name"], run["nonce"], run["last_seq"])
        assert store.values(node)["job/status"] == "setting up"
        assert "killed while setting up (out of memory, SIGKILL)" in str(store.never_started(run))
    assert store_main(["runs", str(tmp_path / "store")]) == 0
    listed = capsys.readouterr().out
    table, _, apart = listed.partition("\nnever started (1; failed or killed while setting up")
    assert "general.default.stuck~" not in table, listed
    (line,) = [row for row in apart.splitlines() if "general.default.stuck~" in row]
    assert "killed while setting up" in line


def test_only_host_zero_writes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("theseus.job._basic.is_primary", lambda: False)
    job = counter(tmp_path)
    job.log({"x": 1})  # ignored off host zero
    assert (
        job() is not None
    )  # Counter itself writes checkpoints; only BasicJob's records are checked
    store = job.store
    assert store.query().has("job/status").count() == 0
    assert store.query().has("x").count() == 0
    assert store.job_config(job.node) is None


def test_hosts_are_synchronized_around_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    monkeypatch.setattr("theseus.job._basic.sync_hosts", calls.append)
    job = counter(tmp_path, **{"counter/steps": 1})
    job()
    assert calls == [
        "theseus/job/start/general.default.train",
        "theseus/job/finish/general.default.train",
    ]


def test_missing_required_value_fails_at_construction(tmp_path: Path) -> None:
    @dataclass
    class Needs:
        seed: int = field("data/seed")

    class NeedsSeed(Counter):
        CONFIG = Needs

        def on_setup(self, mode: Mode) -> None:
            raise AssertionError("never reached")

    with pytest.raises(MissingValueError, match=r"data/seed \(int, declared by Needs\)"):
        NeedsSeed(JobSpec("x", root=tmp_path))


def test_base_without_config_loads_the_saved_configuration(tmp_path: Path) -> None:
    first = counter(tmp_path, **{"counter/steps": 2, "counter/start": 0.5})
    first()
    spec = JobSpec("inspect", root=tmp_path)
    analysis = Inspect(spec, base=first.node)  # Analysis(spec) with base= a checkpoint node
    assert (analysis.args.steps, analysis.args.start, analysis.args.target) == (
        2,
        0.5,
        "blocks_0/attn",
    )
    assert analysis.configuration.job == "tests/inspect"
    assert analysis(resume=True) == 2.0
    assert analysis.node == first.node
    assert values(analysis.store, first.node)["job/name"] == "tests/inspect"
    assert analysis.store.job_of(first.node) == "tests/counter"  # resume records no new job
    artifact = analysis.store.query().node(first.node).artifact().select()
    assert [a["content"] for a in artifact] == [b'{"target": "blocks_0/attn", "value": 2.0}']
    assert spec.result("activation.json").read_bytes() == artifact[0]["content"]


def test_config_classmethod_composes_components_and_own_defaults_win(tmp_path: Path) -> None:
    @dataclass
    class Model:
        steps: int = field("counter/steps", default=10)
        width: int = field("model/width", default=4)

    class WithModel(Counter):
        @classmethod
        def config(cls) -> list[type]:
            return [*super().config(), Model]

        def on_setup(self, mode: Mode) -> None:
            super().on_setup(mode)
            self.model = self.configure(Model)

    tree: Tree = WithModel.schema()
    assert tree.keys() == ["counter/steps", "counter/start", "counter/fail_at", "model/width"]
    assert tree["counter/steps"] == 3  # the job's CONFIG default wins over Model's 10
    tree["model/width"] = 8
    job = WithModel(JobSpec("m", root=tmp_path), config=tree)
    job.setup()
    assert job.model == Model(steps=3, width=8)
    assert job.store.job_of(job.node) == WithModel.__module__ + ":" + WithModel.__qualname__


def test_close_releases_only_a_store_the_job_opened(tmp_path: Path) -> None:
    job = counter(tmp_path)
    job()
    opened = job.store
    job.close()
    assert job.store is not opened  # reopened on the next use
    shared = Store(tmp_path / "store")
    borrowed = Counter(JobSpec("b", root=tmp_path), store=shared)
    borrowed()
    borrowed.close()
    assert borrowed.store is shared and shared.query().spec(run="b").count() == 4
    shared.close()


def test_bad_constructor_arguments(tmp_path: Path) -> None:
    with pytest.raises(JobTypeError, match="expects a JobSpec"):
        Counter("train")
    with pytest.raises(JobTypeError, match=r"base= must be a theseus.store.Node"):
        Counter(JobSpec("x", root=tmp_path), base="general.default.x~ab~0")


def test_a_host_other_than_zero_holds_the_store_folder_and_never_its_database(
    tmp_path: Path,
) -> None:
    from theseus.job import HostZeroStore, from_host_zero
    from theseus.store import StoreError

    elsewhere = HostZeroStore(tmp_path / "store")
    assert elsewhere.root == tmp_path / "store" and elsewhere.discard_if_empty() is False
    elsewhere.close()
    with pytest.raises(StoreError, match=r"store\.query on host 0: only host zero opens") as err:
        elsewhere.query()
    assert "from_host_zero(lambda: store.query(...))" in str(err.value)
    assert "\n" not in str(err.value)
    assert not (tmp_path / "store").exists()  # nothing was created or opened
    assert from_host_zero(lambda: 41 + 1) == 42  # one process: computed here
