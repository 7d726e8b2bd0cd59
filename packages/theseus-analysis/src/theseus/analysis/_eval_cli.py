"""`theseus eval ROOT TARGET --tasks ...`: lm-evaluation-harness tasks on a node, kept there.

The node's checkpoint is opened as `theseus sample` opens it, its model handed to the
harness as `TheseusLM`, and each task's metrics written as values on the node:
`eval/TASK/METRIC` (the harness's metric name without its filter, `acc`, `acc_norm`,
`bits_per_byte`, ...) and `eval/TASK/METRIC_stderr`, with `eval/TASK/version`,
`eval/TASK/num_fewshot`, `eval/TASK/fewshot_seed` and `eval/harness_version`; the
harness's results for the task (its metrics, configuration, versions) are the artifact
`eval-TASK` (JSON). A task the node holds values for already is skipped unless
`--force`. Tasks come from lm-eval's own folder or `--include-path` (task YAML with
`dataset_path: json` and local `data_files` needs no network).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from theseus.cli import common_options
from theseus.job import store_root
from theseus.store import Node, Store

__all__ = ["FEWSHOT_SEED", "eval_command", "evaluate_node", "metric_values"]

#: the few-shot sampler's seed (lm-eval's default), recorded with every result
FEWSHOT_SEED = 1234


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
    echo: Any = print,
) -> dict[str, dict[str, float]]:
    """Run `tasks` on TARGET's checkpoint under `root` and keep the results on its node.

    Returns:
        task -> the values written (skipped tasks are absent).

    Raises:
        EvaluationError: no store, an unknown task, or bad settings.
    """
    import lm_eval
    from lm_eval.tasks import TaskManager

    from theseus.analysis.evaluation._harness import EvaluationError, TheseusLM, open_trainer_at

    manager = TaskManager(include_path=include_path)
    unknown = [task for task in tasks if task not in manager.all_tasks]
    if unknown:
        raise EvaluationError(
            f"task(s) {', '.join(unknown)} are not in lm-eval's task folder"
            + (f" nor in {include_path}" if include_path else "")
            + "; `lm_eval ls tasks` lists them, --include-path adds a folder of task YAML"
        )
    trainer = open_trainer_at(str(root), target)
    node = Node(trainer.node.name, trainer.node.nonce, trainer.node.seq)
    with Store(store_root(root)) as store:
        held = store.values(node)
    todo = []
    for task in tasks:
        if not force and any(key.startswith(f"eval/{task}/") for key in held):
            echo(f"{task}: already on {node.serialize()}, skipped (--force runs it again)")
        else:
            todo.append(task)
    if not todo:
        return {}
    echo(f"evaluating {', '.join(todo)} on {node.serialize()} ...")
    results = lm_eval.simple_evaluate(
        model=TheseusLM(trainer=trainer, batch_size=batch_size),
        tasks=todo,
        num_fewshot=num_fewshot,
        limit=limit,
        task_manager=manager,
        torch_random_seed=None,
        fewshot_random_seed=FEWSHOT_SEED,
    )
    written: dict[str, dict[str, float]] = {}
    for task in todo:
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
            "version": results.get("versions", {}).get(task),
            "n-shot": shots,
            "fewshot_seed": FEWSHOT_SEED,
            "harness_version": lm_eval.__version__,
            "limit": limit,
        }
        text = json.dumps(kept, indent=1, sort_keys=True, default=str) + "\n"
        with Store(store_root(root)) as store:
            store.log(node, values)
            store.put(node, f"eval-{task}", f"eval-{task}.json", text.encode())
        written[task] = {k: v for k, v in values.items() if isinstance(v, float)}
        shown = ", ".join(
            f"{k.rsplit('/', 1)[1]} {v:.4g}"
            for k, v in values.items()
            if k.startswith(f"eval/{task}/") and not k.endswith(("version", "seed", "fewshot"))
        )
        echo(f"{task}: {shown}")
    return written


@click.command("eval")
@click.argument("root", type=click.Path(file_okay=False, path_type=Path))
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
@click.option("--force", is_flag=True, help="Evaluate again tasks the node holds already.")
@common_options
def eval_command(
    root: Path,
    target: str,
    tasks: str,
    include_path: str | None,
    num_fewshot: int | None,
    limit: int | None,
    batch_size: int | None,
    force: bool,
) -> None:
    """Run lm-evaluation-harness TASKS on TARGET's checkpoint under ROOT; keep the results.

    TARGET is a node, a lineage (its latest checkpoint) or a run's name. Each metric
    becomes a value `eval/TASK/METRIC` on the node, and the harness's results the
    artifact `eval-TASK`.
    """
    names = [t.strip() for t in tasks.split(",")]
    if not all(names):
        raise click.BadParameter(f"{tasks!r} has an empty task name", param_hint="--tasks")
    try:
        import lm_eval  # noqa: F401
    except ImportError:
        raise click.ClickException(
            'theseus eval needs lm-evaluation-harness: pip install "theseus-analysis[eval]"'
        ) from None
    evaluate_node(
        root, target, names, include_path=include_path, num_fewshot=num_fewshot, limit=limit,
        batch_size=batch_size, force=force, echo=click.echo,
    )  # fmt: skip
