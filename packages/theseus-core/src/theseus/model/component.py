"""Model components: a Flax module plus the configuration schema it reads.

A component class names its settings dataclass in `CONFIG` and its child component
classes in `components()`. `gather()` walks that tree and returns every schema, which
is how a trainer composes the whole model's configuration without instantiating it.
"""

from __future__ import annotations

from typing import Any, ClassVar

import jax.numpy as jnp

from theseus.config import ConfigError

__all__ = ["Component", "resolve_dtype"]

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


def resolve_dtype(name: str) -> Any:
    """Map a configuration dtype name (`"float32"`, `"bfloat16"`, `"float16"`) to JAX's.

    Raises:
        ValueError: an unknown name; the message lists the supported ones.
    """
    try:
        return _DTYPES[name]
    except KeyError:
        raise ConfigError(
            f"unknown dtype {name!r} in architecture/dtype; use one of {sorted(_DTYPES)}"
        ) from None


class Component:
    """Mixin for Flax modules that carry a configuration schema.

    Subclasses set `CONFIG` (a dataclass whose fields are declared with
    `theseus.config.field`) and override `components()` to list child components.
    """

    CONFIG: ClassVar[type | None] = None

    @classmethod
    def components(cls) -> list[type[Component]]:
        """Child component classes whose schemas belong to this one's configuration."""
        return []

    @classmethod
    def gather(cls) -> list[type]:
        """Every configuration schema of this component and its children, each once, in order."""
        seen: list[type] = []
        stack: list[type[Component]] = [cls]
        visited: set[type[Component]] = set()
        while stack:
            component = stack.pop(0)
            if component in visited:
                continue
            visited.add(component)
            if component.CONFIG is not None and component.CONFIG not in seen:
                seen.append(component.CONFIG)
            stack.extend(component.components())
        return seen
