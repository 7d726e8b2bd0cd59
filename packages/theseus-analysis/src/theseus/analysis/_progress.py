"""The progress bars of the libraries `theseus eval` and `theseus demo` call: off unless asked.

lm-evaluation-harness draws a tqdm bar while it builds each task's requests, and
Hugging Face `datasets` one per split it loads; between Theseus's own lines (each
evaluated task's scores, the trainer's step line, which are log lines, not bars) they
fill a terminal or a job's log with carriage returns. `quiet_progress_bars` turns both
off for the process through the switches the libraries read when they are imported
(`TQDM_DISABLE`, `HF_DATASETS_DISABLE_PROGRESS_BARS`), so it is called at the start of
the verb, before lm-eval is imported; a value the user set is kept. The verbs'
`--progress-bars` flag leaves the bars on. The one bar lm-eval draws with an explicit
`disable=` (its "Tokenizing inputs") the theseus model turns off itself (`bars_off`).
"""

from __future__ import annotations

import os
import sys

__all__ = ["SWITCHES", "bars_off", "quiet_progress_bars"]

#: The environment variables read when tqdm and `datasets` are imported, and the value that
#: turns their bars off.
SWITCHES = {"TQDM_DISABLE": "1", "HF_DATASETS_DISABLE_PROGRESS_BARS": "1"}


def quiet_progress_bars() -> None:
    """Turn off tqdm's and `datasets`' progress bars for this process (a switch the user set
    in the environment wins). `datasets`, when already imported, is told directly."""
    for name, value in SWITCHES.items():
        os.environ.setdefault(name, value)
    if "datasets" in sys.modules and os.environ["HF_DATASETS_DISABLE_PROGRESS_BARS"] == "1":
        sys.modules["datasets"].disable_progress_bars()


def bars_off() -> bool:
    """Whether this process turned tqdm's bars off (`TQDM_DISABLE` set to a non-empty
    value, as tqdm itself reads it)."""
    return bool(os.environ.get("TQDM_DISABLE"))
