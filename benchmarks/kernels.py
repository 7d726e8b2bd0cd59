"""Fused kernels on the device: JAX's bundled Pallas attention and theseus's chunked loss
against tokamax's (DeepMind's Pallas kernel library), where tokamax is installed.

Run: ``python benchmarks/kernels.py [--quick] [--json PATH]`` (on a TPU; on a CPU the
Pallas kernels run in interpret mode at tiny shapes, a smoke run only).

Attention, forward and backward of one layer (``[batch, seq, heads, head_dim]`` bf16,
causal, the gradient of a fixed random projection of the output): theseus's ``attend``
with ``splash`` (the default on a TPU) and ``flash``, against ``tokamax.dot_product_attention``
with ``implementation="mosaic"``. The loss, value and gradients: theseus's
``chunked_cross_entropy`` (default chunks) against ``tokamax.linear_softmax_cross_entropy_loss``
(``mosaic_tpu``). On a TPU the splash kernel's own settings are swept too (blocks of 256
and 1024 tokens against ``attend``'s 512; the backward in separate dq and dkv kernels
instead of the fused one), for choosing ``BLOCK``. Each candidate is timed as the median of 20 calls after 3 warm-up calls
and checked against the float32 reference at highest precision (its largest relative
gradient error is in the row's note). Rows: each candidate's time; where tokamax ran,
ours / tokamax per shape (above 1: tokamax faster; issue 44 adopts it only if it is).
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file or with -m
from benchmarks import _report

ATTENTION = [(8, 12, 12, 1024, 64), (8, 16, 16, 1024, 64), (8, 12, 4, 1024, 64)]
LOSS = [(8, 1024, 768, 50304), (8, 1024, 1024, 50304)]
TINY_ATTENTION = [(1, 2, 2, 256, 64)]
TINY_LOSS = [(2, 64, 32, 300)]


def _timed(fn: Any, *args: Any, calls: int) -> tuple[Any, list[float]]:
    import jax

    out = jax.block_until_ready(fn(*args))
    for _ in range(2):
        jax.block_until_ready(fn(*args))
    times = []
    for _ in range(calls):
        began = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append((time.perf_counter() - began) * 1e3)
    return out, times


def _relative(got: Any, want: Any) -> float:
    import numpy as np

    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.max(np.abs(got - want)) / max(float(np.max(np.abs(want))), 1e-30))


def _measured(
    what: str, step: Any, inputs: tuple[Any, ...], want: Any, calls: int, device: str
) -> tuple[Any, list[float] | None]:
    """`step(*inputs)` timed and checked against `want` (gradients): its row, and its
    times (None when the kernel refused the call: the row says why)."""
    try:
        got, times = _timed(step, *inputs, calls=calls)
    except Exception as exc:  # a kernel that refuses the shape: a note, not a crash
        note = f"did not run: {type(exc).__name__}: {str(exc)[:160]}"
        return _report.info_row(what, "—", [], unit="ms", note=note), None
    error = max(_relative(a, b) for a, b in zip(got, want, strict=True))
    row = _report.info_row(
        what,
        f"{statistics.median(times):.3f} ms",
        times,
        unit="ms",
        note=f"{device}; gradients vs the float32 reference: {error:.1e} relative",
    )
    return row, times


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    _report.add_arguments(p)
    args = p.parse_args(argv)

    import jax
    import jax.numpy as jnp

    from theseus.model.attention.kernels import attend, splash
    from theseus.model.loss import chunked_cross_entropy

    try:
        import tokamax
        from absl import flags

        # tokamax reads absl flags, which parse sys.argv (this script's --json) on first use.
        flags.FLAGS.mark_as_parsed()
    except ImportError:
        tokamax = None
    on_cpu = jax.default_backend() == "cpu"
    calls = 3 if args.quick or on_cpu else 20
    attention_shapes = TINY_ATTENTION if on_cpu else ATTENTION
    loss_shapes = TINY_LOSS if on_cpu else LOSS
    device = jax.devices()[0].device_kind
    rows = []

    def attention_rows(batch: int, heads: int, kv_heads: int, seq: int, width: int) -> None:
        keys = jax.random.split(jax.random.key(0), 4)
        q = jax.random.normal(keys[0], (batch, seq, heads, width), jnp.bfloat16)
        k, v = (
            jax.random.normal(key, (batch, seq, kv_heads, width), jnp.bfloat16) for key in keys[1:3]
        )
        g = jax.random.normal(keys[3], (batch, seq, heads, width), jnp.float32)

        def grads(fn: Any) -> Any:
            return jax.jit(
                jax.grad(
                    lambda q, k, v: jnp.sum(fn(q, k, v).astype(jnp.float32) * g), argnums=(0, 1, 2)
                )
            )

        with jax.default_matmul_precision("highest"):
            want = grads(functools.partial(attend, implementation="reference"))(
                *(x.astype(jnp.float32) for x in (q, k, v))
            )
        candidates = {
            f"theseus {name}": functools.partial(attend, implementation=name)
            for name in ("splash", "flash")
        }
        if not on_cpu:  # the splash kernel's settings, swept (attend uses blocks of BLOCK)
            for block in sorted({256, 1024} & set(range(128, seq + 1, 128))):
                candidates[f"splash blocks {block}"] = functools.partial(splash, block=block)
            candidates["splash unfused backward"] = functools.partial(splash, fused_backward=False)
        if tokamax is not None and not on_cpu:
            candidates["tokamax mosaic"] = lambda q, k, v: tokamax.dot_product_attention(
                q, k, v, is_causal=True, implementation="mosaic"
            )
        shape = f"{batch} x {seq} tokens, {heads} heads ({kv_heads} kv) x {width}"
        times: dict[str, list[float]] = {}
        for name, fn in candidates.items():
            what = f"kernels: attention fwd+bwd, {name}, {shape}"
            row, taken = _measured(what, grads(fn), (q, k, v), want, calls, device)
            rows.append(row)
            if taken is not None:
                times[name] = taken
        if "tokamax mosaic" in times and "theseus splash" in times:
            rows.append(
                _report.compare(
                    f"kernels: attention fwd+bwd, theseus splash vs tokamax mosaic, {shape}",
                    times["theseus splash"],
                    times["tokamax mosaic"],
                    unit="ms",
                    fmt="{:.3f} ms",
                    ratio="ours/theirs",
                    meaning="splash time / tokamax time per call; above 1: tokamax faster",
                    note=device,
                )
            )

    def loss_rows(batch: int, seq: int, width: int, vocab: int) -> None:
        keys = jax.random.split(jax.random.key(1), 3)
        h = jax.random.normal(keys[0], (batch, seq, width), jnp.bfloat16)
        table = jax.random.normal(keys[1], (vocab, width), jnp.float32) * 0.02
        y = jax.random.randint(keys[2], (batch, seq), 0, vocab)

        def ours(h: Any, table: Any, chunk: int = 0) -> Any:
            return chunked_cross_entropy(h, table, y, tied=True, dtype=jnp.bfloat16, chunk=chunk)[0]

        with jax.default_matmul_precision("highest"):
            want = jax.jit(
                jax.grad(
                    lambda h, t: chunked_cross_entropy(
                        h, t, y, tied=True, dtype=jnp.float32, chunk=batch * seq
                    )[0],
                    argnums=(0, 1),
                )
            )(h.astype(jnp.float32), table)
        candidates = {
            "theseus chunked": ours,
            "theseus one chunk": functools.partial(ours, chunk=batch * seq),
        }
        if tokamax is not None and not on_cpu:
            candidates["tokamax mosaic_tpu"] = lambda h, table: (
                tokamax.linear_softmax_cross_entropy_loss(
                    h.reshape(-1, width),
                    y.reshape(-1),
                    table.T.astype(jnp.bfloat16),
                    reduction="mean",
                    implementation="mosaic_tpu",
                )
            )
        shape = f"{batch} x {seq} tokens, width {width}, vocabulary {vocab}"
        times: dict[str, list[float]] = {}
        for name, fn in candidates.items():
            what = f"kernels: loss and gradients, {name}, {shape}"
            step = jax.jit(jax.grad(fn, argnums=(0, 1)))
            row, taken = _measured(what, step, (h, table), want, calls, device)
            rows.append(row)
            if taken is not None:
                times[name] = taken
        if "tokamax mosaic_tpu" in times:
            rows.append(
                _report.compare(
                    f"kernels: loss and gradients, theseus chunked vs tokamax, {shape}",
                    times["theseus chunked"],
                    times["tokamax mosaic_tpu"],
                    unit="ms",
                    fmt="{:.3f} ms",
                    ratio="ours/theirs",
                    meaning="ours time / tokamax time per call; above 1: tokamax faster",
                    note=device,
                )
            )

    for attention_shape in attention_shapes:
        attention_rows(*attention_shape)
    for loss_shape in loss_shapes:
        loss_rows(*loss_shape)
    if tokamax is None:
        print(
            "kernels: tokamax is not installed (pip install tokamax): ours alone", file=sys.stderr
        )
    _report.write(args.json, "kernels", args.quick, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
