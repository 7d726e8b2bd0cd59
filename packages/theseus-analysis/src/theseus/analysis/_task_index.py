"""Which lm-evaluation-harness tasks a name stands for, and whether their data would be
downloaded: the task index `theseus eval` reads (lm-eval's `TaskManager`).

lm-eval's whole index parses its 14,000 task YAML files (about 11 s here), so
`task_manager` indexes only what the tasks asked for need: the synthetic language's
folder and `--include-path` when they hold every task, else lm-eval's folders that
define the tasks (found by reading the files as text), else everything. Each index is
kept for the process. `needs_download` and `check_tasks` refuse, in one line, a task
whose data lives on the Hugging Face Hub.
"""

from __future__ import annotations

import difflib
import functools
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["LOCAL_BUILDERS", "check_tasks", "needs_download", "task_manager"]

#: the `datasets` builders that read the files a task names (no download)
LOCAL_BUILDERS = {"json", "csv", "parquet", "text", "arrow", "pandas"}


def task_manager(root: str | Path, include_path: str | None, tasks: Sequence[str] = ()) -> Any:
    """lm-eval's tasks with the shipped synthetic ones and `include_path`; the synthetic
    tasks get ROOT's language when ROOT holds prepared synthetic data.

    Indexing lm-eval's own folder (about 14,000 YAML files) takes 10 s or more, so when
    every one of `tasks` is a task of the two local folders, only they are indexed; else,
    when lm-eval's folders that define them (found by reading the files as text) define
    every task and group member they name, only those folders are added (`_defining`);
    else, as for an unknown task, the whole folder. Each index is kept for the process
    (made again when a YAML file of `include_path` changes).
    """
    from theseus.analysis.evaluation import TASKS
    from theseus.data.datasets import Synthetic

    metadata: tuple[tuple[str, Any], ...] = ()
    try:
        language = Synthetic.language(root)
    except Exception:  # no synthetic data under ROOT: the language's defaults
        language = None
    if language is not None:
        metadata = tuple(
            (name, getattr(language, name))
            for name in ("alphabet", "order", "concentration", "smoothing", "mean_doc_len", "seed")
        )
    paths = (str(TASKS), *([str(Path(include_path).resolve())] if include_path else []))
    stamp = tuple(
        sorted((str(f), f.stat().st_mtime_ns) for f in Path(include_path or TASKS).rglob("*.y*ml"))
    )
    if tasks:
        local = _manager(paths, metadata, stamp, False)
        if all(str(getattr(local.task_index.get(t), "kind", "")).endswith("TASK") for t in tasks):
            return local
        folders = _defining(tuple(tasks), local, (paths, metadata, stamp))
        if folders:
            return _manager((*folders, *paths), metadata, stamp, False)  # made by _defining
    return _manager(paths, metadata, stamp, True)


def _defining(
    tasks: tuple[str, ...], local: Any, scope: tuple[Any, Any, Any], rounds: int = 4
) -> tuple[str, ...]:
    """Folders of lm-eval's task folder whose YAML files define each of `tasks` (a task or
    a group, not a tag: a tag's members can be anywhere) and, for a group, every member,
    as far down as it goes; () when any of them is not found that way.

    A definition is a line `task: NAME` or `group: NAME` (quoted or not) at the top
    level of a file, found by reading the files as bytes (a fraction of a second, where
    lm-eval's index parses every file as YAML); the folders found are then indexed as
    lm-eval would, after them `local`'s folders with its language and stamp (`scope`:
    `_manager`'s other arguments), which makes the index `task_manager` then returns.
    """
    import lm_eval.tasks

    if not all(tasks):
        return ()
    files = sorted(Path(lm_eval.tasks.__file__).parent.rglob("*.yaml"))
    folders: set[str] = set()
    wanted = [t for t in tasks if t not in local.task_index]
    index: dict[str, Any] = dict(local.task_index)
    for _ in range(rounds):
        if not wanted:
            break
        lines = {
            name: re.compile(
                rb"^['\"]?(?:task|group)['\"]?[ \t]*:[ \t]*['\"]?"
                + re.escape(name.encode())
                + rb"['\"]?[ \t]*$",
                re.M,
            )
            for name in wanted
        }
        found: dict[str, set[str]] = {name: set() for name in wanted}
        for file in files:
            text = file.read_bytes()
            for name, line in lines.items():
                if name.encode() in text and line.search(text):
                    found[name].add(str(file.parent))
        if not all(found.values()):
            return ()
        folders |= {folder for where in found.values() for folder in where}
        paths, metadata, stamp = scope
        index = dict(_manager((*_in_order(folders), *paths), metadata, stamp, False).task_index)
        wanted = sorted({m for t in tasks for m in _members(index, t, set()) if m not in index})
    named = {*tasks, *(m for t in tasks for m in _members(index, t, set()))}
    if wanted or any(
        n not in index or str(index[n].kind.name) not in ("TASK", "PY_TASK", "GROUP") for n in named
    ):
        return ()
    return _in_order(folders)


def _in_order(folders: set[str]) -> tuple[str, ...]:
    """`folders` as lm-eval's roots that index what its whole index would for the names
    they define: a folder inside another left out, and in the reverse of the order in
    which lm-eval's index visits them (it reads one root's files in path order and the
    first definition of a name wins; of several roots the last wins)."""
    top = [f for f in folders if not any(f.startswith(g + "/") for g in folders)]
    return tuple(sorted(top, key=lambda f: f + "/", reverse=True))


def _members(index: dict[str, Any], name: str, seen: set[str]) -> list[str]:
    """Every task and group name below group `name` in `index` (names not in it included,
    so the caller can look for them)."""
    entry = index.get(name)
    if entry is None or name in seen or str(entry.kind.name) != "GROUP":
        return []
    seen.add(name)
    return [n for m in _listed(entry.cfg or {}) if m for n in (m, *_members(index, m, seen))]


def _listed(config: dict[str, Any]) -> list[str]:
    """The names a group's configuration lists under `task` (each a name, or a mapping
    whose `task` is one)."""
    return [m if isinstance(m, str) else m.get("task", "") for m in config.get("task") or []]


@functools.lru_cache(maxsize=8)
def _manager(
    paths: tuple[str, ...], metadata: tuple[tuple[str, Any], ...], stamp: object, defaults: bool
) -> Any:
    """One `TaskManager` per folder list, language, state of the YAML files and scope."""
    from lm_eval.tasks import TaskManager

    return TaskManager(
        include_path=list(paths), include_defaults=defaults, metadata=dict(metadata) or None
    )


def _leaves(manager: Any, name: str, seen: set[str]) -> list[dict[str, Any]]:
    """The configurations of the tasks `name` (a task, group or tag) stands for."""
    entry = manager.task_index.get(name)
    if entry is None or name in seen:
        return []
    seen.add(name)
    config = entry.cfg or {}
    kind = str(entry.kind.name)
    if kind in ("TASK", "PY_TASK"):
        return [config]
    if kind == "TAG":
        members = [n for n, e in manager.task_index.items() if name in (e.tags or ())]
    else:
        members = _listed(config)
    return [leaf for member in members for leaf in _leaves(manager, member, seen)]


def needs_download(manager: Any, name: str) -> str | None:
    """Where task `name`'s data would come from when it is not a local file, else None."""
    import os

    if os.environ.get("HF_DATASETS_OFFLINE") == "1":  # the user's own cached copies
        return None
    for config in _leaves(manager, name, set()):
        if config.get("custom_dataset") is not None:
            continue
        path = config.get("dataset_path")
        if path is None or (isinstance(path, str) and Path(path).expanduser().is_dir()):
            continue
        files = (config.get("dataset_kwargs") or {}).get("data_files")
        if path in LOCAL_BUILDERS and files is not None:
            continue
        return str(path)
    return None


def check_tasks(manager: Any, tasks: list[str], include_path: str | None) -> None:
    """Refuse unknown tasks and tasks whose data would be downloaded, in one line."""
    from theseus.analysis.evaluation import EvaluationError

    unknown = [task for task in tasks if task not in manager.all_tasks]
    if unknown:
        close = {
            task: difflib.get_close_matches(task, manager.all_tasks, n=3, cutoff=0.75)
            for task in unknown
        }
        hints = "; ".join(
            f"{task}: did you mean {' or '.join(near)}?" for task, near in close.items() if near
        )
        raise EvaluationError(
            f"task(s) {', '.join(unknown)} are not in lm-eval's task folder"
            + (f" nor in {include_path}" if include_path else "")
            + (f" ({hints})" if hints else "")
            + "; `lm_eval ls tasks` lists them, --include-path adds a folder of task YAML"
        )
    for task in tasks:
        source = needs_download(manager, task)
        if source is not None:
            raise EvaluationError(
                f"task {task} reads its data from {source!r}, which needs a download, and "
                "Theseus downloads nothing; put the data in local files and name them in a "
                "task YAML (dataset_path: json, dataset_kwargs: data_files) passed with "
                "--include-path, or set HF_DATASETS_OFFLINE=1 to use a copy already in the "
                "Hugging Face cache"
            )
