"""Figures drawn in worker processes (`theseus.analysis._renderers`): the same PDF bytes as
drawn here, and what happens when a worker cannot help.

Reference: `render` of the same figure in this process (theseus-plot's PDFs are byte for
byte reproducible), and the worker's answers counted where they arrive.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from theseus.analysis import _renderers
from theseus.analysis._publish import render


class Curve:
    """An importable class with a `figure` classmethod, as the library's analyses have."""

    @classmethod
    def figure(cls, results: Any) -> Any:
        from theseus.plot import line

        return line(x=list(range(len(results))), y=list(results), marker="o", title="a curve")


class NotDrawable:
    @classmethod
    def figure(cls, results: Any) -> Any:
        raise RuntimeError(f"cannot draw {results!r}")


def count_answers(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Each worker answer's status ("ok", or the error it reported), as it arrives."""
    seen: list[str] = []
    ask = _renderers._Worker.ask

    def counted(self: Any, payload: bytes) -> Any:
        status, value = ask(self, payload)
        seen.append(status if status == "ok" else value)
        return status, value

    monkeypatch.setattr(_renderers._Worker, "ask", counted)
    return seen


@pytest.fixture
def answers(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    return count_answers(monkeypatch)


def test_a_worker_draws_the_bytes_drawn_here_and_outlives_a_dead_one(answers: list[str]) -> None:
    values = np.asarray([0.5, 0.25, 0.75])
    here = render("curve", Curve.figure(values), "Curve")
    renderers = _renderers.Renderers(1)
    try:
        assert renderers.draw(Curve, "figure", values, "curve", "Curve")() == here
        assert answers == ["ok"]
        worker = renderers._workers[0]
        worker.process.kill()
        worker.process.wait()
        assert renderers.draw(Curve, "figure", values, "curve", "Curve")() == here  # drawn here
        assert answers[1].startswith(("the worker stopped", "the worker's pipe broke"))
        assert renderers.draw(Curve, "figure", values, "curve", "Curve")() == here
        assert answers[2] == "ok"  # a new worker took the dead one's place
    finally:
        renderers.close()
    assert all(w.process.poll() is not None for w in renderers._workers)  # all stopped


def test_what_a_worker_cannot_do_is_drawn_here(answers: list[str]) -> None:
    class Local(Curve):
        """Defined in a function: no worker can import it."""

    renderers = _renderers.Renderers(1)
    try:
        values = np.asarray([1.0, 2.0])
        here = render("curve", Curve.figure(values), "Curve")
        assert renderers.draw(Local, "figure", values, "curve", "Local")() == here
        unpicklable = [lambda: None]
        with pytest.raises(TypeError):  # Curve.figure's own error about the lambda, raised here
            renderers.draw(Curve, "figure", unpicklable, "curve", "Curve")()
        assert answers == []  # neither reached a worker
        with pytest.raises(RuntimeError, match=r"cannot draw 'x'"):
            renderers.draw(NotDrawable, "figure", "x", "bad", "NotDrawable")()
        assert answers == ["RuntimeError: cannot draw 'x'"]  # tried there, raised here
    finally:
        renderers.close()


def test_a_class_no_worker_can_import_is_tried_once(answers: list[str]) -> None:
    """A class whose module a worker cannot import (one made at run time, or loaded from
    somewhere the worker's path does not reach) is drawn here, and its later figures go
    to no worker."""
    ghost = type("Ghost", (Curve,), {"__module__": "no_module_a_worker_can_import"})
    values = [0.1, 0.9]
    here = render("curve", Curve.figure(values), "Ghost")
    renderers = _renderers.Renderers(1)
    try:
        assert renderers.draw(ghost, "figure", values, "curve", "Ghost")() == here
        assert renderers.draw(ghost, "figure", values, "curve", "Ghost")() == here
    finally:
        renderers.close()
    assert len(answers) == 1 and answers[0].startswith("ModuleNotFoundError")
