"""Import throughput: `theseus import hf` of a sharded folder vs transformers' `from_pretrained`.

Run: ``uv run --group bench python benchmarks/hf_vs_transformers.py [--quick] [--json PATH]``

The random Llama-like folder of ``hf_import.py`` (about 1 GB of float32 in 2 safetensors
shards; ``--quick``: about 100 MB) is read, each round, by two fresh processes in
alternating order:

* ours, in memory: ``read_hf(folder)`` (the folder checked whole), the model's
  parameter shapes traced, and ``load_params`` (every tensor streamed into arrays placed
  with their shardings): the model in memory, as ``from_pretrained`` leaves it;
* ours, the whole import: ``import_hf(folder, root, run)``, the function behind
  ``theseus import hf``: the above, then the first node's checkpoint written and
  registered in a new store (durable on disk at the end; information: ``from_pretrained``
  writes nothing, and on this machine's disk writing 1 GB alone takes about 5 s);
* theirs: ``AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)`` on the CPU
  (the model in memory, nothing written), in an interpreter that has PyTorch: the one
  ``THESEUS_BENCH_TORCH_PYTHON`` names, or a virtual environment this script makes once
  under ``~/.cache/theseus-benchmarks/torch`` (``pip install torch==2.13.0 transformers``;
  never installed into the workspace).

Each side times only its call, after its imports (Python, JAX or PyTorch start-up is
not the import's work); throughput is the folder's weight bytes over that time, and the
rows' ratios are ours / theirs throughput per round (information). The goal (>= 1) is on
a third pair of sides: a fresh process each, timed from just before it is spawned to its
first logits of a 16-token prompt (interpreter start, imports, reading the folder, the
first forward; ours compiles its forward, and from_pretrained's mapped weights are read
there), theirs time / ours time per round.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import venv
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file or with -m
from benchmarks import _report
from benchmarks.hf_import import QUICK, SIZES, write_folder

GOAL = 1.0
TORCH = "torch==2.13.0"

_OURS = r"""
import json, sys, time
from theseus.experiments.models.hf import import_hf
start = time.perf_counter()
import_hf(sys.argv[1], sys.argv[2], "imported")
print(json.dumps({"seconds": time.perf_counter() - start}))
"""

_OURS_LOAD = r"""
import json, sys, time
import flax.linen as nn, jax, jax.numpy as jnp
from theseus.model.hf import load_params, read_hf
from theseus.model.models import GPT
start = time.perf_counter()
folder = read_hf(sys.argv[1])
model = GPT.build(**folder.settings)
shapes = jax.eval_shape(
    lambda: nn.unbox(model.init(jax.random.key(0), jnp.zeros((1, 8), jnp.int32)))["params"]
)
device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=device), shapes)
jax.block_until_ready(load_params(folder, abstract))
seconds = time.perf_counter() - start
status = open("/proc/self/status").read().split("RssAnon:")[1]
print(json.dumps({"seconds": seconds, "anon_mb": int(status.split()[0]) / 1024}))
"""

_OURS_FIRST = r"""
import json, sys, time
import flax.linen as nn, jax, jax.numpy as jnp
from theseus.model.hf import load_params, read_hf
from theseus.model.models import GPT
folder = read_hf(sys.argv[1])
model = GPT.build(**folder.settings)
shapes = jax.eval_shape(
    lambda: nn.unbox(model.init(jax.random.key(0), jnp.zeros((1, 8), jnp.int32)))["params"]
)
device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=device), shapes)
params = load_params(folder, abstract)
prompt = jnp.asarray([list(range(1, 17))], jnp.int32)
logits = jax.jit(lambda p, x: model.apply({"params": p}, x)[0])(params, prompt)
first = float(logits[0, -1, 0])  # on the host: the logits exist
print(json.dumps({"seconds": time.time() - float(sys.argv[2])}))
"""

_THEIRS_FIRST = r"""
import json, sys, time
import torch, transformers
torch.set_num_threads(max(1, len(__import__("os").sched_getaffinity(0))))
model = transformers.AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32)
with torch.no_grad():
    logits = model(torch.arange(1, 17)[None]).logits
first = float(logits[0, -1, 0])
print(json.dumps({"seconds": time.time() - float(sys.argv[2])}))
"""

_THEIRS = r"""
import json, sys, time
import torch, transformers
torch.set_num_threads(max(1, len(__import__("os").sched_getaffinity(0))))
start = time.perf_counter()
model = transformers.AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32)
seconds = time.perf_counter() - start
assert next(model.parameters()).dtype == torch.float32
status = open("/proc/self/status").read().split("RssAnon:")[1]
print(json.dumps({"seconds": seconds, "anon_mb": int(status.split()[0]) / 1024}))
"""


def torch_python(extra: tuple[str, ...] = (), name: str = "torch") -> str:
    """An interpreter with PyTorch, transformers and `extra` (made once under
    ``~/.cache/theseus-benchmarks/NAME``; never the workspace's)."""
    named = os.environ.get("THESEUS_BENCH_TORCH_PYTHON")
    if named:
        return named
    home = Path.home() / ".cache" / "theseus-benchmarks" / name
    python = home / "bin" / "python"
    ready = home / ".ready"
    wanted = " ".join([TORCH, "transformers", *extra]) + "\n"
    if not ready.is_file() or ready.read_text() != wanted:
        venv.create(home, with_pip=True, clear=True)
        pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        subprocess.run([*pip, TORCH], check=True)  # pip takes the CPU wheel; uv never does
        subprocess.run([*pip, "transformers", "safetensors", "tokenizers", *extra], check=True)
        ready.write_text(wanted)
    return str(python)


def _measure(command: list[str]) -> dict[str, float]:
    """The last JSON line a side prints: its `seconds`, and `anon_mb` where it says. A
    command ending in `SPAWN` gets the wall-clock time just before it starts there."""
    if command[-1] == "SPAWN":
        command = [*command[:-1], repr(time.time())]
    out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    return dict(json.loads(out.strip().splitlines()[-1]))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5, help="rounds of both sides")
    _report.add_arguments(p)
    args = p.parse_args(argv)
    sizes = QUICK if args.quick else SIZES
    rounds = 1 if args.quick else args.rounds
    theirs_python = torch_python()
    loaded_s, ours_s, theirs_s, first_ours, first_theirs = [], [], [], [], []
    anon: dict[str, list[float]] = {"load": [], "theirs": []}
    with tempfile.TemporaryDirectory(prefix="hf-vs-transformers-") as tmp:
        folder = Path(tmp) / "llama"
        folder.mkdir()
        write_folder(folder, sizes)
        weights = sum(f.stat().st_size for f in folder.glob("*.safetensors"))
        for r in range(rounds):
            root = Path(tmp) / f"root{r}"
            sides = {
                "load": [sys.executable, "-c", _OURS_LOAD, str(folder)],
                "import": [sys.executable, "-c", _OURS, str(folder), str(root)],
                "theirs": [theirs_python, "-c", _THEIRS, str(folder)],
                "first": [sys.executable, "-c", _OURS_FIRST, str(folder), "SPAWN"],
                "theirs_first": [theirs_python, "-c", _THEIRS_FIRST, str(folder), "SPAWN"],
            }
            order = list(sides) if r % 2 == 0 else list(sides)[::-1]
            measured = {side: _measure(sides[side]) for side in order}
            seconds = {side: measured[side]["seconds"] for side in sides}
            anon["load"].append(measured["load"]["anon_mb"])
            anon["theirs"].append(measured["theirs"]["anon_mb"])
            loaded_s.append(weights / seconds["load"] / 1e6)
            ours_s.append(weights / seconds["import"] / 1e6)
            theirs_s.append(weights / seconds["theirs"] / 1e6)
            first_ours.append(seconds["first"])
            first_theirs.append(seconds["theirs_first"])
            print(
                f"round {r + 1}: in memory {seconds['load']:.2f} s ({loaded_s[-1]:.0f} MB/s), "
                f"import_hf {seconds['import']:.2f} s ({ours_s[-1]:.0f} MB/s), "
                f"from_pretrained {seconds['theirs']:.2f} s ({theirs_s[-1]:.0f} MB/s); first "
                f"logits from a fresh process: ours {seconds['first']:.2f} s, transformers "
                f"{seconds['theirs_first']:.2f} s"
            )
    size = f"{weights / 1e9:.2f} GB llama-like, 2 shards"
    rows = [
        _report.compare(
            f"hf import: a fresh process's time to the imported model's first logits, ours "
            f"(read_hf, load_params, a compiled forward) vs transformers (from_pretrained, a "
            f"forward), {size}",
            first_ours,
            first_theirs,
            unit="s",
            fmt="{:.2f} s",
            ratio="theirs/ours",
            meaning="theirs time / ours time (the same round); above 1: ours first",
            note=(
                "each side a new Python process, timed from just before it is spawned to its "
                "first logits of a 16-token prompt on the host: interpreter start, imports "
                "(JAX or PyTorch), reading the folder and the first forward (ours compiles it)"
            ),
            goal=(">=", GOAL),
        ),
        _report.compare(
            f"hf import throughput, the model in memory (checked, streamed, placed) vs "
            f"transformers from_pretrained, {size}",
            loaded_s,
            theirs_s,
            unit="MB/s",
            fmt="{:,.0f} MB/s",
            ratio="ours/theirs",
            meaning="ours throughput / theirs throughput (the same round)",
            note=(
                f"new memory the process holds when its call returns (RssAnon, median): ours "
                f"{statistics.median(anon['load']):,.0f} MB, from_pretrained "
                f"{statistics.median(anon['theirs']):,.0f} MB (it maps the safetensors files "
                "and reads a weight on its first use); on this machine's virtual memory a "
                "process's first touch of new memory costs 0.1 to 4 s per GB; information: "
                "from_pretrained maps the files and reads them at the first forward, so the "
                "goal is on the first-logits row"
            ),
        ),
        _report.compare(
            f"hf import throughput, theseus import hf (and its checkpoint written) vs "
            f"transformers from_pretrained (nothing written), {size}",
            ours_s,
            theirs_s,
            unit="MB/s",
            fmt="{:,.0f} MB/s",
            ratio="ours/theirs",
            meaning="ours throughput / theirs throughput (the same round); information",
            note="the import also writes the weights as a durable orbax checkpoint",
        ),
    ]
    _report.write(args.json, "hf_vs_transformers", args.quick, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
