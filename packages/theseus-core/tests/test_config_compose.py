"""Composition rules of theseus.config: paths, declarers, defaults, conflicts, nesting."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import pytest

from theseus.config import (
    ConfigError,
    ConfigTypeError,
    ConflictError,
    Tree,
    compose,
    configure,
    field,
    normalize_path,
)


@dataclass
class Model:
    n_layers: int = field("architecture/n_layers", default=4, help="blocks")
    n_embd: int = field("architecture/n_embd", default=64)


@dataclass
class Attention:
    n_layers: int = field("architecture/n_layers", default=4)
    dropout: float = field("architecture/dropout", default=0.1)


@dataclass
class Trainer:
    n_layers: int = field("architecture/n_layers", default=2)
    batch_size: int = field("training/batch_size", default=8)


def test_field_is_a_dataclass_field_with_its_path() -> None:
    f = {f.name: f for f in dataclasses.fields(Model)}["n_layers"]
    assert f.metadata["theseus.path"] == "architecture/n_layers"
    assert f.metadata["theseus.help"] == "blocks"
    assert Model().n_layers == 4


def test_required_field_is_keyword_only_and_may_follow_defaults() -> None:
    @dataclass
    class Late:
        a: int = field("x/a", default=1)
        b: str = field("x/b")

    assert Late(b="hi") == Late(1, b="hi")
    assert compose([Late])["x/b"].required
    assert not compose([Late])["x/a"].required


def test_dotted_and_slashed_paths_are_the_same() -> None:
    assert normalize_path("training.batch_size") == "training/batch_size"
    assert normalize_path("training/batch_size") == "training/batch_size"


@pytest.mark.parametrize("bad", ["", "a//b", "a/1b", "a/b c", "a/b-c"])
def test_invalid_path_is_an_error(bad: str) -> None:
    with pytest.raises(ConfigError, match="invalid segment"):
        field(bad, default=1)


def test_reserved_first_segment_and_two_defaults_are_errors() -> None:
    with pytest.raises(ConfigError, match="reserved"):
        field("job/name", default="x")
    with pytest.raises(ConfigError, match="both default= and default_factory="):
        field("a/b", default=1, default_factory=list)


def test_a_path_is_one_setting_shared_by_declarers() -> None:
    entries = compose([Model, Attention])
    assert list(entries) == ["architecture/n_layers", "architecture/n_embd", "architecture/dropout"]
    assert entries["architecture/n_layers"].declarers == [Model, Attention]
    tree = Tree(entries)
    tree["architecture/n_layers"] = 6
    assert configure(Model, tree).n_layers == 6
    assert configure(Attention, tree).n_layers == 6


def test_type_conflict_names_both_classes_and_the_path() -> None:
    @dataclass
    class Other:
        n_layers: str = field("architecture/n_layers", default="4")

    with pytest.raises(ConflictError) as info:
        compose([Model, Other])
    message = str(info.value)
    assert "'architecture/n_layers'" in message
    assert "Model" in message and "Other" in message
    assert "int" in message and "str" in message
    # Even the job's own CONFIG may not change a type.
    with pytest.raises(ConflictError, match="Other"):
        compose([Model, Other], own=Other)


def test_component_default_conflict_is_an_error_naming_both() -> None:
    @dataclass
    class Deeper:
        n_layers: int = field("architecture/n_layers", default=12)

    with pytest.raises(ConflictError) as info:
        compose([Model, Deeper])
    message = str(info.value)
    assert "'architecture/n_layers'" in message and "Model" in message and "Deeper" in message
    assert "4" in message and "12" in message


def test_own_config_default_wins_over_components_in_any_order() -> None:
    for classes in ([Trainer, Model, Attention], [Model, Attention, Trainer]):
        entries = compose(classes, own=Trainer)
        assert entries["architecture/n_layers"].default == 2
        assert entries["architecture/n_layers"].default_from is Trainer


def test_own_config_default_also_settles_a_component_disagreement() -> None:
    @dataclass
    class Deeper:
        n_layers: int = field("architecture/n_layers", default=12)

    entries = compose([Model, Deeper, Trainer], own=Trainer)
    assert entries["architecture/n_layers"].default == 2


def test_inherited_config_fields_count_as_own() -> None:
    @dataclass
    class Special(Trainer):
        n_layers: int = field("architecture/n_layers", default=3)

    assert compose([Model, Special], own=Special)["architecture/n_layers"].default == 3


def test_equal_defaults_and_required_plus_default_compose() -> None:
    @dataclass
    class NeedsLayers:
        n_layers: int = field("architecture/n_layers")

    entries = compose([NeedsLayers, Model, Attention])
    assert entries["architecture/n_layers"].default == 4
    assert entries["architecture/n_layers"].default_from is Model


@dataclass
class Dtypes:
    param: str = field("architecture/dtype/param", default="float32")
    activation: str = field("architecture/dtype/activation", default="bfloat16")


@dataclass
class Block:
    dtypes: Dtypes = dataclasses.field(default_factory=Dtypes)
    width: int = field("architecture/width", default=32)


@dataclass
class Top:
    block: Block = dataclasses.field(default_factory=Block)
    name: str = field("run/name", default="x")


def test_nested_dataclasses_at_any_depth() -> None:
    tree = Tree.of(Top)
    assert tree.keys() == [
        "architecture/dtype/param",
        "architecture/dtype/activation",
        "architecture/width",
        "run/name",
    ]
    tree.architecture.dtype.param = "bfloat16"
    top = configure(Top, tree)
    assert top == Top(Block(Dtypes("bfloat16", "bfloat16"), 32), "x")


@dataclass
class Split:
    fraction: float = field("fraction", default=0.5)


@dataclass
class Data:
    train: Split = field("data/train", default_factory=Split)
    val: Split = field("data/val", default_factory=lambda: Split(0.1))


def test_path_on_a_nested_dataclass_field_is_a_prefix() -> None:
    tree = Tree.of(Data)
    assert tree.keys() == ["data/train/fraction", "data/val/fraction"]
    tree["data.val.fraction"] = 0.25
    assert configure(Data, tree) == Data(Split(0.5), Split(0.25))


def test_unresolvable_annotation_is_an_error_naming_the_class() -> None:
    @dataclass
    class Local:
        width: int = field("a/width", default=1)

    @dataclass
    class UsesLocal:
        local: Local = dataclasses.field(default_factory=Local)

    with pytest.raises(ConfigTypeError, match=r"annotations of .*UsesLocal: name 'Local'"):
        compose([UsesLocal])


def test_setting_versus_section_is_a_conflict() -> None:
    @dataclass
    class Leafy:
        dtype: str = field("architecture/dtype", default="float32")

    @dataclass
    class Sectiony:
        param: str = field("architecture/dtype/param", default="float32")

    with pytest.raises(ConflictError, match=r"'architecture/dtype' is a setting in Leafy"):
        compose([Leafy, Sectiony])


def test_a_field_without_path_is_an_error_with_the_fix() -> None:
    @dataclass
    class Plain:
        lr: float = 0.1

    with pytest.raises(
        ConfigError, match=r"Plain.lr has no configuration path.*field\('section/lr'"
    ):
        compose([Plain])


class Custom:
    pass


@dataclass
class Weird:
    thing: Custom = field("a/thing", default_factory=Custom)


def test_non_dataclass_and_unsupported_types_are_errors() -> None:
    with pytest.raises(ConfigError, match="Expected a dataclass type"):
        compose([int])
    with pytest.raises(ConfigTypeError, match=r"Weird.thing at 'a/thing' has type Custom"):
        compose([Weird])


def test_default_that_does_not_fit_its_type_is_an_error() -> None:
    @dataclass
    class Wrong:
        n: int = field("a/n", default="many")  # type: ignore[arg-type]

    with pytest.raises(ConfigTypeError, match=r"'a/n' must be int; got 'many'"):
        compose([Wrong])


def test_default_factory_values_are_independent() -> None:
    @dataclass
    class Lists:
        names: list[str] = field("data/names", default_factory=lambda: ["a"])

    tree = Tree.of(Lists)
    first: Any = tree["data/names"]
    first.append("b")
    assert tree["data/names"] == ["a"]
