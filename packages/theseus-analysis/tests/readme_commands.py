"""Running a README's examples as a reader would: its code blocks, and its commands on a
lineage trained here.

`blocks` reads a section's fenced blocks (the Python examples a test executes). The
READMEs' walkthroughs write their commands for the demo (its root `theseus-demo`, its
lineage `demo`), which takes minutes to train; `train_lineage` trains a small lineage in
its place, `here` points a command at it, and `invoke` runs it through `theseus`'s own
command line, in process. Loaded with `import_module_or_file` by the README tests of the
workspace and of theseus-analysis.
"""

from __future__ import annotations

import re
from pathlib import Path

from click.testing import CliRunner

from theseus.cli import main
from theseus.data.datasets import Synthetic
from theseus.quick import quick
from theseus.registry import import_module_or_file
from theseus.store import Node, Store

DEMO_ROOT, DEMO_RUN = "theseus-demo", "demo"  # what the READMEs' commands name


def blocks(readme: Path, heading: str, language: str) -> list[str]:
    """The fenced blocks marked `language` in the section that starts at `heading` (up
    to the next `## ` heading), in order, each without its fences."""
    section = readme.read_text().split(heading, 1)[1].split("\n## ", 1)[0]
    return re.findall(rf"```{language}\n(.*?)```", section, flags=re.DOTALL)


def commands(readme: Path, heading: str) -> list[str]:
    """The `uv run theseus...` commands of the section's first `bash` block, without
    `uv run ` (so `theseus ...` and `theseus-store ...`), in order."""
    return re.findall(r"^uv run (theseus.*)$", blocks(readme, heading, "bash")[0], re.M)


def train_lineage(root: Path, run: str = "moving", steps: int = 3) -> list[Node]:
    """A tiny `PretrainGPT` lineage named `run` on the synthetic language, a checkpoint
    after each of its `steps` steps and no tandem analysis: its nodes, seq 0 first."""
    jobs = import_module_or_file(str(Path(__file__).with_name("analysis_jobs.py")))
    Synthetic.prepare(root, tokens=40_000, val_tokens=6_000)
    with quick(root) as q:
        q.build(jobs.PretrainGPT, run)
        jobs.tiny(
            q.config, steps=steps, **{"training/analyze": False, "logging/checkpoint_interval": 1}
        )
        q.create()()
    with Store(root / "store") as store:
        [lineage] = {(n.name, n.nonce) for n in store.query().spec(run=run).all()}
    return [Node(*lineage, seq) for seq in range(steps)]


def here(command: str, folder: Path, root: Path, run: str = "moving") -> list[str]:
    """`theseus`'s arguments for the README's `command` (`theseus VERB ...`): the demo's
    root is `root`, its lineage (after `--over`) is `run`, and each YAML file is in `folder`."""
    program, *words = command.split()
    assert program == "theseus", command
    placed = []
    for before, word in zip(["", *words[:-1]], words, strict=True):
        if word == DEMO_ROOT:
            placed.append(str(root))
        elif word == DEMO_RUN and before == "--over":
            placed.append(run)
        elif word.endswith(".yaml"):
            placed.append(str(folder / word))
        else:
            placed.append(word)
    return placed


def invoke(argv: list[str]) -> str:
    """`theseus ARGV` in this process: its output, once it exited 0 (else the test fails
    with the output)."""
    result = CliRunner().invoke(main, argv)
    assert result.exit_code == 0, result.output
    return result.output
