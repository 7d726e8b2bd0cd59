"""``Tree``: a composed configuration, read and written by path or by attribute."""

from __future__ import annotations

import copy
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from theseus.config._compose import MISSING, Entry, compose
from theseus.config._errors import (
    ConfigError,
    ConfigRangeError,
    UnknownKeyError,
    class_name,
    suggest,
)
from theseus.config._field import normalize_path
from theseus.config._range import check_value
from theseus.config._retired import Retired, retired_of
from theseus.config._types import coerce, describe

_OWN_ATTRS = frozenset({"job"})


class Tree:
    """The composed configuration of a job: a schema of paths and their values.

    Values come in two layers over the declared defaults: *loaded* values (a
    YAML file, or the configuration saved at a base node) and *set* values
    (assignments and ``key=value`` overrides). A set value wins over a loaded
    one, which wins over the default. Every value is checked against its
    setting's declared range as it arrives; the rules across settings run in
    :meth:`check` (and :meth:`validate`), once every value is in.

    A path that a composed class lists as ``RETIRED`` (declared by an earlier version,
    not by any class now) still loads at its old default from a file, and is dropped.

    Args:
        entries: the composed schema (see :func:`compose`).
        job: the registry name of the job this tree configures, if any.
        retired: the retired paths this tree accepts at their old defaults.

    Example:
        >>> from dataclasses import dataclass
        >>> from theseus.config import field
        >>> @dataclass
        ... class Arch:
        ...     n_layers: int = field("architecture/n_layers", default=4)
        >>> tree = Tree.of(Arch)
        >>> tree["architecture/n_layers"] = "2"  # coerced: it came from text
        >>> tree.architecture.n_layers
        2
    """

    def __init__(
        self,
        entries: Mapping[str, Entry],
        job: str | None = None,
        retired: Mapping[str, Retired] | None = None,
    ) -> None:
        object.__setattr__(self, "_entries", dict(entries))
        object.__setattr__(self, "_retired", dict(retired or {}))
        object.__setattr__(self, "_loaded", {})
        object.__setattr__(self, "_set", {})
        object.__setattr__(self, "job", job)

    _entries: dict[str, Entry]
    _retired: dict[str, Retired]
    _loaded: dict[str, Any]
    _set: dict[str, Any]
    job: str | None

    @classmethod
    def of(cls, *classes: type, own: type | None = None, job: str | None = None) -> Tree:
        """Compose ``classes`` (see :func:`theseus.config.compose`) into a new tree.

        Args:
            *classes: configuration dataclasses.
            own: the job's own ``CONFIG``, whose defaults win.
            job: the registry name of the job.

        Returns:
            A tree holding only defaults.
        """
        entries = compose(classes, own=own)
        everyone = [own, *classes] if own is not None else list(classes)
        return cls(entries, job=job, retired=retired_of(everyone, entries))

    # ------------------------------------------------------------------ schema
    @property
    def entries(self) -> dict[str, Entry]:
        """The schema: ``{path: Entry}``."""
        return dict(self._entries)

    def keys(self) -> list[str]:
        """Every setting's path, in declaration order."""
        return list(self._entries)

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        try:
            return normalize_path(key) in self._entries  # type: ignore[arg-type]
        except ConfigError:
            return False

    def resolve(self, key: str) -> str:
        """Return the canonical path of the setting ``key`` names.

        Raises:
            UnknownKeyError: no declared setting has that path (lists the closest ones).
        """
        path = normalize_path(key)
        if path in self._retired:
            raise self._retired[path].refusal(key, self.job)
        if path not in self._entries:
            raise UnknownKeyError(
                f"Unknown configuration key {key!r}.{suggest(path, self._entries)} "
                f"This job declares {len(self._entries)} settings; "
                "`theseus configure JOB out.yaml` writes them all."
            )
        return path

    def _is_section(self, path: str) -> bool:
        return any(k.startswith(path + "/") for k in self._entries)

    def _holds_retired(self, path: str) -> bool:
        return any(k.startswith(path + "/") for k in self._retired)

    # ------------------------------------------------------------------ values
    def get(self, key: str, default: Any = None) -> Any:
        """Return (a copy of) the value of ``key``, or ``default`` when it is required and unset."""
        value = self._lookup(self.resolve(key))
        return default if value is MISSING else copy.deepcopy(value)

    def _lookup(self, path: str) -> Any:
        if path in self._set:
            return self._set[path]
        if path in self._loaded:
            return self._loaded[path]
        return self._entries[path].default

    def value(self, key: str) -> Any:
        """Return the value of ``key``.

        Raises:
            UnknownKeyError: unknown key.
            ConfigError: the setting is required and has no value.
        """
        path = self.resolve(key)
        value = self._lookup(path)
        if value is MISSING:
            raise ConfigError(_missing_message([self._entries[path]]))
        return copy.deepcopy(value)

    def set(self, key: str, value: Any) -> None:
        """Set ``key`` to ``value`` (type-checked and coerced); it wins over loaded values.

        Raises:
            UnknownKeyError: unknown key.
            ConfigTypeError: the value does not fit the declared type.
            ConfigRangeError: a number outside the setting's declared range.
        """
        path = self.resolve(key)
        self._set[path] = self._checked(path, value)

    def _checked(self, path: str, value: Any) -> Any:
        entry = self._entries[path]
        coerced = coerce(value, entry.type, path)
        check_value(path, coerced, entry.range, entry.type, entry.default)
        return coerced

    def update(self, values: Mapping[str, Any]) -> None:
        """Set several values (``{"training.batch_size": 8, ...}`` or nested mappings)."""
        for path, value in self._flatten(values, strict=True).items():
            self.set(path, value)

    def load(self, values: Mapping[str, Any], strict: bool = True) -> list[str]:
        """Load values into the *loaded* layer (under any value that was ``set``).

        A top-level ``job`` key is read into :attr:`job` when the tree has none.
        A ``None`` value for a required setting whose type does not admit
        ``None`` leaves the setting unset (that is how ``dump`` writes it).

        Args:
            values: nested or flat mapping of paths to values.
            strict: raise on an unknown key; with ``False`` skip it (used for a
                configuration saved by a different job at a base node).

        Returns:
            The paths that were skipped because this tree does not declare them.

        Raises:
            UnknownKeyError: ``strict`` and a key is not declared.
            ConfigTypeError: a value does not fit its declared type.
            ConfigRangeError: a number outside its setting's declared range.
        """
        values = dict(values)
        job = values.pop("job", None)
        if self.job is None and isinstance(job, str):
            object.__setattr__(self, "job", job)
        skipped: list[str] = []
        for path, value in self._flatten(values, strict, skipped).items():
            entry = self._entries[path]
            if value is None and entry.required:
                try:
                    coerce(None, entry.type, path)
                except ConfigError:
                    self._loaded.pop(path, None)
                    continue
            self._loaded[path] = self._checked(path, value)
        return skipped

    def _flatten(
        self, values: Mapping[str, Any], strict: bool, skipped: list[str] | None = None
    ) -> dict[str, Any]:
        flat: dict[str, Any] = {}
        for key, value in values.items():
            path = normalize_path(str(key))
            if path in self._entries:
                flat[path] = value
            elif path in self._retired and strict:
                if value != self._retired[path].default:  # set by someone: say where it went
                    raise self._retired[path].refusal(str(key), self.job, value)
            elif (
                isinstance(value, Mapping)
                and value
                and (self._is_section(path) or self._holds_retired(path) or not strict)
            ):
                nested = self._flatten(
                    {f"{path}/{k}": v for k, v in value.items()}, strict, skipped
                )
                flat.update(nested)
            elif strict:
                self.resolve(path)
            elif skipped is not None:
                skipped.append(path)
        return flat

    def missing(self) -> list[str]:
        """The paths of required settings that have no value."""
        return [p for p in self._entries if self._lookup(p) is MISSING]

    def validate(self) -> None:
        """Check that every required setting has a value, then :meth:`check` the values.

        Raises:
            ConfigError: lists every unset required path and how to set it.
            ConfigRangeError: see :meth:`check`.
        """
        missing = [self._entries[p] for p in self.missing()]
        if missing:
            raise ConfigError(_missing_message(missing))
        self.check()

    def check(self) -> None:
        """Check every value against its range and run the rules across settings.

        A rule runs when the tree declares every path it reads and each has a value
        (so what the configuration alone can tell is told before a job starts).

        Raises:
            ConfigRangeError: the first value outside its range, or the first rule
                that fails, in declaration order.
        """
        for path, entry in self._entries.items():
            value = self._lookup(path)
            if value is not MISSING:
                check_value(path, value, entry.range, entry.type, entry.default)
        seen: list[object] = []
        for entry in self._entries.values():
            for rule in entry.rules:
                if rule in seen:
                    continue
                seen.append(rule)
                if not all(p in self._entries for p in rule.paths):
                    continue
                values = [self._lookup(p) for p in rule.paths]
                if any(v is MISSING for v in values):
                    continue
                problem = rule.check(*copy.deepcopy(values))
                if problem:
                    raise ConfigRangeError(problem)

    def flat(self) -> dict[str, Any]:
        """``{path: value}`` for every setting; required unset settings map to ``None``."""
        return {
            p: (None if (v := self._lookup(p)) is MISSING else copy.deepcopy(v))
            for p in self._entries
        }

    def to_dict(self) -> dict[str, Any]:
        """The values as a nested mapping (``{"training": {"batch_size": 8}}``)."""
        nested: dict[str, Any] = {}
        for path, value in self.flat().items():
            *parents, leaf = path.split("/")
            node = nested
            for part in parents:
                node = node.setdefault(part, {})
            node[leaf] = value
        return nested

    def copy(self) -> Tree:
        """An independent copy with the same schema and values."""
        twin = Tree(self._entries, self.job, self._retired)
        twin._loaded.update(copy.deepcopy(self._loaded))
        twin._set.update(copy.deepcopy(self._set))
        return twin

    # ------------------------------------------------------------ item/attr
    def __getitem__(self, key: str) -> Any:
        path = normalize_path(key)
        if path in self._entries:
            return self.value(path)
        if self._is_section(path):
            return Section(self, path)
        return self.resolve(path)  # raises UnknownKeyError

    def __setitem__(self, key: str, value: Any) -> None:
        path = normalize_path(key)
        if path not in self._entries and self._is_section(path):
            raise ConfigError(
                f"{key!r} is a section, not a setting; assign one of its keys, e.g. "
                f"{next(k for k in self._entries if k.startswith(path + '/'))!r}."
            )
        self.set(path, value)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return self[name]

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _OWN_ATTRS:
            object.__setattr__(self, name, value)
        else:
            self[name] = value

    def __repr__(self) -> str:
        return f"Tree(job={self.job!r}, {self.flat()!r})"

    def describe(self, key: str) -> str:
        """One line: path, type, default and help of ``key``."""
        entry = self._entries[self.resolve(key)]
        default = "required" if entry.required else f"default {entry.default!r}"
        bounds = f" {entry.range.describe()}" if entry.range and entry.range.describe() else ""
        return f"{entry.path} ({describe(entry.type)}{bounds}, {default}){': ' + entry.help if entry.help else ''}"


class Section:
    """A view of the settings under one path prefix (``tree.architecture``)."""

    def __init__(self, tree: Tree, prefix: str) -> None:
        object.__setattr__(self, "_tree", tree)
        object.__setattr__(self, "_prefix", prefix)

    _tree: Tree
    _prefix: str

    def __getitem__(self, key: str) -> Any:
        return self._tree[f"{self._prefix}/{normalize_path(key)}"]

    def __setitem__(self, key: str, value: Any) -> None:
        self._tree[f"{self._prefix}/{normalize_path(key)}"] = value

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return self[name]

    def __setattr__(self, name: str, value: Any) -> None:
        self[name] = value

    def keys(self) -> list[str]:
        """The paths under this section."""
        return [k for k in self._tree if k.startswith(self._prefix + "/")]

    def __repr__(self) -> str:
        return f"Section({self._prefix!r}, {{{', '.join(f'{k!r}: {self._tree.get(k)!r}' for k in self.keys())}}})"


def _missing_message(entries: Iterable[Entry]) -> str:
    entries = list(entries)
    lines = ", ".join(
        f"{e.path} ({describe(e.type)}, declared by {class_name(e.declarers[0])})" for e in entries
    )
    example = entries[0].path
    return (
        f"Required configuration value{'s' if len(entries) > 1 else ''} not set: {lines}. "
        f"Set {'them' if len(entries) > 1 else 'it'} in the YAML file, with "
        f"`{example.replace('/', '.')}=VALUE` on the command line, or with "
        f"q.config[{example!r}] = VALUE."
    )
