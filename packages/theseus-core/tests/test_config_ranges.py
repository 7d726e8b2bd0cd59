"""Ranges of numeric settings: declared at field(), checked wherever a value enters a configuration.

The property test enumerates every numeric field of the built-in jobs (and of the
analysis kinds, where theseus-analysis is installed) from the registry, so a new field
without a range fails here, and feeds each one values outside its range through an
assignment, a ``key=value`` override and a loaded file.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import re
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from theseus.config import (
    ConfigError,
    ConfigRangeError,
    ConfigTypeError,
    ConflictError,
    Range,
    Tree,
    dump,
    field,
    parse_overrides,
    rule,
)
from theseus.config._compose import Leaf, walk
from theseus.config._field import RANGE_KEY
from theseus.config._range import is_numeric
from theseus.registry import JOBS
from theseus.training.evaluation import Evaluation


def _job_classes() -> dict[str, type]:
    if importlib.util.find_spec("theseus.analysis") is not None:
        import theseus.analysis.demo  # noqa: F401  (registers the analysis kinds)
    # the built-in ones: other tests register their own jobs in the same process
    return {name: JOBS[name] for name in JOBS if JOBS[name].__module__.startswith("theseus.")}


def _evaluation_configs() -> list[type]:
    found, todo = [], list(Evaluation.__subclasses__())
    while todo:
        cls = todo.pop()
        todo += cls.__subclasses__()
        if getattr(cls, "CONFIG", None) is not None:
            found.append(cls.CONFIG)
    return found


def _declaring_classes() -> list[type]:
    classes = [c for job in _job_classes().values() for c in job.config()]
    return list(dict.fromkeys([*classes, *_evaluation_configs()]))


def numeric_fields_without_range(classes: list[type]) -> list[str]:
    """`Class.field (path)` for each numeric field of `classes` that declares no range."""
    bare = []
    for cls in classes:
        for item in walk(cls):
            numeric = isinstance(item, Leaf) and is_numeric(item.type)
            if numeric and RANGE_KEY not in item.field.metadata:
                bare.append(f"{cls.__qualname__}.{item.name} ({item.path})")
    return bare


def test_every_numeric_field_of_the_builtin_jobs_declares_a_range() -> None:
    classes = _declaring_classes()
    assert "BaseTrainerConfig" in {c.__name__ for c in classes}
    assert "PerplexityConfig" in {c.__name__ for c in classes}
    assert numeric_fields_without_range(classes) == []


def test_the_enumeration_finds_a_numeric_field_without_a_range() -> None:
    @dataclass
    class Careless:
        steps: int = field("careless/steps", default=3)
        rate: float | None = field("careless/rate", default=None)
        sizes: list[int] = field("careless/sizes", default_factory=list)
        flag: bool = field("careless/flag", default=True)  # not a number
        ok: int = field("careless/ok", default=1, ge=0)
        free: float = field("careless/free", default=0.0, unbounded=True)

    assert numeric_fields_without_range([Careless]) == [
        "test_the_enumeration_finds_a_numeric_field_without_a_range.<locals>.Careless.steps "
        "(careless/steps)",
        "test_the_enumeration_finds_a_numeric_field_without_a_range.<locals>.Careless.rate "
        "(careless/rate)",
        "test_the_enumeration_finds_a_numeric_field_without_a_range.<locals>.Careless.sizes "
        "(careless/sizes)",
    ]


# ------------------------------------------------------------------ the property test
def _cases() -> list[tuple[str, str, Any, Range]]:
    """`(job, path, type, range)` of every bounded numeric setting of every built-in job."""
    cases = []
    for name, job in sorted(_job_classes().items()):
        for path, entry in job.schema().entries.items():
            if entry.type in (int, float) and entry.range is not None:
                cases.append((name, path, entry.type, entry.range))
    return cases


CASES = _cases()
TREES = {name: job.schema() for name, job in _job_classes().items()}


def _outside(tp: Any, r: Range) -> st.SearchStrategy[Any]:
    """Values outside `r`, computed from its bounds here (not by the code under test)."""
    options: list[st.SearchStrategy[Any]] = []
    if tp is int:
        if r.ge is not None:
            options.append(st.integers(max_value=math.ceil(r.ge) - 1))
        if r.gt is not None:
            options.append(st.integers(max_value=math.floor(r.gt)))
        if r.le is not None:
            options.append(st.integers(min_value=math.floor(r.le) + 1))
        if r.lt is not None:
            options.append(st.integers(min_value=math.ceil(r.lt)))
        return st.one_of(options)
    if r.ge is not None:
        options.append(st.floats(max_value=r.ge, exclude_max=True, allow_nan=False))
    if r.gt is not None:
        options.append(st.floats(max_value=r.gt, allow_nan=False))
    if r.le is not None:
        options.append(st.floats(min_value=r.le, exclude_min=True, allow_nan=False))
    if r.lt is not None:
        options.append(st.floats(min_value=r.lt, allow_nan=False))
    options.append(st.sampled_from([math.nan, math.inf, -math.inf]))
    return st.one_of(options)


def _inside(tp: Any, r: Range) -> st.SearchStrategy[Any]:
    low = r.ge if r.ge is not None else r.gt
    high = r.le if r.le is not None else r.lt
    if tp is int:
        return st.integers(
            min_value=None if low is None else (low if r.gt is None else low + 1),
            max_value=None if high is None else (high if r.lt is None else high - 1),
        )
    return st.floats(
        min_value=low,
        max_value=high,
        exclude_min=r.gt is not None,
        exclude_max=r.lt is not None,
        allow_nan=False,
        allow_infinity=False,
    )


def test_the_property_test_covers_every_family_of_settings() -> None:
    paths = {path for _, path, _, _ in CASES}
    for expected in (
        "training/batch_size",
        "training/tokens",
        "logging/validation_interval",
        "optimization/lr",
        "optimization/beta2",
        "optimization/schedule/warmup",
        "architecture/dropout",
        "architecture/n_head",
        "data/seed",
    ):
        assert expected in paths


def _refused(tree: Tree, path: str, text: str, declared: Range, how: str) -> None:
    fresh = tree.copy()
    with pytest.raises(ConfigRangeError) as caught:
        if how == "set":
            fresh[path] = text
        elif how == "override":
            fresh.update(parse_overrides([f"{path.replace('/', '.')}={text}"]))
        else:
            fresh.load({path: text})
    message = str(caught.value)
    assert "\n" not in message
    assert repr(path) in message
    assert declared.describe() in message
    assert re.search(r"got -?(nan|inf|[0-9.e+-]+)", message)
    assert f"`{path.replace('/', '.')}=" in message  # how to fix it


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_every_numeric_setting_refuses_values_outside_its_range(data: st.DataObject) -> None:
    job, path, tp, declared = data.draw(st.sampled_from(CASES), label="setting")
    value = data.draw(_outside(tp, declared), label="outside")
    how = data.draw(st.sampled_from(["set", "override", "load"]), label="how")
    _refused(TREES[job], path, repr(value), declared, how)
    if tp is float and not math.isnan(value):
        assert (
            value in (math.inf, -math.inf)
            or (declared.ge is not None and value < declared.ge)
            or (declared.gt is not None and value <= declared.gt)
            or (declared.le is not None and value > declared.le)
            or (declared.lt is not None and value >= declared.lt)
        )


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_every_numeric_setting_takes_values_inside_its_range(data: st.DataObject) -> None:
    job, path, tp, declared = data.draw(st.sampled_from(CASES), label="setting")
    value = data.draw(_inside(tp, declared), label="inside")
    tree = TREES[job].copy()
    tree[path] = value
    assert tree[path] == value


# ------------------------------------------------------------------ the issue's cases
@pytest.mark.parametrize(
    ("key", "text", "expected"),
    [
        ("training/tokens", "0", "must be an integer >= 1; got 0."),
        ("training/tokens", "-5", "must be an integer >= 1; got -5."),
        ("training/batch_size", "0", "must be an integer >= 1; got 0."),
        ("logging/validation_interval", "0", "must be an integer >= 1; got 0."),
        ("optimization/lr", "-1", "must be a finite number > 0; got -1.0."),
        ("optimization/lr", "nan", "must be a finite number > 0; got nan."),
        ("optimization/beta2", "1", "must be a finite number >= 0 and < 1; got 1.0."),
        ("architecture/dropout", "1.5", "must be a finite number >= 0 and < 1; got 1.5."),
    ],
)
def test_the_issues_values_are_refused_in_one_line(key: str, text: str, expected: str) -> None:
    tree = JOBS["gpt/train/pretrain"].schema()
    with pytest.raises(ConfigRangeError) as caught:
        tree.update(parse_overrides([f"{key.replace('/', '.')}={text}"]))
    assert str(caught.value).startswith(f"Configuration value for {key!r} {expected}")


@pytest.mark.parametrize(
    ("overrides", "start"),
    [
        (
            {"training/tokens": 255, "training/batch_size": 8, "architecture/block_size": 32},
            "Configuration value for 'training/tokens' must be at least one batch, "
            "training/batch_size x architecture/block_size = 8 x 32 = 256 tokens; got 255.",
        ),
        (
            {"training/batch_size": 12, "training/per_device_batch_size": 5},
            "Configuration value for 'training/per_device_batch_size' must divide "
            "training/batch_size (12) into whole micro-batches",
        ),
        (
            {"architecture/n_embd": 30, "architecture/n_head": 4},
            "Configuration value for 'architecture/n_head' must divide architecture/n_embd (30)",
        ),
        (
            {"architecture/n_embd": 36, "architecture/n_head": 4},
            "Configuration value for 'architecture/n_head' must leave heads of even width",
        ),
        (
            {"optimization/schedule/warmup": 0.5, "optimization/schedule/stable": 0.75},
            "Configuration values for 'optimization/schedule/{warmup,stable,decay}' must sum "
            "to 1 (fractions of the run); got 0.5 + 0.75 + 0.2 = 1.45.",
        ),
    ],
)
def test_rules_across_settings_are_checked_with_the_configuration(
    overrides: dict[str, Any], start: str
) -> None:
    tree = JOBS["gpt/train/pretrain"].schema()
    tree.validate()  # the defaults agree
    tree.update(overrides)  # each value is in its own range
    with pytest.raises(ConfigRangeError) as caught:
        tree.validate()
    assert str(caught.value).startswith(start)
    assert "\n" not in str(caught.value)


def test_one_batch_of_tokens_is_enough() -> None:
    tree = JOBS["gpt/train/pretrain"].schema()
    tree.update({"training/tokens": 256, "training/batch_size": 8, "architecture/block_size": 32})
    tree.validate()


# ------------------------------------------------------------------ declaring ranges
def test_a_range_is_one_lower_and_one_upper_bound_and_not_empty() -> None:
    with pytest.raises(ConfigError, match=r"one lower bound \(ge= or gt=\)"):
        field("a/b", default=1, ge=0, gt=0)
    with pytest.raises(ConfigError, match=r"The range >= 2 and <= 1 is empty"):
        field("a/b", default=1, ge=2, le=1)
    with pytest.raises(ConfigError, match=r"The range > 1 and < 1 is empty"):
        field("a/b", default=1, gt=1, lt=1)
    with pytest.raises(ConfigError, match="unbounded=True means no bounds"):
        field("a/b", default=1, ge=0, unbounded=True)
    with pytest.raises(ConfigError, match="must be a number; got True"):
        field("a/b", default=1, ge=True)
    assert field("a/b", default=1, ge=1, le=1).metadata[RANGE_KEY] == Range(ge=1, le=1)


def test_a_default_outside_its_range_or_a_range_on_text_is_refused_when_composed() -> None:
    @dataclass
    class Bad:
        n: int = field("x/n", default=0, ge=1)

    with pytest.raises(ConfigRangeError, match=r"Bad declares default 0 for 'x/n', outside"):
        Tree.of(Bad)

    @dataclass
    class Text:
        s: str = field("x/s", default="a", ge=1)

    with pytest.raises(ConfigTypeError, match=r"declares a range \(>= 1\) but holds str"):
        Tree.of(Text)


def test_declarers_of_one_path_agree_on_its_range() -> None:
    @dataclass
    class A:
        n: int = field("x/n", default=1, ge=1)

    @dataclass
    class B:
        n: int = field("x/n", default=1, ge=0)

    @dataclass
    class C:
        n: int = field("x/n", default=1)

    with pytest.raises(ConflictError, match=r"range >= 1 in A and >= 0 in B"):
        Tree.of(A, B)
    tree = Tree.of(C, A)  # a declarer without a range takes the other's
    with pytest.raises(ConfigRangeError):
        tree["x/n"] = 0


def test_unbounded_floats_still_refuse_nan_and_infinity() -> None:
    @dataclass
    class Free:
        x: float = field("x/x", default=0.0, unbounded=True)
        top: float = field("x/top", default=1.0, ge=0, le=math.inf)

    tree = Tree.of(Free)
    tree["x/x"] = -1e300
    for bad in ("nan", "inf", "-inf"):
        with pytest.raises(ConfigRangeError, match=r"'x/x' must be a finite number; got"):
            tree["x/x"] = bad
    tree["x/top"] = "inf"  # an infinite bound admits infinity
    assert tree["x/top"] == math.inf


def test_lists_and_optional_numbers_are_checked_item_by_item() -> None:
    @dataclass
    class Many:
        sizes: list[int] = field("x/sizes", default_factory=lambda: [1, 2], ge=1)
        cap: int | None = field("x/cap", default=None, ge=1)

    tree = Tree.of(Many)
    tree["x/cap"] = None
    tree["x/sizes"] = "[3, 4]"
    with pytest.raises(ConfigRangeError, match=r"got 0 in \[3, 0\]"):
        tree["x/sizes"] = [3, 0]
    with pytest.raises(ConfigRangeError, match=r"'x/cap' must be an integer >= 1; got 0"):
        tree["x/cap"] = 0


def test_a_rule_runs_only_when_the_configuration_declares_and_sets_its_paths() -> None:
    @rule("x/low", "x/high")
    def ordered(low: int, high: int) -> str | None:
        return None if low <= high else f"x/low ({low}) must not exceed x/high ({high})"

    @rule("x/low", "y/absent")
    def never(low: int, absent: int) -> str | None:
        raise AssertionError("a rule over an undeclared path must not run")

    @dataclass
    class Pair:
        low: int = field("x/low", default=0, ge=0, rules=[ordered, never])
        high: int = field("x/high", ge=0)

    tree = Tree.of(Pair)
    tree.check()  # x/high is required and unset: the rule waits
    tree["x/high"] = 3
    tree["x/low"] = 5  # each value alone is in range
    with pytest.raises(ConfigRangeError, match=r"^x/low \(5\) must not exceed x/high \(3\)$"):
        tree.validate()
    tree["x/high"] = 9
    tree.validate()
    assert dataclasses.is_dataclass(Pair)


def test_the_written_configuration_and_describe_show_each_range() -> None:
    tree = JOBS["gpt/train/pretrain"].schema()
    text = dump(tree)
    assert "  batch_size: 16  # int >= 1: global batch, in sequences\n" in text
    assert "  beta2: 0.95  # float >= 0 and < 1: second-moment decay\n" in text
    assert tree.describe("architecture/dropout") == (
        "architecture/dropout (float >= 0 and < 1, default 0.0): dropout probability"
    )
