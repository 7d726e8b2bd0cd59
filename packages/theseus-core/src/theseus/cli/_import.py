"""The verbs ``import gpt2`` and ``import hf``: published weights into a root as a lineage."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import TYPE_CHECKING

import click

from theseus.cli._app import common_options, main
from theseus.cli._root import root_argument
from theseus.cli._suite import REVISIONS_HELP, suite_import
from theseus.config import parse_overrides
from theseus.store import Node

if TYPE_CHECKING:  # the reader imports JAX; `theseus --help` must not
    from theseus.model.hf import HFFolder


@main.group("import")
def import_group() -> None:
    """Bring published weights into a root as a new lineage."""


@import_group.command("gpt2")
@click.argument("src", type=click.Path(path_type=Path))
@root_argument()
@click.option("--run", "run_name", default="gpt2", show_default=True, help="The run's name.")
@click.option("--project", default=None, help="The project (default: general).")
@click.option("--group", default=None, help="The group (default: default).")
@common_options
def import_gpt2_command(
    src: Path, root: Path, run_name: str, project: str | None, group: str | None
) -> None:
    """Import the Hugging Face GPT-2 folder SRC into ROOT as a lineage of --run.

    SRC holds config.json, model.safetensors and the tokenizer (tokenizer.json, or
    vocab.json and merges.txt); it is checked whole before anything is written. The
    first node holds a checkpoint of the weights; sample it, analyze it, or resume it
    to fine-tune.
    """
    from theseus.experiments.models.gpt2 import check_new_run, import_gpt2
    from theseus.model.gpt2 import read_gpt2

    check_new_run(root, run_name, project=project, group=group)  # before any reading
    folder = read_gpt2(src)  # a bad folder fails here, before the root is touched
    click.echo(f"Importing GPT-2 from {_described(folder)}.", err=True)
    node = import_gpt2(folder, root, run_name, project=project, group=group)
    _print_next_steps(node, folder, root, run_name, project, group, "gpt2")


def _described(folder: HFFolder) -> str:
    """`PATH: N parameters, L layers, W wide, context C, vocabulary V` of a checked folder."""
    s = folder.settings
    return (
        f"{folder.path}: {folder.parameter_count:,} parameters, {s['architecture/n_layers']} "
        f"layers, {s['architecture/n_embd']} wide, context {s['architecture/block_size']}, "
        f"vocabulary {s['architecture/vocab_size']}"
    )


def _print_next_steps(
    node: Node,
    folder: HFFolder,
    root: Path,
    run_name: str,
    project: str | None,
    group: str | None,
    kind: str,
) -> None:
    """What an import made and the commands that sample and fine-tune it (job `kind`)."""
    from theseus.data.tokenizer import tokenizer_name

    name = tokenizer_name(folder.tokenizer, folder.model_type, folder.eot)
    quoted, run = shlex.quote(str(root)), shlex.quote(run_name)
    place = "".join(
        f" --{flag} {shlex.quote(value)}"
        for flag, value in (("project", project), ("group", group))
        if value is not None
    )
    click.echo(f"Imported as node {node.serialize()} (its checkpoint: the weights, step 0).")
    click.echo(f"Tokenizer: {name} (under {root / 'tokenizers'})")
    target = f"{run}~{node.nonce}"
    click.echo(
        f"Sample:    theseus sample {quoted} {target} 'Hello, my name is' --max-new-tokens 20"
    )
    click.echo(
        f"Fine-tune: theseus data prepare text --root {quoted} --source DIR --tokenizer "
        f"{name}; theseus configure {kind} {kind}.yaml; theseus run tuned {kind}.yaml "
        f"{quoted} --branch {target}{place} training/tokens=N "
        "(the architecture comes from the import; set training keys as KEY=VALUE)"
    )


@import_group.command("hf")
@click.argument("src", type=click.Path(path_type=Path))
@root_argument()
@click.argument("overrides", nargs=-1, metavar="[KEY=VALUE]...")
@click.option("--run", "run_name", default="hf", show_default=True, help="The run's name.")
@click.option("--project", default=None, help="The project (default: general).")
@click.option("--group", default=None, help="The group (default: default).")
@click.option("--revisions", default=None, metavar="all|R1,R2,...", help=REVISIONS_HELP)
@common_options
def import_hf_command(
    src: Path,
    root: Path,
    overrides: tuple[str, ...],
    run_name: str,
    project: str | None,
    group: str | None,
    revisions: str | None,
) -> None:
    """Import the Hugging Face model folder SRC into ROOT as a lineage of --run.

    SRC holds config.json (model_type gpt2, gpt_neox, llama, mistral, qwen2 or olmo2),
    model.safetensors (or shards with model.safetensors.index.json) and tokenizer.json
    (a GPT-2's vocab.json and merges.txt do instead); it is checked whole before anything is written. KEY=VALUE overrides set the import's
    training layout (training.strategy=fsdp, training.shard=4) or parameter dtype; the
    weights stream into that layout shard by shard. With --revisions, SRC is a training
    suite (a Hugging Face cache folder, or one subfolder per revision) and each revision
    becomes a node of the run's one lineage, at seq = its step.
    """
    from theseus.experiments.models.gpt2 import check_new_run
    from theseus.experiments.models.hf import check_overrides, import_hf, read_model

    settings = parse_overrides(overrides)
    if revisions is not None:  # a training suite: one lineage, a node per revision
        suite_import(src, root, run_name, revisions, project, group, settings)
        return
    check_new_run(root, run_name, project=project, group=group)  # before any reading
    folder = read_model(src)  # a bad folder fails here, before the root is touched
    check_overrides(folder, settings)
    click.echo(
        f"Importing {folder.model_type} from {_described(folder)}, {len(folder.files)} "
        "weight file(s).",
        err=True,
    )
    for note in folder.notes:
        click.echo(f"Note: {note}.", err=True)
    node = import_hf(folder, root, run_name, project=project, group=group, overrides=settings)
    _print_next_steps(node, folder, root, run_name, project, group, "hf")
