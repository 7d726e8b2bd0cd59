"""Values in a configuration tree: coercion, access, overrides, YAML, hydration."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pytest

from theseus.config import (
    ConfigError,
    ConfigTypeError,
    MissingValueError,
    Tree,
    UnknownKeyError,
    active,
    configure,
    dump,
    field,
    load,
    parse_overrides,
    using,
)
from theseus.config._types import coerce


@dataclass
class Settings:
    batch_size: int = field("training/batch_size", default=8, help="sequences per step")
    lr: float = field("optimization/lr", default=3e-4)
    name: str = field("run/name", default="demo")
    analyze: bool = field("training/analyze", default=True)
    betas: tuple[float, float] = field("optimization/betas", default=(0.9, 0.95))
    sizes: list[int] = field("data/sizes", default_factory=lambda: [1, 2])
    weights: dict[str, float] = field("data/weights", default_factory=dict)
    style: Literal["pmd", "padded"] = field("data/style", default="pmd")
    limit: int | None = field("training/limit", default=None)
    anything: Any = field("misc/anything", default=None)
    seed: int = field("data/seed")


def tree() -> Tree:
    t = Tree.of(Settings, job="tests/settings")
    t["data/seed"] = 0
    return t


@pytest.mark.parametrize(
    ("tp", "value", "expected"),
    [
        (int, "8", 8),
        (int, 8, 8),
        (float, "0.5", 0.5),
        (float, 2, 2.0),
        (float, "1e-3", 1e-3),
        (bool, "true", True),
        (bool, "false", False),
        (str, "8", "8"),
        (int | None, "null", None),
        (int | None, "3", 3),
        (int | str, "8", "8"),
        (list[int], "[1, 2]", [1, 2]),
        (list[int], (1, 2), [1, 2]),
        (tuple[float, float], [1, "2"], (1.0, 2.0)),
        (tuple[int, ...], [1, 2, 3], (1, 2, 3)),
        (dict[str, float], "{a: 1}", {"a": 1.0}),
        (Literal["pmd", "padded"], "padded", "padded"),
        (Literal[1, 2], "2", 2),
        (Any, object, object),
    ],
)
def test_unambiguous_coercions(tp: Any, value: Any, expected: Any) -> None:
    result = coerce(value, tp, "a/b")
    assert result == expected
    assert type(result) is type(expected)


@pytest.mark.parametrize(
    ("tp", "value", "fragment"),
    [
        (int, "eight", "must be int; got 'eight' (str)"),
        (int, 8.0, "must be int; got 8.0 (float)"),
        (int, True, "must be int; got True (bool)"),
        (bool, 1, "must be bool; got 1 (int). Write true or false"),
        (str, 8, "must be str; got 8 (int). Quote it"),
        (float, "fast", "must be float"),
        (list[int], "[1, x]", "'a/b[1]' must be int; got 'x'"),
        (tuple[int, int], [1, 2, 3], "exactly 2 items"),
        (Literal["pmd", "padded"], "sliding", "Choose one of ['pmd', 'padded']"),
        (int | None, "x", "must be int | None"),
    ],
)
def test_values_that_do_not_fit_are_errors_naming_path_type_and_value(
    tp: Any, value: Any, fragment: str
) -> None:
    with pytest.raises(ConfigTypeError) as info:
        coerce(value, tp, "a/b")
    assert fragment in str(info.value)
    assert "'a/b" in str(info.value)


def test_item_and_attribute_access_read_and_write_the_same_setting() -> None:
    t = tree()
    t["training/batch_size"] = 16
    assert t.training.batch_size == 16
    t.training.batch_size = "32"
    assert t["training.batch_size"] == 32
    t.training["analyze"] = "false"
    assert t["training/analyze"] is False
    assert "training.batch_size" in t and "training/nope" not in t and "x y" not in t
    assert t.training.keys() == ["training/batch_size", "training/analyze", "training/limit"]


def test_unknown_key_is_an_error_with_the_closest_keys() -> None:
    t = tree()
    with pytest.raises(UnknownKeyError) as info:
        t["training/batchsize"] = 4
    message = str(info.value)
    assert "'training/batchsize'" in message and "Did you mean 'training/batch_size'" in message
    with pytest.raises(UnknownKeyError, match="Did you mean 'training/batch_size'"):
        t.training.batch_sise = 4
    with pytest.raises(
        UnknownKeyError, match=r"key 'optimisation'.*Did you mean 'optimization/lr'"
    ):
        _ = t.optimisation.lr
    # It is also a KeyError and an AttributeError, so probing works as usual.
    assert getattr(t.training, "nope", "absent") == "absent"
    with pytest.raises(KeyError):
        t["nope"]


def test_type_error_on_assignment() -> None:
    t = tree()
    with pytest.raises(ConfigTypeError, match=r"'training/batch_size' must be int; got 'big'"):
        t.training.batch_size = "big"
    assert t.training.batch_size == 8  # unchanged


def test_assigning_a_section_is_an_error() -> None:
    with pytest.raises(ConfigError, match=r"'training' is a section.*'training/batch_size'"):
        tree()["training"] = 3


def test_missing_required_values_are_listed_with_the_fix() -> None:
    t = Tree.of(Settings)
    assert t.missing() == ["data/seed"]
    with pytest.raises(MissingValueError) as info:
        t.validate()
    message = str(info.value)
    assert "data/seed (int, declared by Settings)" in message
    assert "data.seed=VALUE" in message
    with pytest.raises(MissingValueError):
        t.value("data/seed")
    assert t.get("data/seed", "unset") == "unset"
    t["data/seed"] = 3
    t.validate()


def test_overrides_parse_both_separators() -> None:
    assert parse_overrides(["training.batch_size=8", "optimization/lr=1e-3", "run.name=a=b"]) == {
        "training/batch_size": "8",
        "optimization/lr": "1e-3",
        "run/name": "a=b",
    }
    with pytest.raises(ConfigError, match=r"key=value.*got 'training.batch_size'"):
        parse_overrides(["training.batch_size"])
    t = tree()
    t.update(parse_overrides(["training.batch_size=8", "optimization/lr=1e-3"]))
    assert (t["training/batch_size"], t["optimization/lr"]) == (8, 1e-3)
    with pytest.raises(UnknownKeyError, match="Did you mean 'optimization/lr'"):
        t.update(parse_overrides(["optimization.lrr=1"]))


def test_set_values_win_over_loaded_values_which_win_over_defaults() -> None:
    t = tree()
    t.load({"training": {"batch_size": 4}, "optimization/lr": 0.1})
    assert t["training/batch_size"] == 4
    t["training/batch_size"] = 2
    t.load({"training": {"batch_size": 64}})
    assert t["training/batch_size"] == 2
    assert t["optimization/lr"] == 0.1


def test_loading_unknown_keys_is_strict_unless_asked() -> None:
    t = tree()
    with pytest.raises(UnknownKeyError, match="Did you mean 'training/batch_size'"):
        t.load({"training": {"batch_sizes": 4}})
    assert t.load({"elsewhere": {"x": 1}, "training": {"batch_size": 4}}, strict=False) == [
        "elsewhere/x"
    ]
    assert t["training/batch_size"] == 4


def test_yaml_round_trip_keeps_every_value_and_type(tmp_path: Path) -> None:
    t = tree()
    t.update(
        {
            "training/batch_size": 3,
            "optimization/betas": (0.8, 0.9),
            "data/weights": {"a": 0.5},
            "data/style": "padded",
            "training/limit": 7,
            "misc/anything": {"k": [1, "x"]},
            "run/name": "123",
        }
    )
    text = dump(t, tmp_path / "c.yaml")
    assert (tmp_path / "c.yaml").read_text() == text
    assert text.startswith("job: tests/settings\n")
    assert "  batch_size: 3  # int: sequences per step\n" in text
    assert "name: '123'" in text
    back = Tree.of(Settings)
    back.load(load(tmp_path / "c.yaml"))
    assert back.job == "tests/settings"
    assert back.flat() == t.flat()
    assert back["optimization/betas"] == (0.8, 0.9)
    assert dump(back) == text


def test_yaml_round_trip_of_awkward_values() -> None:
    nested = Tree.of(Settings, job="tests/settings")
    nested.update(
        {
            "data/seed": 1,
            "misc/anything": {"text": "two\nlines", "flags": ["on", "yes", ""]},
            "run/name": "a # b: c",
            "optimization/lr": float("inf"),
        }
    )
    round_trip = Tree.of(Settings)
    round_trip.load(load(dump(nested)))
    assert round_trip.flat() == nested.flat()
    assert round_trip["misc/anything"]["text"] == "two\nlines"
    assert round_trip["optimization/lr"] == float("inf")


def test_dump_marks_required_unset_values_and_load_leaves_them_unset() -> None:
    t = Tree.of(Settings)
    text = dump(t)
    assert "seed: null  # REQUIRED int" in text
    back = Tree.of(Settings)
    back.load(load(text))
    assert back.missing() == ["data/seed"]


def test_load_errors_say_what_is_wrong(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"does not exist.*theseus configure"):
        load(tmp_path / "absent.yaml")
    (tmp_path / "bad.yaml").write_text("a: [1,\n")
    with pytest.raises(ConfigError, match="Could not parse"):
        load(tmp_path / "bad.yaml")
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match=r"YAML mapping.*got a list"):
        load(tmp_path / "list.yaml")
    assert load("") == {}


def test_configure_reads_the_active_tree_and_defaults_without_one() -> None:
    assert active() is None
    assert configure(Settings, tree()).batch_size == 8
    with pytest.raises(MissingValueError, match="data/seed"):
        configure(Settings)  # no active tree: its own defaults, and seed is required
    t = tree()
    t["training/batch_size"] = 5
    with using(t):
        assert active() is t
        hydrated = configure(Settings)
    assert active() is None
    assert hydrated.batch_size == 5 and hydrated.betas == (0.9, 0.95) and hydrated.seed == 0


def test_configure_a_class_that_was_not_composed_is_an_error() -> None:
    @dataclass
    class Extra:
        width: int = field("architecture/width", default=1)

    with pytest.raises(
        UnknownKeyError, match=r"Extra.width reads 'architecture/width'.*config\(\)"
    ):
        configure(Extra, tree())
    with pytest.raises(ConfigError, match="expects a dataclass type"):
        configure(int, tree())


def test_hydrated_values_are_copies() -> None:
    t = tree()
    hydrated = configure(Settings, t)
    hydrated.sizes.append(3)
    assert t["data/sizes"] == [1, 2]


def test_copy_is_independent() -> None:
    t = tree()
    twin = t.copy()
    twin["training/batch_size"] = 1
    assert t["training/batch_size"] == 8
    assert twin.job == t.job
