"""The compiled engine against references it does not share code with.

References: Flax's own `capture_intermediates` on the same parameters and batch
(on untransformed twins of models whose blocks are `nn.remat`-ed: at module level, in
`setup`, inline in a compact method), the plain `Block` applied iteration by iteration
(for calls below `nn.scan`), and layers computed by hand with NumPy from the
parameters (the MLP, the attention probabilities with rotary positions written as
complex rotations, a vmapped MLP ensemble and the dense layers inside it member by
member). Also: a call below an `nn.scan` that carries variables is a one-line error,
and an `analyze()` may return its `inputs`. Tolerance: float32 on
CPU, rtol 1e-5 (atol 1e-6) between the compiled analysis and a reference.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import flax.core
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from theseus.analysis import AnalysisBase
from theseus.data.datasets import Synthetic
from theseus.experiments.models.gpt import PretrainGPT
from theseus.model.attention.base import SelfAttention
from theseus.model.debug import DebugInputs, TransformedCallError
from theseus.model.models import GPT, MLP, Block, _norm
from theseus.quick import quick
from theseus.registry import import_module_or_file

jobs = import_module_or_file(str(Path(__file__).with_name("analysis_jobs.py")))

TOL = {"rtol": 1e-5, "atol": 1e-6}

RematBlock = nn.remat(Block)
Ensemble = nn.vmap(
    MLP,
    variable_axes={"params": 0},
    split_rngs={"params": True},
    in_axes=None,
    out_axes=0,
    axis_size=2,
    metadata_params={nn.PARTITION_NAME: None},
)


class TransformedGPT(GPT):
    """GPT whose blocks are `nn.remat(Block)`, plus an `nn.vmap`-ed MLP ensemble before `ln_f`."""

    BLOCK = RematBlock

    def setup(self) -> None:
        cfg = self.config
        self.wte = nn.Embed(cfg.vocab_size, cfg.n_embd)
        self.blocks = [
            self.BLOCK(cfg, self.attention, self.mlp_config) for _ in range(cfg.n_layers)
        ]
        self.ensemble = Ensemble(self.mlp_config)
        self.ln_f = _norm(cfg, "ln_f")

    def __call__(self, x, y=None, padding_mask=None, deterministic=True):
        h = self.wte(x)
        for block in self.blocks:
            h = block(h)
        h = h + self.ensemble(h).mean(axis=0)
        logits = self.wte.attend(self.ln_f(h))
        return logits, None if y is None else jnp.mean(logits)


class TwinGPT(TransformedGPT):
    """The same model with plain blocks: same parameters, nothing transformed in the blocks."""

    BLOCK = Block


class TransformedTrainer(PretrainGPT):
    MODEL = TransformedGPT


class SetupRematGPT(TwinGPT):
    """`TwinGPT` whose blocks are `nn.remat(Block)` classes made inside `setup` (anew each time)."""

    def setup(self) -> None:
        cfg = self.config
        self.wte = nn.Embed(cfg.vocab_size, cfg.n_embd)
        self.blocks = [
            nn.remat(Block)(cfg, self.attention, self.mlp_config) for _ in range(cfg.n_layers)
        ]
        self.ensemble = Ensemble(self.mlp_config)
        self.ln_f = _norm(cfg, "ln_f")


class Stack(nn.Module):
    """Blocks and an MLP ensemble built inline in a compact method: `nn.remat(Block)(...)(h)`."""

    config: Any
    attention: Any
    mlp_config: Any
    remat: bool = True

    @nn.compact
    def __call__(self, h):
        block = nn.remat(Block) if self.remat else Block
        for i in range(self.config.n_layers):
            h = block(self.config, self.attention, self.mlp_config, name=f"blocks_{i}")(h)
        members = nn.vmap(
            MLP,
            variable_axes={"params": 0},
            split_rngs={"params": True},
            in_axes=None,
            out_axes=0,
            axis_size=2,
            metadata_params={nn.PARTITION_NAME: None},
        )(self.mlp_config, name="ensemble")(h)
        return h + members.mean(axis=0)


class InlineGPT(GPT):
    """GPT whose blocks and ensemble are made inline by `Stack` (`stack/blocks_0`, ...)."""

    REMAT = True

    def setup(self) -> None:
        cfg = self.config
        self.wte = nn.Embed(cfg.vocab_size, cfg.n_embd)
        self.stack = Stack(cfg, self.attention, self.mlp_config, remat=self.REMAT)
        self.ln_f = _norm(cfg, "ln_f")

    def __call__(self, x, y=None, padding_mask=None, deterministic=True):
        logits = self.wte.attend(self.ln_f(self.stack(self.wte(x))))
        return logits, None if y is None else jnp.mean(logits)


class InlineTwinGPT(InlineGPT):
    """The same model with plain blocks."""

    REMAT = False


class InlineTrainer(PretrainGPT):
    MODEL = InlineGPT


class Step(Block):
    def __call__(self, h, _):
        return super().__call__(h), None


ScannedStep = nn.scan(
    Step,
    variable_axes={"params": 0},
    split_rngs={"params": True},
    length=2,  # architecture/n_layers in these tests
    metadata_params={nn.PARTITION_NAME: None},
)


class ScanGPT(GPT):
    """GPT whose blocks are one `nn.scan` over a stacked `Step` (a `Block`)."""

    def setup(self) -> None:
        cfg = self.config
        self.wte = nn.Embed(cfg.vocab_size, cfg.n_embd)
        self.layers = ScannedStep(cfg, self.attention, self.mlp_config)
        self.ln_f = _norm(cfg, "ln_f")

    def __call__(self, x, y=None, padding_mask=None, deterministic=True):
        h, _ = self.layers(self.wte(x), None)
        logits = self.wte.attend(self.ln_f(h))
        return logits, None if y is None else jnp.mean(logits)


class ScanTrainer(PretrainGPT):
    MODEL = ScanGPT


class _Analysis(AnalysisBase):
    PATH = ""

    def select(self, paths):
        return self.PATH

    def plot(self, results):
        return None


class _Output(_Analysis):
    """The layer's input `x` and its output."""

    def analyze(self, layer, inputs):
        return {"x": inputs.x, "out": layer(inputs.x)}


class _Attention(_Analysis):
    """An attention layer's input `x`, its output and its attention probabilities."""

    TARGET = SelfAttention

    def analyze(self, layer, inputs):
        return {"x": inputs.x, "out": layer(inputs.x), "weights": layer.weights(inputs.x)}


class RematAttention(_Attention, TransformedTrainer):
    NAME = "remat-attention"
    PATH = "blocks_1/attn"


class RematBlockOutput(_Output, TransformedTrainer):
    TARGET = Block
    NAME = "remat-block"
    PATH = "blocks_0"


class EnsembleOutput(_Output, TransformedTrainer):
    TARGET = MLP
    NAME = "ensemble"
    PATH = "ensemble"


class EnsembleInside(_Analysis, TransformedTrainer):
    TARGET = nn.Dense
    NAME = "ensemble-inside"

    def select(self, paths):
        return ["ensemble/c_fc", "ensemble/c_proj"]

    def analyze(self, layers, inputs):
        return [
            {"x": i.inputs, "out": layer(i.inputs)} for layer, i in zip(layers, inputs, strict=True)
        ]


class SetupRematAttention(RematAttention):
    MODEL = SetupRematGPT
    NAME = "setup-remat-attention"


class InlineCalls(_Analysis, InlineTrainer):
    TARGET = (Block, SelfAttention, MLP)
    NAME = "inline-calls"
    PATHS = ["stack/blocks_0", "stack/blocks_1/attn", "stack/ensemble"]

    def select(self, paths):
        return self.PATHS

    def analyze(self, layers, inputs):
        block, attn, ensemble = layers
        return {
            "block": block(inputs[0].x),
            "attn_x": inputs[1].x,
            "attn": attn(inputs[1].x),
            "weights": attn.weights(inputs[1].x),
            "ensemble_x": inputs[2].x,
            "ensemble": ensemble(inputs[2].x),
        }


class ScanInside(_Attention, ScanTrainer):
    NAME = "scan-inside"
    PATH = "layers/attn"


class ScanWhole(_Analysis, ScanTrainer):
    TARGET = Block
    NAME = "scan-whole"
    PATH = "layers"

    def analyze(self, layer, inputs):
        carry, _ = layer(inputs.h, None)
        return {"h": inputs.h, "out": carry}


class PlainMLP(_Output, PretrainGPT):
    TARGET = MLP
    NAME = "plain-mlp"
    PATH = "blocks_1/mlp"


class PlainAttention(_Analysis, PretrainGPT):
    TARGET = SelfAttention
    NAME = "plain-attention"
    PATH = "blocks_1/attn"

    def analyze(self, layer, inputs):
        return {"out": layer(inputs.x), "weights": layer.weights(inputs.x)}


class ReturnsInputs(_Analysis, PretrainGPT):
    TARGET = SelfAttention
    NAME = "returns-inputs"
    PATH = "blocks_0/attn"

    def analyze(self, layer, inputs):
        return inputs


class ReturnsX(ReturnsInputs):
    NAME = "returns-x"

    def analyze(self, layer, inputs):
        return inputs.x


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("reference")
    Synthetic.prepare(root, tokens=40_000, val_tokens=6_000)
    return root


def _create(root: Path, cls: type, run: str):
    with quick(root) as q:
        q.build(cls, run)
        jobs.tiny(q.config)
        job = q.create()
    job.setup()
    return job


def _intermediates(model_cls, job) -> dict:
    """Every module's output on the job's batch, from Flax's `capture_intermediates`."""
    twin = model_cls(job.model.config, job.model.attention, job.model.mlp_config)
    x = np.asarray(job.batch("train")["x"])
    _, state = jax.jit(
        lambda params: twin.apply(
            {"params": params}, x, capture_intermediates=True, mutable=["intermediates"]
        )
    )(job.state.params)
    return jax.tree.map(np.asarray, state["intermediates"])


def _gelu(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))  # nn.gelu's default


def _mlp(params, x):
    """`MLP` by hand (no biases: architecture/bias is false)."""
    return _gelu(x @ np.asarray(params["c_fc"]["kernel"])) @ np.asarray(params["c_proj"]["kernel"])


def _attention_weights(params, x, heads, base=10000.0):
    """Causal attention probabilities by hand, rotary positions as complex rotations."""
    batch, seq, _ = x.shape
    qkv = (x @ np.asarray(params["c_attn"]["kernel"], np.float64)).reshape(batch, seq, 3, heads, -1)
    half = qkv.shape[-1] // 2
    angle = np.arange(seq)[:, None] * base ** (-2.0 * np.arange(half) / (2 * half))

    def rotate(a):
        z = (a[..., :half] + 1j * a[..., half:]) * np.exp(1j * angle)[None, :, None, :]
        return np.concatenate([z.real, z.imag], axis=-1)

    q, k = rotate(qkv[:, :, 0]), rotate(qkv[:, :, 1])
    scores = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(2 * half)
    scores = np.where(np.tril(np.ones((seq, seq), bool)), scores, -np.inf)
    scores = np.exp(scores - scores.max(-1, keepdims=True))
    return scores / scores.sum(-1, keepdims=True)


@pytest.mark.slow  # ~10 s; test_remat_analysis keeps analyses inside nn.remat blocks here
def test_a_call_inside_nn_remat_matches_capture_intermediates_of_the_twin(root: Path) -> None:
    job = _create(root, RematAttention, "remat")
    values = job.compute()
    ref = _intermediates(TwinGPT, job)
    np.testing.assert_allclose(values["x"], ref["blocks_1"]["ln_1"]["__call__"][0], **TOL)
    np.testing.assert_allclose(values["out"], ref["blocks_1"]["attn"]["__call__"][0], **TOL)
    params = job.state.params["blocks_1"]["attn"]
    heads = job.model.attention.n_head
    expected = _attention_weights(params, values["x"].astype(np.float64), heads)
    np.testing.assert_allclose(values["weights"], expected, **TOL)
    # the eager debugger takes the same call
    layer, inputs = job.debug("blocks_1/attn")
    np.testing.assert_allclose(inputs.x, ref["blocks_1"]["ln_1"]["__call__"][0], **TOL)
    np.testing.assert_allclose(layer(inputs.x), ref["blocks_1"]["attn"]["__call__"][0], **TOL)
    # new parameters: the same compilation, numbers that follow them
    job.state = job.state.replace(params=jax.tree.map(lambda p: p * 1.5, job.state.params))
    again = job.compute()
    np.testing.assert_allclose(
        again["x"], _intermediates(TwinGPT, job)["blocks_1"]["ln_1"]["__call__"][0], **TOL
    )
    assert job.traces == 1 and job._analysis_fn._cache_size() == 1


def test_a_remat_block_itself_is_captured_outside_the_transform(root: Path) -> None:
    job = _create(root, RematBlockOutput, "remat-block")
    values = job.compute()
    ref = _intermediates(TwinGPT, job)
    x = np.asarray(job.batch("train")["x"])
    np.testing.assert_allclose(
        values["x"], np.asarray(job.state.params["wte"]["embedding"])[x], **TOL
    )
    np.testing.assert_allclose(values["out"], ref["blocks_0"]["__call__"][0], **TOL)


def test_an_nn_vmap_module_gives_the_whole_batch_of_calls(root: Path) -> None:
    job = _create(root, EnsembleOutput, "ensemble")
    assert "ensemble" in job.find(MLP)
    values = job.compute()
    ref = _intermediates(TwinGPT, job)
    np.testing.assert_allclose(values["x"], ref["blocks_1"]["__call__"][0], **TOL)
    params = jax.tree.map(np.asarray, job.state.params["ensemble"])
    assert values["out"].shape == (2, *values["x"].shape)  # stacked on the mapped axis
    for member in range(2):
        mine = jax.tree.map(lambda p, m=member: p[m], params)
        np.testing.assert_allclose(values["out"][member], _mlp(mine, values["x"]), **TOL)
    layer, inputs = job.debug("ensemble")
    np.testing.assert_allclose(layer(inputs.x), values["out"], **TOL)


def test_calls_below_nn_vmap_give_every_member_stacked(root: Path) -> None:
    job = _create(root, EnsembleInside, "ensemble-inside")
    fc, proj = job.compute()
    x = _intermediates(TwinGPT, job)["blocks_1"]["__call__"][0]  # the ensemble's input
    params = jax.tree.map(np.asarray, job.state.params["ensemble"])
    assert fc["x"].shape == (2, *x.shape)  # in_axes=None: each member saw the same input
    for m in range(2):
        hidden = x @ params["c_fc"]["kernel"][m]
        np.testing.assert_allclose(fc["x"][m], x, **TOL)
        np.testing.assert_allclose(fc["out"][m], hidden, **TOL)
        np.testing.assert_allclose(proj["x"][m], _gelu(hidden), **TOL)
        np.testing.assert_allclose(
            proj["out"][m], _gelu(hidden) @ params["c_proj"]["kernel"][m], **TOL
        )
    layer, inputs = job.debug("ensemble/c_proj")
    np.testing.assert_allclose(layer(inputs.inputs), proj["out"], **TOL)
    job.state = job.state.replace(params=jax.tree.map(lambda p: p * 1.5, job.state.params))
    fc, _ = job.compute()
    np.testing.assert_allclose(
        fc["x"][1], _intermediates(TwinGPT, job)["blocks_1"]["__call__"][0], **TOL
    )
    assert job.traces == 1 and job._analysis_fn._cache_size() == 1


class _Pair(nn.Module):
    """Two dense layers: `tanh(x @ a) @ b`."""

    @nn.compact
    def __call__(self, x):
        return nn.Dense(3, use_bias=False, name="b")(
            jnp.tanh(nn.Dense(4, use_bias=False, name="a")(x))
        )


class _Mapped(nn.Module):
    """`nn.vmap(_Pair)` over axis 1 of its input, with variables on axis 1, outputs on axis 2."""

    @nn.compact
    def __call__(self, x):
        return nn.vmap(
            _Pair,
            variable_axes={"params": 1},
            split_rngs={"params": True},
            in_axes=1,
            out_axes=2,
        )(name="pair")(x)


def test_calls_below_nn_vmap_on_other_axes_are_stacked_on_a_leading_axis() -> None:
    from theseus.model import debug

    x = np.random.default_rng(0).normal(size=(5, 3, 2)).astype(np.float32)  # mapped axis 1
    model = _Mapped()
    variables = model.init(jax.random.PRNGKey(0), x)
    run = lambda: model.apply(variables, x)  # noqa: E731
    (a, a_in), (b, b_in) = debug.capture(run, ["pair/a", "pair/b"])
    params = jax.tree.map(np.asarray, variables["params"]["pair"])
    assert params["a"]["kernel"].shape == (2, 3, 4)  # variable axis 1: [in, members, out]
    assert a_in.inputs.shape == (3, 5, 2)  # every member's input, on a leading axis
    for m in range(3):
        hidden = x[:, m] @ params["a"]["kernel"][:, m]
        np.testing.assert_allclose(a_in.inputs[m], x[:, m], **TOL)
        np.testing.assert_allclose(a(a_in.inputs)[m], hidden, **TOL)
        np.testing.assert_allclose(b_in.inputs[m], np.tanh(hidden), **TOL)
        expected = np.tanh(hidden) @ params["b"]["kernel"][:, m]
        np.testing.assert_allclose(b(b_in.inputs)[m], expected, **TOL)
        np.testing.assert_allclose(np.asarray(run())[:, :, m], expected, **TOL)  # out_axes=2


class _RematOfVmap(nn.Module):
    """`nn.remat(nn.vmap(_Pair))`, both classes made inline on every call."""

    @nn.compact
    def __call__(self, x):
        mapped = nn.vmap(_Pair, variable_axes={"params": 0}, split_rngs={"params": True}, in_axes=0)
        return nn.remat(mapped)(name="pair")(x)


def test_calls_below_a_transform_of_a_transformed_class_are_stacked() -> None:
    from theseus.model import debug

    x = np.random.default_rng(1).normal(size=(3, 5, 2)).astype(np.float32)  # 3 members
    model = _RematOfVmap()
    variables = model.init(jax.random.PRNGKey(0), x)
    run = lambda: model.apply(variables, x)  # noqa: E731
    assert debug.discover(run, nn.Module) == ["", "pair", "pair/a", "pair/b"]
    (pair, pair_in), (a, a_in) = debug.capture(run, ["pair", "pair/a"])
    kernel = np.asarray(variables["params"]["pair"]["a"]["kernel"])  # [members, in, out]
    np.testing.assert_allclose(a_in.inputs, x, **TOL)
    np.testing.assert_allclose(a(a_in.inputs), np.einsum("mbi,mio->mbo", x, kernel), **TOL)
    np.testing.assert_allclose(pair(pair_in.x), run(), **TOL)  # the whole transformed call


class _Branching(nn.Module):
    @nn.compact
    def __call__(self, x):
        first, second = nn.Dense(2, name="first"), nn.Dense(2, name="second")
        if self.is_initializing():
            first(x), second(x)
        return nn.cond(x.sum() > 0, lambda m, x: first(x), lambda m, x: second(x), self, x)


def test_calls_inside_a_function_transform_or_a_transform_around_the_model_say_what_to_do() -> None:
    from theseus.model import debug

    x = jnp.ones((1, 2))
    model = _Branching()
    variables = model.init(jax.random.PRNGKey(0), x)
    assert debug.discover(lambda: model.apply(variables, x), nn.Dense) == ["first", "second"]
    message = r"^module path 'first' is called inside .*module '' opens.*nn\.cond.*select ''"
    with pytest.raises(TransformedCallError, match=message):
        debug.capture(lambda: model.apply(variables, x), ["first"])
    plain = _Pair()
    pv = plain.init(jax.random.PRNGKey(0), x)
    around = r"^module path 'a' is called inside .*that `run` opens around the model"
    for transform in (jax.vmap, jax.jit):
        with pytest.raises(TransformedCallError, match=around):
            debug.capture(lambda t=transform: t(lambda x: plain.apply(pv, x))(x), ["a"])
    # the advice works: capture itself under jax.jit
    inputs = jax.jit(lambda x: debug.capture(lambda: plain.apply(pv, x), ["a"])[0][1].inputs)(x)
    np.testing.assert_allclose(inputs, x, **TOL)


_STASHED_MAKER = nn.transforms.module_class_lift_transform  # Flax's, taken at import


class _Stashed(nn.Module):
    """A remat class made on every call through a maker the capture cannot see."""

    @nn.compact
    def __call__(self, x):
        return _STASHED_MAKER(flax.core.lift.checkpoint, _Pair)(name="pair")(x)


def test_a_lifted_class_made_behind_the_captures_back_is_a_one_line_error() -> None:
    from theseus.model import debug

    x = jnp.ones((1, 2))
    model = _Stashed()
    variables = model.init(jax.random.PRNGKey(0), x)
    message = r"^module path 'pair/a' is called inside nn\.checkpoint at 'pair', whose "
    with pytest.raises(TransformedCallError, match=message + "transformed class was not"):
        debug.capture(lambda: model.apply(variables, x), ["pair/a"])


@pytest.mark.slow  # ~12 s; the nn.vmap probe tests keep the stacked-calls path here
def test_calls_below_nn_scan_give_every_iteration_stacked(root: Path) -> None:
    job = _create(root, ScanInside, "scan-inside")
    assert job.find(SelfAttention) == ["layers/attn"]
    values = job.compute()
    params = job.state.params
    h = np.asarray(params["wte"]["embedding"])[np.asarray(job.batch("train")["x"])]
    # reference: the plain Block applied iteration by iteration, Flax recording its calls
    block = Block(job.model.config, job.model.attention, job.model.mlp_config)
    apply = jax.jit(
        lambda p, h: block.apply(
            {"params": p}, h, capture_intermediates=True, mutable=["intermediates"]
        )
    )
    n = job.model.config.n_layers
    assert values["x"].shape == (n, *h.shape)
    for i in range(n):
        mine = jax.tree.map(lambda p, i=i: p[i], params["layers"])
        out, state = apply(mine, h)
        ref = state["intermediates"]
        np.testing.assert_allclose(values["x"][i], ref["ln_1"]["__call__"][0], **TOL)
        np.testing.assert_allclose(values["out"][i], ref["attn"]["__call__"][0], **TOL)
        expected = _attention_weights(
            mine["attn"], values["x"][i].astype(np.float64), job.model.attention.n_head
        )
        np.testing.assert_allclose(values["weights"][i], expected, **TOL)
        h = np.asarray(out)
    layer, inputs = job.debug("layers/attn")
    np.testing.assert_allclose(layer(inputs.x), values["out"], **TOL)
    job.state = job.state.replace(params=jax.tree.map(lambda p: p * 1.5, job.state.params))
    again = job.compute()
    assert not np.allclose(again["out"], values["out"])
    assert job.traces == 1 and job._analysis_fn._cache_size() == 1


class _Counting(nn.Module):
    @nn.compact
    def __call__(self, h, _):
        seen = self.variable("counter", "n", lambda: jnp.zeros((), jnp.int32))
        seen.value += 1
        return nn.Dense(2, name="d")(h), None


class _Carrying(nn.Module):
    @nn.compact
    def __call__(self, x):
        scan = nn.scan(
            _Counting,
            variable_axes={"params": 0},
            variable_carry="counter",
            split_rngs={"params": True},
            length=3,
        )
        return scan(name="layers")(x, None)[0]


def test_a_call_below_an_nn_scan_that_carries_variables_is_a_one_line_error() -> None:
    from theseus.model import debug

    x = jnp.ones((1, 2))
    model = _Carrying()
    dense = {"kernel": jnp.ones((3, 2, 2)), "bias": jnp.zeros((3, 2))}  # 3 iterations
    variables = {"params": {"layers": {"d": dense}}, "counter": {"layers": {"n": jnp.int32(0)}}}
    run = lambda: model.apply(variables, x, mutable=["counter"])  # noqa: E731
    assert debug.discover(run, nn.Dense) == ["layers/d"]
    message = r"^the calls below nn\.scan at 'layers' cannot be taken apart.*select 'layers'"
    with pytest.raises(TransformedCallError, match=message) as info:
        debug.capture(run, ["layers/d"])
    assert "\n" not in str(info.value)


def test_the_scanned_module_itself_runs_every_iteration(root: Path) -> None:
    job = _create(root, ScanWhole, "scan-whole")
    values = job.compute()
    params = job.state.params
    x = np.asarray(job.batch("train")["x"])
    h = np.asarray(params["wte"]["embedding"])[x]
    np.testing.assert_allclose(values["h"], h, **TOL)
    # reference: the plain GPT's blocks applied one by one with each iteration's slice
    block = Block(job.model.config, job.model.attention, job.model.mlp_config)
    for i in range(job.model.config.n_layers):
        mine = jax.tree.map(lambda p, i=i: p[i], params["layers"])
        h = np.asarray(jax.jit(block.apply)({"params": mine}, h))
    np.testing.assert_allclose(values["out"], h, **TOL)


def test_the_compiled_mlp_matches_flax_and_a_hand_computation(root: Path) -> None:
    job = _create(root, PlainMLP, "plain-mlp")
    values = job.compute()
    ref = _intermediates(GPT, job)
    np.testing.assert_allclose(values["x"], ref["blocks_1"]["ln_2"]["__call__"][0], **TOL)
    np.testing.assert_allclose(values["out"], ref["blocks_1"]["mlp"]["__call__"][0], **TOL)
    params = jax.tree.map(np.asarray, job.state.params["blocks_1"]["mlp"])
    np.testing.assert_allclose(values["out"], _mlp(params, values["x"]), **TOL)


def test_the_compiled_attention_matches_flax_and_a_hand_computation(root: Path) -> None:
    job = _create(root, PlainAttention, "plain-attention")
    values = job.compute()
    ref = _intermediates(GPT, job)
    np.testing.assert_allclose(values["out"], ref["blocks_1"]["attn"]["__call__"][0], **TOL)
    x = ref["blocks_1"]["ln_1"]["__call__"][0].astype(np.float64)
    params = job.state.params["blocks_1"]["attn"]
    expected = _attention_weights(params, x, job.model.attention.n_head)
    np.testing.assert_allclose(values["weights"], expected, **TOL)


def test_analyze_may_return_its_inputs(root: Path) -> None:
    whole = _create(root, ReturnsInputs, "returns-inputs").compute()
    job = _create(root, ReturnsX, "returns-x")
    x = job.compute()
    assert isinstance(whole, DebugInputs) and set(whole) == {
        "x",
        "deterministic",
        "cache",
        "segments",
        "prefixes",
    }
    np.testing.assert_array_equal(whole.x, x)
    rows = np.asarray(job.batch("train")["x"])
    np.testing.assert_allclose(whole.x, np.asarray(jobs.embed_reference(job, rows)), **TOL)


def test_remat_classes_made_in_setup_match_the_twin(root: Path) -> None:
    job = _create(root, SetupRematAttention, "setup-remat")
    assert type(job.model) is SetupRematGPT
    values = job.compute()
    ref = _intermediates(TwinGPT, job)
    np.testing.assert_allclose(values["x"], ref["blocks_1"]["ln_1"]["__call__"][0], **TOL)
    np.testing.assert_allclose(values["out"], ref["blocks_1"]["attn"]["__call__"][0], **TOL)
    expected = _attention_weights(
        job.state.params["blocks_1"]["attn"],
        values["x"].astype(np.float64),
        job.model.attention.n_head,
    )
    np.testing.assert_allclose(values["weights"], expected, **TOL)
    # the eager debugger: the call itself and the remat block made in setup
    layer, inputs = job.debug("blocks_1/attn")
    np.testing.assert_allclose(inputs.x, ref["blocks_1"]["ln_1"]["__call__"][0], **TOL)
    np.testing.assert_allclose(layer(inputs.x), ref["blocks_1"]["attn"]["__call__"][0], **TOL)
    block, given = job.debug("blocks_0")
    np.testing.assert_allclose(block(given.x), ref["blocks_0"]["__call__"][0], **TOL)
    # new parameters: the same compilation, numbers that follow them
    job.state = job.state.replace(params=jax.tree.map(lambda p: p * 1.5, job.state.params))
    again = job.compute()
    ref = _intermediates(TwinGPT, job)
    np.testing.assert_allclose(again["x"], ref["blocks_1"]["ln_1"]["__call__"][0], **TOL)
    np.testing.assert_allclose(again["out"], ref["blocks_1"]["attn"]["__call__"][0], **TOL)
    assert job.traces == 1 and job._analysis_fn._cache_size() == 1


def test_remat_and_vmap_classes_made_inline_in_a_compact_method_match_the_twin(
    root: Path,
) -> None:
    job = _create(root, InlineCalls, "inline")
    assert set(InlineCalls.PATHS) <= set(job.find((Block, SelfAttention, MLP)))
    heads = job.model.attention.n_head
    for scale in (1.0, 1.5):
        job.state = job.state.replace(
            params=jax.tree.map(lambda p, s=scale: p * s, job.state.params)
        )
        values = job.compute()
        ref = _intermediates(InlineTwinGPT, job)["stack"]
        np.testing.assert_allclose(values["block"], ref["blocks_0"]["__call__"][0], **TOL)
        np.testing.assert_allclose(values["attn_x"], ref["blocks_1"]["ln_1"]["__call__"][0], **TOL)
        np.testing.assert_allclose(values["attn"], ref["blocks_1"]["attn"]["__call__"][0], **TOL)
        params = job.state.params["stack"]
        expected = _attention_weights(
            params["blocks_1"]["attn"], values["attn_x"].astype(np.float64), heads
        )
        np.testing.assert_allclose(values["weights"], expected, **TOL)
        np.testing.assert_allclose(values["ensemble_x"], ref["blocks_1"]["__call__"][0], **TOL)
        members = jax.tree.map(np.asarray, params["ensemble"])
        for m in range(2):
            mine = jax.tree.map(lambda p, m=m: p[m], members)
            np.testing.assert_allclose(
                values["ensemble"][m], _mlp(mine, values["ensemble_x"]), **TOL
            )
    assert job.traces == 1 and job._analysis_fn._cache_size() == 1
    layer, inputs = job.debug("stack/blocks_1/attn")
    np.testing.assert_allclose(layer(inputs.x), ref["blocks_1"]["attn"]["__call__"][0], **TOL)
