"""YAML round trip of a configuration, and ``key=value`` overrides from the command line.

The file is a nested mapping of the settings' paths. Its top-level ``job`` key
names the registered job it configures (``job: my/gpt/train``); ``job`` is
therefore a reserved first path segment. ``dump`` writes each setting's type, range and
help as a comment, and a required setting that has no value as ``null`` with a
``REQUIRED`` comment.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from theseus.config._compose import MISSING
from theseus.config._errors import ConfigError
from theseus.config._field import normalize_path
from theseus.config._files import write_atomic
from theseus.config._tree import Tree
from theseus.config._types import describe, plain


def _scalar(value: Any) -> str:
    text = yaml.safe_dump(plain(value), default_flow_style=True, width=10_000).strip()
    text = text.removesuffix("...").strip()
    if "\n" in text:  # a multi-line string: JSON is YAML and stays on one line
        text = json.dumps(plain(value))
    return text


def dump(tree: Tree, file: str | Path | None = None) -> str:
    """Write the configuration as commented YAML (every setting, defaults included).

    Args:
        tree: the configuration.
        file: where to write it; ``None`` only returns the text.

    Returns:
        The YAML text; ``load`` reads it back to the same values.

    Example:
        >>> from dataclasses import dataclass
        >>> from theseus.config import field
        >>> @dataclass
        ... class Training:
        ...     batch_size: int = field("training/batch_size", default=8, help="sequences")
        >>> print(dump(Tree.of(Training, job="demo")), end="")
        job: demo
        training:
          batch_size: 8  # int: sequences
    """
    lines: list[str] = []
    if tree.job is not None:
        lines.append(f"job: {_scalar(tree.job)}")
    nested: dict[str, Any] = {}  # sections in order of first appearance
    for path in tree.entries:
        *parents, leaf = path.split("/")
        node = nested
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = path
    flat, entries = tree.flat(), tree.entries

    def emit(node: dict[str, Any], depth: int) -> None:
        for key, child in node.items():
            if isinstance(child, dict):
                lines.append("  " * depth + f"{key}:")
                emit(child, depth + 1)
                continue
            entry = entries[child]
            unset = entry.required and tree.get(child, MISSING) is MISSING
            comment = f"{'REQUIRED ' if unset else ''}{describe(entry.type)}"
            if entry.range is not None and entry.range.describe():
                comment += f" {entry.range.describe()}"
            if entry.help:
                comment += f": {entry.help}"
            lines.append("  " * depth + f"{key}: {_scalar(flat[child])}  # {comment}")

    emit(nested, 0)
    text = "\n".join(lines) + "\n"
    if file is not None:
        write_atomic(Path(file), text)
    return text


def load(source: str | Path) -> dict[str, Any]:
    """Read a configuration written by :func:`dump` (or by hand).

    Args:
        source: a path to a YAML file, or YAML text.

    Returns:
        The nested mapping, including the ``job`` key when present; pass it to
        :meth:`Tree.load`.

    Raises:
        ConfigError: the file is missing, is not valid YAML or is not a mapping.
    """
    where = "the configuration text"
    if isinstance(source, Path) or (
        isinstance(source, str) and "\n" not in source and source.endswith((".yaml", ".yml"))
    ):
        path = Path(source)
        if not path.is_file():
            raise ConfigError(
                f"Configuration file {str(path)!r} does not exist. Write one with "
                "`theseus configure JOB out.yaml`."
            )
        where, source = repr(str(path)), path.read_text()
    try:
        data = yaml.safe_load(source)
    except yaml.YAMLError as exc:
        raise ConfigError(f"Could not parse {where} as YAML: {exc}. Fix the syntax.") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"Expected {where} to be a YAML mapping of settings (`training: {{batch_size: 8}}`); "
            f"got a {type(data).__name__}."
        )
    return data


def parse_overrides(items: Iterable[str]) -> dict[str, str]:
    """Parse ``key=value`` strings (``training.batch_size=8``) into ``{path: text}``.

    The text is coerced to each setting's type when applied (:meth:`Tree.set`).

    Raises:
        ConfigError: an item has no ``=`` or an invalid key.
    """
    parsed: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(
                f"Expected an override written key=value (e.g. training.batch_size=8); got {item!r}."
            )
        parsed[normalize_path(key.strip())] = value
    return parsed
