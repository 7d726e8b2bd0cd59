"""Ctrl-C, SIGTERM and SIGHUP stop a run alike: at a step boundary, recorded, checkpointed.

The first tests drive the reusable piece (`stop_on_signals`, `deferred_stop`) in this
process with `signal.raise_signal`, and a real store with a timer thread's `os.kill`
(a signal never lands inside a store transaction). The last start a real `theseus run`,
send it the signal a few steps in, and read what it left: the exit code, the node's
status and error in the store, a registered and complete checkpoint of the step it
stopped at, the resume command it printed, and a resume that trains on from there.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from theseus.cli import main
from theseus.data.datasets import Synthetic
from theseus.job import (
    Interrupted,
    StopSignal,
    Terminated,
    deferred_stop,
    stop_on_signals,
    store_root,
)
from theseus.registry import import_module_or_file
from theseus.store import Node, Store

JOBS = str(Path(__file__).with_name("trainer_jobs.py"))
TINY = import_module_or_file(JOBS).TINY
TOKENS_PER_STEP = TINY["training/batch_size"] * TINY["architecture/block_size"]
STEPS = 100_000  # never reached: the signal comes a few steps in, however slow the reader


# ------------------------------------------------------------------ in this process


@pytest.fixture(autouse=True)
def _default_dispositions() -> Any:
    """Each test starts where a job started from a shell starts: SIGTERM and SIGHUP at
    their default action (a suite started under ``nohup`` ignores SIGHUP, which
    stop_on_signals rightly leaves ignored: tested below on purpose). The processes a
    test starts inherit these."""
    previous = {s: signal.signal(s, signal.SIG_DFL) for s in (signal.SIGTERM, signal.SIGHUP)}
    previous[signal.SIGINT] = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    for s, handler in previous.items():
        signal.signal(s, handler)


def test_a_stop_signal_raises_terminated_with_128_plus_signum_and_handlers_come_back() -> None:
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)}
    for signum in (signal.SIGTERM, signal.SIGHUP):
        with pytest.raises(Terminated) as caught, stop_on_signals():
            signal.raise_signal(signum)
            pytest.fail("the signal did not stop the block")  # pragma: no cover
        assert caught.value.code == {signal.SIGTERM: 143, signal.SIGHUP: 129}[signum]
        assert isinstance(caught.value, SystemExit)  # uncaught: the process exits with it
        assert str(caught.value).startswith(f"stopped by {signum.name} (")
    assert {s: signal.getsignal(s) for s in before} == before


def test_ctrl_c_raises_interrupted_a_keyboard_interrupt_with_exit_code_130() -> None:
    with pytest.raises(KeyboardInterrupt) as caught, stop_on_signals():
        with deferred_stop():
            signal.raise_signal(signal.SIGINT)
            stepped = True  # the step finishes whole, as for SIGTERM
        pytest.fail("the kept signal was not raised")  # pragma: no cover
    assert stepped and type(caught.value) is Interrupted
    assert isinstance(caught.value, StopSignal) and caught.value.code == 130
    assert str(caught.value) == "stopped by Ctrl-C (SIGINT), exit code 130"
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # Python's, back


# Code whose module is the store's: the guard knows a frame by its module's name.
STORE_LIKE = """
import contextlib, signal

def write(log):
    signal.raise_signal(signal.SIGINT)  # a signal arrives inside a transaction
    log.append("committed")
    return "done"

@contextlib.contextmanager
def batch(log):
    log.append("begin")
    signal.raise_signal(signal.SIGINT)  # between BEGIN and the body
    try:
        yield
        log.append("commit")
    except BaseException:
        log.append("rollback")
        raise
"""


def test_a_signal_inside_the_stores_code_is_raised_once_that_code_has_returned() -> None:
    store_like: dict[str, Any] = {"__name__": "theseus.store._probe"}
    exec(STORE_LIKE, store_like)
    log: list[str] = []
    with pytest.raises(Interrupted), stop_on_signals():
        result = store_like["write"](log)
        log.append(f"caller got {result}")  # pragma: no cover
    assert log == ["committed"]  # the store's code ran to its end; the caller got the stop

    log.clear()
    with pytest.raises(Interrupted), stop_on_signals(), store_like["batch"](log):
        log.append("body")  # a C call: the signal waits for the body's first Python call
        str.join(" ", [])
        sorted([2, 1], key=lambda x: x)  # here
        log.append("rest of the body")  # pragma: no cover
    assert log == ["begin", "body", "rollback"]  # the batch's exit saw it and rolled back


def test_ctrl_c_never_lands_inside_a_store_transaction(tmp_path: Path) -> None:
    """Python's own Ctrl-C lands anywhere: in about 1 of 50 tries here it landed after
    SQLite's BEGIN and before the store's try, the transaction stayed open, and every
    later write failed with "cannot start a transaction within a transaction" (the job
    could not even record that it failed). 200 tries find that with 98% chance."""
    node = Node.new("probe")
    with Store(tmp_path / "store") as store:
        store.touch(node)
        for attempt in range(200):
            when = (attempt % 20) / 5000  # 0 to 4 ms into the writes
            timer = threading.Timer(when, os.kill, (os.getpid(), signal.SIGINT))
            with pytest.raises(Interrupted), stop_on_signals():
                timer.start()
                for index in range(10**9):  # until the signal comes
                    if attempt % 2:
                        store.log(node, {"a": index})
                    else:
                        with store.batch():
                            store.log(node, {"a": index})
                            store.log(node, {"b": index})
            timer.join()
            store.log(node, {"after": attempt})  # the store is whole: no open transaction
        assert store.values(node)["after"] == 199


def test_a_signal_inside_a_deferred_block_is_raised_when_the_block_ends() -> None:
    done = []
    with pytest.raises(Terminated) as caught, stop_on_signals():
        with deferred_stop():
            signal.raise_signal(signal.SIGTERM)
            done.append("rest of the step")  # the step finishes whole
        pytest.fail("the kept signal was not raised")  # pragma: no cover
    assert done == ["rest of the step"] and caught.value.code == 143


def test_a_signal_while_an_error_is_handled_leaves_that_error_to_propagate() -> None:
    recorded = []
    with pytest.raises(ValueError, match="the run's own error"), stop_on_signals():
        try:
            raise ValueError("the run's own error")
        except ValueError:
            with deferred_stop(raise_at_end=False):  # closing and recording it
                signal.raise_signal(signal.SIGTERM)
                recorded.append("closed")
            recorded.append("recorded")
            raise
    assert recorded == ["closed", "recorded"]


def test_an_ignored_signal_stays_ignored_and_other_threads_install_nothing() -> None:
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as under nohup
    try:
        with stop_on_signals():
            signal.raise_signal(signal.SIGHUP)  # nothing happens
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
        seen = []

        def elsewhere() -> None:
            with stop_on_signals(), deferred_stop():
                seen.append(signal.getsignal(signal.SIGTERM))

        thread = threading.Thread(target=elsewhere)
        thread.start()
        thread.join()
        assert seen == [signal.getsignal(signal.SIGTERM)]  # untouched from a worker thread
    finally:
        signal.signal(signal.SIGHUP, previous)


STUCK = """
import sys, time, jax
from theseus.job import stop_on_signals
# float32 c + 1 stops growing at 2**24, and c < inf stays true: a loop without end
loop = jax.jit(lambda x: jax.lax.while_loop(lambda c: c < jax.numpy.inf, lambda c: c + 1, x))
forever = loop.lower(0.0).compile()  # compiled first: the wait below is the native one
with stop_on_signals():
    print("stuck", flush=True)
    forever(0.0).block_until_ready()  # native code that never returns to Python
"""


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_second_stop_signal_ends_a_process_blocked_in_native_code(
    signum: signal.Signals,
) -> None:
    """A Python handler cannot run while the main thread waits in a compiled computation:
    before the watchdog, the process ignored every SIGTERM and Ctrl-C, and only SIGKILL
    ended it (a model too big for the device hung so). The first arrives twice, as under
    `uv run` (the process group's, then uv's forward): that is one request, not two."""
    child = subprocess.Popen(
        [sys.executable, "-c", STUCK], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == b"stuck"
        time.sleep(0.5)  # into the compiled loop
        child.send_signal(signum)
        time.sleep(0.25)
        child.send_signal(signum)  # the same request, passed on
        with pytest.raises(subprocess.TimeoutExpired):  # the first waits for Python
            child.wait(timeout=1.5)
        child.send_signal(signum)
        assert child.wait(timeout=30) == 128 + signum  # 143, 130
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        for stream in (child.stdout, child.stderr):
            if stream is not None:
                stream.close()


# ------------------------------------------------------------ a real theseus run


def _theseus() -> list[str]:
    script = Path(sys.executable).with_name("theseus")  # the console script of this venv
    return (
        [str(script)]
        if script.exists()
        else [sys.executable, "-c", "from theseus.cli import main; main()"]
    )


def _lineage(root: Path, run: str) -> tuple[list[dict], list]:
    """Every node's values of `run`'s one lineage in seq order, and its checkpoints."""
    with Store(store_root(root)) as store:
        nodes = sorted(store.query().spec(run=run).all(), key=lambda n: n.seq)
        assert len({n.nonce for n in nodes}) == 1
        values = [store.values(n) for n in nodes]
        report = store.fsck()
        assert report.clean and not report.interrupted_checkpoints, report.render()
        assert not report.unregistered_checkpoints, report.render()
        return values, list(store.query().spec(run=run).checkpoints())


@pytest.mark.parametrize(  # Ctrl-C in the default suite (click's own "Aborted!" path); a
    # SIGTERM's run in the slow set: its exit code and watchdog are the native-code test's
    # above, its Terminated error the first test's
    "signum",
    [
        pytest.param(signal.SIGTERM, marks=pytest.mark.slow),
        signal.SIGINT,
        pytest.param(signal.SIGHUP, marks=pytest.mark.slow),
    ],
)
def test_a_stopped_run_is_recorded_checkpointed_and_resumes(
    tmp_path: Path, signum: signal.Signals
) -> None:
    root, config = tmp_path / "root", tmp_path / "tiny.yaml"
    Synthetic.prepare(root, tokens=60_000, val_tokens=8_000)
    written = CliRunner().invoke(
        main, ["--import", JOBS, "configure", "test/synthetic/train", str(config)]
    )
    assert written.exit_code == 0, written.output
    settings = [f"{key}={value}" for key, value in TINY.items()] + [
        "logging/report_interval=1",  # a line per step, to aim the signal
        "logging/checkpoint_interval=1000",  # none due: only the stop saves
        "logging/validation_interval=1000",
    ]
    run = ["run", "stopped", str(config), str(root), *settings]
    child = subprocess.Popen(
        [*_theseus(), "--import", JOBS, *run, f"training/tokens={STEPS * TOKENS_PER_STEP}"],
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "UV_RUN_RECURSION_DEPTH": "1"},  # as `uv run theseus run` starts it
    )
    try:
        assert child.stderr is not None
        for line in child.stderr:  # "... step 3/100000 loss ...": three updates are done
            if f" step 3/{STEPS} " in line:
                child.send_signal(signum)
                time.sleep(0.2)  # as `uv run` forwards what its process group received:
                child.send_signal(signum)  # one request, stopped at a step boundary
                break
        output = child.stderr.read()
        child.wait(timeout=120)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        if child.stderr is not None:
            child.stderr.close()
    # 143 for SIGTERM, 130 for Ctrl-C (before: click's "Aborted!" and 1), 129 for SIGHUP
    assert child.returncode == 128 + signum, output
    assert "Aborted!" not in output and "Traceback" not in output, output
    values, saved = _lineage(root, "stopped")
    stopped = values[-1]["train/step"]
    assert 3 <= stopped < STEPS and len(values) == stopped  # one node per update
    error = (
        "Interrupted: stopped by Ctrl-C (SIGINT)"
        if signum == signal.SIGINT
        else f"Terminated: stopped by {signum.name} ("
    )
    for node in (values[0], values[-1]):  # where the job started, and its last node
        assert node["job/status"] == "failed"
        assert node["job/error"].startswith(error)
    # the update it stopped after was checkpointed (none was due) on its own node
    assert [(c.node.seq, c.step) for c in saved] == [(stopped - 1, stopped)]
    assert Path(saved[0].path).is_dir()
    assert f"stopped by {signum.name} after step {stopped} of {STEPS}" in output, output
    # the exact command that goes on, with the real names and paths, quoted for a shell
    lineage = f"general.default.stopped~{saved[0].node.nonce}"
    # (`uv run` first: started by `uv run`, the environment is on PATH only inside it)
    expected = (
        f"uv run theseus run stopped {shlex.quote(str(config))} {shlex.quote(str(root))} "
        f"--resume {shlex.quote(lineage)} --import {shlex.quote(JOBS)}"
    )
    (said,) = [line for line in output.splitlines() if line.startswith("Continue: ")]
    assert said == f"Continue: {expected}", output
    pasted = shlex.split(said.removeprefix("Continue: "))
    assert pasted[:3] == ["uv", "run", "theseus"]
    resumed = CliRunner().invoke(  # the pasted command, with a nearer end of training
        main, [*pasted[3:], f"training/tokens={(stopped + 2) * TOKENS_PER_STEP}"]
    )
    assert resumed.exit_code == 0, resumed.output
    values, saved = _lineage(root, "stopped")
    assert [v["train/step"] for v in values] == list(range(1, stopped + 3))
    assert values[-1]["job/status"] == "finished" and saved[-1].step == stopped + 2
