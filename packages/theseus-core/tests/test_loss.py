"""`theseus.model.loss`: the chunked cross-entropy against the plain one, and what steps hold.

The reference is the plain loss written out here: the whole float32 logits (`h @ E.T`
tied, `h @ K` untied, in the activation dtype), `optax.softmax_cross_entropy_with_
integer_labels`, masked and averaged by hand; the value also against float64 NumPy.
Differences are |got - want| / max|want| per array. Tolerances:

- float32 (CPU): value 1e-6, gradients (w.r.t. `h` and the unembedding) 1e-5. The
  chunks' logits are the same products; only the order of the sums differs (per chunk,
  then over chunks), a few float32 ulps (1.2e-7 each).
- bfloat16 activations: value 1e-5 (both sides round the same products to the same
  bfloat16 logits and sum in float32), gradient w.r.t. `h` 1e-2, w.r.t. the
  unembedding 2e-2: the plain backward sums the unembedding's gradient over every token
  in bfloat16 (eps 7.8e-3), the chunked one within each chunk in bfloat16 and over the
  chunks in float32 (measured 4.9e-3 and 4.2e-3).
- The model with the batch in one chunk takes the plain path: its loss and gradients
  equal `cross_entropy` of its own logits exactly.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax.training import train_state

from theseus.config import ConfigRangeError
from theseus.model import GPT, ModelInputError, cross_entropy
from theseus.model.loss import (
    LOGITS_PER_CHUNK,
    LossInputError,
    chunk_length,
    chunked_cross_entropy,
)
from theseus.training.base import BaseTrainer
from theseus.training.sharding import ParameterShardingContext

ROWS, LENGTH, WIDTH, VOCAB = 3, 13, 32, 300
RTOL = {"float32": (1e-6, 1e-5, 1e-5), "bfloat16": (1e-5, 1e-2, 2e-2)}  # value, dh, dE


def _inputs(tied: bool, seed: int = 0) -> dict[str, Any]:
    """Hidden states, an unembedding, targets with -1s and a padding mask (some rows short)."""
    rng = np.random.default_rng(seed)
    shape = (VOCAB, WIDTH) if tied else (WIDTH, VOCAB)
    targets = rng.integers(0, VOCAB, (ROWS, LENGTH))
    targets[rng.random((ROWS, LENGTH)) < 0.2] = -1
    mask = np.ones((ROWS, LENGTH), np.int32)
    mask[1, 9:] = 0  # a padded row
    return {
        "h": rng.normal(size=(ROWS, LENGTH, WIDTH)).astype(np.float32),
        "matrix": (rng.normal(size=shape) * 0.3).astype(np.float32),
        "targets": targets.astype(np.int32),
        "mask": mask,
    }


def _plain(h: jax.Array, matrix: jax.Array, targets: Any, mask: Any, tied: bool, dtype: Any):
    """The reference: the whole float32 logits and optax's per-token loss, averaged by hand."""
    product = h.astype(dtype) @ (matrix.T if tied else matrix).astype(dtype)
    valid = (targets >= 0) & (mask > 0)
    losses = optax.softmax_cross_entropy_with_integer_labels(
        product.astype(jnp.float32), np.where(valid, targets, 0)
    )
    return jnp.where(valid, losses, 0.0).sum() / valid.sum()


def _float64(case: dict[str, Any], tied: bool) -> float:
    """The mean loss in float64 NumPy: logsumexp minus the target's logit."""
    h, matrix = case["h"].astype(np.float64), case["matrix"].astype(np.float64)
    logits = h @ (matrix.T if tied else matrix)
    top = logits.max(-1, keepdims=True)
    logsumexp = np.log(np.exp(logits - top).sum(-1)) + top[..., 0]
    valid = (case["targets"] >= 0) & (case["mask"] > 0)
    picked = np.take_along_axis(logits, np.where(valid, case["targets"], 0)[..., None], -1)
    return float(((logsumexp - picked[..., 0]) * valid).sum() / valid.sum())


def _relative(got: Any, want: Any) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.max(np.abs(got - want)) / max(float(np.max(np.abs(want))), 1e-30))


# chunk (tokens) -> positions per chunk for 3 rows of 13: 16 -> 5 (3 chunks, 2 padded
# positions), 12 -> 4 (4 chunks, 3 padded), 2 -> 1 (13 chunks, a chunk of 3 rows > 2
# tokens), 0 -> 13 (the plain path).
# The default suite runs one case of each chunking for each dtype and tying; the other
# combinations are the slow set's (the default suite's budget).
_SLOW = pytest.mark.slow
_CASES = [
    (True, 16, "float32"), (False, 16, "bfloat16"), (False, 2, "float32"),
    (True, 2, "bfloat16"), (True, 0, "float32"), (False, 0, "bfloat16"),
    pytest.param(False, 16, "float32", marks=_SLOW),
    pytest.param(True, 16, "bfloat16", marks=_SLOW),
    *(pytest.param(t, 12, d, marks=_SLOW) for t in (True, False) for d in ("float32", "bfloat16")),
    pytest.param(True, 2, "float32", marks=_SLOW),
    pytest.param(False, 2, "bfloat16", marks=_SLOW),
    pytest.param(False, 0, "float32", marks=_SLOW),
    pytest.param(True, 0, "bfloat16", marks=_SLOW),
]  # fmt: skip


@pytest.mark.parametrize(("tied", "chunk", "dtype"), _CASES)
def test_the_value_and_gradients_equal_the_plain_loss(tied: bool, chunk: int, dtype: str) -> None:
    case = _inputs(tied)
    act = jnp.dtype(dtype)
    h = jnp.asarray(case["h"], act)  # the activations arrive in their dtype
    matrix = jnp.asarray(case["matrix"])  # float32 parameters
    targets, mask = jnp.asarray(case["targets"]), jnp.asarray(case["mask"])

    def chunked(h: jax.Array, matrix: jax.Array) -> jax.Array:
        out = chunked_cross_entropy(h, matrix, targets, mask, tied=tied, dtype=act, chunk=chunk)
        return out[0]

    def plain(h: jax.Array, matrix: jax.Array) -> jax.Array:
        return _plain(h, matrix, case["targets"], case["mask"], tied, act)

    got, (got_dh, got_dm) = jax.jit(jax.value_and_grad(chunked, argnums=(0, 1)))(h, matrix)
    want, (want_dh, want_dm) = jax.jit(jax.value_and_grad(plain, argnums=(0, 1)))(h, matrix)
    rtol_value, rtol_dh, rtol_dm = RTOL[dtype]
    assert got_dh.dtype == act and got_dm.dtype == jnp.float32  # as the plain loss's
    assert _relative(got, want) <= rtol_value
    assert _relative(got_dh, want_dh) <= rtol_dh
    assert _relative(got_dm, want_dm) <= rtol_dm
    if dtype == "float32":
        assert _relative(got, _float64(case, tied)) <= RTOL["float32"][0]
    assert chunked_cross_entropy(h, matrix, targets, mask, tied=tied, dtype=act)[1] == int(
        ((case["targets"] >= 0) & (case["mask"] > 0)).sum()
    )


def _vocab_products(jaxpr: Any, vocab: int) -> int:
    """How many dot_generals in `jaxpr` (and its sub-jaxprs: scan bodies) touch a `vocab` axis."""
    found = 0
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            shapes = [v.aval.shape for v in (*eqn.invars, *eqn.outvars)]
            found += any(vocab in shape for shape in shapes)
        for param in eqn.params.values():
            for sub in param if isinstance(param, tuple | list) else (param,):
                sub = getattr(sub, "jaxpr", sub)  # a ClosedJaxpr's Jaxpr
                if hasattr(sub, "eqns"):
                    found += _vocab_products(sub, vocab)
    return found


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_the_backward_recomputes_no_logits(tied: bool) -> None:
    # The products with the unembedding are the logits, the gradient w.r.t. h and the one
    # w.r.t. the unembedding: three in all for the value and both gradients, as many as
    # the plain loss's autodiff makes (a backward that recomputed the chunk's logits
    # would make four).
    case = _inputs(tied)
    h, matrix = jnp.asarray(case["h"]), jnp.asarray(case["matrix"])
    targets = jnp.asarray(case["targets"])

    def loss(h: jax.Array, matrix: jax.Array) -> jax.Array:
        return chunked_cross_entropy(h, matrix, targets, tied=tied, dtype=jnp.float32, chunk=16)[0]

    def plain(h: jax.Array, matrix: jax.Array) -> jax.Array:
        return _plain(h, matrix, case["targets"], np.ones_like(case["mask"]), tied, jnp.float32)

    grad = jax.make_jaxpr(jax.value_and_grad(loss, argnums=(0, 1)))(h, matrix).jaxpr
    plain_grad = jax.make_jaxpr(jax.value_and_grad(plain, argnums=(0, 1)))(h, matrix).jaxpr
    value = jax.make_jaxpr(loss)(h, matrix).jaxpr
    assert _vocab_products(plain_grad, VOCAB) == 3
    assert _vocab_products(grad, VOCAB) == 3
    assert _vocab_products(value, VOCAB) == 1  # the value alone makes only the logits


def test_no_counted_target_gives_zero_and_a_zero_count() -> None:
    case = _inputs(True)
    h, matrix = jnp.asarray(case["h"]), jnp.asarray(case["matrix"])
    targets = -jnp.ones((ROWS, LENGTH), jnp.int32)
    for chunk in (0, 4):
        loss, count = chunked_cross_entropy(
            h, matrix, targets, tied=True, dtype=jnp.float32, chunk=chunk
        )
        assert float(loss) == 0.0 and int(count) == 0


@pytest.mark.parametrize("vocab", [258, 50_304, 128_256])
@pytest.mark.parametrize("rows", [1, 8, 32, 4096])
def test_a_default_chunk_holds_at_most_256_mib_of_float32_logits(rows: int, vocab: int) -> None:
    for length in (1, 7, 1024, 4096):
        per = chunk_length(rows, length, vocab)
        chunks = -(-length // per)
        assert 1 <= per <= length and chunks * per - length < chunks  # padding < chunks
        assert per == 1 or rows * per * vocab * 4 <= LOGITS_PER_CHUNK * 4 == 256 * 2**20
        fits = rows * length <= LOGITS_PER_CHUNK // vocab  # the plain path
        assert per == length if fits else (per < length or per == 1)


def test_bad_shapes_and_chunks_are_refused_in_one_line() -> None:
    case = _inputs(True)
    h, matrix, targets = (jnp.asarray(case[k]) for k in ("h", "matrix", "targets"))
    calls = [
        lambda: chunked_cross_entropy(h, matrix.T, targets, tied=True, dtype=None),
        lambda: chunked_cross_entropy(h, matrix, targets, tied=False, dtype=None),
        lambda: chunked_cross_entropy(h[0], matrix, targets, tied=True, dtype=None),
        lambda: chunked_cross_entropy(h, matrix, targets[:, 1:], tied=True, dtype=None),
        lambda: chunked_cross_entropy(h, matrix, targets, tied=True, dtype=None, chunk=-1),
    ]
    for call in calls:
        with pytest.raises(LossInputError) as raised:
            call()
        assert "\n" not in str(raised.value) and "expected" in str(raised.value)
    with pytest.raises(ConfigRangeError):
        GPT.build(loss_chunk=-1)


def test_the_model_and_its_loss_refuse_with_one_class() -> None:
    """A sequence longer than block_size (the model's check) and a bad loss shape (the
    loss's) are both `ModelInputError`, caught under the loss's earlier name too."""
    model = GPT.build(n_layers=1, n_embd=32, n_head=2, block_size=8, vocab_size=VOCAB)
    too_long = jnp.zeros((1, 9), jnp.int32)
    with pytest.raises(
        ModelInputError, match=r"^sequence length 9 exceeds architecture/block_size 8\b"
    ):
        model.init(jax.random.key(0), too_long)
    case = _inputs(True)
    h, matrix, targets = (jnp.asarray(case[k]) for k in ("h", "matrix", "targets"))
    try:
        chunked_cross_entropy(h[0], matrix, targets, tied=True, dtype=None)
    except LossInputError as error:  # the earlier name still catches it
        assert type(error) is ModelInputError and isinstance(error, ValueError)
    else:
        pytest.fail("a bad loss shape was not refused")


# ---- the model ----

SMALL = {"n_layers": 1, "n_embd": 16, "n_head": 2, "block_size": LENGTH}


def _model_and_batch(tied: bool, chunk: int, vocab: int = 258) -> tuple[GPT, Any, dict]:
    model = GPT.build(**SMALL, vocab_size=vocab, tie_embeddings=tied, loss_chunk=chunk)
    rng = np.random.default_rng(1)
    y = rng.integers(0, vocab, (ROWS, LENGTH))
    y[0, :3] = -1
    mask = np.ones((ROWS, LENGTH), np.int32)
    mask[2, 8:] = 0
    batch = {
        "x": jnp.asarray(rng.integers(0, vocab, (ROWS, LENGTH)), jnp.int32),
        "y": jnp.asarray(y, jnp.int32),
        "padding_mask": jnp.asarray(mask),
    }
    params = jax.jit(model.init)(jax.random.key(0), batch["x"])["params"]
    return model, params, batch


@pytest.mark.parametrize(
    ("tied", "chunk"),
    [
        pytest.param(True, 0, id="tied-one-chunk"),
        pytest.param(True, 8, id="tied-chunked", marks=pytest.mark.slow),
        pytest.param(False, 0, id="untied-one-chunk", marks=pytest.mark.slow),
        pytest.param(False, 8, id="untied-chunked"),
    ],
)
def test_the_model_loss_is_the_plain_loss_of_its_own_logits(tied: bool, chunk: int) -> None:
    model, params, batch = _model_and_batch(tied, chunk)
    x, y, mask = batch["x"], batch["y"], batch["padding_mask"]

    def model_loss(p: Any) -> jax.Array:
        return model.apply({"params": p}, x, y, mask)[1]

    def of_its_logits(p: Any) -> jax.Array:
        return cross_entropy(model.apply({"params": p}, x)[0], y, mask)[0]

    got, got_grads = jax.jit(jax.value_and_grad(model_loss))(params)
    want, want_grads = jax.jit(jax.value_and_grad(of_its_logits))(params)
    pairs = list(zip(jax.tree.leaves(got_grads), jax.tree.leaves(want_grads), strict=True))
    if chunk == 0:  # 39 tokens in one chunk: today's computation, bit for bit
        assert float(got) == float(want)
        for a, b in pairs:
            np.testing.assert_array_equal(a, b)
    else:  # 8 tokens: 2 positions of 3 rows, 7 chunks
        assert chunk_length(ROWS, LENGTH, 258, chunk) == 2
        assert _relative(got, want) <= RTOL["float32"][0]
        assert max(_relative(a, b) for a, b in pairs) <= RTOL["float32"][1]


def _step_memory(chunk: int, step: str, accumulate: int = 1) -> int:
    """Temporary bytes of the compiled `BaseTrainer.train_step` or `val_step` (one device)."""
    model = GPT.build(
        n_layers=2, n_embd=64, n_head=2, block_size=128, vocab_size=16_384, loss_chunk=chunk
    )
    batch = {
        "x": jnp.zeros((8, 128), jnp.int32),
        "y": jnp.zeros((8, 128), jnp.int32),
        "padding_mask": jnp.ones((8, 128), jnp.int32),
    }
    tx = optax.adamw(1e-3)

    def create() -> Any:
        params = model.init(jax.random.key(0), batch["x"][:1])["params"]
        return train_state.TrainState.create(apply_fn=model.apply, params=params, tx=tx)

    state = jax.eval_shape(create)
    sharding = ParameterShardingContext.create()
    if step == "val":
        program = jax.jit(lambda s, b: BaseTrainer.val_step(s, b, sharding=sharding))
        compiled = program.lower(state, batch).compile()
    else:
        program = jax.jit(
            lambda s, b, k: BaseTrainer.train_step(s, b, k, accumulate, sharding=sharding)
        )
        compiled = program.lower(state, batch, jax.random.key(0)).compile()
    return int(compiled.memory_analysis().temp_size_in_bytes)


@pytest.mark.parametrize(
    ("step", "accumulate"),
    [("train", 1), pytest.param("train", 2, marks=pytest.mark.slow), ("val", 1)],
    ids=["train", "micro", "val"],  # micro-batches: the slow set (the default suite's budget)
)
def test_the_compiled_steps_hold_no_float32_logits(step: str, accumulate: int) -> None:
    """The steps drop the model's logits, so XLA removes them; the loss holds one chunk.

    8 rows x 128 positions x 16,384 logits are 64 MiB in float32 (a micro-batch, half).
    Measured (temp bytes; CPU): train 150.0 MB plain vs 42.2 MB with chunks of 128
    tokens, two micro-batches 75.7 vs 34.2 MB, val 67.4 vs 8.7 MB. The chunked train
    step holds, besides a chunk, the unembedding's float32 gradient from the forward on
    (the scan's carry, 4 MiB here): so the check is that chunking saves at least three
    quarters of the logits' bytes.
    """
    logits = 8 * 128 * 16_384 * 4 // accumulate
    plain = _step_memory(10**9, step, accumulate)  # one chunk: the whole logits
    chunked = _step_memory(128, step, accumulate)
    print(f"{step} x{accumulate}: plain {plain:,} bytes, chunked {chunked:,} (logits {logits:,})")
    assert plain >= logits and plain - chunked >= 0.75 * logits and chunked < plain / 2


def test_the_train_step_is_traced_once() -> None:
    model, params, first = _model_and_batch(False, 8)
    tx = optax.adamw(1e-2)
    traces = []

    @jax.jit
    def step(p: Any, opt: Any, batch: dict) -> Any:
        traces.append(1)
        loss, grads = jax.value_and_grad(
            lambda q: model.apply({"params": q}, batch["x"], batch["y"], batch["padding_mask"])[1]
        )(p)
        updates, opt = tx.update(grads, opt, p)
        return optax.apply_updates(p, updates), opt, loss

    opt, losses = tx.init(params), []
    for shift in range(4):  # new values, the same shapes
        batch = {**first, "x": jnp.roll(first["x"], shift, axis=1)}
        params, opt, loss = step(params, opt, batch)
        losses.append(float(loss))
    assert len(traces) == 1 and step._cache_size() == 1
    assert losses[-1] < losses[0]  # it trained


def test_rows_split_over_four_devices_give_the_one_device_loss_and_gradients() -> None:
    # Data parallelism: h's and the targets' rows sharded over a 4-device mesh, the
    # unembedding replicated. The same products per row; only the order of the sums over
    # rows and chunks may differ: float32 tolerances (value 1e-6, gradients 1e-5).
    if len(jax.devices()) < 4:
        pytest.skip("needs 4 devices (XLA_FLAGS=--xla_force_host_platform_device_count=4)")
    rng = np.random.default_rng(3)
    h = jnp.asarray(rng.normal(size=(8, 13, WIDTH)), jnp.float32)
    matrix = jnp.asarray(rng.normal(size=(VOCAB, WIDTH)) * 0.3, jnp.float32)
    targets = jnp.asarray(rng.integers(-1, VOCAB, (8, 13)), jnp.int32)

    def loss(h: jax.Array, matrix: jax.Array) -> jax.Array:
        return chunked_cross_entropy(h, matrix, targets, tied=True, dtype=jnp.float32, chunk=24)[0]

    step = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))
    want, (want_dh, want_dm) = step(h, matrix)
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:4]), ("batch",))
    rows = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("batch"))
    whole = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    got, (got_dh, got_dm) = step(jax.device_put(h, rows), jax.device_put(matrix, whole))
    assert got_dh.sharding.is_equivalent_to(rows, 3)
    assert _relative(got, want) <= 1e-6
    assert _relative(got_dh, want_dh) <= 1e-5
    assert _relative(got_dm, want_dm) <= 1e-5
