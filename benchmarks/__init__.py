"""Theseus's benchmarks, each against the tool or hand-written code it replaces.

``uv run --group bench python -m benchmarks [--quick]`` runs them all (``run.py``) and
writes ``results.md`` and ``results.json``; each script also runs alone
(``uv run python benchmarks/NAME.py``). See ``README.md`` in this folder.
"""
