"""One host of a two-process CPU cluster: trains the tiny GPT under jax.distributed.

Usage: python multihost_worker.py ROOT PORT PROCESS_ID NUM_PROCESSES OUT.npz
Each process has two CPU devices; collectives go through gloo on 127.0.0.1.
The trainer runs the `Crop` analysis in tandem at every validation; afterwards every
host runs `Crop` again as a job on the last checkpoint (in the same order on each host).
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
    q.build(jobs.TrainWithCrop, "multihost")
    jobs.tiny(q.config, steps=jobs.STEPS, **jobs.SETTINGS)
    trainer = q.create()
    view, tandem = jobs.record_tandem(trainer)  # Crop's result at each validation, this host
    trainer()

# The checkpoint analysis: every host builds, selects, creates and calls in the same order.
with quick(root) as q:
    q.build(jobs.Crop, "inspect")
    q.find().spec(run="multihost").checkpoint().latest().resume()
    analysis = q.create()
    result = analysis()

# The same training with the state fully sharded over both processes' devices (fsdp).
with quick(root) as q:
    q.build(jobs.TrainWithCrop, "multihost-fsdp")
    jobs.tiny(q.config, steps=jobs.STEPS, **jobs.SETTINGS, **{"training/strategy": "fsdp"})
    q.config["training/analyze"] = False
    fsdp = q.create()
    fsdp()
kernel = fsdp.state.params["blocks_0"]["attn"]["c_attn"]["kernel"]
fsdp_kept = sum(s.data.size for s in kernel.addressable_shards) / kernel.size  # this host's

# An intervention sweep on the same checkpoint (interventions run on the global batch).
with quick(root) as q:
    q.build(jobs.PatchHeads, "patch")
    q.find().spec(run="multihost").checkpoint().latest().resume()
    patching = q.create()
    patched = patching()

# A plot() that fails on host zero: every host raises, none waits at a later collective.
with quick(root) as q:
    q.build(jobs.BrokenPlot, "broken")
    q.find().spec(run="multihost").checkpoint().latest().resume()
    broken = q.create()
    try:
        broken()
        raised = "nothing"
    except Exception as exc:  # the test compares what each host raised
        raised = f"{type(exc).__name__}: {exc}"

# Resuming before the lineage's last checkpoint: host zero refuses under the lineage's
# lock, and every host raises its refusal (none waits at the next collective).
with quick(root) as q:
    q.build(jobs.TrainWithCrop, "multihost")
    q.find().spec(run="multihost").seq(2).resume()
    early = q.create()
    try:
        early()
        refused = "nothing"
    except Exception as exc:
        refused = f"{type(exc).__name__}: {exc}"

# Decoding from bfloat16 copies: where the hosts' devices report different free memory
# (host zero plenty, host one too little), every host decides as the one with the least.
import jax.numpy as jnp  # noqa: E402

from theseus.model import generation  # noqa: E402
from theseus.model.models import GPT  # noqa: E402

half = GPT.build(n_layers=1, n_embd=16, n_head=2, block_size=16, vocab_size=32, dtype="bfloat16")
weights = jax.jit(half.init)(jax.random.key(0), jnp.zeros((1, 4), jnp.int32))["params"]
generation._device_free = lambda device: 2**40 if jax.process_index() == 0 else 1
cast_when_short = generation.decoding_params(half, weights) is not weights
generation._device_free = lambda device: 2**40
cast_when_ample = generation.decoding_params(half, weights) is not weights

params = jax.tree.map(
    lambda a: np.asarray(jax.experimental.multihost_utils.process_allgather(a, tiled=True)),
    trainer.state.params,
)
flat = {
    jax.tree_util.keystr(path): leaf
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]
}
fsdp_params = jax.tree.map(
    lambda a: np.asarray(jax.experimental.multihost_utils.process_allgather(a, tiled=True)),
    fsdp.state.params,
)
flat.update(
    {
        "fsdp" + jax.tree_util.keystr(path): leaf
        for path, leaf in jax.tree_util.tree_flatten_with_path(fsdp_params)[0]
    }
)
np.savez(
    out,
    node=str(trainer.node.serialize()),
    devices=jax.device_count(),
    tandem_traces=view.traces,
    tandem_nodes=[str(r.node.serialize()) for r in tandem],
    tandem_x=np.stack([r.values["x"] for r in tandem]),
    tandem_out=np.stack([r.values["out"] for r in tandem]),
    tandem_wrote=[r.path is not None for r in tandem],
    tandem_recorded=[r.artifact is not None for r in tandem],
    analysis_traces=analysis.traces,
    analysis_node=str(result.node.serialize()),
    analysis_x=result.values["x"],
    analysis_out=result.values["out"],
    analysis_wrote=result.path is not None,
    analysis_recorded=result.artifact is not None,
    fsdp_kept=fsdp_kept,
    patch_traces=patching.traces,
    patch_change=patched.values,
    broken_raised=raised,
    refused=refused,
    cast_when_short=cast_when_short,
    cast_when_ample=cast_when_ample,
    **flat,
)
jax.distributed.shutdown()
