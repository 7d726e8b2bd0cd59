"""The two sides `train_step.py` times: the trainer's own jitted step (`TheseusSide`) and a
hand-written Flax + optax loop over the same model and initial parameters (`HandSide`),
with the optimizer both use, the equivalence check between them (`check`) and the timing
of a block of step calls (`timed_calls`). `strategies.py`, `checkpoint.py` and
`scaling.py` drive the trainer through `TheseusSide` too.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

LR = 1e-3
ADAMW = {"b1": 0.9, "b2": 0.95, "eps": 1e-8, "weight_decay": 0.1}
CLIP = 1.0
# (per-step loss atol, parameter rtol, parameter atol after --check steps), per activation
# dtype. In bfloat16 the two sides may fuse differently; AdamW moves a parameter by about
# lr per step at most, so 5 steps bound a parameter's drift by about 1e-2.
TOLERANCES = {"float32": (1e-5, 2e-4, 2e-6), "bfloat16": (1e-2, 1e-2, 1e-2)}


class TheseusSide:
    """The trainer's jitted step, called as `BaseTrainer.run` calls it."""

    name = "theseus"

    def __init__(
        self,
        trainer: Any,
        host: list[dict[str, Any]],
        placement: str,
        *,
        keep_initial: bool = True,
    ) -> None:
        import jax
        import numpy as np

        self.trainer = trainer
        # A host copy of the initial parameters, for `check` (`keep_initial=False`: none).
        self.initial = jax.tree.map(np.asarray, trainer.state.params) if keep_initial else None
        self.train = trainer.loop.compiled_train()
        self.host = host
        self.per_step = placement == "per-step"
        self.placed = [trainer.sharding.place_batch(b) for b in host]
        self.i = 0
        self.loss: Any = None

    def step(self) -> Any:
        import numpy as np

        t, index = self.trainer, self.i % len(self.host)
        placed = t.sharding.place_batch(self.host[index]) if self.per_step else self.placed[index]
        t.state, self.loss, _, _ = self.train(t.state, placed, np.uint32(t.cursor))
        self.i += 1
        return self.loss

    def steps(self, n: int) -> list[float]:
        calls = timed_calls(self.step, n)
        block_until_ready(self.trainer.state, self.loss)
        return calls

    def compiled(self) -> Any:
        """The step compiled again for its current arguments (`memory_analysis()`)."""
        import numpy as np

        t = self.trainer
        return self.train.lower(t.state, self.placed[0], np.uint32(t.cursor)).compile()

    @property
    def params(self) -> Any:
        return self.trainer.state.params


class HandSide:
    """A hand-written Flax + optax loop on the trainer's model and initial parameters."""

    name = "hand"

    def __init__(
        self, trainer: Any, host: list[dict[str, Any]], placement: str, attention: str = "same"
    ) -> None:
        import dataclasses

        import jax
        import numpy as np
        import optax
        from jax.sharding import Mesh, NamedSharding, PartitionSpec

        mesh = Mesh(np.asarray(jax.devices()), ("batch",))
        self.rows = NamedSharding(mesh, PartitionSpec("batch", None))
        replicated = NamedSharding(mesh, PartitionSpec())
        model = trainer.model
        if attention != "same":  # the same module and parameters, another attention kernel
            model = model.clone(attention=dataclasses.replace(model.attention, attention=attention))
        tx = optax.chain(
            optax.clip_by_global_norm(CLIP),
            optax.adamw(LR, **ADAMW, mask=lambda p: jax.tree.map(lambda a: a.ndim >= 2, p)),
        )

        def step(params: Any, opt_state: Any, x: jax.Array, y: jax.Array) -> Any:
            def loss_fn(p: Any) -> jax.Array:
                logits, _ = model.apply({"params": p}, x)
                logits = logits.astype(np.float32)  # as the trainer's loss (bfloat16 runs)
                return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

            loss, grads = jax.value_and_grad(loss_fn)(params)
            updates, opt_state = tx.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state, loss

        initial = jax.tree.map(np.asarray, trainer.state.params)
        self.params = jax.device_put(initial, replicated)
        self.opt_state = jax.jit(tx.init)(self.params)
        self.train = jax.jit(step, donate_argnums=(0, 1))
        self.host = host
        self.per_step = placement == "per-step"
        self.placed = [self.place(b) for b in host]
        self.i = 0
        self.loss: Any = None

    def place(self, batch: dict[str, Any]) -> tuple[Any, Any]:
        import jax

        return jax.device_put(batch["x"], self.rows), jax.device_put(batch["y"], self.rows)

    def step(self) -> Any:
        index = self.i % len(self.host)
        x, y = self.place(self.host[index]) if self.per_step else self.placed[index]
        self.params, self.opt_state, self.loss = self.train(self.params, self.opt_state, x, y)
        self.i += 1
        return self.loss

    def steps(self, n: int) -> list[float]:
        calls = timed_calls(self.step, n)
        block_until_ready((self.params, self.opt_state), self.loss)
        return calls


def timed_calls(step: Callable[[], Any], n: int) -> list[float]:
    """Seconds each of `n` calls of `step` holds the host (dispatch, or waiting on the device)."""
    calls = []
    for _ in range(n):
        start = time.perf_counter()
        step()
        calls.append(time.perf_counter() - start)
    return calls


def block_until_ready(*trees: Any) -> None:
    import jax

    jax.block_until_ready(trees)


def check(theseus: TheseusSide, hand: HandSide, n: int, dtype: str) -> tuple[bool, str]:
    """Run `n` steps on each side from the same parameters; compare losses and parameters.

    Returns:
        Whether they agree within `TOLERANCES[dtype]`, and a one-line summary.
    """
    import jax
    import numpy as np

    loss_atol, param_rtol, param_atol = TOLERANCES[dtype]
    for a, b in zip(jax.tree.leaves(theseus.initial), jax.tree.leaves(hand.params), strict=True):
        np.testing.assert_array_equal(a, np.asarray(b))
    losses = np.array([[float(theseus.step()), float(hand.step())] for _ in range(max(n, 1))])
    loss_diff = float(np.abs(losses[:, 0] - losses[:, 1]).max())
    worst, ok = 0.0, loss_diff <= loss_atol
    for a, b in zip(jax.tree.leaves(theseus.params), jax.tree.leaves(hand.params), strict=True):
        a, b = np.asarray(a), np.asarray(b)
        worst = max(worst, float(np.abs(a - b).max()))
        ok = ok and bool(np.allclose(a, b, rtol=param_rtol, atol=param_atol))
    print(
        f"check: {len(losses)} steps from the same parameters; loss {losses[0, 0]:.4f} -> "
        f"{losses[-1, 0]:.4f}; max |loss diff| {loss_diff:.2e} (tol {loss_atol:g}), "
        f"max |param diff| {worst:.2e} (tol rtol {param_rtol:g} + atol {param_atol:g}): "
        f"{'same' if ok else 'DIFFERENT'}"
    )
    summary = (
        f"equivalence check over {len(losses)} steps: "
        f"{'same' if ok else 'DIFFERENT'} (max |param diff| {worst:.1e})"
    )
    return ok, summary
