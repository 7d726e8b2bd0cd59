"""Interventions: what a sweep costs in forward passes, and what attribution saves.

Run: ``uv run python benchmarks/interventions.py [--rounds 12] [--quick] [--json PATH]``

The default ``PretrainGPT`` (4 layers, n_embd 128, 4 heads, block 128, batch 16) on
fresh weights, one CPU device. Three compiled functions, each warmed up first:

* **sweep**: an ``InterventionBase`` that zero-ablates every head of every layer
  (``select`` returns the 4 attention paths, ``variants`` 4 heads: n = 16
  interventions), measured by the loss: the baseline forward plus 16 intervened
  forwards in one ``jax.lax.map``.
* **forwards**: the trainer's own ``trace`` (the plain forward and loss) compiled with
  ``jax.jit`` and called n + 1 = 17 times back to back, each result waited for.
* **attribution**: the same sweep with ``ESTIMATE = "linear"`` (one forward and one
  backward, then each head's linear estimate).

Each round times the three in a rotating order. Rows: sweep / (n + 1) forwards (goal
<= 1.1: the sweep costs about n + 1 forwards), attribution / (n + 1) forwards
(information: what attribution patching costs against the real sweep), and the
sweep's compilations over two checkpoints' worth of parameters and two batches (goal:
traced once).

Then **agreement**: the demo's model (``theseus demo``'s settings, ``--demo-steps``
steps, 600 as the demo) is trained, and every head of it is patched from its batch into
the batch with its input rows rolled by one (each row reads the next row's tokens and
is judged against its own targets), for real and by attribution patching: the Pearson
correlation of the two [layer, head] loss changes, and the largest head's estimate over
its real effect (information).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file or with -m
from benchmarks import _report

TARGET = 1.1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=12)
    p.add_argument("--demo-steps", type=int, default=600, help="training steps of the demo model")
    _report.add_arguments(p)
    args = p.parse_args(argv)
    if args.quick:
        args.rounds, args.demo_steps = 2, 60

    import jax
    import numpy as np

    from theseus.analysis import InterventionBase
    from theseus.analysis import interventions as iv
    from theseus.data.datasets import Synthetic
    from theseus.experiments.models.gpt import PretrainGPT
    from theseus.model.attention.base import SelfAttention
    from theseus.quick import quick

    class Sweep(InterventionBase, PretrainGPT):
        TARGET = SelfAttention
        NAME = "sweep"

        def select(self, paths: list[str]) -> list[str]:
            return paths

        def variants(self, layer: Any) -> int:
            return int(layer.config.n_head)

        def intervene(self, site: Any) -> Any:
            return iv.ablate_head(site, site.variant)

        def plot(self, results: Any) -> None:
            return None

    class Attribution(Sweep):
        NAME = "attribution"
        ESTIMATE = "linear"

    class Patch(Sweep):
        NAME = "patch"

        def corrupt(self, batch: Any) -> Any:  # other rows' tokens, this row's targets
            return {**batch, "x": jax.numpy.roll(batch["x"], 1, axis=0)}

        def intervene(self, site: Any) -> Any:
            return iv.patch_head(site, site.variant)

    class PatchLinear(Patch):
        NAME = "patch-linear"
        ESTIMATE = "linear"

    with tempfile.TemporaryDirectory() as root:
        Synthetic.prepare(root, tokens=200_000, val_tokens=20_000)
        jobs = {}
        for cls in (Sweep, Attribution):
            with quick(root) as q:
                q.build(cls, cls.NAME)
                jobs[cls.NAME] = q.create()
        sweep, attribution = jobs["sweep"], jobs["attribution"]
        state, batch = sweep.state, sweep.inspection_batch()
        cfg = sweep.configuration
        n = cfg["architecture/n_layers"] * cfg["architecture/n_head"]
        sharding = sweep.sharding
        forward = jax.jit(lambda s, b: type(sweep).trace(s, b, None, sharding=sharding)[1])
        fns = {
            "sweep": lambda: sweep._compiled_analysis()(state, batch, None),
            "attribution": lambda: attribution._compiled_analysis()(
                attribution.state, attribution.inspection_batch(), None
            ),
        }

        def forwards() -> Any:
            for _ in range(n + 1):
                out = jax.block_until_ready(forward(state, batch))
            return out

        sides = {"sweep": fns["sweep"], "forwards": forwards, "attribution": fns["attribution"]}
        for side in sides.values():  # compile and warm up
            jax.block_until_ready(side())
            jax.block_until_ready(side())
        times: dict[str, list[float]] = {name: [] for name in sides}
        names = list(sides)
        for round_ in range(args.rounds):
            order = names[round_ % 3 :] + names[: round_ % 3]
            for name in order:
                began = time.perf_counter()
                jax.block_until_ready(sides[name]())
                times[name].append(1000 * (time.perf_counter() - began))
            print(f"round {round_}: " + ", ".join(f"{k} {v[-1]:.1f} ms" for k, v in times.items()))

        # The same compiled sweep on other parameters and another batch: no new trace.
        other = jax.tree.map(lambda a: a * 1.01, state.params)
        rolled = jax.tree.map(lambda a: np.roll(np.asarray(a), 1, axis=0), batch)
        fn = sweep._compiled_analysis()
        jax.block_until_ready(fn(state.replace(params=other), batch, None))
        jax.block_until_ready(fn(state, sharding.place_batch(rolled), None))
        traces = sweep.traces
        real, estimate = agreement(root, args.demo_steps, Patch, PatchLinear)
        model = (
            f"PretrainGPT {cfg['architecture/n_layers']}x{cfg['architecture/n_embd']}, "
            f"{cfg['architecture/n_head']} heads, block {cfg['architecture/block_size']}, "
            f"batch {cfg['training/batch_size']}"
        )
    rows = [
        _report.compare(
            f"intervention sweep: every head zero-ablated (n = {n}) vs n + 1 plain forwards "
            f"({model})",
            times["sweep"],
            times["forwards"],
            unit="ms",
            fmt="{:.1f} ms",
            ratio="ours/theirs",
            meaning=(
                "sweep time / time of n + 1 compiled forwards in the same round; 1 means "
                "the sweep costs exactly n + 1 forwards"
            ),
            goal=("<=", TARGET),
            note=f"{args.rounds} rounds, rotating order; one jax.lax.map over the n "
            "interventions, lax.cond per site",
        ),
        _report.compare(
            f"attribution patching of the same {n} heads vs n + 1 plain forwards ({model})",
            times["attribution"],
            times["forwards"],
            unit="ms",
            fmt="{:.1f} ms",
            ratio="ours/theirs",
            meaning="attribution time / time of n + 1 forwards; information: one forward "
            "and one backward, then each head's linear estimate",
        ),
        _report.info_row(
            "intervention sweep: traces over two parameter sets and two batches",
            f"{traces} trace(s)",
            [traces],
            unit="traces",
            goal=("<=", 1),
            met=traces == 1,
        ),
    ]
    correlation = float(np.corrcoef(real.ravel(), estimate.ravel())[0, 1])
    top = np.unravel_index(np.abs(real).argmax(), real.shape)
    print(f"demo model: real {real.tolist()}\n  linear {estimate.tolist()}")
    rows.append(
        _report.info_row(
            f"attribution patching vs real patching on the demo model ({args.demo_steps} "
            "steps): correlation over its 8 heads",
            f"{correlation:.3f}",
            [correlation],
            unit="correlation",
            note=f"each head patched from the batch into its input rows rolled by one; largest "
            f"head (layer {top[0]}, head {top[1]}): linear {estimate[top]:+.4f} vs real "
            f"{real[top]:+.4f} nats",
        )
    )
    _report.write(args.json, "interventions", args.quick, rows)
    return _report.exit_status(rows)


def agreement(root: str, steps: int, real_cls: type, linear_cls: type) -> tuple[Any, Any]:
    """Train the demo's model, then patch every head for real and by attribution."""
    import numpy as np

    from theseus.analysis._demo_cli import DEMO_SETTINGS
    from theseus.experiments.models.gpt import PretrainGPT
    from theseus.quick import quick

    with quick(root) as q:
        q.build(PretrainGPT, "demo-model")
        for key, value in DEMO_SETTINGS.items():
            q.config[key] = value
        q.config["training/tokens"] = steps * 16 * 64
        q.config["logging/validation_interval"] = steps
        q.config["logging/checkpoint_interval"] = steps
        q.create()()
    values = []
    for cls in (real_cls, linear_cls):
        with quick(root) as q:
            q.build(cls, cls.NAME)
            q.find().spec(run="demo-model").checkpoint().latest().resume()
            values.append(np.asarray(q.create()().values))
    return values[0], values[1]


if __name__ == "__main__":
    sys.exit(main())
