"""What the drift and memorization tests share: a store's snapshot and one `--over` walk."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from theseus.quick import quick
from theseus.store import Store


def snapshot(root: Path) -> dict[str, object]:
    """Every node's values and its artifacts' versions: what a second walk must not change."""
    with Store(root / "store") as store:
        return {
            n.serialize(): (store.values(n), {k: a.version for k, a in store.get(n).items()})
            for n in store.query().all()
        }


def walk(root: Path, run: str, cls: type, **settings: object) -> tuple[Any, Any]:
    """`cls` over the lineage of `run` (as `theseus run look ... --over`): the job, its result."""
    with quick(root) as q:
        q.build(cls, "look")
        q.find().spec(run=run).over()
        for key, value in settings.items():
            q.config[key] = value
        job = q.create()
        return job, job()
