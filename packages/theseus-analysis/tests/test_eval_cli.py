"""`theseus eval`: results kept on nodes, `--over` a lineage, the synthetic language's tasks,
and no download.

References: accuracies and bits per byte from the trainer's plain forward on each request
alone (`eval_helpers.reference`), restored at each checkpoint by a trainer of its own;
the synthetic tasks' right answers from the language's transition table, enumerated here
by plain loops.
"""

from __future__ import annotations

import itertools
import json
import math
import re
import shutil
from pathlib import Path

import pytest

lm_eval = pytest.importorskip("lm_eval")

from click.testing import CliRunner  # noqa: E402

from theseus.analysis._eval_cli import evaluate_node  # noqa: E402
from theseus.analysis._task_index import needs_download, task_manager  # noqa: E402
from theseus.analysis.evaluation import TASKS, TheseusLM  # noqa: E402
from theseus.analysis.evaluation._harness import open_trainer_at  # noqa: E402
from theseus.cli import main  # noqa: E402
from theseus.data.datasets import Synthetic  # noqa: E402
from theseus.data.synthetic import MarkovLanguage  # noqa: E402
from theseus.model import scoring  # noqa: E402
from theseus.quick import quick  # noqa: E402
from theseus.registry import import_module_or_file  # noqa: E402
from theseus.store import Store  # noqa: E402

jobs = import_module_or_file(str(Path(__file__).with_name("analysis_jobs.py")))
helpers = import_module_or_file(str(Path(__file__).with_name("eval_helpers.py")))
tasks_module = import_module_or_file(str(TASKS / "synthetic.py"))  # the installed folder's


@pytest.fixture(scope="module")
def lineage(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A root whose run `scored` has two checkpoints (seq 1, 3) and a task folder."""
    root = tmp_path_factory.mktemp("eval")
    Synthetic.prepare(root, tokens=40_000, val_tokens=6_000)
    with quick(root) as q:
        q.build(jobs.PretrainGPT, "scored")
        jobs.tiny(q.config, steps=4, **{"training/analyze": False})
        q.create()()
    helpers.write_task(root)
    return root


def _copy(lineage: Path, tmp_path: Path) -> Path:
    root = tmp_path / "root"
    shutil.copytree(lineage, root)
    return root


def _checkpointed(root: Path) -> list:
    with Store(root / "store") as store:
        return sorted({c.node for c in store.query().checkpoints()}, key=lambda n: n.seq)


@pytest.mark.slow  # ~15 s; --over (below) keeps the command line of theseus eval in the default suite
def test_theseus_eval_keeps_each_metric_on_the_node_once(lineage: Path, tmp_path: Path) -> None:
    root = _copy(lineage, tmp_path)
    command = ["eval", str(root), "scored", "--tasks", "tiny_mc", "--include-path", str(root)]
    first = CliRunner().invoke(main, command)
    assert first.exit_code == 0, first.output
    node = _checkpointed(root)[-1]  # the run's latest checkpoint
    with Store(root / "store") as store:
        values = store.values(node)
        artifact = store.get(node)["eval-tiny_mc"]
    trainer = open_trainer_at(root, node.serialize())
    encode = TheseusLM(trainer=trainer).tok_encode
    assert values["eval/tiny_mc/acc"] == helpers.reference_accuracy(trainer, encode)
    assert "eval/tiny_mc/acc_stderr" in values
    assert values["eval/harness_version"] == lm_eval.__version__
    assert values["eval/tiny_mc/fewshot_seed"] == 1234
    assert json.loads(artifact.content)["results"]["acc,none"] == values["eval/tiny_mc/acc"]
    again = CliRunner().invoke(main, command)
    assert again.exit_code == 0 and "skipped" in again.output
    assert "evaluating" not in again.output  # nothing to do: no model was opened
    forced = CliRunner().invoke(main, [*command, "--force"])
    assert forced.exit_code == 0, forced.output
    with Store(root / "store") as store:
        assert len(store.history(node, "eval-tiny_mc")) == 2  # the skip wrote nothing
    unknown = CliRunner().invoke(
        main,  # (lm-eval's whole index is read once a process: the folder is the fixture's)
        ["eval", str(root), "scored", "--tasks", "no_such_task", "--include-path", str(lineage)],
    )
    assert unknown.exit_code != 0 and "no_such_task" in unknown.output
    assert len(unknown.output.strip().splitlines()) == 1


def _bits_per_byte(trainer, texts: list[str]) -> float:
    """Bits per byte of `texts` from the plain forward over the harness's rolling windows."""
    lm = TheseusLM(trainer=trainer)
    total = sizes = 0.0
    for text in texts:
        ids = lm.tok_encode(text)
        for ctx, cont in scoring.rolling_windows(ids, lm.eot_token_id, lm.max_length):
            total += helpers.reference(trainer, [*ctx, *cont], len(cont))[0]
        sizes += len(text.encode())
    return -total / sizes / math.log(2)


def test_over_evaluates_every_checkpoint_with_one_compiled_program(
    lineage: Path, tmp_path: Path
) -> None:
    root = _copy(lineage, tmp_path)
    nodes = _checkpointed(root)
    assert [n.seq for n in nodes] == [1, 3]
    scoring._score.clear_cache()
    tasks = ["tiny_mc", "synthetic_ppl"]
    lines: list[str] = []
    written = evaluate_node(
        root, "scored", tasks, include_path=str(root), limit=2, over=True, echo=lines.append
    )
    assert sorted(written) == [n.serialize() for n in nodes]
    assert any("ETA" in line for line in lines)
    # tiny_mc's rows and synthetic_ppl's windows share the narrowest bucket (the whole
    # 32-token context): one program serves both tasks on both checkpoints
    assert scoring._score._cache_size() == 1
    texts = [d["text"] for d in tasks_module.document_rows(Synthetic.language(root))[:2]]
    rows = helpers.ROWS[:2]
    bits = []
    for node in nodes:
        trainer = open_trainer_at(root, node.serialize())  # restored on its own
        with Store(root / "store") as store:
            values = store.values(node)
        expected = _bits_per_byte(trainer, texts)
        assert values["eval/synthetic_ppl/bits_per_byte"] == pytest.approx(expected, rel=1e-5)
        encode = TheseusLM(trainer=trainer).tok_encode
        assert values["eval/tiny_mc/acc"] == helpers.reference_accuracy(trainer, encode, rows)
        bits.append(expected)
    assert len(set(bits)) == 2  # each node was evaluated with its own parameters
    lines.clear()
    again = evaluate_node(
        root, "scored", tasks, include_path=str(root), limit=2, over=True, echo=lines.append
    )
    assert again == {} and sum("skipped" in line for line in lines) == 2
    try:  # the browser's curve of the accuracy over training (theseus-store's ui extra)
        from theseus.store.ui._data import series
    except ImportError:  # the isolated session installs theseus-store without it
        return
    with Store(root / "store") as store:
        curve = series(store, nodes[0].name, nodes[0].nonce, "eval/synthetic_ppl/bits_per_byte")
    assert curve["node"] == [n.serialize() for n in nodes] and curve["y"] == pytest.approx(bits)


def _chain_probability(lang: MarkovLanguage, prefix: str, continuation: str) -> float:
    """P(continuation | prefix) under the language: the last `order` letters are the state."""
    state = 0
    for letter in prefix[-lang.order :]:
        state = (state * lang.alphabet) % lang.n_contexts + (ord(letter) - ord("a"))
    probability = 1.0
    for letter in continuation:
        symbol = ord(letter) - ord("a")
        probability *= float(lang.transitions[state, symbol])
        state = (state * lang.alphabet) % lang.n_contexts + symbol
    return probability


def test_the_synthetic_choice_is_the_languages_most_likely_continuation() -> None:
    lang = MarkovLanguage(alphabet=6, order=2, seed=3)
    rows = tasks_module.choice_rows(lang, count=30)
    assert len({row["gold"] for row in rows}) > 1  # the right answer moves
    for row in rows:
        query, choices = row["query"], row["choices"]
        assert len(query) == 32 and len(set(choices)) == 4
        best = max(
            ("".join(c) for c in itertools.product("abcdef", repeat=3)),
            key=lambda c: _chain_probability(lang, query, c),
        )
        assert choices[row["gold"]] == best
        gold = _chain_probability(lang, query, best)
        for index, choice in enumerate(choices):
            if index != row["gold"]:
                assert _chain_probability(lang, query, choice) * 10 <= gold
    documents = tasks_module.document_rows(lang, count=5)
    assert len(documents) == 5 and all(set(d["text"]) <= set("abcdef") for d in documents)


def test_the_synthetic_tasks_follow_the_roots_language(tmp_path: Path) -> None:
    Synthetic.prepare(tmp_path, tokens=2_000, val_tokens=500, alphabet=5, seed=7)
    manager = task_manager(tmp_path, None, ["synthetic_mc", "synthetic_ppl"])
    loaded = manager.load(["synthetic_mc", "synthetic_ppl"])["tasks"]
    docs = {name: list(task.test_docs()) for name, task in loaded.items()}
    assert set("".join(d["query"] for d in docs["synthetic_mc"])) <= set("abcde")
    expected = tasks_module.choice_rows(MarkovLanguage(alphabet=5, seed=7))
    assert [d["query"] for d in docs["synthetic_mc"]] == [r["query"] for r in expected]
    assert set("".join(d["text"] for d in docs["synthetic_ppl"])) <= set("abcde")


def test_synthetic_perplexity_is_the_forwards_bits_per_byte(lineage: Path, tmp_path: Path) -> None:
    root = _copy(lineage, tmp_path)
    node = _checkpointed(root)[-1]
    written = evaluate_node(root, "scored", ["synthetic_ppl", "synthetic_mc"], limit=4)
    values = written[node.serialize()]
    trainer = open_trainer_at(root, node.serialize())
    texts = [d["text"] for d in tasks_module.document_rows(Synthetic.language(root))[:4]]
    bits = _bits_per_byte(trainer, texts)
    assert values["synthetic_ppl"]["eval/synthetic_ppl/bits_per_byte"] == pytest.approx(
        bits, rel=1e-5
    )
    rows = tasks_module.choice_rows(Synthetic.language(root))[:4]
    encode = TheseusLM(trainer=trainer).tok_encode
    assert values["synthetic_mc"]["eval/synthetic_mc/acc"] == helpers.reference_accuracy(
        trainer, encode, rows, delimiter=""
    )


@pytest.mark.parametrize(  # one in the default suite (its budget), all in the slow set
    "task", ["hellaswag", *(pytest.param(t, marks=pytest.mark.slow) for t in ("ai2_arc", "mmlu"))]
)
def test_a_task_that_needs_a_download_is_one_line(
    lineage: Path, tmp_path: Path, task: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    root = _copy(lineage, tmp_path)
    before = (root / "store").stat().st_mtime_ns, sorted(p.name for p in (root / "store").iterdir())
    done = CliRunner().invoke(
        main, ["eval", str(root), "scored", "--tasks", task, "--include-path", str(lineage)]
    )
    assert done.exit_code != 0
    [line] = done.output.strip().splitlines()
    assert "download" in line and task in line
    with Store(root / "store") as store:
        assert not any(k.startswith("eval/") for n in _checkpointed(root) for k in store.values(n))
    del before
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")  # the user's cached copies: not refused
    assert needs_download(task_manager(root, str(lineage), [task]), task) is None


@pytest.mark.slow  # lm-eval's whole index, about 11 s
def test_a_task_read_from_its_own_folders_is_the_task_of_the_whole_index(tmp_path: Path) -> None:
    """`task_manager` indexes only the folders of lm-eval's that define the tasks asked for
    (a group with its members) and the whole folder where it cannot tell (a tag, a group
    of tags, an unknown name): what each task stands for equals lm-eval's own whole index."""
    from lm_eval.tasks import TaskManager

    from theseus.analysis._task_index import _leaves

    whole = TaskManager(include_path=[str(TASKS)])
    for task, small in [
        ("hellaswag", True), ("arc_easy", True), ("lambada_openai", True),
        ("mmlu_abstract_algebra", True), ("mmlu", False), ("ai2_arc", False),
    ]:  # fmt: skip
        manager = task_manager(tmp_path, None, [task])
        assert (len(manager.all_tasks) < 100) == small, task
        ours, theirs = _leaves(manager, task, set()), _leaves(whole, task, set())
        assert theirs and ours == theirs, task
        assert manager.task_index[task].yaml_path == whole.task_index[task].yaml_path, task
        assert needs_download(manager, task) == needs_download(whole, task) is not None


@pytest.mark.slow  # two fresh interpreters import lm-eval and JAX and join: about 30 s
@pytest.mark.multiprocess
def test_two_processes_evaluate_as_one(lineage: Path, tmp_path: Path) -> None:
    """`theseus eval` on two jax.distributed processes (one CPU device each, gloo): the
    values process 0 writes equal a one-process evaluation's; process 1 writes nothing."""
    import os
    import re
    import socket
    import subprocess
    import sys

    one, two = _copy(lineage, tmp_path / "one"), _copy(lineage, tmp_path / "two")
    tasks = ["tiny_mc", "synthetic_ppl"]
    [alone] = evaluate_node(one, "scored", tasks, include_path=str(one), limit=3).values()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("THESEUS_", "SLURM_"))}
    flags = re.sub(r"--xla_force_host_platform_device_count=\d+", "", env.get("XLA_FLAGS", ""))
    env |= {
        "JAX_PLATFORMS": "cpu",
        "XLA_FLAGS": f"{flags} --xla_force_host_platform_device_count=1",
    }
    command = [sys.executable, "-c", "from theseus.cli import main; main()", "eval", str(two),
               "scored", "--tasks", ",".join(tasks), "--include-path", str(two), "--limit", "3",
               "--coordinator", f"127.0.0.1:{port}", "--num-processes", "2"]  # fmt: skip
    procs = [
        subprocess.Popen(
            [*command, "--process-id", str(i)],
            env=env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for i in (0, 1)
    ]
    outputs = []
    for proc in procs:
        try:
            outputs.append(proc.communicate(timeout=300))
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise
        assert proc.returncode == 0, outputs[-1][1][-3000:]
    assert "tiny_mc: " in outputs[0][0] and "tiny_mc: " not in outputs[1][0]  # 0 reports
    node = _checkpointed(two)[-1]
    with Store(two / "store") as store:
        values = store.values(node)
        assert len(store.history(node, "eval-tiny_mc")) == 1  # written once, by process 0
    for task in tasks:
        for key, value in alone[task].items():
            assert values[key] == pytest.approx(value, rel=1e-6, abs=1e-9), key


@pytest.mark.parametrize(  # each a process of its own (~4 s): the default's in the default suite
    "asked", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["default", "asked"]
)
def test_library_progress_bars_are_off_unless_asked_for(
    lineage: Path, tmp_path: Path, asked: bool
) -> None:
    """lm-eval draws a tqdm bar while it builds a task's requests (`100%|...| 3/3 [...]`);
    `theseus eval` turns it off in its process, `--progress-bars` leaves it on. Theseus's
    own lines (each task's scores) are there either way, and git's complaint where there
    is no repository (lm-eval asks git for the results' `git_hash`) never is."""
    import os
    import subprocess
    import sys

    root = _copy(lineage, tmp_path)
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("TQDM_DISABLE", "HF_DATASETS_DISABLE_PROGRESS_BARS")
    }
    env["JAX_PLATFORMS"] = "cpu"
    env["GIT_DIR"] = str(tmp_path / "no-repository")  # as outside any: git says "fatal: ..."
    command = [sys.executable, "-c", "from theseus.cli import main; main()", "eval", str(root),
               "scored", "--tasks", "tiny_mc", "--include-path", str(root), "--limit", "3",
               "--force"]  # fmt: skip
    bar = re.compile(r"\d+%\|.*\| *\d+/\d+ \[")  # tqdm's default bar: 100%|####| 3/3 [00:00<...
    done = subprocess.run(
        [*command, *(["--progress-bars"] if asked else [])],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "tiny_mc: " in done.stdout and "evaluating tiny_mc on " in done.stdout
    assert bool(bar.search(done.stderr)) == asked, done.stderr[-3000:]
    assert "not a git repository" not in done.stderr  # lm-eval's git_hash, asked quietly


def test_an_unknown_task_is_one_line_naming_the_tasks_close_to_it(tmp_path: Path) -> None:
    from lm_eval.tasks import TaskManager

    from theseus.analysis._task_index import check_tasks
    from theseus.analysis.evaluation import EvaluationError

    helpers.write_task(tmp_path)
    manager = TaskManager(include_path=str(tmp_path), include_defaults=False)
    with pytest.raises(EvaluationError) as refused:
        check_tasks(manager, ["tiny_mcq", "zzzz"], str(tmp_path))
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith(
        f"task(s) tiny_mcq, zzzz are not in lm-eval's task folder nor in {tmp_path}"
    )
    assert "(tiny_mcq: did you mean tiny_mc?)" in message  # and nothing is close to zzzz
    check_tasks(manager, ["tiny_mc"], str(tmp_path))  # a known task passes
