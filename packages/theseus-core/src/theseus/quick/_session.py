"""``quick(root)``: build, configure, select a base and create a job in a few lines."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from theseus.config import Tree, load
from theseus.job import (
    BasicJob,
    CheckpointWalker,
    JobSpec,
    from_host_zero,
    is_primary,
    open_store,
    process_count,
    process_index,
    store_root,
    sync_hosts,
)
from theseus.quick._find import Finder, QuickError
from theseus.registry import resolve_job
from theseus.store import MARKER, Node, NotAStoreError, Store, bind_root


class Quick:
    """A session over one root folder: its store, at most one job being built, a base node.

    Use ``with quick(root) as q:`` or, in a notebook, ``q = init(root)`` ...
    ``q.close()``. The order of :meth:`build` and :meth:`find` does not matter.

    Args:
        root: the root folder (created if absent); its store is ``ROOT/store``. Its
            store folder or a ``postgresql://`` URL name the same root (``bind_root``).
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = bind_root(root)
        self._made = _missing(self.root)  # folders this session creates (removed if unused)
        self.store = _open_store(store_root(self.root))
        self._job: type[BasicJob] | None = None
        self._spec: JobSpec | None = None
        self._tree: Tree | None = None
        self._base: Node | None = None
        self._resume = False
        self._over: tuple[list[Node], bool] | None = None  # (checkpoints, force) of over()
        self._saved: dict[str, object] | None = None

    def build(
        self,
        job: type[BasicJob] | str,
        run_name: str,
        project: str | None = None,
        group: str | None = None,
    ) -> Tree:
        """Choose the job to create and compose its configuration into :attr:`config`.

        Args:
            job: a job class (registered or not) or a registered job name.
            run_name: the run name of the job's spec.
            project: the project (default ``general``).
            group: the group (default ``default``).

        Returns:
            :attr:`config`, the job's composed configuration.

        Raises:
            QuickError: ``job`` is not a :class:`BasicJob` subclass.
            theseus.registry.UnknownNameError: no job has that name.
        """
        cls = resolve_job(job)
        if not (isinstance(cls, type) and issubclass(cls, BasicJob)):
            raise QuickError(
                f"q.build() expects a job class (a subclass of theseus.job.BasicJob) or a "
                f"registered job name; got {job!r}."
            )
        if self._over is not None:
            _check_walker(cls)
        self._job = cls
        self._spec = JobSpec(run_name, root=self.root, project=project, group=group)
        self._tree = cls.schema()
        if self._saved is not None:
            self._tree.load(self._saved, strict=False)
        return self._tree

    @property
    def config(self) -> Tree:
        """The composed configuration of the built job (assign by path or attribute).

        Raises:
            QuickError: before :meth:`build`.
        """
        if self._tree is None:
            raise QuickError(
                "q.config exists once a job is chosen: call q.build(JobClass, run_name) first."
            )
        return self._tree

    @property
    def base(self) -> Node | None:
        """The node selected by ``find()...resume()`` or ``...branch()``, if any."""
        return self._base

    def find(self) -> Finder:
        """A query over the store's nodes, ending in ``.resume()``/``.branch()`` or a terminal.

        Across hosts every host calls it the same way; host zero runs the query and the
        others receive its answer (they never open the database).
        """
        return Finder(self)

    def _select(self, node: Node, resume: bool) -> Node:
        self._base, self._resume, self._over = node, resume, None
        self._load_saved(node)
        return node

    def _select_over(self, nodes: list[Node], force: bool) -> list[Node]:
        if self._job is not None:
            _check_walker(self._job)
        self._base, self._resume, self._over = nodes[0], True, (nodes, force)
        self._load_saved(nodes[-1])  # as `--resume name~nonce` reads a lineage
        return nodes

    def _load_saved(self, node: Node) -> None:
        saved = from_host_zero(lambda: self.store.job_config(node))
        self._saved = load(saved) if saved is not None else {}
        if self._tree is not None:
            self._tree.load(self._saved, strict=False)

    def create(self) -> BasicJob:
        """Construct the job and set it up (fresh, branch or resume, as selected); do not run it.

        After ``find()...over()`` the job is resumed at the lineage's first checkpoint
        and calling it walks them all (see :meth:`Finder.over`).

        Returns:
            The job; call it (``job()``) to run it.

        Raises:
            QuickError: before :meth:`build`.
            ConfigError: a required setting has no value.
        """
        if self._job is None or self._spec is None:
            raise QuickError("q.create() needs a job: call q.build(JobClass, run_name) first.")
        job = self._job(self._spec, base=self._base, config=self.config, store=self.store)
        job.setup(resume=self._resume)
        if self._over is not None:
            nodes, force = self._over
            assert isinstance(job, CheckpointWalker), "checked when built and selected"
            job.over(nodes, force=force)
        return job

    def close(self) -> None:
        """Close the store."""
        self.store.close()

    def discard(self) -> None:
        """Close the store; if this session created it and nothing was recorded, delete it.

        Called when the session ends with an error, so a failed run on a new root
        (a misspelt setting, say) leaves no empty store and no empty folders behind.
        """
        if self.store.discard_if_empty():
            for folder in reversed(self._made):
                with contextlib.suppress(OSError):
                    folder.rmdir()  # only when empty

    def __enter__(self) -> Quick:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self.discard()


def _check_walker(cls: type[BasicJob]) -> None:
    """Refuse `over()` for a job that cannot walk checkpoints (a trainer), before any work."""
    if not issubclass(cls, CheckpointWalker):
        raise QuickError(
            f"over() runs an analysis over every checkpoint of a lineage, but {cls.__name__} "
            "is not an analysis (it has no over()): build an analysis job (a subclass of "
            "theseus.analysis.AnalysisBase), or select one node with .resume() or .branch()."
        )


def _missing(root: Path) -> list[Path]:
    """`root` and those of its parents that do not exist yet, outermost first."""
    missing = []
    for folder in [root.absolute(), *root.absolute().parents]:
        if folder.exists():
            break
        missing.append(folder)
    return missing[::-1]


def _open_store(path: Path) -> Store:
    """Open (or create) the store; across hosts, host zero creates it and the others wait.

    Raises:
        NotAStoreError: on a host other than zero, when the store host zero opened is not
            visible there (the hosts do not share `ROOT`).
    """
    if process_count() == 1:
        return Store(path)
    if is_primary():
        store = Store(path)
        sync_hosts("theseus/quick/store")
        return store
    sync_hosts("theseus/quick/store")
    if not (path / MARKER).is_file():  # a look at the folder; the database stays unopened
        raise NotAStoreError(
            f"host {process_index()} cannot see the store that host zero opened at {path} "
            f"(no {MARKER} there). Every host needs the same ROOT, on a file system they share."
        )
    return open_store(path)


def init(root: str | os.PathLike[str]) -> Quick:
    """Open a quick session (for notebooks); call ``q.close()`` when done."""
    return Quick(root)


@contextlib.contextmanager
def quick(root: str | os.PathLike[str]) -> Iterator[Quick]:
    """``with quick(root) as q:`` opens a session and closes it at the end of the block.

    Example:
        >>> import tempfile
        >>> with quick(tempfile.mkdtemp()) as q:
        ...     q.find().count()
        0
    """
    session = Quick(root)
    try:
        yield session
    except BaseException:
        session.discard()
        raise
    session.close()
