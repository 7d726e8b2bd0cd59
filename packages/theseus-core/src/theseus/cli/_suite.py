"""`theseus import hf SRC ROOT --run NAME --revisions all|R1,R2,...`: a suite as one lineage.

The `import hf` command hands `--revisions` here: `suite_import` imports the chosen
revisions of the suite at SRC (`theseus.experiments.models.suite.import_suite`),
prints the integrity table (revision, step, tokens, weights digest, flags) and one
line per flagged revision on stderr, so no broken revision comes in silently, then
what to run next on the lineage.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import click

from theseus.cli._next import command, program

__all__ = ["REVISIONS_HELP", "analyze_commands", "suite_import"]

#: The analysis the import suggests (the README's: which heads an induction prompt needs,
#: at each revision), and the module that registers it.
SUGGESTED = ("demo/intervene/head-ablation", "theseus.analysis.demo")

REVISIONS_HELP = (
    "Import a training suite as one lineage: SRC is a Hugging Face cache folder "
    "(models--ORG--NAME) or a folder with one subfolder per revision; `all` takes every "
    "revision whose name carries a step (step1000, stage1-step11931-tokens50B), in step "
    "order, or name them: R1,R2 (`main` only when named). Importing again adds only the "
    "missing revisions."
)


def suite_import(
    src: Path,
    root: Path,
    run: str,
    revisions: str,
    project: str | None = None,
    group: str | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> None:
    """Import the suite and print its table, its flags and the commands that come next."""
    from theseus.experiments.models.suite import import_suite

    result = import_suite(
        src, root, run, revisions, project=project, group=group, overrides=overrides
    )
    click.echo(result.table)
    flagged = [
        (name, result.findings.flags(name))
        for name in [line.split()[0] for line in result.table.splitlines()[1:]]
        if result.findings.flags(name)
    ]
    # each flagged revision was said once on stderr, by import_suite's warning
    quoted, lineage = shlex.quote(str(root)), result.lineage
    written = len(result.nodes)
    before = f"; {len(result.kept)} were imported before" if result.kept else ""
    click.echo(
        f"Imported {written} revision{'' if written == 1 else 's'} as nodes of {lineage} "
        f"(seq = step){before}."
    )
    if flagged:
        click.echo(
            f"{len(flagged)} revision(s) flagged: their nodes hold import/duplicate_of, "
            "import/shared_shards_with or import/missing_before."
        )
    for line in analyze_commands(root, lineage):
        click.echo(line)
    store = program("theseus-store")
    click.echo(f"Lineage:   {store} lineage {shlex.quote(str(root / 'store'))} {lineage}")
    click.echo(f"Browse:    {store} ui {quoted}")


def analyze_commands(root: Path, lineage: str) -> list[str]:
    """The lines that say how to analyze every revision of `lineage` under `root`: the two
    commands to paste (configure the suggested analysis, run it `--over` the lineage), or,
    without theseus-analysis, what to install."""
    import importlib.util

    analysis, module = SUGGESTED
    if importlib.util.find_spec("theseus.analysis") is None:
        return ["Analyze:   install theseus-analysis, whose analyses run --over the lineage."]
    configure = command("configure", analysis, "ablation.yaml", "--import", module)
    over = ("--over", lineage, "--import", module)
    run = command("run", "ablation", "ablation.yaml", Path(root).resolve(), *over)
    return [f"Analyze:   {configure}", f"           {run}"]
