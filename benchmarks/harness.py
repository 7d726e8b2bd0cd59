"""lm-evaluation-harness: `theseus eval`'s model vs the harness's own `hf` model.

Run: ``uv run --group bench python benchmarks/harness.py [--rounds 3] [--quick]
[--json PATH]`` (about two minutes on 2 CPU cores; the first run also makes the torch
interpreter, below).

A GPT-2 (4 layers, n_embd 128, 128 positions, a byte-level BPE tokenizer of 400 tokens)
is made with transformers and saved as a Hugging Face folder, then imported with
`import_gpt2`. Two local tasks over generated sentences, a multiple-choice task (400
questions, 4 choices: 1,600 `loglikelihood` requests) and a perplexity task (40
documents: `loglikelihood_rolling`), run through `lm_eval.simple_evaluate` each round in
two fresh processes, in alternating order:

* ours: `TheseusLM` on the imported node (batch size 16), in this workspace;
* theirs: the harness's `hf` model on the folder (batch size 16, float32, CPU), in an
  interpreter with PyTorch, transformers, accelerate and lm-eval (made once under
  ``~/.cache/theseus-benchmarks/torch-eval``; never the workspace's).

Each side times `simple_evaluate` only, after its model is set up (ours includes its
compilations). Rows: requests per second, ours over theirs per round (goal >= 1); and
the compiled scoring programs ours made for each task against the length buckets its
requests fall in (goal: no more programs than buckets).
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file or with -m
from benchmarks import _report
from benchmarks.hf_vs_transformers import torch_python

GOAL = 1.0
WORDS = ["ship", "harbour", "plank", "river", "water", "sailor", "net", "model", "token", "piece", "fox", "dog", "judge", "form", "matter", "year", "city", "sea", "stone", "wind", "road", "tree", "house", "light"]  # fmt: skip

_FOLDER = r"""
import sys, torch, transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
text = open(sys.argv[2]).read().splitlines()
backend = Tokenizer(models.BPE())
backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
backend.decoder = decoders.ByteLevel()
backend.train_from_iterator(text, trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>"], show_progress=False))
eot = "<|endoftext|>"
tok = transformers.GPT2TokenizerFast(tokenizer_object=backend, bos_token=eot, eos_token=eot, unk_token=eot)
config = transformers.GPT2Config(n_layer=4, n_embd=128, n_head=4, n_positions=128, vocab_size=len(tok),
    bos_token_id=tok.eos_token_id, eos_token_id=tok.eos_token_id, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
torch.manual_seed(0)
transformers.GPT2LMHeadModel(config).eval().save_pretrained(sys.argv[1])
tok.save_pretrained(sys.argv[1])
"""

_THEIRS = r"""
import json, sys, time
import lm_eval
from lm_eval.models.huggingface import HFLM
from lm_eval.tasks import TaskManager
model = HFLM(pretrained=sys.argv[1], dtype="float32", device="cpu", batch_size=16)
manager = TaskManager(include_path=sys.argv[2], include_defaults=False)
start = time.perf_counter()
lm_eval.simple_evaluate(model=model, tasks=["bench_mc", "bench_ppl"], task_manager=manager,
                        bootstrap_iters=0, torch_random_seed=None)
print(json.dumps({"seconds": time.perf_counter() - start}))
"""

_OURS = r"""
import json, sys, time
import lm_eval
from lm_eval.tasks import TaskManager
from theseus.analysis.evaluation import TheseusLM
from theseus.analysis.evaluation._harness import open_trainer_at
from theseus.model import scoring
model = TheseusLM(trainer=open_trainer_at(sys.argv[1], "gpt2"), batch_size=16)
manager = TaskManager(include_path=sys.argv[2], include_defaults=False)
lengths = []
score = model._score
def counted(pairs):
    lengths.extend(min(len(a) + len(b), model.max_length + 1) - 1 for a, b in pairs)
    return score(pairs)
model._score = counted
start = time.perf_counter()
lm_eval.simple_evaluate(model=model, tasks=["bench_mc", "bench_ppl"], task_manager=manager,
                        bootstrap_iters=0, torch_random_seed=None)
seconds = time.perf_counter() - start
buckets = len({scoring._bucket(n, model.max_length) for n in lengths})
print(json.dumps({"seconds": seconds, "programs": scoring._score._cache_size(),
                  "buckets": buckets, "requests": len(lengths)}))
"""


def _sentence(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def _tasks(folder: Path, questions: int, documents: int) -> tuple[str, int]:
    """The two tasks' files in `folder`; the tokenizer's training text and the requests."""
    rng = random.Random(0)
    rows = []
    for _ in range(questions):
        choices = [_sentence(rng, rng.randint(1, 4)) for _ in range(4)]
        rows.append({"query": _sentence(rng, rng.randint(3, 20)), "choices": choices,
                     "gold": rng.randrange(4)})  # fmt: skip
    texts = [{"text": _sentence(rng, rng.randint(50, 400))} for _ in range(documents)]
    (folder / "mc.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "ppl.jsonl").write_text("".join(json.dumps(r) + "\n" for r in texts))
    head = "dataset_path: json\ntest_split: test\nmetadata:\n  version: 1.0\ndataset_kwargs:\n"
    (folder / "bench_mc.yaml").write_text(
        f"task: bench_mc\n{head}  data_files:\n    test: {folder / 'mc.jsonl'}\n"
        "output_type: multiple_choice\ndoc_to_text: '{{query}}'\ndoc_to_choice: '{{choices}}'\n"
        "doc_to_target: '{{gold}}'\nmetric_list:\n  - metric: acc\n"
    )
    (folder / "bench_ppl.yaml").write_text(
        f"task: bench_ppl\n{head}  data_files:\n    test: {folder / 'ppl.jsonl'}\n"
        "output_type: loglikelihood_rolling\ndoc_to_text: ''\ndoc_to_target: '{{text}}'\n"
        "metric_list:\n  - metric: bits_per_byte\n"
    )
    text = "\n".join(r["query"] + " " + " ".join(r["choices"]) for r in rows)
    return text, questions * 4 + documents


def _measure(command: list[str]) -> dict[str, float]:
    out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    return dict(json.loads(out.strip().splitlines()[-1]))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    _report.add_arguments(p)
    args = p.parse_args(argv)
    rounds, questions, documents = (1, 40, 4) if args.quick else (args.rounds, 400, 40)
    theirs_python = torch_python(("accelerate", "lm-eval==0.4.13"), name="torch-eval")
    ours_rps, theirs_rps, programs, buckets = [], [], [], []
    with tempfile.TemporaryDirectory(prefix="harness-") as tmp:
        here = Path(tmp)
        text, requests = _tasks(here, questions, documents)
        (here / "text.txt").write_text(text)
        folder = here / "gpt2"
        subprocess.run([theirs_python, "-c", _FOLDER, str(folder), str(here / "text.txt")],
                       check=True)  # fmt: skip
        from theseus.experiments.models.gpt2 import import_gpt2

        import_gpt2(folder, here / "root", run="gpt2")
        for r in range(rounds):
            sides = {
                "ours": [sys.executable, "-c", _OURS, str(here / "root"), str(here)],
                "theirs": [theirs_python, "-c", _THEIRS, str(folder), str(here)],
            }
            order = list(sides) if r % 2 == 0 else list(sides)[::-1]
            measured = {side: _measure(sides[side]) for side in order}
            ours_rps.append(requests / measured["ours"]["seconds"])
            theirs_rps.append(requests / measured["theirs"]["seconds"])
            programs.append(measured["ours"]["programs"])
            buckets.append(measured["ours"]["buckets"])
            print(
                f"round {r + 1}: ours {measured['ours']['seconds']:.2f} s, theirs "
                f"{measured['theirs']['seconds']:.2f} s for {requests} requests; ours compiled "
                f"{programs[-1]} program(s) for {buckets[-1]} length bucket(s)"
            )
    shape = f"GPT-2 4x128, {questions} questions x 4 choices + {documents} documents"
    rows = [
        _report.compare(
            f"lm-eval requests/s: theseus eval's model vs the harness's hf model ({shape})",
            ours_rps,
            theirs_rps,
            unit="requests/s",
            fmt="{:,.0f} requests/s",
            ratio="ours/theirs",
            meaning="ours requests/s / theirs requests/s (the same round)",
            goal=(">=", GOAL),
            note=f"{rounds} rounds, alternating order, fresh processes; ours includes compiling",
        ),
        _report.compare(
            f"lm-eval compiled scoring programs vs length buckets, two tasks ({shape})",
            [float(x) for x in programs],
            [float(x) for x in buckets],
            unit="programs",
            fmt="{:.0f}",
            ratio="ours/theirs",
            meaning="programs compiled / distinct power-of-two length buckets of the requests",
            goal=("<=", 1.0),
            note="counted from the jit cache of theseus.model.scoring after both tasks",
        ),
    ]
    _report.write(args.json, "harness", args.quick, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
