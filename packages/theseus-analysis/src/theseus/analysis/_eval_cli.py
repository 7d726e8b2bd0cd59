"""`theseus eval ROOT TARGET --tasks ...`: lm-evaluation-harness tasks on a node, kept there.

The node's checkpoint is opened as `theseus sample` opens it, its model handed to the
harness as `TheseusLM`, and each task's metrics written as values on the node:
`eval/TASK/METRIC` (the harness's metric name without its filter, `acc`, `acc_norm`,
`bits_per_byte`, ...) and `eval/TASK/METRIC_stderr`, with `eval/TASK/version`,
`eval/TASK/num_fewshot`, `eval/TASK/fewshot_seed` and `eval/harness_version`; the
harness's results for the task (its metrics, configuration, versions) are the artifact
`eval-TASK` (JSON). A task the node holds values for already is skipped unless
`--force`.

`--over` walks every checkpoint of TARGET's lineage with one trainer: its compiled
scoring programs serve every node (the parameters change, not their shapes), the next
checkpoint is read while the current one is evaluated, and nodes that hold the tasks
already are skipped.

Tasks come from lm-eval's own folder, the synthetic language's folder shipped here
(`synthetic_mc`, `synthetic_ppl`; the root's own language settings are passed to them)
and `--include-path`. Nothing is downloaded: a task whose data lives on the Hugging Face
Hub is refused before anything runs.
"""

from __future__ import annotations

import functools
import json
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import click

from theseus.analysis._progress import quiet_progress_bars
from theseus.analysis._task_index import check_tasks, task_manager
from theseus.cli import cluster_options, common_options, root_argument
from theseus.job import is_primary, process_count

__all__ = ["FEWSHOT_SEED", "eval_command", "evaluate_node", "metric_values"]

#: the few-shot sampler's seed (lm-eval's default), recorded with every result
FEWSHOT_SEED = 1234


class _OwnTaskNote(logging.Filter):
    """Drops lm-eval's note on passing `--metadata` to a task with its own dataset
    function, for the synthetic tasks (Theseus passes the root's language itself)."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = str(record.msg)
        return not (text.startswith("synthetic_") and "Custom kwargs" in text)


def _quiet() -> None:
    logger = logging.getLogger("lm_eval.api.task")
    if not any(isinstance(f, _OwnTaskNote) for f in logger.filters):
        logger.addFilter(_OwnTaskNote())
    import lm_eval.evaluator

    if getattr(lm_eval.evaluator, "get_git_commit_hash", None) not in (None, _git_hash):
        lm_eval.evaluator.get_git_commit_hash = _git_hash


def _git_hash() -> str | None:
    """What lm-eval records as its results' `git_hash` (`git describe --always` in the
    working folder, else the commit of a `.git` above it, else None), without git's
    "fatal: not a git repository" on the user's terminal where there is no repository:
    lm-eval lets git write to the process's stderr."""
    import os
    import subprocess

    from lm_eval.loggers.utils import get_commit_from_path

    try:
        described = subprocess.check_output(
            ["git", "describe", "--always"], stderr=subprocess.DEVNULL
        )
    except (subprocess.CalledProcessError, FileNotFoundError):
        return get_commit_from_path(os.getcwd())
    return described.strip().decode()


def metric_values(task: str, results: dict[str, Any]) -> dict[str, float]:
    """`eval/TASK/METRIC` -> number from the harness's results for `task` (filters dropped,
    entries that are not numbers, such as an unavailable stderr, left out)."""
    values: dict[str, float] = {}
    for key, value in results.items():
        metric = key.split(",", 1)[0]
        if metric == "alias" or isinstance(value, bool) or not isinstance(value, int | float):
            continue
        values[f"eval/{task}/{metric}"] = float(value)
    return values


def _lineage_checkpoints(store: Any, target: str) -> list[Any]:
    """The checkpointed nodes of TARGET's lineage, in seq order."""
    from theseus.analysis.evaluation import EvaluationError

    node = store.resolve(target)
    saved = {
        c.node for c in store.query().nonce(node.nonce).checkpoints() if c.node.name == node.name
    }
    if not saved:
        raise EvaluationError(
            f"{target} ({node.name}~{node.nonce}) has no checkpoint to evaluate; train or "
            "import it first"
        )
    return sorted(saved, key=lambda n: n.seq)


def _done(values: dict[str, Any], task: str) -> bool:
    return any(key.startswith(f"eval/{task}/") for key in values)


def _write(
    store: Any, node: Any, task: str, results: dict[str, Any], limit: int | None
) -> dict[str, Any]:
    """Keep one task's results on `node`: its values and the artifact `eval-TASK`."""
    import lm_eval

    values: dict[str, Any] = dict(metric_values(task, results["results"].get(task, {})))
    version = results.get("versions", {}).get(task)
    if version is not None:  # a number, or "Yaml" for a task file without one
        values[f"eval/{task}/version"] = version if isinstance(version, float) else str(version)
    shots = results.get("n-shot", {}).get(task)
    if shots is not None:
        values[f"eval/{task}/num_fewshot"] = int(shots)
    values[f"eval/{task}/fewshot_seed"] = FEWSHOT_SEED
    values["eval/harness_version"] = lm_eval.__version__
    kept = {
        "task": task,
        "results": results["results"].get(task),
        "config": results.get("configs", {}).get(task),
        "version": version,
        "n-shot": shots,
        "fewshot_seed": FEWSHOT_SEED,
        "harness_version": lm_eval.__version__,
        "limit": limit,
    }
    text = json.dumps(kept, indent=1, sort_keys=True, default=str) + "\n"
    with store.batch():
        store.log(node, values)
        store.put(node, f"eval-{task}", f"eval-{task}.json", text.encode())
    return values


def _shown(task: str, values: dict[str, Any]) -> str:
    return ", ".join(
        f"{k.rsplit('/', 1)[1]} {v:.4g}"
        for k, v in values.items()
        if k.startswith(f"eval/{task}/") and not k.endswith(("version", "seed", "fewshot"))
    )


def evaluate_node(
    root: str | Path,
    target: str,
    tasks: list[str],
    *,
    include_path: str | None = None,
    num_fewshot: int | None = None,
    limit: int | None = None,
    batch_size: int | None = None,
    force: bool = False,
    over: bool = False,
    echo: Callable[[str], Any] = print,
) -> dict[str, dict[str, dict[str, float]]]:
    """Run `tasks` on TARGET's checkpoint under `root` (every checkpoint of its lineage with
    `over`) and keep the results on each node.

    Every process runs the harness on the same requests (the model's programs are
    collective across hosts); process 0 writes the results.

    Returns:
        node (`name~nonce~seq`) -> task -> the numeric values written (skipped tasks
        and nodes are absent).

    Raises:
        EvaluationError: no store, an unknown task, a task that needs a download, or bad
            settings.
    """
    import lm_eval

    from theseus.analysis.evaluation._harness import TheseusLM, stored
    from theseus.cli import open_trainer, target_node
    from theseus.job import from_host_zero, store_root
    from theseus.quick import quick
    from theseus.store import Node, Store

    say = echo if is_primary() else (lambda line: None)
    _quiet()
    root = stored(root)  # the Theseus root (its data/ holds the synthetic language)
    manager = task_manager(root, include_path, tasks)
    check_tasks(manager, tasks, include_path)
    with Store(store_root(root)) as store:  # what to do, before a model is opened
        nodes = (
            from_host_zero(lambda: _lineage_checkpoints(store, target))
            if over
            else [from_host_zero(lambda: target_node(store, target))]
        )
        plan: list[tuple[Node, list[str]]] = []
        for node in nodes:
            held = from_host_zero(functools.partial(store.values, node))
            todo = [task for task in tasks if force or not _done(held, task)]
            skipped = [task for task in tasks if task not in todo]
            if skipped:
                say(
                    f"{node.serialize()}: {', '.join(skipped)} already there, skipped "
                    "(--force runs it again)"
                )
            if todo:
                plan.append((node, todo))
    if not plan:
        return {}
    with quick(root) as q:
        trainer: Any = open_trainer(q, plan[0][0].serialize())
        store = q.store
        model = TheseusLM(trainer=trainer, batch_size=batch_size)
        written: dict[str, dict[str, dict[str, float]]] = {}
        ahead = process_count() == 1  # across hosts, restores synchronize: keep their order
        started = time.perf_counter()
        with ThreadPoolExecutor(1, thread_name_prefix="theseus-eval-read") as pool:
            pending = None
            for index, (node, todo) in enumerate(plan):
                if node != trainer.node:
                    saved = pending.result() if pending is not None else None
                    trainer.restore_node(node, saved)
                following = plan[index + 1][0] if index + 1 < len(plan) else None
                pending = (
                    pool.submit(
                        lambda n: trainer.read_checkpoint(trainer.checkpoint_path(n)), following
                    )
                    if ahead and following is not None and following != trainer.node
                    else None
                )
                say(f"evaluating {', '.join(todo)} on {node.serialize()} ...")
                results = lm_eval.simple_evaluate(
                    model=model, tasks=todo, num_fewshot=num_fewshot, limit=limit,
                    task_manager=manager, torch_random_seed=None, fewshot_random_seed=FEWSHOT_SEED,
                )  # fmt: skip
                for task in todo:
                    if is_primary():
                        values = _write(store, node, task, results, limit)
                    else:
                        values = dict(metric_values(task, results["results"].get(task, {})))
                    written.setdefault(node.serialize(), {})[task] = {
                        k: v for k, v in values.items() if isinstance(v, float)
                    }
                    say(f"{task}: {_shown(task, values)}")
                if over:
                    elapsed = time.perf_counter() - started
                    left = elapsed / (index + 1) * (len(plan) - index - 1)
                    say(
                        f"checkpoint {index + 1}/{len(plan)} (seq {node.seq}) done, elapsed "
                        f"{elapsed:.1f} s, ETA {left:.1f} s"
                    )
        if over:
            say(
                f"evaluated {len(plan)} of {len(nodes)} checkpoint(s) of "
                f"{nodes[0].name}~{nodes[0].nonce}; the browser draws eval/TASK/METRIC over them"
            )
    return written


@click.command("eval")
@root_argument(create=False)
@click.argument("target")
@click.option("--tasks", required=True, help="Comma-separated lm-eval task names.")
@click.option(
    "--include-path",
    type=click.Path(exists=True, file_okay=False),
    help="A folder of task YAML files (local data, no download).",
)
@click.option("--num-fewshot", type=click.IntRange(0, 10_000), help="Few-shot examples.")
@click.option("--limit", type=click.IntRange(1, 2**31 - 1), help="Documents per task at most.")
@click.option("--batch-size", type=click.IntRange(1, 65_536), help="Rows per compiled call.")
@click.option("--over", is_flag=True, help="Evaluate every checkpoint of TARGET's lineage.")
@click.option("--force", is_flag=True, help="Evaluate again tasks the node holds already.")
@click.option(
    "--progress-bars", is_flag=True, help="Show lm-eval's and datasets' progress bars too."
)
@cluster_options
@common_options
def eval_command(
    root: Path,
    target: str,
    tasks: str,
    include_path: str | None,
    num_fewshot: int | None,
    limit: int | None,
    batch_size: int | None,
    over: bool,
    force: bool,
    progress_bars: bool,
) -> None:
    """Run lm-evaluation-harness TASKS on TARGET's checkpoint under ROOT; keep the results.

    TARGET is a node, a lineage (its latest checkpoint; with --over, all of them) or a
    run's name. Each metric becomes a value `eval/TASK/METRIC` on the node, and the
    harness's results the artifact `eval-TASK`. Besides lm-eval's tasks (local data
    only), `synthetic_mc` and `synthetic_ppl` test the synthetic language.
    """
    names = [t.strip() for t in tasks.split(",")]
    if not all(names):
        raise click.BadParameter(f"{tasks!r} has an empty task name", param_hint="--tasks")
    if not progress_bars:
        quiet_progress_bars()  # before lm-eval and datasets are imported
    try:
        import lm_eval  # noqa: F401
    except ImportError:
        raise click.ClickException(
            'theseus eval needs lm-evaluation-harness: pip install "theseus-analysis[eval]"'
        ) from None
    evaluate_node(
        root, target, names, include_path=include_path, num_fewshot=num_fewshot, limit=limit,
        batch_size=batch_size, force=force, over=over, echo=click.echo,
    )  # fmt: skip
