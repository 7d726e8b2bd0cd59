"""``JobSpec``: who a job is (project, group, run) and where its files go (root)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from theseus.store import Node, bind_root

STORE_DIR = "store"
# Named for what it holds, so a root called `results` (as in `quick("./results")`)
# does not become results/results/.
ANALYSES_DIR = "analyses"


def store_root(root: str | os.PathLike[str]) -> Path:
    """The folder of the theseus-store under a Theseus root: ``ROOT/store``.

    A root holds everything of its runs: ``store/`` (the lineage database),
    ``data/`` (prepared datasets), ``analyses/`` (the files analyses write) and
    ``checkpoints/``. A root given as its store folder (``ROOT/store``) is ROOT, and one
    given as ``postgresql://USER@HOST:PORT/DB?files=DIR`` is the folder DIR, whose store
    keeps its rows in that database (``theseus.store.bind_root``).
    """
    return bind_root(root) / STORE_DIR


@dataclasses.dataclass(frozen=True)
class JobSpec:
    """The identity of a job run and the root folder it writes under.

    Args:
        name: the run name (the last part of the node name ``project.group.run``).
        root: the root folder (store, checkpoints, prepared data, results), its store
            folder, or a ``postgresql://`` URL (``theseus.store.bind_root``).
        project: the project name; ``None`` means ``general``.
        group: the group name; ``None`` means ``default``.

    Raises:
        theseus.store.InvalidNodeError: a name part is not ASCII letters, digits, ``_`` or ``-``.

    Example:
        >>> import tempfile
        >>> root = tempfile.mkdtemp()
        >>> spec = JobSpec("inspect", root=root)
        >>> spec.result("activation.pdf").relative_to(root).as_posix()
        'analyses/general/default/inspect/activation.pdf'
    """

    name: str
    root: Path
    project: str = "general"
    group: str = "default"

    def __init__(
        self,
        name: str,
        root: str | os.PathLike[str] = ".",
        project: str | None = None,
        group: str | None = None,
    ) -> None:
        node = Node.new(name, project=project, group=group)  # validates every part
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "root", bind_root(root))
        object.__setattr__(self, "project", node.project)
        object.__setattr__(self, "group", node.group)

    @property
    def run(self) -> str:
        """The run name (same as :attr:`name`)."""
        return self.name

    def result(self, *parts: str) -> Path:
        """A path under ``ROOT/analyses/<project>/<group>/<run>/``; its folder is created.

        Args:
            *parts: path components below the run's result folder.

        Returns:
            The path (the folder itself when no parts are given).
        """
        folder = self.root / ANALYSES_DIR / self.project / self.group / self.name
        path = folder.joinpath(*parts)
        (path if not parts else path.parent).mkdir(parents=True, exist_ok=True)
        return path
