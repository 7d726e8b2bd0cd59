"""Sparse autoencoders: training throughput vs a hand-written loop, and a tandem SAE's cost.

Run: ``uv run python benchmarks/sae.py [--rounds 10 --d-model 256 --expansion 8 --k 32
--tokens 4096] [--quick] [--json PATH]`` (the TPU plan: ``--d-model 768 --expansion 16``,
the 124M GPT's residual stream with 12,288 features).

**Training**, on JAX's first device: activations of width d = 256 (sparse mixtures of
4,096 random unit directions, made once and kept on the device), a top-k SAE of 2,048
features (k = 32), 4,096 tokens a step, Adam at 1e-3.

* ours: ``Programs.update``, the compiled step ``SAEBase`` runs after its forward: the
  draw of 4,096 activations from the shuffling buffer on the device (16 lanes, 8
  forwards deep), the SAE's update with unit decoder rows (and which features fired),
  the new activations written into the drawn slots.
* theirs: a hand-written JAX + optax loop: the same SAE written out in ``jax.numpy``
  (``lax.top_k`` and a scatter), ``jax.value_and_grad``, ``optax.adam``, unit decoder
  rows, each step reading its batch from the same activations shuffled once on the
  device (a dynamic slice: the cheapest read there is).

Each round times ``--steps`` steps of each, in alternating order; the row is their
tokens/s, ours / theirs (goal >= 0.95).

**Tandem**: the demo's model (``theseus demo``'s settings) trains with the demo's SAE
analysis (``demo/analyze/features``: a top-k SAE of 512 features on the residual stream
after each of its two blocks) in tandem; at a validation the view trains both SAEs on
2^16 tokens. Each round times one such view run and, beside it, training steps on as
many tokens: the ratio (information) is what a tandem SAE costs against the training it
rides on. A size that does not fit on the device exits 1 with one line (``_memory.py``).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file or with -m
from benchmarks import _memory, _report

LANES, DEPTH = 16, 8  # the buffer: 16 lanes (rows) of 8 forwards of tokens / 16 tokens
TARGET = 0.95


@dataclasses.dataclass(frozen=True)
class Size:
    """The SAE of the training rows: input width `d`, `width` features, top `k`, and
    `tokens` activations a step (a multiple of `LANES`)."""

    d: int = 256
    width: int = 2048
    k: int = 32
    tokens: int = 4096


def activations(n: int, d: int) -> Any:
    """`n` activations `[n, d]`: 8 of 4,096 random unit directions each, random weights."""
    import numpy as np

    rng = np.random.default_rng(0)
    directions = rng.normal(size=(4096, d)).astype(np.float32)
    directions /= np.linalg.norm(directions, axis=1, keepdims=True)
    chosen = rng.integers(0, 4096, size=(n, 8))
    weights = rng.exponential(1.0, size=(n, 8, 1)).astype(np.float32)
    return (directions[chosen] * weights).sum(axis=1)


def hand_written(data: Any, size: Size) -> tuple[Any, Any]:
    """The baseline: `step(state, offset) -> state`, and its first state."""
    import jax
    import jax.numpy as jnp
    import optax

    optimizer = optax.adam(1e-3)
    rows = jax.random.normal(jax.random.key(1), (size.width, size.d))
    rows = rows / jnp.linalg.norm(rows, axis=1, keepdims=True)
    params = {"W_enc": rows.T, "W_dec": rows, "b_enc": jnp.zeros(size.width),
              "b_dec": jnp.zeros(size.d)}  # fmt: skip

    def loss(p: Any, x: Any) -> Any:
        pre = (x - p["b_dec"]) @ p["W_enc"] + p["b_enc"]
        values, index = jax.lax.top_k(pre, size.k)
        f = jnp.zeros_like(pre).at[jnp.arange(x.shape[0])[:, None], index].set(jax.nn.relu(values))
        return jnp.mean(jnp.sum((f @ p["W_dec"] + p["b_dec"] - x) ** 2, axis=-1))

    def step(state: Any, offset: Any) -> Any:
        p, opt = state
        x = jax.lax.dynamic_slice_in_dim(data, offset * size.tokens, size.tokens)
        grads = jax.grad(loss)(p, x)
        updates, opt = optimizer.update(grads, opt, p)
        p = optax.apply_updates(p, updates)
        p = {**p, "W_dec": p["W_dec"] / jnp.linalg.norm(p["W_dec"], axis=1, keepdims=True)}
        return p, opt

    return jax.jit(step, donate_argnums=0), (params, optimizer.init(params))


def training_rows(
    rounds: int, steps: int, size: Size, profile: Path | None = None
) -> list[_report.Row]:
    """The training row; with `profile`, `steps` more steps of each side traced into
    `profile/ours` and `profile/theirs` and their device time printed by operation."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax

    from theseus.analysis.sae import SAEConfig
    from theseus.analysis.sae._stream import Bank, Programs
    from theseus.training.sharding import ParameterShardingContext

    n = (steps + 1) * size.tokens
    data = jax.device_put(jnp.asarray(activations(n, size.d)))
    shuffled = jax.device_put(data[np.random.default_rng(2).permutation(n)])
    theirs_step, theirs_state = hand_written(shuffled, size)

    config = SAEConfig(size.d, size.width, "topk", k=size.k)
    sharding = ParameterShardingContext.create()
    traced: list[str] = []
    programs = Programs(None, Bank(("x",), ((config,),)), optax.adam(1e-3), sharding, "bench",
                        traced.append, 8, 4, 2)  # fmt: skip
    length = size.tokens // LANES
    chunks = data.reshape(-1, LANES, length, size.d)  # a forward's activations each
    first = chunks[:DEPTH].transpose(1, 0, 2, 3).reshape(LANES, -1, size.d)
    buffers = {"x": jax.device_put(first, programs.lanes)}
    fresh = programs.start(buffers, {"x": 1.0}, jax.random.key(0))
    state = [fresh, programs.init_optimizer(fresh), buffers, programs.unfired()]

    def ours() -> None:
        saes, opts, bufs, fired = state
        for i in range(steps):
            acts = {"x": chunks[(DEPTH + i) % len(chunks)]}
            saes, opts, bufs, fired, metrics = programs.update(
                saes, opts, bufs, fired, acts, jax.random.key(i), {"x": 1.0}
            )
        jax.block_until_ready(metrics)
        state[:] = [saes, opts, bufs, fired]

    mine = [theirs_state]

    def theirs() -> None:
        s = mine[0]
        for i in range(steps):
            s = theirs_step(s, i)
        jax.block_until_ready(s)
        mine[0] = s

    ours()  # compile and warm both
    theirs()
    ours_rate, theirs_rate = [], []
    for r in range(rounds):
        for name in ("ours", "theirs") if r % 2 == 0 else ("theirs", "ours"):
            began = time.perf_counter()
            (ours if name == "ours" else theirs)()
            rate = steps * size.tokens / (time.perf_counter() - began)
            (ours_rate if name == "ours" else theirs_rate).append(rate)
    if profile is not None:
        from benchmarks import _profile

        saes, opts, bufs, fired = state
        acts = {"x": chunks[DEPTH % len(chunks)]}
        args = (saes, opts, bufs, fired, acts, jax.random.key(0), {"x": 1.0})
        texts = {
            "ours": programs.update.lower(*args).compile().as_text(),
            "theirs": theirs_step.lower(mine[0], 0).compile().as_text(),
        }
        for name, side in (("ours", ours), ("theirs", theirs)):
            with jax.profiler.trace(str(profile / name)):
                side()
            print(f"{name}:", *_profile.lines(profile / name, steps, hlo=texts[name]), sep="\n")
    return [
        _report.compare(
            f"SAE training tokens/s (top-k, d {size.d}, {size.width} features, k {size.k}, "
            f"{size.tokens} tokens a step): SAEBase's step after its forward vs a "
            "hand-written JAX + optax loop",
            ours_rate,
            theirs_rate,
            unit="tokens/s",
            fmt="{:,.0f} tokens/s",
            ratio="ours/theirs",
            meaning="ours tokens/s / theirs tokens/s; ours also draws from and refills the "
            "shuffling buffer",
            goal=(">=", TARGET),
            note=f"{device()}; {steps} steps a round; ours compiled "
            f"{programs.update._cache_size()} time(s)",
        )
    ]


def tandem_rows(rounds: int, steps: int) -> list[_report.Row]:
    import jax
    import numpy as np

    from theseus.analysis._demo_cli import DEMO_SETTINGS
    from theseus.analysis.demo import Features
    from theseus.data.datasets import Synthetic
    from theseus.experiments.models.gpt import PretrainGPT
    from theseus.quick import quick

    class WithFeatures(PretrainGPT):
        ANALYSIS = [Features]

    with tempfile.TemporaryDirectory() as root:
        Synthetic.prepare(root)
        with quick(root) as q:
            q.build(WithFeatures, "tandem")
            for key, value in DEMO_SETTINGS.items():
                q.config[key] = value
            per_step = q.config["training/batch_size"] * q.config["architecture/block_size"]
            q.config["training/tokens"] = steps * per_step
            q.config["logging/validation_interval"] = steps
            q.config["logging/checkpoint_interval"] = steps
            trainer = q.create()
            trainer()  # trains, and runs the view once at its validation (compiles it)
            [view] = trainer.loop.views
            tokens = view.settings().tokens
            train = trainer.loop.compiled_train()
            rows = trainer.batch("train")
            batch = trainer.sharding.place_batch(rows)
            cursor = np.uint32(trainer.cursor)
            train_steps = max(1, tokens // per_step)

            def training() -> None:  # the trainer's own compiled step (it donates the state)
                s = trainer.state
                for _ in range(train_steps):
                    s, loss, _, _ = train(s, batch, cursor)
                jax.block_until_ready(loss)
                trainer.state = s

            training()
            sae_s, train_s = [], []
            for r in range(rounds):
                for name in ("sae", "train") if r % 2 == 0 else ("train", "sae"):
                    began = time.perf_counter()
                    if name == "sae":
                        view.compute()
                    else:
                        training()
                    (sae_s if name == "sae" else train_s).append(time.perf_counter() - began)
            compiles = dict(view.compiles)
    return [
        _report.compare(
            f"tandem SAE at a validation (the demo's model; 2 SAEs of 512 features, {tokens:,} "
            "tokens each, measures and contexts included) vs training steps on as many tokens",
            sae_s,
            train_s,
            unit="s",
            fmt="{:.2f} s",
            ratio="ours/theirs",
            meaning="SAE time at a validation / time of training on the same number of "
            "tokens (information)",
            note=f"{device()}; {train_steps} training steps of {per_step} tokens; the "
            f"view's programs traced {compiles}",
        )
    ]


def device() -> str:
    """`"one CPU device"`, `"one TPU v5 lite device"`: where the rows ran."""
    import jax

    first = jax.devices()[0]
    return f"one {'CPU' if first.platform == 'cpu' else first.device_kind} device"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--steps", type=int, default=20, help="SAE steps a round (training rows)")
    p.add_argument("--d-model", type=int, default=Size.d, help="the activations' width")
    p.add_argument("--expansion", type=int, default=Size.width // Size.d, help="features / d")
    p.add_argument("--k", type=int, default=Size.k, help="features kept per token (top-k)")
    p.add_argument("--tokens", type=int, default=Size.tokens, help="activations a step")
    p.add_argument(
        "--profile",
        type=Path,
        help="trace --steps more training steps of each side into this folder (ours/, "
        "theirs/) and print their device time by operation",
    )
    _report.add_arguments(p)
    args = p.parse_args(argv)
    if args.quick:
        args.rounds, args.steps = 2, 4
    if args.tokens % LANES:
        p.error(f"--tokens must be a multiple of {LANES} (the buffer's lanes); got {args.tokens}")
    size = Size(args.d_model, args.d_model * args.expansion, args.k, args.tokens)
    with _memory.exit_on_out_of_memory(
        f"SAE training (d {size.d}, {size.width} features, {size.tokens} tokens a step)",
        f"--tokens {max(LANES, size.tokens // 2)} or a smaller --expansion",
    ):
        rows = training_rows(args.rounds, args.steps, size, args.profile)
        rows += tandem_rows(args.rounds, 8 if args.quick else 40)
    _report.write(args.json, "sae", args.quick, rows)
    return _report.exit_status(rows)


if __name__ == "__main__":
    sys.exit(main())
