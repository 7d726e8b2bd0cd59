"""Figures drawn in worker processes, several at once.

A set of analyses publishes several figures at every node (the library's first analyses:
six), and matplotlib draws one at a time in a process, holding the interpreter lock. With
`Renderers`, `figure(results)` of an importable class and its PDF run in worker processes
of their own, while the walk's process writes what it has; each worker draws one figure
at a time, and the PDFs are the bytes the walk's process would have made (theseus-plot's
exports are reproducible).

A worker is `python -c "...serve()"` with the walk's `sys.path`, on the CPU only
(`JAX_PLATFORMS=cpu`: it never opens the accelerator), reading pickled jobs on its
stdin and answering on a pipe of its own (what the figure code prints goes to stderr).
A job a worker cannot do (a class it cannot import, such as one defined in a script
or in a file loaded by path; results that do not pickle; a worker that died) is drawn
in the walk's process instead, where an error in the figure code is raised as it would
be without workers.

How many: `THESEUS_RENDER_WORKERS` (0: none), by default all usable cores but two (the
walk's own: its dispatch and XLA's compilations), at most 8, and none on fewer than four
cores.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import pickle
import queue
import struct
import subprocess
import sys
import threading
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import IO, Any

from theseus.analysis._errors import AnalysisError

__all__ = ["Renderers", "default_workers", "serve"]

log = logging.getLogger("theseus.analysis")

_HEADER = struct.Struct("<Q")
MAX_WORKERS = 8


def default_workers() -> int:
    """Worker processes a walk draws with: `THESEUS_RENDER_WORKERS`, else the usable cores
    but two (at most `MAX_WORKERS`), none on fewer than four.

    Raises:
        AnalysisError: `THESEUS_RENDER_WORKERS` is not a whole number of 0 or more.
    """
    asked = os.environ.get("THESEUS_RENDER_WORKERS", "").strip()
    if asked:
        try:
            count = int(asked)
        except ValueError:
            count = -1
        if count < 0:
            raise AnalysisError(
                f"THESEUS_RENDER_WORKERS must be a whole number of 0 or more (0: draw every "
                f"figure in the walk's process); got {asked!r}"
            )
        return count
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return 0 if cores < 4 else min(MAX_WORKERS, cores - 2)


def _send(stream: IO[bytes], payload: bytes) -> None:
    stream.write(_HEADER.pack(len(payload)))
    stream.write(payload)
    stream.flush()


def _receive(stream: IO[bytes]) -> bytes | None:
    header = stream.read(_HEADER.size)
    if len(header) < _HEADER.size:
        return None  # the other side closed the pipe
    (size,) = _HEADER.unpack(header)
    payload = stream.read(size)
    return payload if len(payload) == size else None


def _draw(cls: type, method: str, results: Any, name: str, owner: str) -> Any:
    """`render(name, cls.method(results), owner)`."""
    from theseus.analysis._publish import render

    return render(name, getattr(cls, method)(results), owner)


def _resolve(module: str, qualname: str) -> type:
    """The class `module.qualname`, imported."""
    target: Any = importlib.import_module(module)
    for part in qualname.split("."):
        target = getattr(target, part)
    return target


def serve() -> None:
    """A worker's loop: a job `(module, qualname, method, results, name, owner)` in, `("ok",
    render's result)`, `("unimportable", why)` (the job or its class could not be read
    here) or `("error", what the drawing raised)` out, until stdin closes."""
    jobs = sys.stdin.buffer
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # prints go to stderr, not the pipe
    while (payload := _receive(jobs)) is not None:
        answer: tuple[str, Any]
        try:
            module, qualname, method, results, name, owner = pickle.loads(payload)
            cls = _resolve(module, qualname)
        except Exception as exc:
            answer = ("unimportable", f"{type(exc).__name__}: {exc}")
        else:
            try:
                answer = ("ok", _draw(cls, method, results, name, owner))
            except BaseException as exc:  # reported; the walk draws it again
                answer = ("error", f"{type(exc).__name__}: {exc}")
        try:
            reply = pickle.dumps(answer)
        except Exception as exc:
            reply = pickle.dumps(("error", f"the result does not pickle: {exc}"))
        _send(answers, reply)


class _Worker:
    def __init__(self) -> None:
        env = dict(os.environ, JAX_PLATFORMS="cpu", MPLBACKEND="Agg", PYTHONUNBUFFERED="1")
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        self.process = subprocess.Popen(
            [sys.executable, "-c", "from theseus.analysis._renderers import serve; serve()"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
        )

    def ask(self, payload: bytes) -> tuple[str, Any]:
        process = self.process
        assert process.stdin is not None and process.stdout is not None
        try:
            _send(process.stdin, payload)
            reply = _receive(process.stdout)
        except OSError as exc:
            return "error", f"the worker's pipe broke: {exc}"
        if reply is None:
            return "error", f"the worker stopped (exit status {process.poll()})"
        answer: tuple[str, Any] = pickle.loads(reply)
        return answer


def _close(workers: Sequence[_Worker]) -> None:
    for worker in workers:
        with contextlib.suppress(OSError):
            if worker.process.stdin is not None:
                worker.process.stdin.close()
    for worker in workers:
        try:
            worker.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            worker.process.kill()
            worker.process.wait()
        with contextlib.suppress(OSError):
            if worker.process.stdout is not None:
                worker.process.stdout.close()


class Renderers:
    """`count` worker processes, started at once (they import while the caller works);
    with none, every figure is drawn by the caller.

    `draw(cls, "figure", results, name, owner)` returns a callable that gives
    `render(name, cls.figure(results), owner)`: drawn by a worker when one can, else (or
    when the worker failed) by the caller when it is called. Close with `close()`;
    the workers also end with the interpreter or when this is collected.
    """

    def __init__(self, count: int) -> None:
        self.count = count
        self._workers = [_Worker() for _ in range(count)]
        self._idle: queue.SimpleQueue[_Worker] = queue.SimpleQueue()
        for worker in self._workers:
            self._idle.put(worker)
        self._threads = ThreadPoolExecutor(max(1, count), thread_name_prefix="theseus-renderer")
        self._local: set[tuple[str, str]] = set()  # classes a worker could not import
        self._lock = threading.Lock()
        self._finalize = weakref.finalize(self, _close, list(self._workers))

    def close(self) -> None:
        """Stop the workers (after the jobs they hold)."""
        self._threads.shutdown(wait=True)
        self._finalize()

    def draw(
        self, cls: type, method: str, results: Any, name: str, owner: str
    ) -> Callable[[], Any]:
        """Start drawing `cls.method(results)`; the returned callable waits and gives
        `render`'s `(filename, content)` (or None)."""
        where = (cls.__module__, cls.__qualname__)

        def here() -> Any:
            return _draw(cls, method, results, name, owner)

        with self._lock:
            local = where in self._local
        if (
            not self.count
            or local
            or cls.__module__ == "__main__"
            or "<locals>" in cls.__qualname__
        ):
            return here
        try:
            payload = pickle.dumps((*where, method, results, name, owner))
        except Exception:  # results that do not pickle: drawn here
            return here
        future: Future[tuple[str, Any]] = self._threads.submit(self._ask, payload)

        def wait() -> Any:
            status, value = future.result()
            if status == "ok":
                return value
            if status == "unimportable":  # later jobs of this class are drawn here at once
                with self._lock:
                    self._local.add(where)
            log.debug("%s: drawn in this process (the worker: %s)", owner, value)
            return here()  # an error of the figure code is raised here, as without workers

        return wait

    def _ask(self, payload: bytes) -> tuple[str, Any]:
        worker = self._idle.get()
        try:
            answer = worker.ask(payload)
            if answer[0] == "error" and worker.process.poll() is not None:
                with self._lock:  # a worker that died is replaced, once per death
                    worker = _Worker()
                    self._workers.append(worker)
                    self._finalize.detach()
                    self._finalize = weakref.finalize(self, _close, list(self._workers))
            return answer
        finally:
            self._idle.put(worker)
