"""Stop signals: Ctrl-C, SIGTERM and SIGHUP end a job alike: at a step boundary, recorded.

Schedulers and preemption end a process with SIGTERM (SLURM, Kubernetes, `kill`), a
closed terminal sends SIGHUP, and a person at the terminal presses Ctrl-C (SIGINT). Left
to their default action the first two end the process at once, and Ctrl-C raises
KeyboardInterrupt wherever the main thread happens to be: in the middle of a training
step, or of a store transaction. Inside :func:`stop_on_signals` each of them raises in
the main thread at a safe point instead: SIGTERM and SIGHUP raise :class:`Terminated`, a
`SystemExit` whose code is 128 + signum (143 for SIGTERM, 129 for SIGHUP), and Ctrl-C
raises :class:`Interrupted`, a `KeyboardInterrupt` (so a notebook or a script's
``except KeyboardInterrupt`` sees what it always saw) whose `code` is 130. Both are
:class:`StopSignal` exceptions: the job records `failed` with the error on its nodes, and the
trainer checkpoints the step it stopped after and says how to resume.

Work that must not be cut in the middle (a training step, whose state is donated to
the compiled update; the final checkpoint) runs inside :func:`deferred_stop`: a signal
that arrives there is kept and raised when the block ends, so the trainer stops at a
step boundary with a whole state it can still checkpoint. A signal never lands inside
the store either: one that arrives while the main thread runs `theseus.store`'s code
(a transaction begun and not yet committed or rolled back, anywhere: a job's status, a
checkpoint's registration, an analysis's artifact) is kept and raised as soon as that
code has returned, so every transaction ends whole and the failure can still be recorded.

Handlers are installed only in the main thread (elsewhere both context managers do
nothing), only over the default action (a signal ignored with `nohup`, or by a shell for
a background job, or handled by the program itself, keeps its handler), and restored
when the block ends. On several hosts every host gets the signal from its scheduler and
stops on its own; host zero records.

A scheduler's warning before a time limit or a preemption is another kind of signal:
where the environment names one (``THESEUS_PREEMPTION=USR2``, which the script of
``theseus submit`` sets), it stops nothing by itself. Its handler only notes it
(:func:`preemption_requested`); the training loop asks at each step boundary, and
every process of the run agrees on the step at which to stop (a vote, see
``theseus.training._preempt``), checkpoints it, and raises :class:`Preempted`.

A Python handler runs only when the main thread runs Python. A process blocked in native
code (a compiled step that never returns, a collective waiting for a host that died, an
allocation the device cannot serve) would never see the first signal, so a second stop
signal (Ctrl-C included) ends the process at once with 128 + signum (nothing more is
recorded): each stop signal's number reaches a watchdog thread through
`signal.set_wakeup_fd`, which the interpreter writes from its C-level handler whatever
the main thread is doing. A signal within `REPEAT_S` of the first is the same request
passed on by a launcher (`uv run` forwards what the process group already received),
not a second one.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from types import FrameType

__all__ = [
    "ENV_PREEMPTION",
    "STOP_SIGNALS",
    "Interrupted",
    "Preempted",
    "StopSignal",
    "Terminated",
    "deferred_stop",
    "preemption_requested",
    "preemption_signal",
    "stop_on_signals",
]

#: The environment variable naming the scheduler's warning signal (``USR2``, ``SIGUSR2``).
ENV_PREEMPTION = "THESEUS_PREEMPTION"

#: What a scheduler or a closed terminal sends to end a process (SIGHUP where it exists).
STOP_SIGNALS: tuple[signal.Signals, ...] = tuple(
    getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name)
)

#: Where a signal is never raised: the store's code (see the module's notes).
_STORE = "theseus.store"
#: ...nor while a context manager is entered or left: a `with store.batch():` begins
#: and ends its transaction there.
_ENTER_EXIT = frozenset({"__enter__", "__exit__"})


class StopSignal:
    """What :class:`Terminated` and :class:`Interrupted` share: the signal that stopped a job.

    Attributes:
        signum: the signal's number (the process's exit code for it is 128 + signum:
            `SystemExit.code` of `Terminated`, `code` of `Interrupted`).
    """

    signum: int

    @property
    def signal_name(self) -> str:
        """The signal's name, e.g. ``SIGTERM``."""
        try:
            return signal.Signals(self.signum).name
        except ValueError:
            return f"signal {self.signum}"


class Terminated(StopSignal, SystemExit):
    """The process received a stop signal (SIGTERM, SIGHUP) inside :func:`stop_on_signals`.

    A `SystemExit` whose code is 128 + signum: uncaught, the process exits with the
    code a shell reports for a process ended by that signal (143 for SIGTERM).

    Attributes:
        signum: the signal's number.
    """

    def __init__(self, signum: int) -> None:
        super().__init__(128 + signum)
        self.signum = signum

    def __str__(self) -> str:
        return (
            f"stopped by {self.signal_name} (a scheduler, preemption, `kill` or a closed "
            f"terminal), exit code {self.code}"
        )


class Interrupted(StopSignal, KeyboardInterrupt):
    """Ctrl-C (SIGINT) inside :func:`stop_on_signals`, raised at a step boundary.

    A `KeyboardInterrupt`, as Ctrl-C raises anywhere else; `code` is 130 (128 + 2),
    what `theseus run` exits with.
    """

    def __init__(self, signum: int = signal.SIGINT) -> None:
        super().__init__()
        self.signum = signum
        self.code: int = 128 + signum

    def __str__(self) -> str:
        return f"stopped by Ctrl-C ({self.signal_name}), exit code {self.code}"


class Preempted(Terminated):
    """The scheduler warned of a time limit or a preemption (:data:`ENV_PREEMPTION`'s
    signal); the run checkpointed the step every process stopped at.

    Exits with 128 + signum (140 for SIGUSR2), which the script of ``theseus submit``
    reads as "requeue me".
    """

    def __str__(self) -> str:
        return (
            f"preempted: {self.signal_name} (the scheduler's warning before a time limit or a "
            f"preemption) arrived; checkpointed where every process stopped, exit code {self.code}"
        )


def preemption_signal() -> signal.Signals | None:
    """The signal :data:`ENV_PREEMPTION` names, or None when it is unset or empty.

    Raises:
        ValueError: it names no signal this platform has (one line, naming the variable).
    """
    text = os.environ.get(ENV_PREEMPTION, "").strip().upper()
    if not text:
        return None
    name = text if text.startswith("SIG") else f"SIG{text}"
    found = getattr(signal, name, None)
    stops = (*STOP_SIGNALS, signal.SIGINT)
    if not isinstance(found, signal.Signals) or found in stops or name == "SIGKILL":
        raise ValueError(
            f"{ENV_PREEMPTION}={os.environ[ENV_PREEMPTION]!r} names no signal a process can "
            "be warned with; expected e.g. USR2 or USR1 (not TERM, HUP, INT or KILL)."
        )
    return found


def preemption_requested() -> bool:
    """Whether the scheduler's warning signal arrived inside :func:`stop_on_signals`."""
    return _state.warned is not None


@dataclass
class _State:
    """What the handlers share; touched only in the main thread, where signals run."""

    installed: bool = False
    deferring: int = 0  # depth of nested deferred_stop blocks
    pending: int | None = None  # a signal that arrived while deferring
    stopping: bool = False  # a stop was raised: later signals leave it to the watchdog
    warned: int | None = None  # the preemption signal arrived (it stops nothing by itself)


_state = _State()


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _module(frame: FrameType) -> str:
    return str(frame.f_globals.get("__name__", ""))


def _cuts(frame: FrameType) -> bool:
    """Whether a signal raised in `frame` could cut a transaction: the store's code (one
    may be open), or `contextlib` entering or leaving a context (`store.batch()`)."""
    module = _module(frame)
    return module.startswith(_STORE) or (
        module == "contextlib" and frame.f_code.co_name in _ENTER_EXIT
    )


def _guarded(frame: FrameType | None) -> bool:
    """Whether `frame` or a frame that called it is one a signal must not cut (`_cuts`)."""
    while frame is not None:
        if _cuts(frame):
            return True
        frame = frame.f_back
    return False


def _handle(signum: int, frame: FrameType | None) -> None:
    if _state.stopping:
        return
    if _state.deferring:
        if _state.pending is None:  # say it now: the block may take a while to end
            _say(f"{signal.Signals(signum).name}: stopping once the work under way is done")
        _state.pending = _state.pending or signum
        return
    if _guarded(frame) and _hold(signum):
        return
    _stop(_state.pending or signum)


def _say(line: str) -> None:
    """One line on stderr, written to the file descriptor itself: the handler may run
    while the main thread is inside a write to `sys.stderr` (a progress bar), which
    Python's buffered streams refuse to re-enter."""
    with contextlib.suppress(OSError):  # no stderr: nothing to say it on
        os.write(2, f"\n{line} (a second signal stops the process at once)\n".encode())


def _hold(signum: int) -> bool:
    """Keep `signum` until the main thread has left guarded code (`_release` raises it).

    Returns False where another profiler runs (a developer's `cProfile`): the signal is
    then raised at once, as Python would.
    """
    if sys.getprofile() not in (None, _release):
        return False
    _state.pending = _state.pending or signum
    sys.setprofile(_release)
    return True


def _release(frame: FrameType, event: str, arg: object) -> None:
    """The main thread's profile function while a signal is held: raise it at the first
    call made outside guarded code, or where the store's outermost frame returns (what
    a profile function raises appears at that call's site; a `with store.batch():`
    body gets it from its first call, so the batch's exit rolls back).
    """
    if event == "call":
        out = not _cuts(frame) and not _guarded(frame.f_back)
    elif event == "return":
        out = _module(frame).startswith(_STORE) and not _guarded(frame.f_back)
    else:
        return
    if not out:
        return
    sys.setprofile(None)
    # a deferred block still open keeps the signal for its end
    held = _state.installed and not _state.deferring and not _state.stopping
    if held and _state.pending is not None:
        _stop(_state.pending)


def _warn(signum: int, frame: object) -> None:
    _state.warned = signum


def _stop(signum: int) -> None:
    _state.pending, _state.stopping = None, True
    if sys.getprofile() is _release:
        sys.setprofile(None)
    if signum == signal.SIGINT:
        raise Interrupted(signum)
    raise Terminated(signum)


#: Seconds after the first stop signal within which another is the same request: a
#: launcher passes its own on (`uv run` forwards SIGINT about 200 ms later where its
#: input is no terminal, and SIGTERM at once), so a process group's signal reaches the
#: job twice. A person's second Ctrl-C comes later.
REPEAT_S = 1.0


def _watch(read_fd: int, stops: frozenset[int]) -> None:
    """Read signal numbers from the wakeup pipe; end the process at the second stop signal
    (one that comes `REPEAT_S` or more after the first)."""
    first: float | None = None
    while True:
        try:
            data = os.read(read_fd, 64)
        except OSError:
            return
        if not data:  # the block ended: the write end is closed
            return
        for signum in data:
            if signum not in stops:
                continue
            if first is None:
                first = time.monotonic()
            elif time.monotonic() - first >= REPEAT_S:
                os._exit(128 + signum)


@contextlib.contextmanager
def _wakeup_watchdog(signals: Sequence[signal.Signals]) -> Iterator[None]:
    """A thread that ends the process at the second of `signals`, even while the main
    thread is blocked in native code (see the module's notes)."""
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    try:
        previous: int | None = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    except ValueError:  # not the main thread of the main interpreter
        previous = None
    if previous is None:
        os.close(read_fd)
        os.close(write_fd)
        yield
        return
    watcher = threading.Thread(
        target=_watch,
        args=(read_fd, frozenset(int(s) for s in signals)),
        name="theseus-stop-watchdog",
        daemon=True,
    )
    watcher.start()
    try:
        yield
    finally:
        signal.set_wakeup_fd(previous)
        os.close(write_fd)  # the watchdog reads the end of the pipe and returns
        watcher.join(timeout=5)
        os.close(read_fd)


def _at_default(s: signal.Signals) -> bool:
    """Whether `s` does what it does when nobody handles it (Ctrl-C: Python's own
    KeyboardInterrupt), so that taking it over changes nothing anyone chose."""
    handler = signal.getsignal(s)
    return handler is signal.SIG_DFL or (
        s == signal.SIGINT and handler is signal.default_int_handler
    )


@contextlib.contextmanager
def stop_on_signals(
    signals: Sequence[signal.Signals] = (*STOP_SIGNALS, signal.SIGINT),
) -> Iterator[None]:
    """Inside the block, each of `signals` raises a :class:`StopSignal` in the main thread.

    SIGINT (Ctrl-C) raises :class:`Interrupted`, the others :class:`Terminated`; never
    inside a :func:`deferred_stop` block (it is raised when the block ends) nor inside
    the store's code (raised once it returns). Handlers are installed only in the main
    thread and only over a signal's default action, and the previous ones are restored
    at the end. Nested blocks use the outer one's handlers. A second stop signal ends
    the process at once (exit code 128 + signum), also while the main thread is blocked
    in native code.

    Args:
        signals: the signals that stop the process (default :data:`STOP_SIGNALS` and
            SIGINT).

    Raises:
        StopSignal: one of `signals` arrived (at the end of a :func:`deferred_stop`
            block when it arrived inside one).
    """
    if not _in_main_thread() or _state.installed:
        yield
        return
    # A new outermost block starts clean, whatever an earlier one left (it resets all
    # of this when it ends; a block that never ended, e.g. a generator left unclosed,
    # must not make this one ignore its signals).
    _state.pending, _state.stopping, _state.deferring, _state.warned = None, False, 0, None
    warning = preemption_signal()
    previous = {s: signal.signal(s, _handle) for s in signals if _at_default(s)}
    stops = list(previous)
    if warning is not None and warning not in previous:
        previous[warning] = signal.signal(warning, _warn)
    _state.installed = True
    try:
        with _wakeup_watchdog(stops):
            yield
        if _state.pending is not None:  # kept by a deferred block that ended in an error
            _stop(_state.pending)
    finally:
        if sys.getprofile() is _release:
            sys.setprofile(None)
        for s, handler in previous.items():
            signal.signal(s, handler)
        _state.installed, _state.deferring = False, 0
        _state.pending, _state.stopping, _state.warned = None, False, None


@contextlib.contextmanager
def deferred_stop(*, raise_at_end: bool = True) -> Iterator[None]:
    """Keep a stop signal that arrives inside the block, and raise it when the block ends.

    For work that must finish whole (a training step, a checkpoint). A block that ends
    in an error lets the error propagate (the signal stays pending for the enclosing
    block). Outside the main thread, or outside :func:`stop_on_signals`, it does nothing.

    Args:
        raise_at_end: False for the handling of another error (closing, recording
            it): the signal stays pending and that error is the one that propagates.

    Raises:
        StopSignal: a stop signal arrived inside the block (raised at its end).
    """
    if not _in_main_thread() or not _state.installed:
        yield
        return
    _state.deferring += 1
    try:
        yield
    finally:
        _state.deferring -= 1
    if raise_at_end and not _state.deferring and _state.pending is not None:
        _stop(_state.pending)
