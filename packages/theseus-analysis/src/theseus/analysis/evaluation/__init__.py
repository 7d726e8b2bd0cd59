"""Evaluations papers report, on any node: lm-evaluation-harness over Theseus's model.

`TheseusLM` is the harness's model (registered as `theseus`, so `lm_eval --model theseus
--model_args root=ROOT,target=NODE --tasks ...` works once the `eval` extra is
installed). Importing this package needs the extra: `pip install
"theseus-analysis[eval]"`.
"""

from theseus.analysis.evaluation._harness import EvaluationError, TheseusLM

__all__ = [
    "EvaluationError",
    "TheseusLM",
]
