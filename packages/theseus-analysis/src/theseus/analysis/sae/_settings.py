"""`SAEBase`'s settings: the class attributes, and the configuration schema under
`sae/<NAME>/` they become (each default the class attribute).

The schema is their only check. A class attribute is the default of its setting, so a
class is held to the schema where it is made (`check`): each attribute that the
setting's type or range does not admit is refused naming the attribute, and then the
rules across the settings run, as they run for every value a YAML file or `key=value`
sets: topk keeps `k` features of each SAE, so `k` is at most every width given, and
`width` or `expansion` names at least one SAE. (A width that is `expansion` x the
site's width is known once the site is found: `SAEBase` builds every SAE's shape when
it sets up, before it writes anything.)
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Literal

from theseus.config import ConfigError, Tree, field, rule

__all__ = ["ATTRIBUTES", "check", "schema", "segment"]

#: Each class attribute and the setting it is the default of (`sae/<NAME>/<setting>`).
ATTRIBUTES = {
    "ARCHITECTURE": "architecture",
    "WIDTH": "width",
    "EXPANSION": "expansion",
    "K": "k",
    "L1": "l1",
    "L0": "l0",
    "THRESHOLD": "threshold",
    "BANDWIDTH": "bandwidth",
    "LEARNING_RATE": "lr",
    "TOKENS": "tokens",
    "BUFFER": "buffer",
    "EVAL_BATCHES": "eval_batches",
    "CONTEXTS": "contexts",
    "WINDOW": "window",
    "SEED": "seed",
}


def segment(name: str) -> str:
    """`NAME` as one configuration path segment (an identifier)."""
    text = re.sub(r"[^A-Za-z0-9_]", "_", name)
    return f"_{text}" if text[0].isdigit() else text


def prefix_of(cls: type[Any]) -> str:
    """`sae/<NAME>`, where `cls`'s settings live (`sae/_` before a class names itself)."""
    name = getattr(cls, "NAME", None)
    return f"sae/{segment(name)}" if isinstance(name, str) and name else "sae/_"


def _value(attribute: str, value: Any) -> Any:
    """A class attribute as its setting holds it: `WIDTH`/`EXPANSION` as lists (None: []).

    Anything else is passed as written, for the schema to admit or refuse.
    """
    if attribute in ("WIDTH", "EXPANSION"):
        if value is None and attribute == "WIDTH":
            return []
        if isinstance(value, tuple | list):
            return list(value)
        if isinstance(value, int) and not isinstance(value, bool):
            return [value]
    return value


def _rules(prefix: str) -> tuple[Any, Any]:
    """The checks across one SAE analysis's settings (their paths carry its `NAME`)."""
    key = prefix.replace("/", ".")

    @rule(f"{prefix}/architecture", f"{prefix}/k", f"{prefix}/width")
    def fits(architecture: str, k: int, width: list[int]) -> str | None:
        if architecture != "topk" or not width or k <= min(width):
            return None
        return (
            f"Configuration value for '{prefix}/k' must be at most every width in "
            f"'{prefix}/width' for topk (each SAE keeps its k largest features); got k = {k} "
            f"with width {width}. Set `{key}.k={min(width)}`, or only widths of at least {k}."
        )

    @rule(f"{prefix}/width", f"{prefix}/expansion")
    def some(width: list[int], expansion: list[int]) -> str | None:
        if width or expansion:
            return None
        return (
            f"Configuration values '{prefix}/width' and '{prefix}/expansion' are both empty, "
            f"so no SAE would train; set one, e.g. `{key}.expansion=[8]`."
        )

    return fits, some


def _schema(name: str, module: str, prefix: str, values: dict[str, Any]) -> type:
    """The schema under `prefix` whose defaults are `values` (by class attribute)."""
    fits, some = _rules(prefix)

    def setting(attribute: str, help: str, **declared: Any) -> Any:
        default = _value(attribute, values[attribute])
        path = f"{prefix}/{ATTRIBUTES[attribute]}"
        if isinstance(default, list | dict | set):  # a dataclass default must not be shared
            return field(
                path, default_factory=lambda: type(default)(default), help=help, **declared
            )
        return field(path, default=default, help=help, **declared)

    fields = [
        ("architecture", Literal["topk", "jumprelu", "relu"],
         setting("ARCHITECTURE", "topk | jumprelu | relu")),
        ("width", list[int], setting("WIDTH", "features of each SAE, one SAE per entry; [] uses "
         "expansion x the site's width", ge=1, rules=[some])),
        ("expansion", list[int], setting("EXPANSION", "width = expansion x the site's width, "
         "one SAE per entry (when width is [])", ge=1)),
        ("k", int, setting("K", "active features per token (topk), the L0 target "
         "(jumprelu: the thresholds start where each feature fires on k / width of the tokens)", ge=1, rules=[fits])),
        ("l1", float, setting("L1", "L1 penalty, each feature weighted by its decoder norm (relu)", ge=0)),
        ("l0", float, setting("L0", "L0 penalty (jumprelu; SAELens's l0_coefficient)", ge=0)),
        ("threshold", float, setting("THRESHOLD", "the least initial threshold (jumprelu)", gt=0)),
        ("bandwidth", float, setting("BANDWIDTH", "the threshold gradient's kernel width "
         "(jumprelu)", gt=0)),
        ("lr", float, setting("LEARNING_RATE", "Adam's learning rate", gt=0)),
        ("tokens", int, setting("TOKENS", "tokens each SAE trains on per node", ge=1)),
        ("buffer", int, setting("BUFFER", "forwards the shuffling buffer holds", ge=1)),
        ("eval_batches", int, setting("EVAL_BATCHES", "held-out val batches the measures read",
         ge=1)),
        ("contexts", int, setting("CONTEXTS", "top contexts kept per feature", ge=1)),
        ("window", tuple[int, int], setting("WINDOW", "tokens shown before and after a "
         "context's activating token", ge=0)),
        ("seed", int, setting("SEED", "the SAEs' initialization and draws", unbounded=True)),
    ]  # fmt: skip
    made = dataclasses.make_dataclass(f"{name}Settings", fields, frozen=True)
    made.__module__ = module
    return made


def schema(cls: type[Any]) -> type:
    """The settings of `cls` as a configuration schema under `sae/<NAME>/`, each
    default the class attribute (so `theseus configure` writes them and `key=value`
    overrides them). `check` holds the attributes to it first."""
    values = {attribute: getattr(cls, attribute) for attribute in ATTRIBUTES}
    return _schema(cls.__name__, cls.__module__, prefix_of(cls), values)


def check(cls: type[Any], base: type[Any]) -> None:
    """Refuse `cls` where it is made if its schema does not admit its class attributes.

    Each attribute `cls` sets is tried on the schema of `base`'s (admitted) attributes
    as a configuration value of its setting; then the rules across the settings run.

    Raises:
        TypeError: one line naming the attribute, the value and what its setting admits
            (or the rule's message, for attributes that disagree).
    """
    prefix = prefix_of(cls)
    admitted = {attribute: getattr(base, attribute) for attribute in ATTRIBUTES}
    tree = Tree.of(_schema(base.__name__, base.__module__, prefix, admitted))
    for attribute, setting in ATTRIBUTES.items():
        value = getattr(cls, attribute)
        if value is admitted[attribute]:
            continue
        path = f"{prefix}/{setting}"
        try:
            tree.set(path, _value(attribute, value))
        except ConfigError:
            raise TypeError(
                f"{cls.__name__}.{attribute} = {value!r}; use a value its setting admits: "
                f"{tree.describe(path)}"
            ) from None
    try:
        tree.check()
    except ConfigError as exc:
        raise TypeError(f"{cls.__name__}'s class attributes disagree: {exc}") from None
