"""One host of a two-process CPU cluster: trains the tiny GPT under jax.distributed.

Usage: python multihost_worker.py ROOT PORT PROCESS_ID NUM_PROCESSES OUT.npz
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
jobs = import_module_or_file(
    os.path.join(here, "..", "packages", "theseus-core", "tests", "trainer_jobs.py")
)

with quick(root) as q:
    q.build(jobs.SyntheticTrainer, "multihost")
    jobs.tiny(
        q.config, steps=6, **{"logging/checkpoint_interval": 3, "logging/validation_interval": 3}
    )
    trainer = q.create()
    trainer()

params = jax.tree.map(
    lambda a: np.asarray(jax.experimental.multihost_utils.process_allgather(a, tiled=True)),
    trainer.state.params,
)
flat = {
    jax.tree_util.keystr(path): leaf
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]
}
np.savez(out, node=str(trainer.node.serialize()), devices=jax.device_count(), **flat)
jax.distributed.shutdown()
