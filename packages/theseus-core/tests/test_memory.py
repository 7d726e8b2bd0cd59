"""A state that cannot fit is refused at setup, in one line, before anything is allocated.

Before, `theseus run y ok.yaml ROOT architecture/n_embd=65536` printed nothing for 825 s
at 0% CPU: XLA's allocation of a state many times the memory never returned. References:
the bytes each device really keeps of an allocated state (its arrays' shards), and the
parameter count of the default GPT written out by hand (checked on a small model here).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import jax
import pytest
from click.testing import CliRunner

from theseus.cli import main
from theseus.data.datasets import Synthetic
from theseus.quick import quick
from theseus.registry import import_module_or_file
from theseus.store import Store
from theseus.training import _memory

jobs = import_module_or_file(str(Path(__file__).with_name("trainer_jobs.py")))


def _gpt_parameters(n_layers: int, n_embd: int, vocab: int) -> int:
    """The default GPT's parameter count, by hand: per block a fused QKV [E, 3E], the
    attention's projection [E, E], the MLP [E, 4E] and [4E, E], two norm scales [E];
    then the final norm [E] and the (tied) embedding [V, E]."""
    return n_layers * (12 * n_embd**2 + 2 * n_embd) + n_embd + vocab * n_embd


def _set_up(root: Path, run: str, **settings: Any) -> Any:
    with quick(root) as q:
        q.build(jobs.SyntheticTrainer, run)
        jobs.tiny(q.config, steps=2, **settings)
        return q.create()


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("memory")
    Synthetic.prepare(root, tokens=30_000, val_tokens=4_000)
    return root


@pytest.mark.parametrize("strategy", ["dp", "fsdp"])
def test_the_bytes_each_device_keeps_are_known_before_anything_is_allocated(
    root: Path, strategy: str
) -> None:
    trainer = _set_up(root, f"bytes-{strategy}", **{"training/strategy": strategy})
    abstract = trainer.layout.abstract
    predicted = _memory.device_bytes([abstract.params, abstract.opt_state])
    kept: dict[Any, int] = {}  # the reference: the shards the allocated state holds
    for leaf in jax.tree.leaves([trainer.state.params, trainer.state.opt_state]):
        for shard in leaf.addressable_shards:
            kept[shard.device] = kept.get(shard.device, 0) + shard.data.nbytes
    assert predicted == kept and len(kept) == 4  # the four CPU devices of the tests
    parameters = _gpt_parameters(1, 32, 258)  # TINY: 1 layer, n_embd 32
    leaves = jax.tree.leaves(trainer.state.params)
    assert sum(leaf.size for leaf in leaves) == parameters  # the formula, on a real model
    assert _memory.whole_bytes(abstract.params) == 4 * parameters  # float32


def test_a_device_that_reports_its_memory_holds_its_own_share(root: Path) -> None:
    """A device that reports `bytes_limit` (a GPU's, a TPU's) is held to its share: the
    same model that dp cannot place fits when fsdp splits it over the four devices."""
    dp = _set_up(root, "limit-dp").layout.abstract
    fsdp = _set_up(root, "limit-fsdp", **{"training/strategy": "fsdp"}).layout.abstract
    share = {
        name: max(_memory.device_bytes([a.params, a.opt_state]).values())
        for name, a in (("dp", dp), ("fsdp", fsdp))
    }
    assert share["fsdp"] < share["dp"]
    between = (share["fsdp"] + share["dp"]) // 2

    def limit(device: jax.Device) -> int:  # what such a device's memory_stats would say
        return between

    refused = _memory.refusal(dp, limit=limit, available=lambda: None)
    assert refused is not None
    reason, own = refused
    assert own and reason.startswith("the model's state does not fit on CPU device 0: ")
    assert f"the device keeps {share['dp'] / 1e9:,.2f} GB" in reason
    assert _memory.refusal(fsdp, limit=limit, available=lambda: None) is None


# The child may reserve 8 GiB of address space: a state that slipped through the check
# fails to allocate at once instead of taking the machine's memory.
LIMITED = (
    "import resource; resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30)); "
    "from theseus.cli import main; main()"
)


def test_a_model_too_big_for_the_machine_is_refused_in_one_line(tmp_path: Path) -> None:
    root, config = tmp_path / "root", tmp_path / "ok.yaml"
    Synthetic.prepare(root, tokens=30_000, val_tokens=4_000)
    theseus = [sys.executable, "-c", LIMITED]
    # the configuration is written here (no memory limit needed); the run is limited
    written = CliRunner().invoke(main, ["configure", "gpt/train/pretrain", str(config)])
    assert written.exit_code == 0, written.output
    done = subprocess.run(
        [*theseus, "run", "y", str(config), str(root), "architecture/n_embd=65536"],
        capture_output=True,
        text=True,
        timeout=600,  # a hang fails here; the refusal takes seconds
    )
    assert done.returncode == 1, done.stderr
    [line] = [row for row in (done.stdout + done.stderr).splitlines() if "TrainerError" in row]
    parameters = _gpt_parameters(4, 65536, 258)  # gpt/train/pretrain's 4 layers
    assert re.search(
        rf"does not fit in this machine's memory: parameters {4 * parameters / 1e9:,.2f} GB "
        rf"\+ optimizer state {8 * parameters / 1e9:,.2f} GB, of which the \d+ CPU device\(s\) "
        r"of this process keep [\d,.]+ GB, and [\d,.]+ GB is available\. Make the model smaller",
        line,
    ), line
    with Store(root / "store") as store:  # recorded as a run that never started
        [run] = store.runs()
        assert "does not fit" in str(store.never_started(run))
