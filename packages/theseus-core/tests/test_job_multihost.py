"""Two JAX processes run one job: they agree on the node; only host zero writes."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from theseus.store import Node, Store

WORKER = """
import sys
import jax
jax.config.update("jax_cpu_collectives_implementation", "gloo")
address, pid, root, jobs_file = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
jax.distributed.initialize(coordinator_address=address, num_processes=2, process_id=pid)
from theseus.job import JobSpec
from theseus.registry import import_module_or_file
jobs = import_module_or_file(jobs_file)
job = jobs.Counter(JobSpec("multihost", root=root))
value = job()
print("RESULT", jax.process_index(), job.node.serialize(), value, flush=True)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return int(s.getsockname()[1])


@pytest.mark.multiprocess
def test_two_hosts_share_one_lineage_and_host_zero_writes(tmp_path: Path) -> None:
    address = f"localhost:{free_port()}"
    jobs_file = str(Path(__file__).with_name("core_jobs.py"))
    env = {
        **os.environ,
        "JAX_PLATFORMS": "cpu",
        "XLA_FLAGS": "--xla_force_host_platform_device_count=1",
    }
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, address, str(pid), str(tmp_path), jobs_file],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for pid in (0, 1)
    ]
    outputs = []
    for proc in procs:
        try:
            out, err = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise
        assert proc.returncode == 0, err[-3000:]
        outputs.append(next(line for line in out.splitlines() if line.startswith("RESULT")).split())
    (_, i0, node0, v0), (_, i1, node1, v1) = outputs
    assert (i0, i1) == ("0", "1")
    assert node0 == node1  # one nonce, drawn by host zero
    assert float(v0) == float(v1) == 8.0
    store = Store(tmp_path / "store")
    end = Node.deserialize(node0)
    assert store.query().nonce(end.nonce).count() == 4
    assert store.query().count() == 4  # host one created no lineage of its own
    assert store.query().checkpoint().count() == 3
    assert store.values(end) == {
        "counter/value": 8.0,
        "job/status": "finished",
        "job/name": "tests/counter",
        "job/module": "core_jobs",
    }
    store.close()
