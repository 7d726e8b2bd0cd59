"""The docstring examples of the foundation modules run and print what they show."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "theseus.config._field",
    "theseus.config._tree",
    "theseus.config._hydrate",
    "theseus.config._yaml",
    "theseus.config._range",
    "theseus.config._retired",
    "theseus.training.optimization",
    "theseus.job._spec",
    "theseus.quick._session",
    "theseus.data",
    "theseus.model.loss",
    "theseus.model.attention.base",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name: str) -> None:
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0, f"{name} has no examples"
    assert result.failed == 0
