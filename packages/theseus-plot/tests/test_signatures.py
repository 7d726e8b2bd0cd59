"""The helpers take exactly seaborn's parameters, plus four keyword-only extras."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import pytest
import seaborn as sns

import theseus.plot as tp

EXTRAS = ("title", "xlabel", "ylabel", "figsize")
PAIRS = [
    (tp.heatmap, sns.heatmap),
    (tp.bar, sns.barplot),
    (tp.line, sns.lineplot),
    (tp.scatter, sns.scatterplot),
]


def _described(function: Callable[..., Any], skip: tuple[str, ...] = ()) -> list[tuple]:
    return [
        (p.name, p.kind, p.default)
        for p in inspect.signature(function).parameters.values()
        if p.name not in skip
    ]


@pytest.mark.parametrize(("ours", "theirs"), PAIRS, ids=lambda f: f.__name__)
def test_parameters_match_installed_seaborn(ours: Callable[..., Any], theirs: Callable[..., Any]):
    assert _described(ours, skip=EXTRAS) == _described(theirs)


@pytest.mark.parametrize(("ours", "theirs"), PAIRS, ids=lambda f: f.__name__)
def test_extras_are_keyword_only_before_kwargs(
    ours: Callable[..., Any], theirs: Callable[..., Any]
):
    parameters = list(inspect.signature(ours).parameters.values())
    assert [p.name for p in parameters[-5:-1]] == list(EXTRAS)
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in parameters[-5:-1])
    assert all(p.default is None for p in parameters[-5:-1])
    assert parameters[-1].kind is inspect.Parameter.VAR_KEYWORD
    assert len(parameters) == len(inspect.signature(theirs).parameters) + len(EXTRAS)


@pytest.mark.parametrize("name", ["heatmap", "bar", "line", "scatter"])
def test_mixin_methods_are_the_functions(name: str):
    class Analysis(tp.Plotting):
        pass

    method = getattr(Analysis(), name)
    assert method is getattr(tp, name)
    assert inspect.signature(method) == inspect.signature(getattr(tp, name))


def test_public_names():
    assert sorted(tp.__all__) == sorted(
        name
        for name in vars(tp)
        if not name.startswith("_")
        and name not in {"annotations"}
        and not inspect.ismodule(getattr(tp, name))
    )
