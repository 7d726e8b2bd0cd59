"""Two jax.distributed processes (gloo on 127.0.0.1) train an SAE chain like one process.

The lineage is trained here on four devices; two workers of two devices each walk its
checkpoints with an SAE analysis (the buffer's lanes split over both hosts' devices,
the held-out measures and top contexts gathered from both), host zero alone writing the
store. The reference is the same walk in this process, in a copy of the root made
before: the SAEs agree (decoder directions, measures), every compiled program is traced
once on each host, and the second node's SAE is matched to the first's.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from theseus.data.datasets import Synthetic
from theseus.job import store_root
from theseus.quick import quick
from theseus.registry import import_module_or_file
from theseus.store import Node, Store

HERE = Path(__file__).resolve().parent
jobs = import_module_or_file(str(HERE / "multihost_jobs.py"))
multihost = import_module_or_file(str(HERE / "test_multihost.py"))
LABEL = "blocks_0/mlp/64"


def _chain(root: Path) -> dict[int, dict[str, object]]:
    """Each checkpointed node's SAE: its values, decoder and features.json."""
    with Store(store_root(root)) as store:
        nodes = sorted(
            {c.node for c in store.query().spec(run="trained").checkpoints()}, key=lambda n: n.seq
        )
        found = {}
        for node in nodes:
            held = store.get(node)
            weights = held[f"features/{LABEL}/sae_weights.safetensors"].content
            prefix = f"sae/features/{LABEL}/"
            found[node.seq] = {
                "values": {
                    k[len(prefix) :]: v
                    for k, v in store.values(node).items()
                    if k.startswith(prefix)
                },
                "W_dec": _decoder(weights),
                "features": json.loads(held[f"features/{LABEL}/features.json"].content),
                "node": node,
            }
        return found


def _decoder(content: bytes) -> np.ndarray:
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    rows = np.asarray(safetensors_numpy.load(content)["W_dec"], np.float64)
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


@pytest.mark.slow
@pytest.mark.multiprocess
def test_two_processes_train_the_sae_chain_one_process_trains(tmp_path: Path) -> None:
    root, reference = tmp_path / "root", tmp_path / "reference"
    Synthetic.prepare(root, tokens=40_000, val_tokens=6_000)
    with quick(root) as q:
        q.build(jobs.trainer_jobs.SyntheticTrainer, "trained")
        jobs.tiny(q.config, steps=4, **{"logging/checkpoint_interval": 2})
        q.create()()
    shutil.copytree(root, reference)

    outs = [tmp_path / f"host{i}.npz" for i in range(2)]
    multihost.run_workers("multihost_sae_worker.py", root, outs)
    hosts = [dict(np.load(o, allow_pickle=True)) for o in outs]
    for host, primary in zip(hosts, (True, False), strict=True):
        assert int(host["devices"]) == 4
        assert dict(host["compiles"].tolist()) == dict.fromkeys(
            ["contexts", "evaluate", "fill", "scales", "start", "step"], 1
        )
        assert host["nodes"].tolist() == hosts[0]["nodes"].tolist()
        assert host["recorded"].tolist() == [primary] * len(host["nodes"])

    with quick(reference) as q:  # the same walk in this process (four devices)
        q.build(jobs.Features, "features")
        q.find().spec(run="trained").over()
        q.create()()
    two, one = _chain(root), _chain(reference)
    assert sorted(two) == sorted(one) and len(two) == 2
    for seq in two:
        cosine = np.sum(two[seq]["W_dec"] * one[seq]["W_dec"], axis=1)
        assert cosine.min() > 0.999, (seq, cosine.min())
        for key in ("fvu", "l0", "loss_clean", "loss_zeroed", "loss_spliced", "loss_recovered"):
            assert two[seq]["values"][key] == pytest.approx(one[seq]["values"][key], rel=1e-3)
    first, second = sorted(two)
    assert two[first]["values"]["matched"] is None
    assert two[second]["values"]["matched"] == pytest.approx(
        one[second]["values"]["matched"], abs=0.05
    )
    node = two[first]["node"]
    assert isinstance(node, Node)
    assert two[second]["features"]["previous"] == node.serialize()
