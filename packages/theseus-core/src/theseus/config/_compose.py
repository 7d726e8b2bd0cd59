"""Composition: the declared settings of several dataclasses merged into one schema of paths."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Iterable, Iterator
from typing import Any

from theseus.config._errors import (
    ConfigError,
    ConfigRangeError,
    ConfigTypeError,
    class_name,
)
from theseus.config._field import HELP_KEY, PATH_KEY, RANGE_KEY, RULES_KEY
from theseus.config._range import Range, Rule, check_value, is_numeric
from theseus.config._types import check_supported, coerce, describe

MISSING: Any = dataclasses.MISSING


@dataclasses.dataclass
class Entry:
    """One setting of a composed schema.

    Attributes:
        path: the canonical path (``"training/batch_size"``).
        type: the declared annotation.
        default: the default value, or ``MISSING`` when the setting is required.
        help: the declared one-line description.
        declarers: the classes that declare this path, in composition order.
        default_from: the class whose default is used (``None`` when required).
        own: whether the default comes from the job's own ``CONFIG`` (it then wins).
        range: the numbers the setting admits (``None``: not declared).
        rules: the checks across settings its declarers attach to it.
    """

    path: str
    type: Any
    default: Any
    help: str
    declarers: list[type]
    default_from: type | None
    own: bool = False
    range: Range | None = None
    rules: list[Rule] = dataclasses.field(default_factory=list)

    @property
    def required(self) -> bool:
        """Whether the setting has no default."""
        return self.default is MISSING


@dataclasses.dataclass(frozen=True)
class Leaf:
    """A leaf field of a dataclass as found by :func:`walk`."""

    path: str
    name: str
    type: Any
    field: dataclasses.Field[Any]
    owner: type


def _field_default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not MISSING:
        return f.default
    factory: Any = f.default_factory
    if factory is not MISSING:
        return factory()
    return MISSING


def walk(cls: type, prefix: str = "") -> Iterator[Leaf | tuple[str, dataclasses.Field[Any], type]]:
    """Yield the leaf settings of a dataclass, and ``(path, field, nested_class)`` for sections.

    Args:
        cls: a dataclass type.
        prefix: a path prefix for the fields of a nested dataclass.

    Yields:
        A :class:`Leaf` per setting, and a tuple for each nested dataclass field
        (before its own leaves).

    Raises:
        ConfigError: ``cls`` is not a dataclass, or a field has no path.
        ConfigTypeError: a field's type is not supported.
    """
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        raise ConfigError(
            f"Expected a dataclass type to compose; got {cls!r}. Decorate it with "
            "@dataclasses.dataclass and declare its settings with theseus.config.field()."
        )
    try:
        hints = typing.get_type_hints(cls)
    except Exception as exc:  # a forward reference that does not resolve
        raise ConfigTypeError(
            f"Cannot resolve the annotations of {class_name(cls)}: {exc}. Import every "
            "type its fields name in its module."
        ) from exc
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        tp = hints.get(f.name, f.type)
        own = f.metadata.get(PATH_KEY)
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            nested = f"{prefix}{own}/" if own else prefix
            yield (nested.rstrip("/"), f, tp)
            yield from walk(tp, nested)
            continue
        if own is None:
            raise ConfigError(
                f"Field {class_name(cls)}.{f.name} has no configuration path. Declare it "
                f"with theseus.config.field('section/{f.name}', default=...)."
            )
        reason = check_supported(tp)
        if reason:
            raise ConfigTypeError(
                f"Field {class_name(cls)}.{f.name} at {prefix + own!r} has type "
                f"{describe(tp)}: {reason}. Use bool, int, float, str, Literal, list, "
                "tuple, dict[str, ...] or an optional of these."
            )
        yield Leaf(prefix + own, f.name, tp, f, cls)


def compose(classes: Iterable[type], own: type | None = None) -> dict[str, Entry]:
    """Merge the settings of ``classes`` into one schema.

    A path is one setting shared by every declarer. Declarers must agree on the
    type. Defaults declared by ``own`` (the job's ``CONFIG``) win over the
    others; two other declarers with different defaults are a conflict.

    Args:
        classes: dataclass types, each composed with its nested dataclasses.
        own: the job's own configuration class (may also appear in ``classes``).

    Returns:
        ``{path: Entry}`` in declaration order.

    Raises:
        ConfigError: two declarers disagree on a type, a default or a range, or a
            path is both a setting and a section.
        ConfigTypeError: a default does not fit its declared type, or a range is
            declared on a setting that holds no numbers.
        ConfigRangeError: a default is outside its setting's range.
    """
    order = [own] if own is not None else []
    order += [c for c in classes if c is not own]
    entries: dict[str, Entry] = {}
    for cls in dict.fromkeys(order):
        for item in walk(cls):
            if isinstance(item, Leaf):
                _merge(entries, item, is_own=cls is own)
    _check_sections(entries)
    for entry in entries.values():
        _check_default(entry)
    return entries


def _check_default(entry: Entry) -> None:
    if entry.required or entry.range is None:
        return
    try:
        check_value(entry.path, entry.default, entry.range, entry.type, MISSING)
    except ConfigRangeError:
        assert entry.default_from is not None
        raise ConfigRangeError(
            f"{class_name(entry.default_from)} declares default {entry.default!r} for "
            f"{entry.path!r}, outside its range ({entry.range.describe()}); change the "
            "default or the range."
        ) from None


def _merge_range(entry: Entry, leaf: Leaf) -> None:
    declared = leaf.field.metadata.get(RANGE_KEY)
    if declared is not None and not is_numeric(leaf.type):
        raise ConfigTypeError(
            f"Field {class_name(leaf.owner)}.{leaf.name} at {leaf.path!r} declares a range "
            f"({declared.describe() or 'unbounded'}) but holds {describe(leaf.type)}, not "
            "numbers; drop ge=/gt=/le=/lt=/unbounded= there."
        )
    if declared is not None and entry.range is not None and declared != entry.range:
        raise ConfigError(
            f"Path {leaf.path!r} has range {entry.range.describe() or 'unbounded'} in "
            f"{class_name(entry.declarers[0])} and {declared.describe() or 'unbounded'} in "
            f"{class_name(leaf.owner)}. A path is one setting: declare the same range in both."
        )
    if entry.range is None:
        entry.range = declared
    for check in leaf.field.metadata.get(RULES_KEY, ()):
        if check not in entry.rules:
            entry.rules.append(check)


def _merge(entries: dict[str, Entry], leaf: Leaf, is_own: bool) -> None:
    default = _field_default(leaf.field)
    if default is not MISSING:
        default = coerce(default, leaf.type, leaf.path)
    declarer = leaf.owner
    entry = entries.get(leaf.path)
    if entry is None:
        entries[leaf.path] = Entry(
            leaf.path,
            leaf.type,
            default,
            leaf.field.metadata.get(HELP_KEY, ""),
            [declarer],
            declarer if default is not MISSING else None,
            is_own and default is not MISSING,
        )
        _merge_range(entries[leaf.path], leaf)
        return
    if declarer not in entry.declarers:
        entry.declarers.append(declarer)
    if entry.type != leaf.type:
        raise ConfigError(
            f"Path {leaf.path!r} is declared as {describe(entry.type)} by "
            f"{class_name(entry.declarers[0])} and as {describe(leaf.type)} by "
            f"{class_name(declarer)}. A path is one setting: give both fields the same "
            "type, or move one of them to another path."
        )
    _merge_range(entry, leaf)
    if not entry.help and leaf.field.metadata.get(HELP_KEY):
        entry.help = leaf.field.metadata[HELP_KEY]
    if default is MISSING:
        return
    if entry.default is MISSING:
        entry.default, entry.default_from, entry.own = default, declarer, is_own
        return
    if entry.own or entry.default == default:
        return
    if is_own:
        entry.default, entry.default_from, entry.own = default, declarer, True
        return
    assert entry.default_from is not None
    raise ConfigError(
        f"Path {leaf.path!r} has default {entry.default!r} in "
        f"{class_name(entry.default_from)} and {default!r} in {class_name(declarer)}. "
        "Set the default once in the job's CONFIG (its default wins over the "
        "components'), or make the components agree."
    )


def _check_sections(entries: dict[str, Entry]) -> None:
    for path in entries:
        parts = path.split("/")
        for i in range(1, len(parts)):
            prefix = "/".join(parts[:i])
            if prefix in entries:
                a, b = entries[prefix], entries[path]
                raise ConfigError(
                    f"Path {prefix!r} is a setting in {class_name(a.declarers[0])} and a "
                    f"section (it contains {path!r}) in {class_name(b.declarers[0])}. "
                    "Rename one of them."
                )
