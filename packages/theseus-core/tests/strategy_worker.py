"""Train the tiny synthetic GPT with one strategy on this process's devices; save the state.

Usage: python strategy_worker.py ROOT RUN STRATEGY SHARD STEPS OUT.npz [RESUME_NODE]
The device count comes from XLA_FLAGS (the test sets it); STRATEGY_WORKER_SETTINGS, if
set, is a JSON object of further settings (`{"architecture/n_kv_head": 2}`). With RESUME_NODE the run
continues that checkpoint (any strategy and device count saved it) to STEPS steps
under this STRATEGY and SHARD. OUT.npz holds every parameter and optimizer-state leaf
(by key path), the devices, the bytes each device keeps of the parameters and of the
optimizer state, and their whole sizes.
"""

import json
import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import numpy as np

from theseus.quick import quick
from theseus.registry import import_module_or_file

root, run, strategy, shard, steps, out = sys.argv[1:7]
resume = sys.argv[7] if len(sys.argv) > 7 else None
jobs = import_module_or_file(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "trainer_jobs.py")
)
settings = {
    "training/strategy": strategy,
    "training/shard": int(shard),
    "logging/checkpoint_interval": 10,
    "logging/validation_interval": 10,
    **json.loads(os.environ.get("STRATEGY_WORKER_SETTINGS", "{}")),
}

with quick(root) as q:
    q.build(jobs.SyntheticTrainer, run)
    jobs.tiny(q.config, steps=int(steps), **settings)
    if resume is not None:
        q.find().node(q.store.resolve(resume)).resume()
        for key, value in settings.items():
            q.config[key] = value
    trainer = q.create()
    trainer()


def leaves(tree, prefix):
    return {
        prefix + jax.tree_util.keystr(path): np.asarray(leaf)
        for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]
    }


def kept(tree):
    return sum(leaf.addressable_shards[0].data.nbytes for leaf in jax.tree.leaves(tree))


def whole(tree):
    return sum(leaf.nbytes for leaf in jax.tree.leaves(tree))


state = trainer.state
np.savez(
    out,
    node=str(trainer.node.serialize()),
    devices=jax.device_count(),
    kept_params=kept(state.params),
    whole_params=whole(state.params),
    kept_opt=kept(state.opt_state),
    whole_opt=whole(state.opt_state),
    **leaves(state.params, "params"),
    **leaves(state.opt_state, "opt"),
)
