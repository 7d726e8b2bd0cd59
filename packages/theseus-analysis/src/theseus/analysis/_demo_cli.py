"""`theseus demo [ROOT]`: train a tiny GPT offline, analyze it in tandem and on a checkpoint.

The whole pipeline in one command, on a CPU, with no download: prepare `synthetic`,
train `demo/train` (PretrainGPT with two tandem analyses and the library's induction
score, see `theseus.analysis.demo`) with small settings, checkpoint it, analyze its latest
checkpoint as a standalone job,
ablate each of its heads (an intervention sweep), sample a few continuations of held-out
text, evaluate it on the synthetic language's own lm-evaluation-harness tasks (when the
`eval` extra is installed), and print the lineage, the checkpoints, the losses against
the language's entropy bound, the induction score at each validation, the scores, where
the PDFs are, and what to run next (among it the browser's pages that show the induction
score over training).
"""

from __future__ import annotations

import math
import shlex
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import click

from theseus.analysis._progress import quiet_progress_bars
from theseus.cli import cluster_options, common_options, root_argument
from theseus.cli._next import program
from theseus.store import Store, is_database_url

DEMO_ROOT = "theseus-demo"  # ROOT when none is given, in the current folder
DEMO_SETTINGS = {
    "architecture/n_layers": 2,
    "architecture/n_embd": 64,
    "architecture/n_head": 4,
    "architecture/block_size": 64,
    "training/batch_size": 16,
    "training/validation_steps": 4,
    "optimization/lr": 3e-3,
    "logging/report_interval": 25,
}  # the model and its training; any GPT trainer takes them
TANDEM_SETTINGS = {
    "library/induction/tokens": "data",  # the few ids the synthetic language uses
}  # what only the demo's trainer, with its induction companion, declares
SAMPLES = 3  # lines the trained model writes at the end
UI_PORT = 8765  # where `theseus-store ui` serves by default (its --port)


def python_line(python: str, root: Path) -> str:
    """`PYTHON -c CODE` that finds the demo's latest checkpoint with `theseus.quick`, as a
    shell reads it whatever the root's name holds (quotes, `$`, spaces, any letter): the
    root is a Python string literal in CODE, and CODE one shell word."""
    literal = repr(str(root))
    if literal.startswith("'"):  # the same string between double quotes: CODE reads better
        literal = '"' + literal[1:-1].replace('"', '\\"') + '"'
    code = (
        f"from theseus.quick import init; q = init({literal}); "
        'print(q.find().spec(run="demo").checkpoint().latest().first())'
    )
    return f"{python} -c {shlex.quote(code)}"


def _induction(store: Store, nonce: str) -> list[tuple[Any, str, float, float, float]]:
    """Each node of the lineage `nonce` that holds the tandem induction score, in seq order:
    `(node, head, score, first_half_loss, second_half_loss)`, `head` (`L{l}H{h}`) the one
    with the highest score."""
    from theseus.analysis.library import InductionHeads

    rows = []
    found = store.query().nonce(nonce).artifact(InductionHeads.NAME).all()
    for node in sorted(found, key=lambda n: n.seq):
        values = store.values(node)
        heads = {
            key.rsplit("/", 1)[1]: float(value)
            for key, value in values.items()
            if key.startswith("dynamics/induction/L") and isinstance(value, (int, float))
        }
        head = max(heads, key=lambda h: heads[h])
        first, second = (values[f"dynamics/induction/{h}_half_loss"] for h in ("first", "second"))
        assert isinstance(first, float) and isinstance(second, float)
        rows.append((node, head, heads[head], first, second))
    return rows


def _even(configuration: Any) -> float:
    """The induction score of a head that attends evenly to every token it can see: the
    mean of `1 / (q + 1)` over the second half's queries `q = n .. 2n - 1`, where `n` is
    `library/induction/length` clipped to half the block (as `InductionHeads` reads it)."""
    n = min(
        int(configuration["library/induction/length"]),
        int(configuration["architecture/block_size"]) // 2,
    )
    return sum(1 / (q + 1) for q in range(n, 2 * n)) / n


def _pages(lineage: str) -> list[str]:
    """The browser's pages of the induction score on `lineage`: its heatmap at each node
    (the time slider) and its highest head's score over training (a curve)."""
    from theseus.analysis.library import InductionHeads

    here = f"http://127.0.0.1:{UI_PORT}"
    return [
        f"{here}/slider?{urlencode({'l': lineage, 'name': InductionHeads.NAME})}",
        f"{here}/curves?{urlencode({'l': lineage, 'key': 'dynamics/induction/max'})}",
    ]


def _evaluate(root: Path, lineage: str) -> dict[str, dict[str, float]] | None:
    """The synthetic tasks on `lineage`'s latest checkpoint (None without lm-eval)."""
    try:
        import lm_eval  # noqa: F401
    except ImportError:
        return None
    from theseus.analysis._eval_cli import evaluate_node

    click.echo("Evaluating the model on synthetic_mc and synthetic_ppl ...")
    written = evaluate_node(
        root, lineage, ["synthetic_mc", "synthetic_ppl"], batch_size=32, force=True,
        echo=lambda line: None,
    )  # fmt: skip
    [scores] = written.values()
    return scores


@click.command("demo")
@root_argument(default=DEMO_ROOT)
@click.option(
    "--steps",
    type=click.IntRange(1, 2**31 - 1),  # the step counter is 32-bit (training/_rules.MAX_STEPS)
    default=600,
    show_default=True,
    help="Optimizer steps to train.",
)
@click.option(
    "--progress-bars", is_flag=True, help="Show lm-eval's and datasets' progress bars too."
)
@cluster_options
@common_options
def demo(root: Path, steps: int, progress_bars: bool) -> None:
    """Train a tiny GPT on built-in synthetic data under ROOT, analyze it, print where it all went.

    ROOT defaults to ./theseus-demo, in the current folder.

    On several hosts, run it on every host with the options that join a cluster (see
    `theseus run --help`); process 0 prints the report.
    """
    if not progress_bars:
        quiet_progress_bars()  # before lm-eval and datasets are imported
    import jax

    from theseus.analysis.demo import AttentionPattern, DemoTrainer, HeadAblation
    from theseus.data.datasets import Synthetic
    from theseus.data.prepared import DataNotPreparedError
    from theseus.job import is_primary, process_count, process_index, sync_hosts
    from theseus.quick import quick

    root = root.absolute()
    # Host zero prepares first; the others then find its files (a shared ROOT) or, on a
    # disk of their own, prepare the same language themselves.
    for turn in ("primary", "others"):
        if (turn == "primary") == is_primary():
            try:
                Synthetic.open(root)
                click.echo(
                    f"Using the synthetic language already prepared in "
                    f"{root / 'data' / 'synthetic'}"
                )
            except DataNotPreparedError:
                click.echo(f"Preparing the synthetic language in {root / 'data' / 'synthetic'} ...")
                Synthetic.prepare(root)
        sync_hosts(f"theseus/demo/data/{turn}")
    bound = Synthetic.entropy_bound(root)

    with quick(root) as q:
        q.build(DemoTrainer, "demo", project="theseus", group="demo")
        for key, value in {**DEMO_SETTINGS, **TANDEM_SETTINGS}.items():
            q.config[key] = value
        per_step = q.config["training/batch_size"] * q.config["architecture/block_size"]
        q.config["training/tokens"] = steps * per_step
        q.config["logging/validation_interval"] = max(1, steps // 4)
        q.config["logging/checkpoint_interval"] = max(1, steps // 4)
        trainer = q.create()
        assert isinstance(trainer, DemoTrainer)
        start_loss = trainer.validate()["val/loss"]
        click.echo(
            f"Training a {DEMO_SETTINGS['architecture/n_layers']}-layer GPT for {steps} steps "
            f"({steps * per_step:,} tokens) on {trainer.sharding.mesh.size} device(s) ..."
        )
        began = time.perf_counter()
        trainer()
        elapsed = time.perf_counter() - began
        if is_primary():  # host zero wrote the store and the files; it alone reports
            store = trainer.store
            nodes = sorted(store.query().nonce(trainer.node.nonce).all(), key=lambda n: n.seq)
            checkpointed = [(n, c) for n in nodes for c in store.checkpoints(n)]
            final = store.values(trainer.node)
            tandem = {a.NAME: store.history(trainer.node, a.NAME) for a in DemoTrainer.ANALYSIS}
            cadences = sum(a.NAME in store.get(n) for n in nodes for a in DemoTrainer.ANALYSIS)
            induction = _induction(store, trainer.node.nonce)

        # What the trained model writes: held-out documents' first tokens, continued.
        held_out = Synthetic.open(root)
        tokens, starts = held_out.tokens("val"), held_out.doc_starts("val")
        prompts = [trainer.tokenizer.decode(tokens[s : s + 8]) for s in starts[:SAMPLES]]
        samples = trainer.generate(prompts, 40, temperature=0.8, key=jax.random.key(0))

        # The same analysis as a standalone job on the latest checkpoint of this lineage.
        q.build(AttentionPattern, "demo-inspect", project="theseus", group="demo")
        q.find().nonce(trainer.node.nonce).checkpoint().latest().resume()
        inspected = q.create()()

        # An intervention on the same checkpoint: each head of each layer ablated.
        q.build(HeadAblation, "demo-ablate", project="theseus", group="demo")
        q.find().nonce(trainer.node.nonce).checkpoint().latest().resume()
        ablated = q.create()()

    # The model on the language's own evaluations, kept on the latest checkpoint's node.
    lineage = f"{trainer.node.name}~{trainer.node.nonce}"
    scores = _evaluate(root, lineage)

    if not is_primary():
        click.echo(
            f"Process {process_index()} of {process_count()} finished run "
            f"{trainer.node.serialize()}; process 0 prints the report."
        )
        return
    uniform = math.log(int(trainer.configuration["architecture/vocab_size"]))
    click.echo("")
    click.echo(f"Run {trainer.node.name} (lineage {trainer.node.nonce}) trained in {elapsed:.0f} s")
    click.echo(
        f"  nodes:        {len(nodes)} (seq 0 .. {nodes[-1].seq}), last node {trainer.node.serialize()}"
    )
    click.echo(f"  val loss:     {start_loss:.3f} -> {final['val/loss']:.3f} nats/token")
    click.echo(
        f"  entropy bound {bound:.3f} nats/token (no model can do better; uniform guessing: {uniform:.3f})"
    )
    click.echo(f"  train loss:   {final['train/loss']:.3f} at step {final['train/step']}")
    click.echo("  checkpoints:")
    for node, checkpoint in checkpointed:
        click.echo(f"    step {checkpoint.step:>5} at node seq {node.seq}: {checkpoint.path}")
    click.echo("  analyses (tandem, at each validation):")
    for name, versions in tandem.items():
        where = trainer.spec.result(versions[-1].filename) if versions else "not written (above)"
        click.echo(f"    {name}: {where}")
    click.echo(f"    {cadences} PDFs kept as artifacts on the run's nodes")
    click.echo(
        "  induction score (library/induction, at each validation: each head's attention from "
        "a repeated random token to the token after its first occurrence; 1 copies it "
        f"always, a head that attends evenly scores {_even(trainer.configuration):.3f}):"
    )
    for node, head, score, first, second in induction:
        click.echo(
            f"    seq {node.seq:>5}: highest {head} {score:.3f}; loss on the repeat "
            f"{second:.3f}, on its first occurrence {first:.3f} nats/token"
        )
    click.echo("  analysis of the latest checkpoint (a standalone job):")
    click.echo(f"    {AttentionPattern.NAME}: {inspected.path}")
    click.echo(f"    attached to node {inspected.node.serialize()}")
    layer, head = divmod(int(ablated.values.argmax()), ablated.values.shape[1])
    click.echo("  intervention on the latest checkpoint (each head zero-ablated in turn):")
    click.echo(f"    {HeadAblation.NAME}: {ablated.path}")
    click.echo(
        f"    the loss rises most without layer {layer} head {head}: "
        f"{ablated.values[layer, head]:+.3f} nats/token"
    )
    click.echo("  samples (8 tokens of held-out text, then 40 drawn at temperature 0.8):")
    for prompt, sample in zip(prompts, samples, strict=True):
        click.echo(f"    {prompt!r} -> {sample!r}")
    if scores is None:
        click.echo(
            "  evaluation:   skipped (lm-evaluation-harness is not installed: pip install "
            '"theseus-analysis[eval]")'
        )
    else:
        mc, ppl = scores.get("synthetic_mc", {}), scores.get("synthetic_ppl", {})
        loss = final["val/loss"]
        assert isinstance(loss, float)
        click.echo(
            "  evaluation (lm-evaluation-harness; values eval/TASK/METRIC on the last node):"
        )
        click.echo(
            f"    synthetic_mc  acc {mc['eval/synthetic_mc/acc']:.3f} "
            f"+/- {mc['eval/synthetic_mc/acc_stderr']:.3f} (chance 0.25; the language itself 1.0)"
        )
        click.echo(
            f"    synthetic_ppl {ppl['eval/synthetic_ppl/bits_per_byte']:.3f} bits/byte (val "
            f"loss {loss / math.log(2):.3f} bits/token; entropy bound "
            f"{bound / math.log(2):.3f})"
        )
    with Store(root / "store", create=False, readonly=True) as opened:
        rows = f" (rows in {opened.database})" if is_database_url(opened.database) else ""
    click.echo(f"  store:        {root / 'store'}{rows}")
    click.echo("")
    click.echo("Look at it:")
    store_cli = program("theseus-store")
    python = program("python")
    where = shlex.quote(str(root / "store"))
    click.echo(f"  {store_cli} runs {where}")
    click.echo(f"  {store_cli} show {where} {trainer.node.serialize()}")
    click.echo(f"  {store_cli} lineage {where} {trainer.node.serialize()}")
    click.echo(
        f"  {program('theseus')} --import theseus.analysis.demo sample "
        f"{shlex.quote(str(root))} {trainer.node.name}~{trainer.node.nonce} "
        f"{shlex.quote(prompts[0])} --temperature 0.8 --max-new-tokens 40"
    )
    click.echo(f"  {python_line(python, root)}")
    click.echo(
        f"  {program('theseus')} --import theseus.analysis.demo eval {shlex.quote(str(root))} "
        f"{lineage} --over --tasks synthetic_mc,synthetic_ppl"
    )
    click.echo("Train sparse autoencoders at each of its checkpoints, chained (its features page):")
    theseus = program("theseus")
    features = shlex.quote(str(root / "features.yaml"))
    click.echo(
        f"  {theseus} configure demo/analyze/features {features} --import theseus.analysis.demo"
    )
    click.echo(
        f"  {theseus} run features {features} {shlex.quote(str(root))} --over {lineage} "
        "--import theseus.analysis.demo"
    )
    click.echo('Browse it in a web browser (read-only; pip install "theseus-store[ui]"):')
    click.echo(f"  {store_cli} ui {shlex.quote(str(root))}")
    click.echo(
        "and open the induction score there: every head at each validation (the arrow keys "
        "step through training), and the highest head's score over training:"
    )
    for page in _pages(lineage):
        click.echo(f"  {page}")
