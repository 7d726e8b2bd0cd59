"""The ``data`` verbs: ``theseus data prepare DATASET ROOT [--OPTION VALUE ...]`` (or ``--root ROOT``)."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any, cast

import click

from theseus.cli._app import common_options, main
from theseus.cli._root import ROOT, with_root_help
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
@click.argument("dataset", metavar="DATASET [ROOT]")
@click.option(
    "--root",
    "root_option",
    default=None,
    metavar="ROOT",
    type=ROOT,
    help="The root the prepared files go under (ROOT/data), as ROOT after DATASET does.",
)
@click.option(
    "--replace",
    is_flag=True,
    help="Replace other tokens already prepared under ROOT/data/DATASET; without it they are "
    "kept. Runs trained on the old ones are analyzed and branched on the new ones; those whose "
    "checkpoints recorded the old ones (saved by this version or later) resume training only "
    "once the old ones are prepared again.",
)
@common_options
@click.pass_context
@with_root_help
def prepare_command(
    ctx: click.Context, dataset: str, root_option: Path | None, replace: bool
) -> None:
    """Prepare DATASET under ROOT; other --options go to the dataset's prepare().

    ROOT comes right after DATASET (theseus data prepare DATASET ROOT [--OPTION VALUE ...])
    or as --root ROOT; the files go to ROOT/data/. Tokens prepared there before are
    never replaced by others without --replace (a dataset's own --force
    goes to its prepare()); the same tokens again write nothing.
    """
    args = list(ctx.args)
    given = args.pop(0) if args and not args[0].startswith("--") else None
    if given is not None and root_option is not None:
        raise ConfigError(
            f"ROOT is given twice, as --root {root_option} and as {given!r}; pass one (dataset "
            "options are written --name VALUE or --flag)."
        )
    if given is None and root_option is None:
        raise ConfigError(
            f"No ROOT: write theseus data prepare {dataset} ROOT [--OPTION VALUE ...] (or "
            "--root ROOT), ROOT the Theseus root whose data/ gets the files."
        )
    root = ROOT.convert(given, None, ctx) if given is not None else root_option
    assert root is not None
    cls = DATASETS[dataset]  # an unknown name lists the registered datasets
    if not callable(getattr(cls, "prepare", None)):
        raise ConfigError(
            f"Dataset {dataset!r} ({cls.__qualname__}) has no prepare(root, **options) "
            "classmethod, so it cannot be prepared from the command line."
        )
    options = parse_options(args)
    preparable = cast(PreparableDataset, cls)
    from theseus.data.prepared import (  # numpy: only when preparing
        dataset_dir,
        replacing,
        setting_changes,
        short_digest,
    )

    before = _stamp(dataset_dir(root, dataset) / "header.json")
    held = _header(dataset_dir(root, dataset) / "header.json")
    with replacing() if replace else contextlib.nullcontext():
        folder = preparable.prepare(root, **options)
    header = Path(folder) / "header.json" if isinstance(folder, str | Path) else None
    if header is None or not header.is_file():  # a dataset of the user's own
        click.echo(f"Prepared {dataset} under {root}.")
        return
    written = json.loads(header.read_text())
    count = written["count"]
    tokens = (
        f"{count['train']:,} training and {count['val']:,} validation tokens "
        f"({written['tokenizer']} tokenizer)"
    )
    if before is not None and before == _stamp(header):
        click.echo(f"{dataset} under {root} already holds these tokens: {tokens}; nothing written.")
        return
    click.echo(f"Prepared {dataset} under {root}: {tokens}.")
    if held is not None and held.get("digest") != written.get("digest"):
        changes = setting_changes(held, written) or ["the same settings, other tokens"]
        click.echo(
            f"Replaced the tokens prepared there before (sha256 {short_digest(held.get('digest'))}"
            f": {'; '.join(changes)}). Runs trained on those are analyzed and branched on "
            "these; those whose checkpoints recorded them resume training only once they "
            "are prepared again."
        )


def _header(path: Path) -> dict[str, Any] | None:
    """The header at `path`, None where there is none (or it cannot be read)."""
    try:
        return cast(dict[str, Any], json.loads(path.read_text()))
    except (OSError, ValueError):
        return None


def _stamp(path: Path) -> tuple[int, int] | None:
    """`(inode, mtime_ns)` of `path`, None where it does not exist: a header written anew
    (through a rename) has another."""
    try:
        stat = path.stat()
    except OSError:
        return None
    return stat.st_ino, stat.st_mtime_ns
