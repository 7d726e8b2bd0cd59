"""Decoding with the KV cache: against a hand-written JAX decode loop, and against recompute.

Run: ``uv run python benchmarks/generation.py [--new 256 --rounds 5 --layers 4 --width 128
--block 512 --batch 1 --vocab 258 --dtype float32] [--quick] [--json PATH]``
(the 124M GPT of the TPU table: ``--layers 12 --width 768 --heads 12 --block 1024
--vocab 50304 --dtype bfloat16``).

Three sides continue the same prompts (16 tokens each) greedily by ``--new`` tokens with
the same GPT and parameters:

* **ours**: ``theseus.model.generation.generate``: one prefill, then one compiled step a
  token (decode and pick in one program) over a cache of ``block`` slots; a bfloat16
  model decodes from its float32 matrices cast to bfloat16 once (``decoding_params``).
* **hand**: what a JAX user writes with the same model, parameters and cache: a jitted
  prefill and a jitted step (``model.apply(..., cache=)`` then ``argmax``, the cache
  donated), called in a Python loop, the tokens gathered on the device.
* **recompute**: the plain forward (``GPT.__call__``, compiled) on the whole sequence so
  far, padded to ``block`` tokens so it compiles once, its argmax at the last real
  position; what a loop without a cache does.

The tokens are checked by teacher forcing. On a CPU in float32, ours's and the hand
loop's tokens must be equal and at every new position the token chosen has exactly the
largest logit of the full forward on its own sequence. Elsewhere (bfloat16, or an
accelerator's fused attention) the cache and the forward round differently, and a deep
random network amplifies rounding (the 124M GPT's bfloat16 forward is ~50% of the
logits' scale away from its float32 one, on a CPU too), so each side is held to a float32
forward at 'highest' matmul precision instead: its cache's logits (ours's read from the
cast matrices, the hand loop's from the float32 ones), fed its tokens one at a time, must
be no further from it than the bfloat16 forward's (``ACCURACY`` times as far at most,
plus 1e-3 of the scale). The share of ours's tokens equal to the hand loop's is in the
note (all of them on a CPU, where the cast matrices give the same logits bit for bit).
After a warm-up run of each
(compilation), the sides alternate for ``--rounds`` rounds (rotating order). Rows: ours
vs hand (goal >= 1.0), ours vs recompute (goal >= 5) and ours's per-token latency.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file or with -m
from benchmarks import _report

TARGET = 5.0  # ours vs recompute
HAND_TARGET = 1.0  # ours vs the hand-written loop
ACCURACY = 1.5  # the cache's error vs float32 / the plain forward's, at most


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--new", type=int, default=256, help="new tokens per run")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--heads", type=int, default=0, help="0: width // 32")
    p.add_argument("--block", type=int, default=512)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--vocab", type=int, default=258)
    p.add_argument("--dtype", default="float32", help="activation dtype (bfloat16, float32)")
    _report.add_arguments(p)
    args = p.parse_args(argv)
    if args.quick:
        args.new, args.rounds = 64, 2

    import functools

    import flax.linen as nn
    import jax
    import jax.numpy as jnp
    import numpy as np

    from theseus.model.generation import decoding_params, generate
    from theseus.model.models import GPT

    def build(dtype: str) -> GPT:
        return GPT.build(
            n_layers=args.layers, n_embd=args.width, n_head=args.heads or max(1, args.width // 32),
            block_size=args.block, vocab_size=args.vocab, dtype=dtype,
        )  # fmt: skip

    model = build(args.dtype)
    params = nn.unbox(model.init(jax.random.key(0), jnp.zeros((1, 8), jnp.int32)))["params"]
    params = jax.tree.map(lambda x: x * 4.0, params)  # tokens that vary from step to step
    prompts = [[(7 * i + 3 * b) % args.vocab for i in range(16)] for b in range(args.batch)]

    @jax.jit
    def next_tokens(params: dict, padded: jax.Array, last: jax.Array) -> jax.Array:
        logits, _ = model.apply({"params": params}, padded)
        return jnp.argmax(logits[jnp.arange(padded.shape[0]), last], axis=-1)

    @jax.jit
    def full_logits(params: dict, padded: jax.Array) -> jax.Array:
        return model.apply({"params": params}, padded)[0].astype(jnp.float32)

    def recompute() -> list[list[int]]:
        seqs = np.zeros((args.batch, args.block), np.int32)
        seqs[:, :16] = np.asarray(prompts)
        for n in range(args.new):
            length = 16 + n
            token = next_tokens(params, jnp.asarray(seqs), jnp.full(args.batch, length - 1))
            seqs[:, length] = np.asarray(token)
        return seqs[:, 16 : 16 + args.new].tolist()

    def ours() -> list[list[int]]:
        return generate(model, params, prompts, args.new, temperature=0)

    @jax.jit
    def hand_prefill(params: dict, tokens: jax.Array) -> tuple[jax.Array, object]:
        cache = model.empty_cache(tokens.shape[0], args.block)
        logits, cache = model.apply({"params": params}, tokens, cache=cache)
        return jnp.argmax(logits[:, -1], axis=-1).astype(jnp.int32), cache

    @functools.partial(jax.jit, donate_argnums=1)
    def hand_step(params: dict, cache: object, token: jax.Array) -> tuple[jax.Array, object]:
        logits, cache = model.apply({"params": params}, token[:, None], cache=cache)
        return jnp.argmax(logits[:, 0], axis=-1).astype(jnp.int32), cache

    def hand() -> list[list[int]]:
        token, cache = hand_prefill(params, jnp.asarray(prompts, jnp.int32))
        out = [token]
        for _ in range(args.new - 1):
            token, cache = hand_step(params, cache, token)
            out.append(token)
        return np.asarray(jnp.stack(out, axis=1)).tolist()

    exact = jax.default_backend() == "cpu" and args.dtype == "float32"
    reference = build("float32")

    @jax.jit
    def reference_logits(params: dict, padded: jax.Array) -> jax.Array:
        with jax.default_matmul_precision("highest"):
            return reference.apply({"params": params}, padded)[0]

    @jax.jit
    def forced_prefill(params: dict, tokens: jax.Array) -> tuple[jax.Array, object]:
        cache = model.empty_cache(tokens.shape[0], args.block)
        logits, cache = model.apply({"params": params}, tokens, cache=cache)
        return logits[:, -1].astype(jnp.float32), cache

    @functools.partial(jax.jit, donate_argnums=1)
    def forced_step(params: dict, cache: object, token: jax.Array) -> tuple[jax.Array, object]:
        logits, cache = model.apply({"params": params}, token[:, None], cache=cache)
        return logits[:, 0].astype(jnp.float32), cache

    def cached_logits(tokens: np.ndarray, weights: dict) -> np.ndarray:
        """[batch, new, vocab]: the cache's logits at each new position, fed `tokens`."""
        logits, cache = forced_prefill(weights, jnp.asarray(prompts, jnp.int32))
        out = [logits]
        for n in range(args.new - 1):
            logits, cache = forced_step(weights, cache, jnp.asarray(tokens[:, n], jnp.int32))
            out.append(logits)
        return np.asarray(jnp.stack(out, axis=1))

    def check(tokens: list[list[int]], weights: dict, side: str) -> str:
        """Teacher forcing (see the module's docstring): raise if the cache, read with
        `weights`, disagrees with the forward; what was checked, for the rows' notes."""
        chosen_ids = np.asarray(tokens)
        seqs = np.zeros((args.batch, args.block), np.int32)
        seqs[:, :16] = np.asarray(prompts)
        seqs[:, 16 : 16 + args.new] = chosen_ids
        window = slice(15, 15 + args.new)
        logits = np.asarray(full_logits(params, jnp.asarray(seqs)))[:, window]
        if exact:
            chosen = np.take_along_axis(logits, chosen_ids[..., None], -1)[..., 0]
            if (logits.max(-1) > chosen).any():
                raise SystemExit(
                    "generation: a cached token is not the full forward's argmax in float32 "
                    "on a CPU: the cache and the forward disagree"
                )
            return "the full forward's argmax exactly"
        truth = np.asarray(reference_logits(params, jnp.asarray(seqs)))[:, window]
        scale = float(np.abs(truth).max())
        cache_error = float(np.abs(cached_logits(chosen_ids, weights) - truth).max()) / scale
        forward_error = float(np.abs(logits - truth).max()) / scale
        if cache_error > ACCURACY * forward_error + 1e-3:
            raise SystemExit(
                f"generation: {side}'s cache logits are {cache_error:.2e} of the scale from a "
                f"float32 forward, the {args.dtype} forward's {forward_error:.2e}: the cache "
                "is less accurate than the forward"
            )
        return (
            f"{side}'s teacher-forced cache logits {cache_error:.1e} of the scale from a "
            f"float32 forward, the {args.dtype} forward {forward_error:.1e} (at most "
            f"{ACCURACY}x)"
        )

    first = ours()  # also compiles
    theirs = hand()
    if exact:
        if theirs != first:
            raise SystemExit("generation: the hand-written loop and theseus's generate disagree")
        checked_how = "ours's tokens equal the hand loop's; " + check(first, params, "ours")
    else:
        # ours decodes from the matrices in the activation dtype (decoding_params), the hand
        # loop from the float32 ones: the same logits on a CPU, an accelerator may round
        # them apart, and a deep random network's greedy tokens follow any rounding. Each
        # side is held to the float32 forward on its own tokens.
        same = float(np.mean(np.asarray(first) == np.asarray(theirs)))
        checked_how = "; ".join(
            [
                check(first, decoding_params(model, params), "ours"),
                check(theirs, params, "the hand loop"),
                f"{same:.0%} of ours's tokens equal the hand loop's",
            ]
        )
    recompute()  # compiles
    sides = {"ours": ours, "hand": hand, "recompute": recompute}
    speeds: dict[str, list[float]] = {name: [] for name in sides}
    for round_ in range(args.rounds):
        names = list(sides)[round_ % 3 :] + list(sides)[: round_ % 3]
        for name in names:
            began = time.perf_counter()
            tokens = sides[name]()
            speeds[name].append(args.batch * args.new / (time.perf_counter() - began))
            assert len(tokens[0]) == args.new
        print(
            f"round {round_}: "
            + ", ".join(f"{name} {speeds[name][-1]:,.0f} tok/s" for name in sides),
            flush=True,
        )
    shape = (
        f"GPT {args.layers}x{args.width}, vocab {args.vocab}, block {args.block}, "
        f"batch {args.batch}, {args.dtype}"
    )
    checked = "greedy; " + checked_how
    rows = [
        _report.compare(
            f"generation: decode tokens/s, theseus generate vs a hand-written JAX loop with "
            f"the same cache, {args.new} new tokens ({shape})",
            speeds["ours"],
            speeds["hand"],
            unit="tokens/s",
            fmt="{:,.0f} tokens/s",
            ratio="ours/theirs",
            meaning="ours tokens/s / hand loop tokens/s in the same round",
            goal=(">=", HAND_TARGET),
            note=f"{args.rounds} rounds, rotating order; {checked}",
        ),
        _report.compare(
            f"generation: decode tokens/s with the KV cache vs full recompute, "
            f"{args.new} new tokens ({shape})",
            speeds["ours"],
            speeds["recompute"],
            unit="tokens/s",
            fmt="{:,.0f} tokens/s",
            ratio="ours/theirs",
            meaning="cached tokens/s / recompute tokens/s in the same round",
            goal=(">=", TARGET),
            note=f"{args.rounds} rounds, rotating order; {checked}",
        ),
        _report.info_row(
            f"generation: per-token latency with the KV cache ({shape})",
            f"{1000 * args.batch / statistics.median(speeds['ours']):.2f} ms/token",
            [1000 * args.batch / x for x in speeds["ours"]],
            unit="ms",
            note="median over rounds of run time / new tokens, prefill included",
        ),
    ]
    _report.write(args.json, "generation", args.quick, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
