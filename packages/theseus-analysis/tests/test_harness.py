"""lm-evaluation-harness's model over a node (`TheseusLM`), against the model's own forward.

References: each request's loglikelihood from the trainer's plain forward on the request's
tokens alone (float64 NumPy log-softmax; 1e-4 absolute, the parity tolerance of the
harness's `hf` model), the rolling windows lm-eval's own `get_rolling_token_windows` and
`make_disjoint_window` produce, and greedy generation from `trainer.generate`. A local
JSON task run through `lm_eval.simple_evaluate` scores `acc` as the references say.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

lm_eval = pytest.importorskip("lm_eval")

from lm_eval import utils as lm_utils  # noqa: E402

from theseus.analysis.evaluation import EvaluationError, TheseusLM  # noqa: E402
from theseus.data.datasets import Synthetic  # noqa: E402
from theseus.model import scoring  # noqa: E402
from theseus.quick import quick  # noqa: E402
from theseus.registry import import_module_or_file  # noqa: E402

jobs = import_module_or_file(str(Path(__file__).with_name("analysis_jobs.py")))
helpers = import_module_or_file(str(Path(__file__).with_name("eval_helpers.py")))
ATOL = 1e-4


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object]:
    root = tmp_path_factory.mktemp("harness")
    Synthetic.prepare(root, tokens=40_000, val_tokens=6_000)
    with quick(root) as q:
        q.build(jobs.PretrainGPT, "scored")
        jobs.tiny(q.config, steps=4, **{"training/analyze": False})
        trainer = q.create()
        trainer()
    return root, trainer


_reference = helpers.reference


def _request(*args):  # what the harness hands a model: an object with `args`
    return SimpleNamespace(args=args)


def test_loglikelihoods_are_the_forwards(trained) -> None:
    _, trainer = trained
    lm = TheseusLM(trainer=trainer, batch_size=4)
    requests = [("the quick brown", " fox"), ("a", "b"), ("", "hello"), ("x y ", "z")]
    answers = lm.loglikelihood([_request(*r) for r in requests])
    for (context, continuation), (total, greedy) in zip(requests, answers, strict=True):
        if context:
            context, continuation = (
                context.rstrip(),
                context[len(context.rstrip()) :] + continuation,
            )
            ctx = lm.tok_encode(context)
            cont = lm.tok_encode(context + continuation)[len(ctx) :]
        else:
            ctx, cont = [lm.eot_token_id], lm.tok_encode(continuation)
        expected = _reference(trainer, ctx + cont, len(cont))
        assert abs(total - expected[0]) <= ATOL and greedy == expected[1], (context, continuation)


def test_rolling_windows_are_lm_evals(trained) -> None:
    _, trainer = trained
    lm = TheseusLM(trainer=trainer)
    block = lm.max_length
    for n in (1, 5, block, block + 1, 3 * block + 7):
        tokens = list(range(1, n + 1))
        theirs = [
            lm_utils.make_disjoint_window(w)
            for w in lm_utils.get_rolling_token_windows(tokens, 0, block, 1)
        ]
        assert scoring.rolling_windows(tokens, 0, block) == [(list(a), list(b)) for a, b in theirs]
    text = "the cat sat on the mat and then " * 6  # longer than the context
    [total] = lm.loglikelihood_rolling([_request(text)])
    ids = lm.tok_encode(text)
    expected = sum(
        _reference(trainer, [*ctx, *cont], len(cont))[0]
        for ctx, cont in scoring.rolling_windows(ids, lm.eot_token_id, block)
    )
    assert abs(total - expected) <= 1e-5 * abs(expected)


def test_generation_stops_at_until_and_is_the_trainers_greedy_text(trained) -> None:
    _, trainer = trained
    lm = TheseusLM(trainer=trainer)
    full = trainer.generate("the ", 8, temperature=0)
    assert len(full) >= 3
    stop = full[2]  # a character the greedy text holds: the answer ends before it
    [free, cut] = lm.generate_until(
        [
            _request("the ", {"max_gen_toks": 8}),
            _request("the ", {"until": [stop], "max_gen_toks": 8}),
        ]
    )
    assert free == full
    assert cut == full.split(stop)[0]


ROWS = helpers.ROWS
_task = helpers.write_task


def test_a_local_multiple_choice_task_scores_its_accuracy(trained, tmp_path: Path) -> None:
    _, trainer = trained
    lm = TheseusLM(trainer=trainer)
    rows = ROWS
    _task(tmp_path)
    from lm_eval.tasks import TaskManager

    results = lm_eval.simple_evaluate(
        model=lm, tasks=["tiny_mc"],
        task_manager=TaskManager(include_path=str(tmp_path), include_defaults=False),
        torch_random_seed=None,
    )  # fmt: skip
    acc = results["results"]["tiny_mc"]["acc,none"]
    assert acc == helpers.reference_accuracy(trainer, lm.tok_encode, rows)


@pytest.mark.slow  # a fresh interpreter imports lm-eval, JAX and the model: about 15 s
def test_the_plain_lm_eval_command_finds_the_theseus_model(trained, tmp_path: Path) -> None:
    """`lm_eval --model theseus` from a fresh interpreter, nothing imported by hand."""
    import os
    import subprocess
    import sys

    root, trainer = trained
    _task(tmp_path)
    out = tmp_path / "out"
    command = Path(sys.executable).with_name("lm_eval")
    done = subprocess.run(
        [str(command), "--model", "theseus", "--model_args", f"root={root},target=scored",
         "--tasks", "tiny_mc", "--include_path", str(tmp_path), "--output_path", str(out)],
        capture_output=True, text=True, env={**os.environ, "JAX_PLATFORMS": "cpu"}, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    [written] = out.rglob("results_*.json")
    acc = json.loads(written.read_text())["results"]["tiny_mc"]["acc,none"]
    in_process = lm_eval.simple_evaluate(
        model=TheseusLM(trainer=trainer), tasks=["tiny_mc"], torch_random_seed=None,
        task_manager=__import__("lm_eval.tasks").tasks.TaskManager(include_path=str(tmp_path)),
    )["results"]["tiny_mc"]["acc,none"]  # fmt: skip
    assert acc == in_process


def test_bad_model_arguments_are_one_line(trained, tmp_path: Path) -> None:
    _, trainer = trained
    for kwargs, message in (
        ({}, "needs a node"),
        ({"trainer": trainer, "batch_size": "x"}, "batch_size must be a positive integer"),
        ({"trainer": trainer, "pretrained": "gpt2"}, "take root, target"),
        ({"root": str(tmp_path / "none"), "target": "x"}, "none does not exist"),
    ):
        with pytest.raises(EvaluationError, match=message) as info:
            TheseusLM(**kwargs)
        assert "\n" not in str(info.value)


@pytest.mark.slow  # two fresh interpreters import lm-eval, JAX and the model: about 25 s
def test_the_plain_command_imports_the_jobs_model_args_name(tmp_path: Path) -> None:
    """A node whose job lives in a module of the user's: one line naming `import=`, then
    `import=FILE` in --model_args evaluates it."""
    import os
    import subprocess
    import sys

    root = tmp_path / "root"
    Synthetic.prepare(root, tokens=20_000, val_tokens=4_000)
    with quick(root) as q:
        q.build(jobs.GPTWithAnalysis, "own")
        jobs.tiny(q.config, steps=2, **{"training/analyze": False})
        q.create()()
    _task(tmp_path)
    command = [str(Path(sys.executable).with_name("lm_eval")), "--model", "theseus",
               "--tasks", "tiny_mc", "--include_path", str(tmp_path), "--model_args"]  # fmt: skip
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    refused = subprocess.run(
        [*command, f"root={root},target=own"], capture_output=True, text=True, env=env,
        timeout=300,
    )  # fmt: skip
    assert refused.returncode != 0
    assert "import=" in refused.stderr and "analysis_jobs" in refused.stderr
    jobs_file = Path(__file__).with_name("analysis_jobs.py")
    done = subprocess.run(
        [*command, f"root={root},target=own,import={jobs_file}"], capture_output=True,
        text=True, env=env, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "tiny_mc" in done.stdout
