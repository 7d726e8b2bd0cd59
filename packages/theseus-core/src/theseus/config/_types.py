"""Type checking and unambiguous coercion of configuration values."""

from __future__ import annotations

import types
import typing
from typing import Any

import yaml

from theseus.config._errors import ConfigTypeError

_SCALARS = (bool, int, float, str)


def describe(tp: Any) -> str:
    """Return a short readable name of a type annotation (``int | None``, ``list[str]``)."""
    if tp is type(None):
        return "None"
    if isinstance(tp, type) and not typing.get_args(tp):
        return tp.__name__
    return str(tp).replace("typing.", "")


def check_supported(tp: Any) -> str | None:
    """Return why ``tp`` cannot be a configuration type, or ``None`` if it can.

    Supported: ``bool``, ``int``, ``float``, ``str``, ``None``, ``Any``, ``Literal``,
    unions (``X | None``), ``list[X]``, ``tuple[X, ...]``, ``tuple[X, Y]``, ``dict[str, X]``.
    """
    if tp is Any or tp is type(None) or tp in _SCALARS:
        return None
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Literal:
        bad = [a for a in args if not isinstance(a, _SCALARS) and a is not None]
        return f"Literal choices must be scalars, got {bad!r}" if bad else None
    if origin in (typing.Union, types.UnionType, list, tuple, dict):
        if origin is dict and args and args[0] is not str:
            return "dict keys must be str"
        for arg in args:
            if arg is Ellipsis:
                continue
            reason = check_supported(arg)
            if reason:
                return reason
        return None
    if tp in (list, tuple, dict):
        return None
    return f"{describe(tp)} is not a supported configuration type"


def _parse(value: str) -> Any:
    try:
        parsed = yaml.safe_load(value)
    except yaml.YAMLError:
        return value
    if isinstance(parsed, str):  # YAML 1.1 reads "1e-3" as a string; Python does not
        try:
            return float(parsed)
        except ValueError:
            return parsed
    return parsed


def _fail(path: str, tp: Any, value: Any, hint: str = "") -> ConfigTypeError:
    return ConfigTypeError(
        f"Configuration value for {path!r} must be {describe(tp)}; got {value!r} "
        f"({type(value).__name__}).{hint} Fix the value in the file, the assignment, "
        f"or the key=value override."
    )


def coerce(value: Any, tp: Any, path: str) -> Any:
    """Return ``value`` as type ``tp``, converting only where it is unambiguous.

    A string is parsed as YAML when the type is not ``str`` (``"8"`` to ``8``,
    ``"true"`` to ``True``, ``"[1, 2]"`` to a list); an ``int`` becomes a
    ``float`` for a ``float`` field. Everything else must already match. In a
    union, a member that matches without parsing wins (``"8"`` stays a string
    in ``int | str``).

    Args:
        value: the value to check.
        tp: the declared annotation.
        path: the configuration path, for the error message.

    Returns:
        The coerced value.

    Raises:
        ConfigTypeError: the value does not fit ``tp``.
    """
    return _coerce(value, tp, path, parse=True)


def _coerce(value: Any, tp: Any, path: str, parse: bool) -> Any:
    if tp is Any:
        return value
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        for parse_text in (False, True) if parse else (False,):
            for member in args:
                try:
                    return _coerce(value, member, path, parse_text)
                except ConfigTypeError:
                    continue
        raise _fail(path, tp, value)
    if parse and isinstance(value, str) and tp is not str:
        parsed = _parse(value)
        if not isinstance(parsed, str):
            return _coerce(parsed, tp, path, parse=False)
    if origin is typing.Literal:
        for choice in args:
            if value == choice and type(value) is type(choice):
                return choice
        raise _fail(path, tp, value, f" Choose one of {list(args)!r}.")
    if tp is type(None):
        if value is None:
            return None
        raise _fail(path, tp, value)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise _fail(path, tp, value, " Write true or false.")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise _fail(path, tp, value)
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise _fail(path, tp, value)
    if tp is str:
        if isinstance(value, str):
            return value
        raise _fail(path, tp, value, " Quote it to make it a string.")
    if origin in (list, tuple) or tp in (list, tuple):
        return _sequence(value, tp, origin or tp, args, path, parse)
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            raise _fail(path, tp, value)
        if not args:
            return dict(value)
        return {
            _coerce(k, args[0], path, parse): _coerce(v, args[1], f"{path}[{k!r}]", parse)
            for k, v in value.items()
        }
    raise _fail(path, tp, value)


def _sequence(
    value: Any, tp: Any, kind: type, args: tuple[Any, ...], path: str, parse: bool
) -> Any:
    if not isinstance(value, (list, tuple)):
        raise _fail(path, tp, value)
    if not args:
        return list(value) if kind is list else tuple(value)
    if kind is list:
        return [_coerce(v, args[0], f"{path}[{i}]", parse) for i, v in enumerate(value)]
    if len(args) == 2 and args[1] is Ellipsis:
        return tuple(_coerce(v, args[0], f"{path}[{i}]", parse) for i, v in enumerate(value))
    if len(args) != len(value):
        raise _fail(path, tp, value, f" It needs exactly {len(args)} items.")
    pairs = enumerate(zip(value, args, strict=True))
    return tuple(_coerce(v, a, f"{path}[{i}]", parse) for i, (v, a) in pairs)


def plain(value: Any) -> Any:
    """Return ``value`` with tuples turned into lists, ready for YAML."""
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value
