"""`theseus run` trains the demo's model fully sharded on 4 virtual devices.

The run prints what each device keeps of the parameters and of the optimizer state; the
test checks those numbers against the model's parameter count (an abstract init of the
same architecture, independent of the arrays' shardings), and that training, validation,
the tandem analyses and the checkpoint all went through under `training/strategy=fsdp`.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import yaml

from theseus.analysis._demo_cli import DEMO_SETTINGS
from theseus.analysis.demo import DemoTrainer
from theseus.data.datasets import Synthetic
from theseus.job import store_root
from theseus.model.models import GPT
from theseus.store import Store

STEPS = 40
DEVICES = 4
MEMORY = re.compile(
    r"state on (\d+) device\(s\) \(training/strategy = (\w+), training/shard = (\d+)\): "
    r"parameters ([\d.,]+) MB, each device keeps ([\d.,]+) MB \((\d+)%\); "
    r"optimizer state ([\d.,]+) MB, each device keeps ([\d.,]+) MB \((\d+)%\)"
)


def _theseus() -> str:
    return str(Path(sys.executable).with_name("theseus"))


@pytest.mark.slow
def test_theseus_run_trains_the_demo_model_with_fsdp_on_four_devices(tmp_path: Path) -> None:
    Synthetic.prepare(tmp_path, tokens=60_000, val_tokens=8_000)
    config = tmp_path / "demo.yaml"
    demo = ["--import", "theseus.analysis.demo"]
    subprocess.run([_theseus(), "configure", "demo/train", str(config), *demo], check=True)
    settings = {**DEMO_SETTINGS, "logging/report_interval": 10, "logging/validation_interval": 20}
    overrides = [f"{key.replace('/', '.')}={value}" for key, value in settings.items()]
    per_step = int(DEMO_SETTINGS["training/batch_size"]) * int(
        DEMO_SETTINGS["architecture/block_size"]
    )
    overrides += ["training.strategy=fsdp", f"training.tokens={STEPS * per_step}"]
    env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={DEVICES}"}
    done = subprocess.run(
        [_theseus(), "run", "sharded", str(config), str(tmp_path), *demo, *overrides],
        capture_output=True, text=True, timeout=600, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]

    found = MEMORY.search(done.stderr)
    assert found, done.stderr[-3000:]
    devices, strategy, shard = int(found[1]), found[2], int(found[3])
    assert (devices, strategy, shard) == (DEVICES, "fsdp", 1)
    params_mb, params_device_mb = float(found[4]), float(found[5])
    optimizer_mb, optimizer_device_mb = float(found[7]), float(found[8])

    # The reference: the same architecture's parameters counted from an abstract init.
    with Store(store_root(tmp_path)) as store:
        last = store.query().spec(run="sharded").checkpoint().latest().first()
        assert last is not None and store.values(last)["train/step"] == STEPS
        saved = yaml.safe_load(store.job_config(last) or "")
        validated = [n for n in store.query().spec(run="sharded").has("val/loss").all()]
        patterns = store.query().spec(run="sharded").artifact("attention-pattern").all()
    architecture = {f"architecture/{k}": v for k, v in saved["architecture"].items()}
    model = GPT.build(**{k: v for k, v in architecture.items() if k in _gpt_keys()})
    block = int(DEMO_SETTINGS["architecture/block_size"])
    abstract = jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, block), jnp.int32))
    count = sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(abstract))
    whole_mb = count * 4 / 1e6  # float32
    assert params_mb == pytest.approx(whole_mb, abs=0.006)  # printed with two decimals
    assert optimizer_mb == pytest.approx(2 * whole_mb, abs=0.011)  # Adam's two moments
    # Each of the 4 devices keeps a quarter (within 5%, and the rounding of the print).
    assert params_device_mb == pytest.approx(whole_mb / DEVICES, rel=0.05, abs=0.006)
    assert optimizer_device_mb == pytest.approx(2 * whole_mb / DEVICES, rel=0.05, abs=0.006)
    assert int(found[6]) == int(found[9]) == 100 // DEVICES

    # It trained: two validations, the second lower, and the tandem analyses published.
    assert len(validated) == 2
    assert len(patterns) == 2
    assert "validation loss" in done.stderr
    losses = [float(x) for x in re.findall(r"validation loss ([\d.]+)", done.stderr)]
    assert len(losses) == 2 and losses[1] < losses[0] < np.log(256), losses
    assert DemoTrainer.ANALYSIS, "the demo trains with tandem analyses"


def _gpt_keys() -> set[str]:
    """The settings `GPT.build` takes: the paths its schemas declare."""
    import dataclasses

    from theseus.config._field import PATH_KEY

    return {f.metadata[PATH_KEY] for schema in GPT.gather() for f in dataclasses.fields(schema)}
