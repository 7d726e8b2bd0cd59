"""One stage of the kill cycle: train a tiny GPT, fresh or resuming a lineage, and pause.

Usage: python kill_cycle_worker.py ROOT RUN STEPS INTERVAL PAUSE [NONCE]

ROOT is spelled as the test chose (symlink, relative, `..`, trailing slash). PAUSE is
`save:K` (just after step K's asynchronous save started, so it may still be writing),
`tick:K` (just after the node moved on at step K) or `none`. At the pause the stage
prints `PAUSED` and waits on stdin; the test kills it there with SIGKILL. NONCE resumes
that lineage's last checkpoint; without it the run is fresh. A stage that is not
killed prints `DONE <step> <node>`.
"""

import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")

from pathlib import Path

from theseus.quick import quick
from theseus.registry import import_module_or_file

jobs = import_module_or_file(str(Path(__file__).with_name("trainer_jobs.py")))

root, run, steps, interval, pause = sys.argv[1:6]
nonce = sys.argv[6] if len(sys.argv) > 6 else None
where, _, at = pause.partition(":")


class Pausing(jobs.SyntheticTrainer):
    """Stops at the chosen point and waits to be killed."""

    def _pause(self, point: str) -> None:
        if point == where and int(self.state.step) == int(at):
            print("PAUSED", flush=True)
            sys.stdin.readline()  # the test never answers: SIGKILL ends the process here

    def save_checkpoint(self) -> None:
        super().save_checkpoint()
        self._pause("save")

    def tick(self):  # type: ignore[no-untyped-def]
        node = super().tick()
        self._pause("tick")
        return node


with quick(root) as q:
    q.build(Pausing, run)
    if nonce is not None:
        q.find().nonce(nonce).checkpoint().latest().resume()
    jobs.tiny(q.config, steps=int(steps), **{"logging/checkpoint_interval": int(interval)})
    trainer = q.create()
    trainer()
    print("DONE", int(trainer.state.step), trainer.node.serialize(), flush=True)
