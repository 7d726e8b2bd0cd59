"""Discovery: which module calls a trace makes, by type, and the debugger's errors.

`discover` listens to module calls through `theseus.model.hooks` and names each
`__call__` of a module type by its module path (`"blocks_0/attn"`, the root module
is `""`). `check_paths` and `check_target` validate what callers select
against it, with one-line errors that list the discovered paths.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Sequence
from typing import Any

from theseus.errors import TheseusError
from theseus.model import hooks


class UnknownPathError(TheseusError, ValueError):
    """A module path that the trace never calls (the message lists the discovered ones)."""


class DebugTargetError(TheseusError, TypeError):
    """`find()` or `debug()` was given something that is not a module class."""


class UnknownArgumentError(TheseusError, KeyError):
    """`inputs[name]` for a name the recorded call did not take."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class DebugClosedError(TheseusError, RuntimeError):
    """A debug layer or its inputs used after `close()`."""


class TransformedCallError(TheseusError, ValueError):
    """A selected call inside a transform whose calls cannot be taken apart (`jax.lax.scan`, ...)."""


def check_paths(wanted: Sequence[Any], discovered: Sequence[str], what: str) -> list[str]:
    """Validate selected paths against the discovered ones.

    Args:
        wanted: the paths asked for.
        discovered: the paths `discover` found.
        what: who asked (`"trainer.debug()"`, `"Activations.select()"`), for the message.

    Returns:
        `wanted` as a list of strings.

    Raises:
        UnknownPathError: a path that is not a string or was not discovered.
    """
    shown = ", ".join(repr(p) for p in discovered) or "none"
    for path in wanted:
        if not isinstance(path, str):
            raise UnknownPathError(
                f"{what} must name module paths as strings like 'blocks_0/attn'; got "
                f"{path!r} ({type(path).__name__}). Discovered paths: {shown}."
            )
        if path not in discovered:
            close = difflib.get_close_matches(path.replace(".", "/"), discovered, n=1)
            hint = f" Did you mean {close[0]!r}? (paths are joined with '/')" if close else ""
            raise UnknownPathError(
                f"{what} asked for module path {path!r}, which the trace never calls.{hint} "
                f"Discovered paths: {shown}."
            )
    return list(wanted)


def check_target(target: Any, what: str) -> None:
    """Raise `DebugTargetError` (a `TypeError`) unless `target` is a module class or a tuple of them."""
    targets = target if isinstance(target, tuple) else (target,)
    if not targets or not all(isinstance(t, type) for t in targets):
        raise DebugTargetError(
            f"{what} expects a module class such as SelfAttention (or a tuple of classes); "
            f"got {target!r} ({type(target).__name__})"
        )


def discover(run: Callable[[], Any], target: type | tuple[type, ...]) -> list[str]:
    """Paths of every `__call__` of a `target` module while `run()` runs, in call order.

    Args:
        run: runs the model once (call it under `jax.eval_shape` to spend no FLOPs).
        target: a module class (or tuple of classes); subclasses match too.

    Returns:
        Each path once, as a string (`""` is the root module).
    """
    return hooks.discover(run, lambda call: isinstance(call.module, target))
