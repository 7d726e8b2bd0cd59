"""The time-travel debugger: find module calls by type, replay one, get it back bound.

A trainer's `trace(state, batch, key, sharding=...)` is one pure model call. Flax
linen reports every module method call to its interceptors; this package listens
through `theseus.model.hooks` (the one module that installs one) and names each
call by its module path (`"blocks_0/attn"`, the root module is `""`):

- `discover(run, target)` lists the paths of every `__call__` of a module of type
  `target` (subclasses too), in call order, each once. Callers run it under
  `jax.eval_shape`, so discovery costs no FLOPs.
- `capture(run, paths)` runs the call until the first `__call__` at each of `paths`
  has happened and returns, for each, the module bound to its real variables and
  the call's arguments by name (`DebugInputs`). The rest of the forward pass is not
  run. Used eagerly by `BaseTrainer.debug` and under `jax.jit` by the analysis engine.

Calls inside a Flax lifted transform (`nn.remat`, `nn.vmap`, `nn.scan`, ...) run in the
transform's own trace, so their values cannot leave it. `capture` therefore takes
them at the transformed module's own call, outside the transform (classes made inside
`setup` or a compact method included: they are hooked as Flax creates them): a
selected transformed module (`nn.remat(Block)` at `"blocks_0"`, `nn.vmap(MLP)`,
`nn.scan(...)`) is captured bound to its variables, so calling it runs the transform
on its real arguments; it is called like its class, by keyword too (`layer(**inputs)`:
the arguments are bound to the original `__call__` and passed on positionally, since
`nn.scan` and `nn.vmap` ignore keywords); a call inside `nn.remat`/`nn.checkpoint` or
`nn.jit` (value-transparent) is captured by running the original class untransformed on the same variables and
arguments; a call below `nn.vmap` or `nn.scan` is captured by running the original class
under the same transform, with the body returning the call's array arguments next to
its output, so they leave stacked on a leading axis (one entry per mapped call or per
iteration; Python values stay as they are); its module maps over that axis (variables
on the transform's own axes), so calling it gives every entry's output. That module is called like the class itself, positionally or by keyword
(`layer(**inputs)`): array arguments are mapped, other values (`deterministic=True`)
passed to every entry. A call below any other transform, or below an `nn.scan` that
carries variables, is a `TransformedCallError` naming the module to select.

`DebugSession` is what `trainer.debug(path)` returns: unpack it
(`layer, inputs = trainer.debug(path)`) or use it as a context manager; `close()`
releases the layer and inputs, and using either afterwards is a `DebugClosedError`.

The package is split by concept: `_discovery` (`discover`, path checks, the errors),
`_session` (`DebugLayer`, `DebugInputs`, `DebugSession`), `_lifted` (Flax lifted
classes: hooks, `call_lifted`, `subtree`), `_mapped` (the module of a call below
`nn.vmap`/`nn.scan`) and `_capture` (`capture`); naming a call (`path_of`, `join`,
`named_arguments`) and `trace_state` come from `theseus.model.hooks`. Every public
name is imported from here; the analysis engine's interventions use `trace_state`,
`subtree`, `lifted`, `lifted_calls`, `lifted_call_around` and `call_lifted`.
"""

from theseus.model.debug._capture import capture
from theseus.model.debug._discovery import (
    DebugClosedError,
    DebugTargetError,
    TransformedCallError,
    UnknownArgumentError,
    UnknownPathError,
    check_paths,
    check_target,
    discover,
)
from theseus.model.debug._lifted import (
    attributes,
    call_lifted,
    lifted,
    lifted_call_around,
    lifted_calls,
    subtree,
)
from theseus.model.debug._mapped import mapped_layer
from theseus.model.debug._session import DebugInputs, DebugLayer, DebugSession
from theseus.model.hooks import join, named_arguments, path_of, trace_state

__all__ = [
    "DebugClosedError",
    "DebugInputs",
    "DebugLayer",
    "DebugSession",
    "DebugTargetError",
    "TransformedCallError",
    "UnknownArgumentError",
    "UnknownPathError",
    "attributes",
    "call_lifted",
    "capture",
    "check_paths",
    "check_target",
    "discover",
    "join",
    "lifted",
    "lifted_call_around",
    "lifted_calls",
    "mapped_layer",
    "named_arguments",
    "path_of",
    "subtree",
    "trace_state",
]
