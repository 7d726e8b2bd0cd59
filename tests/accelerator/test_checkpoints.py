"""Checkpoints cross platforms: saved on the accelerator, restored on the CPU, and back.

One program holds a TPU at a time, so the CPU side is a child process started with
`JAX_PLATFORMS=cpu` (it never opens the chip). It restores the shared run's latest
checkpoint (saved by this process on the accelerator), then trains and saves a short
run of its own (4 steps), and writes the logits of both on a validation batch. This
process restores the CPU's checkpoint on the accelerator. Every logit is computed under
`precise()`; the two platforms' logits of one checkpoint agree within `across`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import _run
import jax
import numpy as np
import pytest
from _tolerances import across, assert_close, platform, precise

from theseus.experiments.models.gpt import PretrainGPT
from theseus.quick import quick

pytestmark = pytest.mark.accelerator

CHILD = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    import jax, numpy as np
    sys.path.insert(0, sys.argv[3])
    import _run
    from theseus.experiments.models.gpt import PretrainGPT
    from theseus.quick import quick

    root, out = Path(sys.argv[1]), Path(sys.argv[2])
    ids = np.load(out / "ids.npy")

    def logits(trainer):
        with jax.default_matmul_precision("highest"):
            found, _ = trainer.model.apply({"params": trainer.state.params}, ids)
        return np.asarray(found)

    with quick(root) as q:
        q.build(PretrainGPT, "restored-on-cpu")
        q.find().spec(run=_run.RUN).checkpoint().latest().resume()
        restored = q.create()
    np.save(out / "restored.npy", logits(restored))
    saved = _run.train(root, run="saved-on-cpu", **{"training/tokens": 4 * 8 * 32})
    np.save(out / "saved.npy", logits(saved))
    where = {leaf.platform for p in jax.tree.leaves(saved.state.params) for leaf in p.devices()}
    (out / "platforms.json").write_text(json.dumps(sorted(where)))
    """
)


def _params_on(trainer: Any) -> set[str]:
    return {d.platform for p in jax.tree.leaves(trainer.state.params) for d in p.devices()}


def test_a_checkpoint_restores_on_the_other_platform(
    trained: tuple[Path, Any], tmp_path: Path
) -> None:
    root, trainer = trained
    ids = np.asarray(trainer.read_batch(0, "val")["x"])
    np.save(tmp_path / "ids.npy", ids)
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}  # keeps PYTHONPATH and the TPU_ variables
    child = subprocess.run(
        [sys.executable, "-c", CHILD, str(root), str(tmp_path), str(_run.HERE)],
        env=env,
        capture_output=True,
        text=True,
        timeout=500,
    )
    assert child.returncode == 0, child.stderr[-3000:]
    assert json.loads((tmp_path / "platforms.json").read_text()) == ["cpu"]

    here = platform()
    assert _params_on(trainer) == {here}
    with precise():
        ours, _ = trainer.model.apply({"params": trainer.state.params}, ids)
    restored = np.load(tmp_path / "restored.npy")
    assert_close(restored, np.asarray(ours), across("cpu", here), what="restored on the CPU")

    with quick(root) as q:
        q.build(PretrainGPT, "restored-here")
        q.find().spec(run="saved-on-cpu").checkpoint().latest().resume()
        back = q.create()
    assert _params_on(back) == {here} and int(back.state.step) == 4
    with precise():
        theirs, _ = back.model.apply({"params": back.state.params}, ids)
    saved = np.load(tmp_path / "saved.npy")
    assert_close(np.asarray(theirs), saved, across(here, "cpu"), what=f"restored on {here}")
