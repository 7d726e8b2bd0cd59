"""Two jax.distributed processes (gloo on 127.0.0.1) train like one process with all devices."""

from __future__ import annotations

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
jobs = import_module_or_file(
    str(HERE.parent / "packages" / "theseus-core" / "tests" / "trainer_jobs.py")
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.multiprocess
def test_two_processes_train_the_same_model_as_one(tmp_path: Path) -> None:
    Synthetic.prepare(tmp_path, tokens=40_000, val_tokens=6_000)
    port = _free_port()
    outs = [tmp_path / f"host{i}.npz" for i in range(2)]
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(HERE / "multihost_worker.py"),
                str(tmp_path),
                str(port),
                str(i),
                "2",
                str(outs[i]),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for i in range(2)
    ]
    logs = []
    for proc in procs:
        try:
            out, _ = proc.communicate(timeout=400)
        finally:
            proc.kill()
        logs.append(out.decode(errors="replace")[-4000:])
    assert [p.returncode for p in procs] == [0, 0], "\n---\n".join(logs)

    hosts = [dict(np.load(o)) for o in outs]
    assert int(hosts[0]["devices"]) == 4
    assert str(hosts[0]["node"]) == str(hosts[1]["node"])  # every host agrees on the lineage

    # The same global batches on one process with four devices.
    with quick(tmp_path) as q:
        q.build(jobs.SyntheticTrainer, "single")
        jobs.tiny(
            q.config,
            steps=6,
            **{"logging/checkpoint_interval": 3, "logging/validation_interval": 3},
        )
        single = q.create()
        single()
    assert jax.device_count() == 4
    flat = {
        jax.tree_util.keystr(p): np.asarray(v)
        for p, v in jax.tree_util.tree_flatten_with_path(single.state.params)[0]
    }
    for key, value in flat.items():
        np.testing.assert_allclose(hosts[0][key], value, rtol=1e-5, atol=1e-6, err_msg=key)
        np.testing.assert_array_equal(hosts[0][key], hosts[1][key])

    # Host zero alone wrote the store: one lineage, every node, both checkpoints.
    with Store(store_root(tmp_path)) as store:
        nodes = store.query().spec(run="multihost").all()
        assert sorted(n.seq for n in nodes) == list(range(6))
        assert len({n.nonce for n in nodes}) == 1
        steps = sorted(c.step for n in nodes for c in store.checkpoints(n))
        assert steps == [3, 6]
