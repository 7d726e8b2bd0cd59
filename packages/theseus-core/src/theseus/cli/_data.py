"""The ``data`` verbs: ``theseus data prepare DATASET --root ROOT [--OPTION VALUE ...]``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import click

from theseus.cli._app import common_options, main
from theseus.config import ConfigError
from theseus.registry import DATASETS, PreparableDataset


def parse_options(args: list[str]) -> dict[str, Any]:
    """Turn ``["--source", "dir", "--force"]`` into ``{"source": "dir", "force": True}``.

    Raises:
        ConfigError: an argument is not an ``--option``.
    """
    options: dict[str, Any] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("--") or len(arg) == 2:
            raise ConfigError(
                f"Expected dataset options written --name VALUE or --flag; got {arg!r} "
                f"in {' '.join(args)!r}."
            )
        key, sep, inline = arg[2:].partition("=")
        key = key.replace("-", "_")
        if sep:
            options[key], i = inline, i + 1
        elif i + 1 < len(args) and not args[i + 1].startswith("--"):
            options[key], i = args[i + 1], i + 2
        else:
            options[key], i = True, i + 1
    return options


@main.group("data")
def data_group() -> None:
    """Prepare datasets in a root folder."""


@data_group.command(
    "prepare", context_settings={"ignore_unknown_options": True, "allow_extra_args": True}
)
@click.argument("dataset")
@click.option(
    "--root",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="The root folder the prepared files go under.",
)
@common_options
@click.pass_context
def prepare_command(ctx: click.Context, dataset: str, root: Path) -> None:
    """Prepare DATASET under ROOT; other --options go to the dataset's prepare()."""
    cls = DATASETS[dataset]  # an unknown name lists the registered datasets
    if not callable(getattr(cls, "prepare", None)):
        raise ConfigError(
            f"Dataset {dataset!r} ({cls.__qualname__}) has no prepare(root, **options) "
            "classmethod, so it cannot be prepared from the command line."
        )
    options = parse_options(list(ctx.args))
    preparable = cast(PreparableDataset, cls)
    folder = preparable.prepare(root, **options)
    header = Path(folder) / "header.json" if isinstance(folder, str | Path) else None
    if header is None or not header.is_file():  # a dataset of the user's own
        click.echo(f"Prepared {dataset} under {root}.")
        return
    written = json.loads(header.read_text())
    count = written["count"]
    click.echo(
        f"Prepared {dataset} under {root}: {count['train']:,} training and {count['val']:,} "
        f"validation tokens ({written['tokenizer']} tokenizer)."
    )
