"""Decoding with the KV cache against recomputing the whole sequence for every token.

Run: ``uv run python benchmarks/generation.py [--new 256 --rounds 5 --layers 4 --width 128
--block 512 --batch 1] [--quick] [--json PATH]``

Both sides continue the same prompt (16 tokens) greedily by ``--new`` tokens with the same
GPT and parameters, and must produce the same tokens (checked every round).

* **cached**: ``theseus.model.generation.generate``: one prefill, then one compiled
  decode step per token over a cache of ``block`` slots.
* **recompute**: the plain forward (``GPT.__call__``, compiled) on the whole sequence so
  far, padded to ``block`` tokens so it compiles once, its argmax at the last real
  position; what a loop without a cache does.

After a warm-up run of each (compilation), the two alternate for ``--rounds`` rounds
(cached first in even rounds). The table gives decode tokens/s per side and the paired
ratio cached/recompute, PASS at >= 5; a second row gives the cached side's per-token
latency.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file or with -m
from benchmarks import _report

TARGET = 5.0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--new", type=int, default=256, help="new tokens per run")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--block", type=int, default=512)
    p.add_argument("--batch", type=int, default=1)
    _report.add_arguments(p)
    args = p.parse_args(argv)
    if args.quick:
        args.new, args.rounds = 64, 2

    import flax.linen as nn
    import jax
    import jax.numpy as jnp
    import numpy as np

    from theseus.model.generation import generate
    from theseus.model.models import GPT

    model = GPT.build(
        n_layers=args.layers, n_embd=args.width, n_head=max(1, args.width // 32),
        block_size=args.block, vocab_size=258,
    )  # fmt: skip
    params = nn.unbox(model.init(jax.random.key(0), jnp.zeros((1, 8), jnp.int32)))["params"]
    params = jax.tree.map(lambda x: x * 4.0, params)  # tokens that vary from step to step
    prompts = [[(7 * i + 3 * b) % 258 for i in range(16)] for b in range(args.batch)]

    @jax.jit
    def next_tokens(params: dict, padded: jax.Array, last: jax.Array) -> jax.Array:
        logits, _ = model.apply({"params": params}, padded)
        return jnp.argmax(logits[jnp.arange(padded.shape[0]), last], axis=-1)

    def recompute() -> list[list[int]]:
        seqs = np.zeros((args.batch, args.block), np.int32)
        seqs[:, :16] = np.asarray(prompts)
        for n in range(args.new):
            length = 16 + n
            token = next_tokens(params, jnp.asarray(seqs), jnp.full(args.batch, length - 1))
            seqs[:, length] = np.asarray(token)
        return seqs[:, 16 : 16 + args.new].tolist()

    def cached() -> list[list[int]]:
        return generate(model, params, prompts, args.new, temperature=0)

    assert cached() == recompute(), "the cache and the recompute disagree"  # also compiles
    ours, theirs = [], []
    for round_ in range(args.rounds):
        order = (cached, recompute) if round_ % 2 == 0 else (recompute, cached)
        times = {}
        for side in order:
            began = time.perf_counter()
            tokens = side()
            times[side] = time.perf_counter() - began
            assert len(tokens[0]) == args.new
        ours.append(args.batch * args.new / times[cached])
        theirs.append(args.batch * args.new / times[recompute])
        print(f"round {round_}: cached {ours[-1]:,.0f} tok/s, recompute {theirs[-1]:,.0f} tok/s")
    shape = f"GPT {args.layers}x{args.width}, block {args.block}, batch {args.batch}"
    rows = [
        _report.compare(
            f"generation: decode tokens/s with the KV cache vs full recompute, "
            f"{args.new} new tokens ({shape})",
            ours,
            theirs,
            unit="tokens/s",
            fmt="{:,.0f} tokens/s",
            ratio="ours/theirs",
            meaning="cached tokens/s / recompute tokens/s in the same round",
            goal=(">=", TARGET),
            note=f"{args.rounds} rounds, alternating order; greedy, same tokens checked",
        ),
        _report.info_row(
            f"generation: per-token latency with the KV cache ({shape})",
            f"{1000 * args.batch / statistics.median(ours):.2f} ms/token",
            [1000 * args.batch / x for x in ours],
            unit="ms",
            note="median over rounds of run time / new tokens, prefill included",
        ),
    ]
    _report.write(args.json, "generation", args.quick, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
