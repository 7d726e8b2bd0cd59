"""Hydration: ``configure(Cls)`` builds a dataclass instance from the active configuration;
``check_settings(instance)`` holds an instance made in Python to its declaration."""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import typing
from collections.abc import Iterator
from typing import Any, TypeVar

from theseus.config._errors import ConfigError, UnknownKeyError, class_name
from theseus.config._field import PATH_KEY
from theseus.config._tree import Tree

T = TypeVar("T")

_ACTIVE: contextvars.ContextVar[Tree | None] = contextvars.ContextVar(
    "theseus_active_configuration", default=None
)


def active() -> Tree | None:
    """Return the configuration made active by :func:`using`, or ``None``."""
    return _ACTIVE.get()


@contextlib.contextmanager
def using(tree: Tree) -> Iterator[Tree]:
    """Make ``tree`` the active configuration inside the ``with`` block.

    Args:
        tree: the composed configuration :func:`configure` reads from.

    Yields:
        ``tree``.
    """
    token = _ACTIVE.set(tree)
    try:
        yield tree
    finally:
        _ACTIVE.reset(token)


def configure(cls: type[T], tree: Tree | None = None) -> T:
    """Build an instance of the dataclass ``cls`` from a configuration.

    Every field reads the value at its path, so two classes that declare one
    path receive one value.

    Args:
        cls: a dataclass whose fields are declared with :func:`theseus.config.field`.
        tree: the configuration to read; defaults to the active one (:func:`using`),
            and without one to ``cls``'s own defaults.

    Returns:
        The hydrated instance.

    Raises:
        UnknownKeyError: ``cls`` declares a path the configuration lacks (it was
            not composed into the job: add it to the job's ``config()``).
        ConfigError: a required value is unset.

    Example:
        >>> from dataclasses import dataclass
        >>> from theseus.config import field
        >>> @dataclass
        ... class Opt:
        ...     lr: float = field("optimization/lr", default=3e-4)
        >>> tree = Tree.of(Opt)
        >>> tree["optimization.lr"] = 1e-3
        >>> with using(tree):
        ...     configure(Opt).lr
        0.001
    """
    source = tree if tree is not None else active()
    if source is None:
        source = Tree.of(cls)
    return _build(cls, source, "")


def _build(cls: type[T], tree: Tree, prefix: str) -> T:
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        raise ConfigError(
            f"configure() expects a dataclass type; got {cls!r}. Declare the settings "
            "in a @dataclass with theseus.config.field()."
        )
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        tp = hints.get(f.name, f.type)
        own = f.metadata.get(PATH_KEY)
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            kwargs[f.name] = _build(tp, tree, f"{prefix}{own}/" if own else prefix)
            continue
        if own is None:
            raise ConfigError(
                f"Field {class_name(cls)}.{f.name} has no configuration path. Declare it "
                f"with theseus.config.field('section/{f.name}', default=...)."
            )
        path = prefix + own
        if path not in tree:
            raise UnknownKeyError(
                f"{class_name(cls)}.{f.name} reads {path!r}, which the active configuration "
                f"does not declare. Compose {class_name(cls)} into the job (list it in the "
                "job's config()) before hydrating it."
            )
        kwargs[f.name] = tree.value(path)
    return cls(**kwargs)


def check_settings(settings: Any) -> None:
    """Refuse a settings dataclass whose values its declaration does not admit.

    The checks and their one-line errors are a configuration's: each value's type and
    range, then the rules across the class's settings. A factory that takes settings
    made in Python (``AdamW.build(AdamWConfig(...), lr)``) calls it, so its declaration
    is the only check there is.

    Args:
        settings: an instance of a dataclass declared with :func:`theseus.config.field`.

    Raises:
        ConfigTypeError: a value that does not fit its declared type.
        ConfigRangeError: a number outside its range, or a rule that fails.

    Example:
        >>> from dataclasses import dataclass
        >>> from theseus.config import field
        >>> @dataclass
        ... class Opt:
        ...     lr: float = field("optimization/lr", default=3e-4, gt=0)
        >>> check_settings(Opt(lr=1e-3))
        >>> check_settings(Opt(lr=-1.0))
        Traceback (most recent call last):
        ...
        theseus.config._errors.ConfigRangeError: Configuration value for 'optimization/lr' must be a finite number > 0; got -1.0. ...
    """
    tree = Tree.of(type(settings))
    tree.update(_by_path(settings, ""))
    tree.check()


def _by_path(settings: Any, prefix: str) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for f in dataclasses.fields(settings):
        if not f.init:
            continue
        value, own = getattr(settings, f.name), f.metadata.get(PATH_KEY)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            values.update(_by_path(value, f"{prefix}{own}/" if own else prefix))
        elif own is not None:
            values[prefix + own] = value
    return values
