"""Two jax.distributed processes (gloo on 127.0.0.1) train and analyze like one process.

The trainer runs the `Crop` analysis in tandem at each validation, and afterwards every
host runs `Crop` as a job on the last checkpoint. `Crop` crops rows that both hosts
placed, so each host must gather the other's rows; only host zero writes the files
and the store.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from theseus.data.datasets import Synthetic
from theseus.job import store_root
from theseus.quick import quick
from theseus.registry import import_module_or_file
from theseus.store import Store

HERE = Path(__file__).resolve().parent
jobs = import_module_or_file(str(HERE / "multihost_jobs.py"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _watching(database: Path, log: Path) -> dict[str, str]:
    """This environment, plus the watch that logs each open of `database` to `log`."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(HERE / "watch_database"), *filter(None, [env.get("PYTHONPATH")])]
    )
    env["THESEUS_WATCH_DATABASE"], env["THESEUS_WATCH_LOG"] = str(database), str(log)
    return env


def run_workers(
    script: str, root: Path, outs: list[Path], envs: list[dict[str, str]] | None = None
) -> None:
    """`script` (beside this file) as processes 0 and 1 of one cluster on a free port,
    each writing `outs[i]`; both must exit 0 (their output's tail otherwise)."""
    port = _free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, str(HERE / script), str(root), str(port), str(i), "2", str(out)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=None if envs is None else envs[i],
        )
        for i, out in enumerate(outs)
    ]
    logs = []
    for proc in procs:
        try:
            out, _ = proc.communicate(timeout=400)
        finally:
            proc.kill()
        logs.append(out.decode(errors="replace")[-4000:])
    assert [p.returncode for p in procs] == [0, 0], "\n---\n".join(logs)


def _arrays(content: bytes) -> dict[str, np.ndarray]:
    """The arrays of a `Crop` artifact (JSON lists of float32 values)."""
    return {k: np.asarray(v, dtype=np.float32) for k, v in json.loads(content).items()}


def _single_process(root: Path) -> tuple[object, list, object]:
    """The same global batches and analyses on this process's four devices."""
    with quick(root) as q:
        q.build(jobs.TrainWithCrop, "single")
        jobs.tiny(q.config, steps=jobs.STEPS, **jobs.SETTINGS)
        single = q.create()
        _, tandem = jobs.record_tandem(single)
        single()
    with quick(root) as q:
        q.build(jobs.Crop, "inspect-single")
        q.find().spec(run="single").checkpoint().latest().resume()
        result = q.create()()
    with quick(root) as q:
        q.build(jobs.PatchHeads, "patch-single")
        q.find().spec(run="single").checkpoint().latest().resume()
        patched = q.create()()
    return single, tandem, result, patched


@pytest.mark.slow  # the default suite's budget: nox -s slow runs it
@pytest.mark.multiprocess
def test_two_processes_train_the_same_model_as_one(tmp_path: Path) -> None:
    Synthetic.prepare(tmp_path, tokens=40_000, val_tokens=6_000)
    outs = [tmp_path / f"host{i}.npz" for i in range(2)]
    opens = [tmp_path / f"host{i}.opens" for i in range(2)]
    database = store_root(tmp_path) / "store.sqlite"
    run_workers("multihost_worker.py", tmp_path, outs, [_watching(database, o) for o in opens])

    # Host zero alone opened the database; host one had every answer by broadcast.
    assert opens[0].read_text().strip()  # the watch sees opens
    assert not opens[1].exists(), opens[1].read_text()

    hosts = [dict(np.load(o)) for o in outs]
    assert int(hosts[0]["devices"]) == 4
    for key in ("node", "tandem_nodes", "analysis_node"):  # every host agrees on the nodes
        np.testing.assert_array_equal(hosts[0][key], hosts[1][key], err_msg=key)

    single, tandem, result, patched = _single_process(tmp_path)
    assert jax.device_count() == 4
    flat = {
        jax.tree_util.keystr(p): np.asarray(v)
        for p, v in jax.tree_util.tree_flatten_with_path(single.state.params)[0]
    }
    for key, value in flat.items():
        np.testing.assert_allclose(hosts[0][key], value, rtol=1e-5, atol=1e-6, err_msg=key)
        np.testing.assert_array_equal(hosts[0][key], hosts[1][key])
    # fsdp across both processes: each host keeps half of a kernel (its two devices' quarters),
    # and the parameters are one process's dp ones within 1e-5, as |fsdp - dp| / |dp| over
    # each leaf (Adam turns a gradient entry near zero, summed in another order, into a
    # step of about the learning rate, so single entries can differ by more).
    for host in hosts:
        assert float(host["fsdp_kept"]) == 0.5
    for key, value in flat.items():
        got = hosts[0]["fsdp" + key]
        error = np.linalg.norm((got - value).ravel()) / np.linalg.norm(value.ravel())
        assert error <= 1e-5, f"fsdp{key}: relative error {error:.2e}"
        np.testing.assert_array_equal(got, hosts[1]["fsdp" + key])

    # Both hosts ran the compiled analysis (compiled once per view or job) and hold the
    # same global results: all 8 rows, half of them placed by the other host.
    expected = {
        "tandem": {k: np.stack([r.values[k] for r in tandem]) for k in ("x", "out")},
        "analysis": result.values,
    }
    assert expected["tandem"]["x"].shape == (2, 8, 4, 8)  # (validation, rows, tokens, features)
    for host in hosts:
        assert int(host["tandem_traces"]) == 1 and int(host["analysis_traces"]) == 1
        for run, values in expected.items():
            for key, value in values.items():
                name = f"{run}_{key}"
                np.testing.assert_array_equal(host[name], hosts[0][name], err_msg=name)
                np.testing.assert_allclose(host[name], value, rtol=1e-5, atol=1e-6, err_msg=name)
    # The intervention sweep: compiled once on each host, both hold the global change
    # (layers, heads, rows, tokens), equal to one process's.
    assert patched.values.shape == (1, 2, 8, 32)
    assert np.abs(patched.values).max() > 1e-3
    for host in hosts:
        assert int(host["patch_traces"]) == 1
        np.testing.assert_array_equal(host["patch_change"], hosts[0]["patch_change"])
        np.testing.assert_allclose(host["patch_change"], patched.values, rtol=1e-5, atol=1e-5)
    # Only host zero wrote (the file and the artifact): the checkpoint analysis inline;
    # in tandem the publishing thread did (the store below), so no host's run() returned
    # a path.
    for host, primary in zip(hosts, (True, False), strict=True):
        assert host["tandem_wrote"].tolist() == [False] * 2 == host["tandem_recorded"].tolist()
        assert bool(host["analysis_wrote"]) is primary is bool(host["analysis_recorded"])
    # The checkpoint analysis reads the state and batch of the last validation exactly.
    # plot() failed on host zero: host zero raised its own error, host one a clear one.
    assert str(hosts[0]["broken_raised"]) == "RuntimeError: plot() failed on purpose"
    assert str(hosts[1]["broken_raised"]).startswith("AnalysisError: BrokenPlot.plot()")
    for host in hosts:  # host zero's refusal to train over a later checkpoint, on both
        assert str(host["refused"]).startswith("TrainerError: cannot resume training from")
        assert "1 later checkpoint(s)" in str(host["refused"])
        # one host short of memory: no host decodes from bfloat16 copies; none short: all do
        assert not host["cast_when_short"] and host["cast_when_ample"]
    np.testing.assert_array_equal(hosts[0]["analysis_x"], hosts[0]["tandem_x"][-1])
    np.testing.assert_array_equal(hosts[0]["analysis_out"], hosts[0]["tandem_out"][-1])

    # Host zero alone wrote the store: one lineage, every node, both checkpoints, and one
    # version of `crop` per validation (seq 2, seq 5) plus one by the checkpoint analysis.
    with Store(store_root(tmp_path)) as store:
        lineages = {}
        for run in ("multihost", "single"):
            nodes = sorted(store.query().spec(run=run).all(), key=lambda n: n.seq)
            assert [n.seq for n in nodes] == list(range(6))
            assert len({n.nonce for n in nodes}) == 1
            steps = sorted(c.step for n in nodes for c in store.checkpoints(n))
            assert steps == [3, 6]
            versions = {n.seq: store.history(n, "crop") for n in nodes if "crop" in store.get(n)}
            assert {s: [a.version for a in v] for s, v in versions.items()} == {2: [1], 5: [1, 2]}
            lineages[run] = versions
    multihost, one = lineages["multihost"], lineages["single"]
    for seq, version in ((2, 0), (5, 0), (5, 1)):
        mine, theirs = _arrays(multihost[seq][version].content), _arrays(one[seq][version].content)
        assert sorted(mine) == ["out", "x"]
        for key in mine:
            np.testing.assert_allclose(mine[key], theirs[key], rtol=1e-5, atol=1e-6, err_msg=key)
    for index, seq in enumerate((2, 5)):  # the artifact holds exactly host zero's results
        stored = _arrays(multihost[seq][0].content)
        np.testing.assert_array_equal(stored["x"], hosts[0]["tandem_x"][index])
        np.testing.assert_array_equal(stored["out"], hosts[0]["tandem_out"][index])
    assert multihost[5][1].content == multihost[5][0].content  # the checkpoint's, the same

    # One file per run under analyses/, the latest version; nothing else (no temporary files).
    results = tmp_path / "analyses" / "general" / "default"
    files = sorted(p.relative_to(results).as_posix() for p in results.rglob("*") if p.is_file())
    assert files == [
        "inspect-single/crop.json",
        "inspect/crop.json",
        "multihost/crop.json",
        "patch-single/patch-heads.json",
        "patch/patch-heads.json",
        "single/crop.json",
    ]
    assert (results / "multihost" / "crop.json").read_bytes() == multihost[5][0].content
    assert (results / "inspect" / "crop.json").read_bytes() == multihost[5][1].content
