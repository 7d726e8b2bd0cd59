"""The forward recorder side by side: theseus vs clouseau, and capture vs a plain jit.

Run: ``uv run --group bench python benchmarks/recorder.py [--repeats N] [--quick]
[--json PATH]``

1. An Equinox transformer (every module works on ``[seq, d_model]`` arrays, 58
   recorded modules). Every module's output is recorded with
   ``theseus.analysis.inspector.tail`` and with ``clouseau.inspector.tail``
   (forward pass plus file written) on the same inputs, eagerly and under
   ``jax.jit``; the arrays must be identical; the rounds alternate the variants
   and the paired ratios clouseau/theseus are reported (goal: theseus 2x faster).
   Theseus under ``jax.jit`` is also timed in parts (entering the recorder, the
   forward with its host callback, writing the file) beside a plain jitted forward,
   and with the forward jitted through ``inspector.jit`` (values leave the program
   as outputs, no host callback).
2. A Flax linen GPT: a plain jitted forward vs the same forward that also returns
   one module's cropped input (``capture`` with a ``transform``, values returned
   from the compiled program); goal: paired ratio <= 1.05.

``--json PATH`` writes the rows in the schema of ``benchmarks/_report.py``;
``--quick`` is a smoke run (few repeats, about a minute).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import equinox as eqx
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file or with -m
from benchmarks import _report
from theseus.analysis import inspector

# ---------------------------------------------------------------- Equinox transformer


class Linear(eqx.Module):
    weight: jax.Array  # [d_in, d_out]
    bias: jax.Array  # [d_out]

    def __init__(self, d_in: int, d_out: int, key: jax.Array) -> None:
        self.weight = jax.random.normal(key, (d_in, d_out)) / np.sqrt(d_in)
        self.bias = jnp.zeros(d_out)

    def __call__(self, x: jax.Array) -> jax.Array:  # [..., d_in] -> [..., d_out]
        return x @ self.weight + self.bias


class LayerNorm(eqx.Module):
    scale: jax.Array
    shift: jax.Array

    def __init__(self, d: int) -> None:
        self.scale, self.shift = jnp.ones(d), jnp.zeros(d)

    def __call__(self, x: jax.Array) -> jax.Array:
        mean = x.mean(-1, keepdims=True)
        var = ((x - mean) ** 2).mean(-1, keepdims=True)
        return (x - mean) / jnp.sqrt(var + 1e-5) * self.scale + self.shift


class Attention(eqx.Module):
    q: Linear
    k: Linear
    v: Linear
    o: Linear
    heads: int = eqx.field(static=True)

    def __init__(self, d: int, heads: int, key: jax.Array) -> None:
        kq, kk, kv, ko = jax.random.split(key, 4)
        self.q, self.k, self.v, self.o = (Linear(d, d, k) for k in (kq, kk, kv, ko))
        self.heads = heads

    def __call__(self, x: jax.Array) -> jax.Array:  # [seq, d]
        seq, d = x.shape

        def split(t: jax.Array) -> jax.Array:  # [heads, seq, d_head]
            return t.reshape(seq, self.heads, d // self.heads).transpose(1, 0, 2)

        q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
        scores = q @ k.transpose(0, 2, 1) / np.sqrt(d // self.heads)
        mask = jnp.tril(jnp.ones((seq, seq), bool))
        weights = jax.nn.softmax(jnp.where(mask, scores, -1e9), axis=-1)
        return self.o((weights @ v).transpose(1, 0, 2).reshape(seq, d))


class MLP(eqx.Module):
    up: Linear
    down: Linear

    def __init__(self, d: int, key: jax.Array) -> None:
        ku, kd = jax.random.split(key)
        self.up, self.down = Linear(d, 4 * d, ku), Linear(4 * d, d, kd)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.down(jax.nn.gelu(self.up(x)))


class Block(eqx.Module):
    ln1: LayerNorm
    attn: Attention
    ln2: LayerNorm
    mlp: MLP

    def __init__(self, d: int, heads: int, key: jax.Array) -> None:
        ka, km = jax.random.split(key)
        self.ln1, self.attn = LayerNorm(d), Attention(d, heads, ka)
        self.ln2, self.mlp = LayerNorm(d), MLP(d, km)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class Embed(eqx.Module):
    table: jax.Array

    def __call__(self, tokens: jax.Array) -> jax.Array:  # [seq] -> [seq, d]
        return self.table[tokens]


class Transformer(eqx.Module):
    embed: Embed
    blocks: list[Block]
    ln_f: LayerNorm
    head: Linear

    def __init__(self, vocab: int, d: int, depth: int, heads: int, key: jax.Array) -> None:
        keys = jax.random.split(key, depth + 2)
        self.embed = Embed(jax.random.normal(keys[0], (vocab, d)) * 0.02)
        self.blocks = [Block(d, heads, k) for k in keys[1:-1]]
        self.ln_f, self.head = LayerNorm(d), Linear(d, vocab, keys[-1])

    def __call__(self, tokens: jax.Array) -> jax.Array:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


# ------------------------------------------------------------------------ timing


def interleaved_times(fns: dict[str, Callable[[], Any]], repeats: int) -> dict[str, list[float]]:
    """Wall times of several functions run in alternation (fair under shared CPUs)."""
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return times


def import_clouseau() -> Any:
    """Import ``clouseau.inspector``, which needs ``safetensors.torch`` at import time.

    clouseau 0.2 imports ``safetensors.torch`` (hence torch) even to record a JAX
    model, and this workspace never installs torch. Without torch, a stand-in
    ``safetensors.torch`` module is registered whose ``save_file`` raises: the JAX
    path measured here never calls it, so clouseau runs its real code throughout.
    """
    import importlib.util
    import sys
    import types

    if importlib.util.find_spec("torch") is None and "safetensors.torch" not in sys.modules:
        stand_in = types.ModuleType("safetensors.torch")

        def save_file(*args: Any, **kwargs: Any) -> None:
            raise RuntimeError("torch is not installed; clouseau's torch writer is unavailable")

        stand_in.save_file = save_file  # type: ignore[attr-defined]
        sys.modules["safetensors.torch"] = stand_in
    from clouseau import inspector as clouseau_inspector

    return clouseau_inspector


MEANING = "clouseau time / theseus time; above 1 means theseus is faster"


def bench_equinox(repeats: int, workdir: Path) -> tuple[list[_report.Row], dict[str, Any]]:
    """Rows eager, jit and capture vs clouseau; and the parts of theseus under jit (ms)."""
    clouseau_inspector = import_clouseau()

    model = Transformer(vocab=512, d=128, depth=5, heads=4, key=jax.random.key(0))
    tokens = jax.random.randint(jax.random.key(1), (64,), 0, 512)
    forward = jax.jit(lambda m, t: m(t))
    parts: dict[str, list[float]] = {"enter": [], "forward": [], "exit": []}

    def theseus_eager() -> None:
        with inspector.tail(model, workdir / "theseus-eager") as fm:
            fm(tokens).block_until_ready()

    def clouseau_eager() -> None:
        with clouseau_inspector.tail(model, workdir / "clouseau-eager.safetensors") as fm:
            fm(tokens).block_until_ready()

    def theseus_jit() -> None:
        start = time.perf_counter()
        recorder = inspector.tail(model, workdir / "theseus-jit")
        fm = recorder.__enter__()
        entered = time.perf_counter()
        forward(fm, tokens).block_until_ready()
        ran = time.perf_counter()
        recorder.__exit__(None, None, None)
        done = time.perf_counter()
        for name, seconds in (("enter", entered - start), ("forward", ran - entered)):
            parts[name].append(seconds)
        parts["exit"].append(done - ran)

    def clouseau_jit() -> None:
        with clouseau_inspector.tail(model, workdir / "clouseau-jit.safetensors") as fm:
            forward(fm, tokens).block_until_ready()

    recorded_forward = inspector.jit(lambda m, t: m(t))

    def theseus_inspector_jit() -> None:
        with inspector.tail(model, workdir / "theseus-inspector-jit") as fm:
            recorded_forward(fm, tokens).block_until_ready()

    captured_forward = jax.jit(lambda m, t: m(t))
    captured_model = inspector.capture(model)

    def theseus_capture() -> None:
        _, captured = captured_forward(captured_model, tokens)
        inspector.save_recording(captured, workdir / "theseus-capture")

    def plain_jit() -> None:
        forward(model, tokens).block_until_ready()

    print("Equinox transformer: 5 blocks, d_model 128, 4 heads, 64 tokens, vocab 512")
    times = interleaved_times(
        {
            "theseus eager": theseus_eager,
            "clouseau eager": clouseau_eager,
            "theseus jit": theseus_jit,
            "clouseau jit": clouseau_jit,
            "theseus inspector.jit": theseus_inspector_jit,
            "theseus capture": theseus_capture,
            "plain jit": plain_jit,
        },
        repeats,
    )
    for values in parts.values():
        del values[0]  # the warm-up call
    ms = {name: [t * 1e3 for t in ts] for name, ts in times.items()}
    ours = inspector.read_from_safetensors(workdir / "theseus-eager")
    print(f"  recorded modules: {len(ours)}")
    assert len(ours) >= 50, len(ours)
    for mode in ("eager", "jit"):
        theirs = inspector.read_from_safetensors(workdir / f"clouseau-{mode}.safetensors")
        mine = inspector.read_from_safetensors(workdir / f"theseus-{mode}")
        assert list(mine) == list(theirs), (list(mine)[:5], list(theirs)[:5])
        identical = all(
            mine[k].dtype == theirs[k].dtype and np.array_equal(mine[k], theirs[k]) for k in mine
        )
        worst = max(float(np.max(np.abs(mine[k] - theirs[k]))) for k in mine)
        print(
            f"  {mode}: same {len(mine)} keys in the same order, arrays identical: {identical}"
            f" (max abs difference {worst:.1e})"
        )
        assert identical
    from clouseau.io_utils import read_from_safetensors as clouseau_read

    theirs_of_ours = clouseau_read(workdir / "theseus-eager" / "activations-000.safetensors")
    assert list(theirs_of_ours) == list(ours)
    assert all(np.array_equal(theirs_of_ours[k], ours[k]) for k in ours)
    print("  clouseau's reader reads theseus's file: same keys, same order, same arrays")
    outputs = inspector.read_from_safetensors(workdir / "theseus-inspector-jit")
    under_jit = inspector.read_from_safetensors(workdir / "clouseau-jit.safetensors")
    assert list(outputs) == list(under_jit)
    identical = all(
        outputs[k].dtype == under_jit[k].dtype and np.array_equal(outputs[k], under_jit[k])
        for k in outputs
    )
    print(f"  inspector.jit (values as outputs) vs clouseau under jit: identical: {identical}")
    assert identical
    captured = inspector.read_from_safetensors(workdir / "theseus-capture")
    worst = max(float(np.max(np.abs(captured[k] - ours[k]))) for k in ours)
    print(f"  capture vs eager recording: max abs difference {worst:.1e}")
    rows = []
    for mode, what, how in (
        ("eager", "tail, eager (forward + file) vs clouseau", "values reach the host directly"),
        (
            "jit",
            "tail, forward under jax.jit + file vs clouseau under jit",
            "one host callback per model call (clouseau: one per module); see "
            "info.tail_jit_breakdown_ms",
        ),
    ):
        rows.append(
            _report.compare(
                what,
                ms[f"theseus {mode}"],
                ms[f"clouseau {mode}"],
                unit="ms",
                fmt="{:.2f} ms",
                ratio="theirs/ours",
                meaning=MEANING,
                goal=(">=", 2.0),
                note=f"58 modules of an Equinox transformer; files checked bit-identical; {how}",
            )
        )
    rows.append(
        _report.compare(
            "tail, forward under inspector.jit + file vs clouseau under jax.jit",
            ms["theseus inspector.jit"],
            ms["clouseau jit"],
            unit="ms",
            fmt="{:.2f} ms",
            ratio="theirs/ours",
            meaning=MEANING,
            goal=(">=", 2.0),
            note="the forward jitted through theseus (inspector.jit): recorded values leave the "
            "program as outputs, no host callback; same keys and order as tail under jax.jit",
        )
    )
    rows.append(
        _report.compare(
            "capture + save_recording vs clouseau under jit",
            ms["theseus capture"],
            ms["clouseau jit"],
            unit="ms",
            fmt="{:.2f} ms",
            ratio="theirs/ours",
            meaning=MEANING,
            note="values returned by the compiled program (no host callback)",
        )
    )
    for row in rows:
        ratios = row.ratios
        print(
            f"  {row.what}: theseus {row.ours}  clouseau {row.theirs}  clouseau/theseus "
            f"{statistics.median(ratios):.2f}x (paired, {min(ratios):.2f}-{max(ratios):.2f})"
        )
    breakdown = {
        "plain jitted forward, no recording": statistics.median(ms["plain jit"]),
        "enter tail (wrap the model, open the cache)": statistics.median(parts["enter"]) * 1e3,
        "forward with its host callback and host cache": statistics.median(parts["forward"]) * 1e3,
        "exit (write the file)": statistics.median(parts["exit"]) * 1e3,
        "theseus tail under jit, whole": statistics.median(ms["theseus jit"]),
        "clouseau tail under jit, whole": statistics.median(ms["clouseau jit"]),
    }
    print("  theseus tail under jit, in parts (medians):")
    for name, value in breakdown.items():
        print(f"    {name:48s} {value:8.2f} ms")
    return rows, {"tail_jit_breakdown_ms": breakdown}


# ------------------------------------------------------------------ Flax linen GPT


class CausalSelfAttention(nn.Module):
    d_model: int
    heads: int

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:  # [batch, seq, d]
        b, s, d = x.shape
        qkv = nn.Dense(3 * d, name="qkv")(x).reshape(b, s, 3, self.heads, d // self.heads)
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(d // self.heads)
        mask = jnp.tril(jnp.ones((s, s), bool))
        weights = jax.nn.softmax(jnp.where(mask, scores, -1e9), axis=-1)
        return nn.Dense(d, name="out")(jnp.einsum("bhqk,bkhd->bqhd", weights, v).reshape(b, s, d))


class GPTBlock(nn.Module):
    d_model: int
    heads: int

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = x + CausalSelfAttention(self.d_model, self.heads, name="attn")(
            nn.LayerNorm(name="ln1")(x)
        )
        h = nn.gelu(nn.Dense(4 * self.d_model, name="up")(nn.LayerNorm(name="ln2")(x)))
        return x + nn.Dense(self.d_model, name="down")(h)


class GPT(nn.Module):
    vocab: int = 1024
    d_model: int = 256
    depth: int = 4
    heads: int = 8

    @nn.compact
    def __call__(self, tokens: jax.Array) -> jax.Array:  # [batch, seq] -> [batch, seq, vocab]
        x = nn.Embed(self.vocab, self.d_model, name="wte")(tokens)
        for i in range(self.depth):
            x = GPTBlock(self.d_model, self.heads, name=f"blocks_{i}")(x)
        return nn.Dense(self.vocab, name="lm_head")(nn.LayerNorm(name="ln_f")(x))


def bench_linen(repeats: int) -> _report.Row:
    model = GPT()
    tokens = jax.random.randint(jax.random.key(2), (8, 128), 0, model.vocab)
    variables = model.init(jax.random.key(3), tokens)
    plain = jax.jit(model.apply)

    def crop_filter(path: inspector.ModulePath, module: Any) -> bool:
        return path == "blocks_2.attn"

    crop = inspector.capture(
        model,
        filter_=crop_filter,
        record="inputs",
        transform=lambda key, x: x[:, :4, :16],
    )
    recorded = jax.jit(crop.apply)

    def run_plain() -> None:
        plain(variables, tokens).block_until_ready()

    def run_recorded() -> None:
        out, captured = recorded(variables, tokens)
        jax.block_until_ready((out, captured))

    out, captured = recorded(variables, tokens)
    np.testing.assert_array_equal(out, plain(variables, tokens))
    (key,) = captured
    with tempfile.TemporaryDirectory() as folder:  # the same input recorded eagerly by tail
        with inspector.tail(model, folder, filter_=crop_filter, record="inputs") as fm:
            fm.apply(variables, tokens)
        eager = inspector.read_from_safetensors(folder)[key][:, :4, :16]
    np.testing.assert_allclose(captured[key], eager, rtol=1e-4, atol=1e-5)
    print(
        f"Flax linen GPT: 4 blocks, d_model 256, 8 heads, batch 8 x 128 tokens, vocab 1024;"
        f" recording {key} cropped to {tuple(captured[key].shape)}"
    )
    times = interleaved_times({"plain": run_plain, "recorded": run_recorded}, repeats)
    row = _report.compare(
        "linen GPT: capture of a cropped input vs plain jit",
        [t * 1e3 for t in times["recorded"]],
        [t * 1e3 for t in times["plain"]],
        unit="ms",
        fmt="{:.2f} ms",
        ratio="ours/theirs",
        meaning="capture time / plain jit time; below 1.05 means capture costs under 5%",
        goal=("<=", 1.05),
        note="ratio direction is ours/theirs here (lower is better); 'theirs' is a plain "
        "jax.jit(model.apply), not clouseau",
    )
    print(
        f"  plain jit {row.theirs}   with the recorded crop {row.ours}   median of paired "
        f"ratios = {statistics.median(row.ratios):5.3f}x (target <= 1.05)"
    )
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=None, help="timed rounds (20; quick: 3)")
    _report.add_arguments(parser)
    args = parser.parse_args()
    repeats = args.repeats or (3 if args.quick else 20)
    with tempfile.TemporaryDirectory() as folder:
        rows, info = bench_equinox(repeats, Path(folder))
    rows.append(bench_linen(10 if args.quick else max(repeats, 50)))
    _report.write(args.json, "recorder", args.quick, rows, info)


if __name__ == "__main__":
    main()
