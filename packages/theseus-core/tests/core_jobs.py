"""Small jobs used by the theseus-core foundation tests (loaded with ``--import``).

``Counter`` doubles a value once per tick, logs it, and checkpoints it;
``Inspect`` is an analysis stand-in that reads the value at its node.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from theseus.config import field
from theseus.job import BasicJob, Mode, is_primary
from theseus.registry import analysis, job


@dataclass
class CounterConfig:
    steps: int = field("counter/steps", default=3, help="ticks to run")
    start: float = field("counter/start", default=1.0, help="value at seq 0")
    fail_at: int = field("counter/fail_at", default=-1, help="raise at this step (-1: never)")


@job("tests/counter")
class Counter(BasicJob):
    """Doubles a value every tick and checkpoints it."""

    CONFIG = CounterConfig

    def on_setup(self, mode: Mode) -> None:
        if mode is Mode.FRESH:
            self.value = self.args.start
        else:
            ckpt = self.store.checkpoints(self.base)[-1]  # type: ignore[arg-type]
            self.value = json.loads((Path(ckpt.path) / "value.json").read_text())
        self.setups = getattr(self, "setups", 0) + 1

    def run(self) -> float:
        for step in range(self.args.steps):
            if step == self.args.fail_at:
                raise RuntimeError(f"planned failure at step {step}")
            self.tick()
            self.value *= 2.0
            self.log({"counter/value": self.value})
            if is_primary():  # only host zero writes
                folder = self.spec.result(f"ckpt-{self.node.nonce}-{self.node.seq}")
                folder.mkdir(parents=True, exist_ok=True)
                (folder / "value.json").write_text(json.dumps(self.value))
                self.store.checkpoint(self.node, str(folder))
        return self.value


@dataclass
class InspectConfig(CounterConfig):
    target: str = field("analysis/target", default="blocks_0/attn")


@analysis("tests/inspect")
class Inspect(Counter):
    """Reads the counter's value at its node and stores it as an artifact."""

    CONFIG = InspectConfig
    NAME = "activation"

    def run(self) -> float:
        payload = json.dumps({"target": self.args.target, "value": self.value}).encode()
        self.spec.result(f"{self.NAME}.json").write_bytes(payload)
        self.store.put(self.node, self.NAME, f"{self.NAME}.json", payload)
        return self.value
