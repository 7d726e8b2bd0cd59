"""The compiled programs of `SAEBase`: activations streamed from the forward through a
shuffling buffer kept on the devices into SAE steps; the held-out measures; the features'
top contexts.

A site's buffer is `[lanes, depth, d]`: one lane per batch row (the rows are split over
the data-parallel devices, and so are the lanes), `depth` = BUFFER forwards x the
sequence length. While the buffer warms up, `fill` writes each forward's activations
into the next slot. Then each `step` runs one forward, draws `length` distinct random
slots of every lane, trains every SAE of the site on the activations those slots held
(an SAE batch of rows x length activations from many earlier forwards and positions),
and writes the new forward's activations into the drawn slots: every activation is
trained on at most once, none leaves the devices, and the draws depend on the shapes
alone, so one device and N devices train the same SAEs. One compiled program per step
(the forward, the draw, every SAE's update), state donated.

The SAEs train on activations scaled by a factor per site (`scales`: the mean squared
norm becomes `d`, so one `K` or penalty means the same at every checkpoint); what is
measured, matched and saved is the SAE folded back to the raw activations (`fold`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding, PartitionSpec

from theseus.analysis._errors import AnalysisError
from theseus.analysis._forward import forward, unchanged
from theseus.analysis._sites import Outcome
from theseus.analysis.sae._model import SAEConfig, decode, encode, init_params, make_train_step
from theseus.training.sharding import ParameterShardingContext

__all__ = ["Bank", "Programs", "activations", "calibrate", "fold", "unfold"]

Params = dict[str, Any]


@dataclass(frozen=True)
class Bank:
    """The SAEs one activation pass trains: for each selected site, one config per width."""

    sites: tuple[str, ...]
    configs: tuple[tuple[SAEConfig, ...], ...]

    def labels(self) -> list[tuple[int, int, str]]:
        """`(site index, width index, label)` of every SAE; the label is `SITE/WIDTH`."""
        return [
            (i, j, f"{site}/{config.width}")
            for i, site in enumerate(self.sites)
            for j, config in enumerate(self.configs[i])
        ]


def fold(params: Params, scale: float) -> Params:
    """An SAE trained on activations times `scale`, as one that reads the raw activations."""
    return {
        **params,
        "W_enc": params["W_enc"] * scale,
        "W_dec": params["W_dec"] / scale,
        "b_dec": params["b_dec"] / scale,
    }


def unfold(params: Params, scale: float, config: SAEConfig) -> Params:
    """The inverse of `fold` (same features, same reconstruction); for `relu` and `topk`
    each decoder row is then brought to unit norm, its feature scaled the other way."""
    inner = {
        **params,
        "W_enc": params["W_enc"] / scale,
        "W_dec": params["W_dec"] * scale,
        "b_dec": params["b_dec"] * scale,
    }
    if config.architecture == "jumprelu":
        return inner
    norms = np.maximum(np.linalg.norm(np.asarray(inner["W_dec"]), axis=1), 1e-12)
    return {
        **inner,
        "W_dec": np.asarray(inner["W_dec"]) / norms[:, None],
        "W_enc": np.asarray(inner["W_enc"]) * norms[None, :],
        "b_enc": np.asarray(inner["b_enc"]) * norms,
    }


def calibrate(params: Params, x: jax.Array, config: SAEConfig) -> Params:
    """`jumprelu`'s thresholds set so that each feature fires on `k / width` of `x`
    (`[n, d_in]`, the scaled activations), so the SAE starts at its L0 target `k`.

    Each threshold is its feature's `1 - k / width` quantile of the ReLU'd
    pre-activations, at least `config.threshold`. (A threshold learned in log space by
    Adam moves about the learning rate a step: from SAELens's fixed start, 1e-3, it would
    need thousands of steps to reach the activations' scale, and until then JumpReLU is
    a ReLU with half the features active.)
    """
    pre = jax.nn.relu((x - params["b_dec"]) @ params["W_enc"] + params["b_enc"])  # [n, width]
    share = min(1.0, config.k / config.width)
    threshold = jnp.quantile(pre, 1.0 - share, axis=0)
    threshold = jnp.maximum(threshold, config.threshold)
    return {**params, "log_threshold": jnp.log(threshold).astype(jnp.float32)}


def activations(
    trace: Callable[..., Any],
    sites: tuple[str, ...],
    sharding: ParameterShardingContext,
    owner: str,
    state: Any,
    batch: dict[str, Any],
) -> dict[str, jax.Array]:
    """Each site's output `[rows, length, d]` on `batch` (deterministic), as float32.

    Raises:
        AnalysisError: a site's output is not one array of that shape.
    """
    _, calls = forward(
        lambda: trace(state, batch, None, sharding=sharding), sites, unchanged, owner
    )
    rows, length = batch["x"].shape[:2]
    out = {}
    for site in sites:
        value = calls[site].output
        if not isinstance(value, jax.Array) or value.ndim != 3 or value.shape[:2] != (rows, length):
            shape = getattr(value, "shape", type(value).__name__)
            raise AnalysisError(
                f"{owner}: an SAE reads a site's output as [batch, length, d], but {site!r} "
                f"returned {shape} on a batch of {rows} x {length}; select a module that "
                "returns the activations (a Block, an MLP, an attention layer)"
            )
        out[site] = value.astype(jnp.float32)
    return out


def after(slots: jax.Array, drawn: jax.Array) -> jax.Array:
    """`slots` unchanged, computed from `drawn` so that the write into those slots of the
    donated buffer comes after the read that made `drawn`.

    Without the dependency XLA cannot order the read before the in-place write and
    copies the whole buffer twice a step (measured on a CPU: 55 ms against 6 ms for a
    buffer of 100 MB). `isnan(max)` is 0 or 1 and every slot is below the largest index
    less one, so the minimum is `slots` whatever the activations hold.
    """
    below = jnp.asarray(jnp.iinfo(slots.dtype).max - 1, slots.dtype)
    return jnp.minimum(slots, below + jnp.isnan(drawn.max()).astype(slots.dtype))


class Programs:
    """The jitted programs of one bank of SAEs on one trainer's trace (each traced once).

    Args:
        trace: the trainer's `trace` classmethod.
        bank: the sites and SAE configs.
        optimizer: the SAEs' optimizer.
        sharding: the trainer's mesh and rules.
        owner: the analysis's class name, for messages.
        count: called with a program's name each time it is traced.
        top: top contexts kept per feature; before, after: a context's tokens around it.
    """

    def __init__(
        self,
        trace: Callable[..., Any],
        bank: Bank,
        optimizer: optax.GradientTransformation,
        sharding: ParameterShardingContext,
        owner: str,
        count: Callable[[str], None],
        top: int,
        before: int,
        after: int,
    ) -> None:
        self.trace, self.bank, self.sharding, self.owner = trace, bank, sharding, owner
        self.optimizer, self.count = optimizer, count
        self.top, self.before, self.after = top, before, after
        self.updates = [[make_train_step(c, optimizer) for c in cs] for cs in bank.configs]
        replicated = sharding.replicated()
        self.lanes = NamedSharding(sharding.mesh, PartitionSpec("batch", None, None))
        self.fill = jax.jit(self._fill, donate_argnums=0, out_shardings=self.lanes)
        shardings = (replicated, replicated, self.lanes, replicated, replicated)
        self.step = jax.jit(self._step, donate_argnums=(0, 1, 2, 3), out_shardings=shardings)
        self.update = jax.jit(  # the step without its forward (benchmarks/sae.py times it)
            self._update, donate_argnums=(0, 1, 2, 3), out_shardings=shardings
        )
        self.unfired = jax.jit(
            lambda: [[jnp.zeros((c.width,), bool) for c in cs] for cs in bank.configs],
            out_shardings=replicated,
        )
        self.scales = jax.jit(self._scales, out_shardings=replicated)
        self.start = jax.jit(self._start, out_shardings=replicated)
        self.evaluate = jax.jit(self._evaluate, out_shardings=replicated)
        self.contexts = jax.jit(self._contexts, out_shardings=replicated)
        self.init_optimizer = jax.jit(
            lambda saes: [[optimizer.init(p) for p in row] for row in saes],
            out_shardings=replicated,
        )

    # ------------------------------------------------------------------ forward
    def _forward(self, state: Any, batch: dict[str, Any], on_call: Any = unchanged) -> Any:
        output, calls = forward(
            lambda: self.trace(state, batch, None, sharding=self.sharding),
            self.bank.sites,
            on_call,
            self.owner,
        )
        return output, calls

    def activations(self, state: Any, batch: dict[str, Any]) -> dict[str, jax.Array]:
        """Each site's output `[rows, length, d]` on `batch`, as float32."""
        return activations(self.trace, self.bank.sites, self.sharding, self.owner, state, batch)

    # ------------------------------------------------------------------ buffers
    def empty(self, lanes: int, depth: int, widths: list[int]) -> dict[str, jax.Array]:
        """Zeroed buffers `[lanes, depth, d]`, one per site, split over the devices by lane."""

        def make() -> dict[str, jax.Array]:
            return {
                s: jnp.zeros((lanes, depth, d), jnp.float32)
                for s, d in zip(self.bank.sites, widths, strict=True)
            }

        return jax.jit(make, out_shardings=self.lanes)()

    def _fill(self, buffers: Any, state: Any, batch: Any, slot: jax.Array) -> Any:
        self.count("fill")
        acts = self.activations(state, batch)
        return {
            site: jax.lax.dynamic_update_slice_in_dim(
                buffers[site], acts[site], slot * acts[site].shape[1], axis=1
            )
            for site in self.bank.sites
        }

    def _scales(self, buffers: Any) -> Any:
        """Per site: the factor that makes the buffer's mean squared norm `d`."""
        self.count("scales")
        return {
            site: jnp.sqrt(b.shape[-1] / jnp.maximum(jnp.mean(jnp.sum(b**2, axis=-1)), 1e-12))
            for site, b in buffers.items()
        }

    def _start(self, buffers: Any, scales: Any, key: jax.Array) -> Any:
        """Fresh SAEs: `init_params`, the decoder bias at the scaled buffer's mean, and
        `jumprelu`'s thresholds calibrated on the buffer (`calibrate`)."""
        self.count("start")
        saes = []
        for i, site in enumerate(self.bank.sites):
            b = buffers[site]
            mean = jnp.mean(b.reshape(-1, b.shape[-1]), axis=0) * scales[site]
            row = []
            for j, config in enumerate(self.bank.configs[i]):
                params = init_params(config, jax.random.fold_in(jax.random.fold_in(key, i), j))
                params = {**params, "b_dec": mean}
                if config.architecture == "jumprelu":
                    params = calibrate(params, b.reshape(-1, b.shape[-1]) * scales[site], config)
                row.append(params)
            saes.append(row)
        return saes

    # ------------------------------------------------------------------ training
    def _step(
        self,
        saes: Any,
        opts: Any,
        buffers: Any,
        fired: Any,
        state: Any,
        batch: Any,
        key: jax.Array,
        scales: Any,
    ) -> Any:
        self.count("step")
        acts = self.activations(state, batch)
        return self._update(saes, opts, buffers, fired, acts, key, scales)

    def _update(
        self,
        saes: Any,
        opts: Any,
        buffers: Any,
        fired: Any,
        acts: Any,
        key: jax.Array,
        scales: Any,
    ) -> Any:
        """A step after the forward: each site's draw from its buffer, every SAE's update
        (and which of its features have fired so far, `fired`), the new activations `acts`
        (`{site: [lanes, length, d]}`) written in."""
        new_saes, new_opts, new_buffers, new_fired, metrics = [], [], {}, [], []
        for i, site in enumerate(self.bank.sites):
            buffer, fresh = buffers[site], acts[site]
            lanes, depth, d = buffer.shape
            length = fresh.shape[1]
            draw = jax.random.uniform(jax.random.fold_in(key, i), (lanes, depth))
            _, slots = jax.lax.top_k(draw, length)  # distinct random slots of each lane
            drawn = jnp.take_along_axis(buffer, slots[..., None], axis=1)
            new_buffers[site] = buffer.at[jnp.arange(lanes)[:, None], after(slots, drawn)].set(
                fresh
            )
            x = drawn.reshape(lanes * length, d) * scales[site]
            x = jax.lax.with_sharding_constraint(x, self.sharding.batch_sharding(2))
            row_saes, row_opts, row_fired, row_metrics = [], [], [], []
            for j, update in enumerate(self.updates[i]):
                params, opt, m = update(saes[i][j], opts[i][j], x)
                row_saes.append(params)
                row_opts.append(opt)
                row_fired.append(fired[i][j] | m.pop("fired"))
                row_metrics.append(m)
            new_saes.append(row_saes)
            new_opts.append(row_opts)
            new_fired.append(row_fired)
            metrics.append(row_metrics)
        return new_saes, new_opts, new_buffers, new_fired, metrics

    # ------------------------------------------------------------------ measures
    def _evaluate(self, saes: Any, state: Any, batch: Any) -> Any:
        """On one held-out batch, with each SAE read on the raw activations (folded):
        the loss clean, with each site zeroed and with each SAE's reconstruction spliced
        in (one forward each), and the sums FVU, L0 and the dead features are made of."""
        self.count("evaluate")

        def loss(on_call: Any) -> tuple[jax.Array, Any]:
            output, calls = self._forward(state, batch, on_call)
            value = Outcome.of(output, batch).loss
            if value is None:
                raise AnalysisError(
                    f"{self.owner}: loss recovered needs the trace to return "
                    "(logits, loss, ...) as forward does; this trace returns no loss"
                )
            return value, calls

        def at(site: str, replace: Callable[[jax.Array], jax.Array]) -> Any:
            def on_call(path: str, module: Any, named: Any, output: Any) -> Any:
                return replace(output) if path == site else output

            return on_call

        clean, calls = loss(unchanged)
        result: dict[str, Any] = {"clean": clean, "sites": []}
        for i, site in enumerate(self.bank.sites):
            x = calls[site].output.astype(jnp.float32)
            x = x.reshape(-1, x.shape[-1])
            zeroed, _ = loss(at(site, jnp.zeros_like))
            per: dict[str, Any] = {
                "zeroed": zeroed,
                "sum": jnp.sum(x, axis=0),
                "squares": jnp.sum(x**2, axis=0),
                "count": jnp.asarray(x.shape[0], jnp.float32),
                "saes": [],
            }
            for j, config in enumerate(self.bank.configs[i]):
                params = saes[i][j]
                features = encode(params, x, config)
                error = decode(params, features) - x

                def splice(out: jax.Array, params: Params = params, c: SAEConfig = config) -> Any:
                    raw = out.astype(jnp.float32)
                    return decode(params, encode(params, raw, c)).astype(out.dtype)

                spliced, _ = loss(at(site, splice))
                per["saes"].append(
                    {
                        "spliced": spliced,
                        "error": jnp.sum(error**2),
                        "active": jnp.sum(features > 0).astype(jnp.float32),
                        "fired": jnp.any(features > 0, axis=0),
                    }
                )
            result["sites"].append(per)
        return result

    def _contexts(self, saes: Any, state: Any, batch: Any) -> Any:
        """Per SAE on `batch`: each feature's `top` activations and where they are, its
        activation over the window around each, its density and its largest activation."""
        self.count("contexts")
        acts = self.activations(state, batch)
        offsets = jnp.arange(-self.before, self.after + 1)
        out: list[list[Any]] = []
        for i, site in enumerate(self.bank.sites):
            rows, length, d = acts[site].shape
            x = acts[site].reshape(rows * length, d)
            row = []
            for j, config in enumerate(self.bank.configs[i]):
                f = encode(saes[i][j], x, config).T  # [width, tokens]
                values, where = jax.lax.top_k(f, min(self.top, rows * length))
                position = where % length
                near = position[..., None] + offsets  # [width, top, window]
                inside = (near >= 0) & (near < length)
                flat = (where // length)[..., None] * length + jnp.clip(near, 0, length - 1)
                window = jnp.take_along_axis(f, flat.reshape(f.shape[0], -1), axis=1)
                row.append(
                    {
                        "values": values,
                        "where": where,
                        "window": jnp.where(inside, window.reshape(flat.shape), 0.0),
                        "density": jnp.mean(f > 0, axis=1),
                        "max": jnp.max(f, axis=1),
                    }
                )
            out.append(row)
        return {"ids": batch["x"], "saes": out}
