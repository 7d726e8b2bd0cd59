"""``BasicJob``: the lifecycle every job shares (construct, set up, run, tick, finish).

Construction reads configuration only. ``setup(resume=False)`` picks the live
node in one of three modes and records the run; ``tick()`` moves the live node
to its successor; ``__call__`` synchronizes hosts, sets up, runs and finishes,
and records the outcome (``job/name``, ``job/module``, ``job/status`` and, on
failure, ``job/error``, in one record) on the node where the job started and on its last
live node. A new lineage's node says ``setting up`` while its setup runs and ``ready``
once it is done, so a process killed while setting up leaves a node that says so.
Inside setup and ``__call__``, Ctrl-C, SIGTERM and SIGHUP stop the job at a safe point,
recorded, with exit code 128 + signum (``theseus.job._signals``). Only host zero writes
to the store.
"""

from __future__ import annotations

import abc
import contextlib
import enum
import sys
from collections.abc import Iterator
from typing import Any, ClassVar, TypeVar

from theseus.config import Tree, configure, dump, load, using
from theseus.job._errors import JobError
from theseus.job._hosts import agree_on_nonce, from_host_zero, is_primary, open_store, sync_hosts
from theseus.job._signals import Preempted, deferred_stop, stop_on_signals
from theseus.job._slurm import ScheduledJob, current_scheduled
from theseus.job._spec import JobSpec, store_root
from theseus.registry import job_key
from theseus.store import Node, Store

T = TypeVar("T")


class Mode(enum.StrEnum):
    """How ``setup()`` chose the live node."""

    FRESH = "fresh"  # a new lineage at seq 0
    BRANCH = "branch"  # a new lineage whose first node's parent is the base
    RESUME = "resume"  # the live node is the base itself


def describe(exc: BaseException) -> str:
    """What `job/error` records for `exc`: its class and message (Ctrl-C says so: a
    KeyboardInterrupt has no message of its own)."""
    if isinstance(exc, KeyboardInterrupt) and not str(exc):
        return "KeyboardInterrupt: stopped by Ctrl-C (SIGINT)"
    return f"{type(exc).__name__}: {exc}"


def module_of(cls: type) -> str:
    """What `--import` takes to register `cls` again: its module's dotted name, or the
    module's file when the name is made up (`__main__`, a file `--import`ed under a
    `theseus_user_*` name), which no import by name would find."""
    name = cls.__module__
    file = getattr(sys.modules.get(name), "__file__", None)
    if file and (name == "__main__" or name.startswith("theseus_user_")):
        return str(file)
    return name


class BasicJob(abc.ABC):
    """The base of every job: override :meth:`run`; name its dataclass in ``CONFIG``.

    Args:
        spec: who the run is and where it writes (:class:`JobSpec`).
        base: a node to branch from or resume (``setup(resume=...)`` decides).
        config: the composed configuration; ``None`` composes the defaults
            (and, with ``base``, loads the configuration saved in its lineage).
        store: the store to use; ``None`` opens ``Store(ROOT/store)`` when first needed.

    Raises:
        ConfigError: a required setting has no value.
        ConfigError: the configuration does not compose or hydrate.

    Attributes:
        args: ``CONFIG`` hydrated from the configuration (``None`` without ``CONFIG``).
        configuration: the composed :class:`~theseus.config.Tree`.
        spec, base: as given.
    """

    CONFIG: ClassVar[type | None] = None
    #: False (most jobs): resuming a node continues its run, so the job's run is that
    #: node's. True: resuming works on a node of another run and writes this job's own
    #: results beside it (an analysis of a checkpoint); `theseus run RUN --resume NODE`
    #: then takes RUN as this job's own name.
    RESUME_ATTACHES: ClassVar[bool] = False

    @classmethod
    def config(cls) -> list[type]:
        """The configuration dataclasses this job composes, ``CONFIG`` first.

        Subclasses that declare components extend it:
        ``return [*super().config(), *cls.MODEL.gather()]``.
        """
        return [cls.CONFIG] if cls.CONFIG is not None else []

    @classmethod
    def schema(cls) -> Tree:
        """A fresh tree of this job's composed configuration with its defaults."""
        return Tree.of(*cls.config(), own=cls.CONFIG, job=job_key(cls))

    def __init__(
        self,
        spec: JobSpec,
        base: Node | None = None,
        *,
        config: Tree | None = None,
        store: Store | None = None,
    ) -> None:
        if not isinstance(spec, JobSpec):
            raise JobError(
                f"{type(self).__name__} expects a JobSpec as its first argument; got "
                f"{type(spec).__name__}. Build one with JobSpec(run_name, root=...)."
            )
        if base is not None and not isinstance(base, Node):
            raise JobError(
                f"base= must be a theseus.store.Node (e.g. from q.find()...first()); got "
                f"{type(base).__name__}."
            )
        self.spec = spec
        self.base = base
        #: The scheduler job this process runs in (``theseus run --scheduler-job``), or None.
        self.scheduled: ScheduledJob | None = current_scheduled()
        self._store = store
        self._owns_store = store is None
        if config is None:
            tree = self.schema()
            if base is not None:
                saved = from_host_zero(lambda: self.store.job_config(base))
                if saved is not None:
                    tree.load(load(saved), strict=False)
                    tree.job = job_key(type(self))
        else:
            tree = config.copy()
            tree.job = job_key(type(self))
        tree.validate()
        self.configuration = tree
        self.args: Any = configure(self.CONFIG, tree) if self.CONFIG is not None else None
        self._node: Node | None = None
        self._start: Node | None = None
        self._mode: Mode | None = None
        self._record_on_tick = False

    # ------------------------------------------------------------------ access
    @property
    def store(self) -> Store:
        """The store at ``ROOT/store`` (opened on first use; on host zero only, see `open_store`)."""
        if self._store is None:
            self._store = open_store(store_root(self.spec.root))
        return self._store

    @property
    def node(self) -> Node:
        """The live node. Raises :class:`JobError` before ``setup()``."""
        if self._node is None:
            raise JobError(
                f"{type(self).__name__} has no node yet: call job.setup() (or run the job, "
                "or build it with q.create()) first."
            )
        return self._node

    @property
    def mode(self) -> Mode | None:
        """How setup chose the node (``None`` before setup)."""
        return self._mode

    def configure(self, cls: type[T]) -> T:
        """Hydrate a dataclass from this job's configuration (see :func:`theseus.config.configure`)."""
        return configure(cls, self.configuration)

    @contextlib.contextmanager
    def activated(self) -> Iterator[Tree]:
        """Make this job's configuration the active one inside a ``with`` block."""
        with using(self.configuration) as tree:
            yield tree

    def log(self, values: dict[str, Any]) -> None:
        """Record scalar values on the live node (host zero only)."""
        if is_primary():
            self.store.log(self.node, values)

    # --------------------------------------------------------------- lifecycle
    def setup(self, resume: bool = False) -> Node:
        """Choose the live node and prepare the job; calling it again does nothing.

        No base: fresh (a new lineage). Base and ``resume=False``: branch (a new
        lineage whose first node's parent is the base). Base and ``resume=True``:
        resume (the live node is the base). Fresh and branch record the
        composed configuration at the new node; resume records it at the first
        tick if it differs from the saved one.

        Args:
            resume: continue the base itself instead of branching from it.

        Returns:
            The live node.

        Raises:
            JobError: ``resume=True`` without a base, or a second call that asks
                for a different mode.
        """
        wanted = Mode.FRESH if self.base is None else (Mode.RESUME if resume else Mode.BRANCH)
        if self._mode is not None:
            if wanted is not self._mode:
                raise JobError(
                    f"{type(self).__name__} is already set up in {self._mode.value} mode at "
                    f"{self.node}; setup(resume={resume}) asks for {wanted.value}. Construct "
                    "a new job to use another mode."
                )
            return self.node
        if resume and self.base is None:
            raise JobError(
                f"setup(resume=True) needs a base node to resume, and {type(self).__name__} "
                "was built without base=. Pass base=NODE (q.find()...resume() does), or "
                "call setup() for a fresh run."
            )
        with stop_on_signals():  # Ctrl-C or SIGTERM while setting up is recorded too
            return self._set_up(wanted)

    def _set_up(self, mode: Mode) -> Node:
        """`setup`'s work: choose the node, then `on_setup`, each outcome recorded.

        A new lineage says `job/status = setting up` before `on_setup` starts and
        `ready` once it is done, so a process killed in between (out of memory, SIGKILL)
        leaves a node that says so; what `on_setup` raises is recorded as `failed` with
        `job/failed_in = setup`. A resumed node keeps its own record either way.
        """
        node = self._choose(mode)
        self._node = self._start = node
        fresh = mode is not Mode.RESUME
        try:
            if fresh:
                self._status({"job/status": "setting up"})
            with self.activated():
                self.on_setup(mode)
        except BaseException as exc:
            if fresh:
                with deferred_stop(raise_at_end=False):  # `exc` is recorded whole
                    self._failed_in_setup(exc)
            self._node = self._start = None
            raise
        if fresh:
            self._status({"job/status": "ready"})
        self._mode = mode
        return node

    def _failed_in_setup(self, exc: BaseException) -> None:
        """Record on a new lineage's node that it never started, and why (`theseus-store
        runs` lists such lineages apart)."""
        error = describe(exc)
        self._status({"job/status": "failed", "job/error": error, "job/failed_in": "setup"})

    def _choose(self, mode: Mode) -> Node:
        spec, key, text = self.spec, job_key(type(self)), dump(self.configuration)
        if mode is Mode.RESUME:
            assert self.base is not None
            node = self.base
            if is_primary():
                saved = self.store.job_config(node)
                if saved is None:
                    self.store.record_job(node, key, text)
                self._record_on_tick = saved is not None and saved != text
            return node
        drawn = Node.new(spec.name, project=spec.project, group=spec.group, parent=self.base)
        if self.scheduled is not None and self.scheduled.nonce is not None:
            # the lineage `theseus submit` made for the job (every process read it alike)
            drawn = Node(drawn.name, self.scheduled.nonce, 0, parent=self.base)
        node = Node(drawn.name, agree_on_nonce(drawn.nonce), 0, parent=self.base)
        if is_primary():
            self.store.touch(node)
            self.store.record_job(node, key, text)
        return node

    def on_setup(self, mode: Mode) -> None:
        """Hook: allocate or restore state for ``mode`` (the trainer's). Default: nothing."""
        return None

    def resume_at(self, node: Node) -> Node:
        """Re-point a job set up in resume mode at another node, as ``setup`` would have.

        The live node, the start node and the base become ``node``, and its job record
        is handled as resume does (recorded there if it has none). What the node holds
        (a checkpoint) is the caller's to restore: ``BaseTrainer.restore_node`` does
        both. A job that walks many checkpoints (``CheckpointWalker``) moves this way.

        Returns:
            ``node``, the new live node.

        Raises:
            JobError: the job is not set up in resume mode.
        """
        self._check_resumed()
        self.base = node
        self._node = self._start = self._choose(Mode.RESUME)
        return node

    def _check_resumed(self) -> None:
        """Raise `JobError` unless the job is set up in resume mode (before moving it)."""
        if self._mode is not Mode.RESUME:
            state = "not set up" if self._mode is None else f"set up in {self._mode.value} mode"
            raise JobError(
                f"{type(self).__name__} is {state}; only a job set up with setup(resume=True) "
                "moves to another node. Build it on a base and resume it first."
            )

    def tick(self) -> Node:
        """Move the live node to its successor (same lineage, ``seq + 1``) and return it.

        Everything that reads ``job.node`` sees the new node.

        Raises:
            JobError: before ``setup()``.
        """
        node = self.node.next()
        self._node = node
        if is_primary():
            self.store.touch(node)
            if self._record_on_tick:
                self.store.record_job(node, job_key(type(self)), dump(self.configuration))
                self._record_on_tick = False
        return node

    def before_run(self) -> None:
        """Hook: refuse to run (raise) before anything is recorded. Default: nothing."""
        return None

    @abc.abstractmethod
    def run(self) -> Any:
        """The job's work. Runs after setup, with the job's configuration active."""

    def on_finish(self) -> None:
        """Hook: release resources after ``run()`` (wait for checkpoints...). Default: nothing."""
        return None

    def finish(self) -> None:
        """Run :meth:`on_finish`, then record ``job/status: finished``."""
        with self.activated():
            self.on_finish()
        self._status({"job/status": "finished"})

    def __call__(self, resume: bool = False) -> Any:
        """Synchronize hosts, set up (unless already set up), run, finish.

        Ctrl-C, SIGTERM and SIGHUP (a person, a scheduler, preemption, a closed
        terminal) stop it at a safe point: inside, Ctrl-C raises
        :class:`~theseus.job.Interrupted` and the others :class:`~theseus.job.Terminated`
        (see ``theseus.job._signals``), recorded like any failure, and the process exits
        with 128 + signum.

        Args:
            resume: passed to :meth:`setup` when the job is not set up yet.

        Returns:
            Whatever :meth:`run` returns.

        Raises:
            BaseException: whatever setup or run raised (``Interrupted``, a
                ``KeyboardInterrupt``, for Ctrl-C; ``Terminated`` for another stop
                signal), after recording
                ``job/status: failed`` and ``job/error`` on the job's nodes.
        """
        with stop_on_signals():
            return self._run_recorded(resume)

    def _run_recorded(self, resume: bool) -> Any:
        """`__call__`'s work, inside the stop signals' handlers."""
        sync_hosts(f"theseus/job/start/{self.spec.project}.{self.spec.group}.{self.spec.name}")
        if self._mode is None:
            self.setup(resume=resume)  # a failed fresh or branch setup records it itself
        try:
            with self.activated():
                self.before_run()  # a refusal leaves a resumed node's history as it was
        except BaseException as exc:
            if self._mode is not Mode.RESUME:  # a new lineage never started: it says why
                with deferred_stop(raise_at_end=False):
                    self._failed_in_setup(exc)
            raise
        finished = False
        try:
            self._status({"job/status": "running"})
            if self.scheduled is not None and is_primary():
                assert self._start is not None
                self.scheduled.record_start(self.store, self._start)
            with self.activated():
                result = self.run()
            with deferred_stop():  # checkpoints commit and the status is recorded whole
                self.finish()
                finished = True
        except BaseException as exc:
            if self._node is not None and not finished:
                with deferred_stop(raise_at_end=False):  # both nodes get `exc`'s record
                    if isinstance(exc, Preempted):  # checkpointed: the run goes on later
                        self._status({"job/status": "preempted", "job/stopped": str(exc)})
                    else:
                        self._status({"job/status": "failed", "job/error": describe(exc)})
            raise
        sync_hosts(f"theseus/job/finish/{self.spec.project}.{self.spec.group}.{self.spec.name}")
        return result

    def outcome(self, result: Any) -> list[str]:
        """What `theseus run` prints after the run, below its "finished" line.

        Override to say what the run wrote (files, artifacts). Default: nothing.

        Args:
            result: what `__call__` returned.
        """
        return []

    def close(self) -> None:
        """Close the store if this job opened it (a store passed in stays open)."""
        if self._owns_store and self._store is not None:
            self._store.close()
            self._store = None

    def status_key(self, what: str) -> str:
        """The value key under which this job records its `name`, `status` or `error`."""
        return f"job/{what}"

    def _status(self, values: dict[str, Any]) -> None:
        if not is_primary():
            return
        record = {  # whose status it is, then the status
            self.status_key("name"): job_key(type(self)),
            self.status_key("module"): module_of(type(self)),
            **{self.status_key(key.removeprefix("job/")): value for key, value in values.items()},
        }
        if self.scheduled is not None:  # and the scheduler job's state beside it
            record.update(self.scheduled.values(str(values["job/status"])))
        for node in dict.fromkeys(n for n in (self._start, self._node) if n is not None):
            self.store.log(node, {**record, **self._cleared(node, values)})

    def _cleared(self, node: Node, values: dict[str, Any]) -> dict[str, None]:
        """What an earlier run's end left on `node` (`error`, `stopped`), set to None when
        a run starts there, so a later success never stands beside an old error."""
        if values.get("job/status") != "running":
            return {}
        held = self.store.values(node)
        stale = (self.status_key("error"), self.status_key("stopped"))
        return {key: None for key in stale if held.get(key) is not None}

    def __repr__(self) -> str:
        where = f" at {self._node}" if self._node is not None else ""
        return (
            f"<{type(self).__name__} {self.spec.project}.{self.spec.group}.{self.spec.name}{where}>"
        )
