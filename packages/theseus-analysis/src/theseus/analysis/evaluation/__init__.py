"""Evaluations papers report, on any node: lm-evaluation-harness over Theseus's model.

`TheseusLM` is the harness's model (registered as `theseus`, so `lm_eval --model theseus
--model_args root=ROOT,target=NODE --tasks ...` works once the `eval` extra is
installed). `TASKS` is the folder of the synthetic language's own tasks
(`synthetic_mc`, `synthetic_ppl`; pass it to `lm_eval --include_path`). Importing this
package needs the extra: `pip install "theseus-analysis[eval]"`.
"""

from pathlib import Path

from theseus.analysis.evaluation._harness import EvaluationError, TheseusLM

#: the synthetic language's task folder (task YAML whose documents `synthetic.py` makes)
TASKS = Path(__file__).with_name("tasks")

__all__ = [
    "TASKS",
    "EvaluationError",
    "TheseusLM",
]
