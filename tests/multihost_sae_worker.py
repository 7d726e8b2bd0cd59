"""One host of a two-process CPU cluster: an SAE chain over a lineage's checkpoints.

Usage: python multihost_sae_worker.py ROOT PORT PROCESS_ID NUM_PROCESSES OUT.npz
Each process has two CPU devices; collectives go through gloo on 127.0.0.1.
"""

import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
os.environ["JAX_PLATFORMS"] = "cpu"

import jax

root, port, process_id, processes, out = sys.argv[1:6]
jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(
    coordinator_address=f"127.0.0.1:{port}",
    num_processes=int(processes),
    process_id=int(process_id),
    initialization_timeout=120,
)

import numpy as np  # noqa: E402

from theseus.quick import quick  # noqa: E402
from theseus.registry import import_module_or_file  # noqa: E402

here = os.path.dirname(os.path.abspath(__file__))
jobs = import_module_or_file(os.path.join(here, "multihost_jobs.py"))

with quick(root) as q:
    q.build(jobs.Features, "features")
    q.find().spec(run="trained").over()
    job = q.create()
    walked = job()

# What this host computed (every host computes; host zero alone records).
np.savez(
    out,
    devices=jax.device_count(),
    compiles=np.array(sorted(job.compiles.items()), dtype=object),
    nodes=np.array([n.seq for n in walked.nodes]),
    recorded=np.array([r.artifact is not None for r in walked.results]),
)
