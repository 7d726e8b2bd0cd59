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

``--ours-only`` (the TPU plan: a TPU host has no torch and no network) runs ours alone:
the same GPT-2 is written without torch (random weights with GPT-2's initialization in
NumPy, the same BPE tokenizer, saved with safetensors and tokenizers), and ours's
requests/s is a row of information, without a ratio. The folder is imported in a process
of its own on the CPU (``JAX_PLATFORMS=cpu``), so that this one never holds the device:
a TPU serves one process at a time, and each round's ours process needs it. A side that
fails exits 1 with one line: its last line of output.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
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


_IMPORT = r"""
import sys
from theseus.experiments.models.gpt2 import import_gpt2
import_gpt2(sys.argv[1], sys.argv[2], run="gpt2")
"""


def _numpy_folder(folder: Path, text: str) -> None:
    """The GPT-2 of `_FOLDER` without torch: the same BPE tokenizer and sizes, weights drawn
    as `GPT2LMHeadModel` initializes them (normal, std 0.02; layer norms 1 and 0)."""
    import numpy as np
    from safetensors.numpy import save_file
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    eot = "<|endoftext|>"
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.train_from_iterator(text.splitlines(), trainers.BpeTrainer(
        vocab_size=400, special_tokens=[eot], show_progress=False))  # fmt: skip
    vocab, width, layers, positions = backend.get_vocab_size(), 128, 4, 128
    rng = np.random.default_rng(0)

    def normal(*shape: int) -> np.ndarray:
        return (0.02 * rng.standard_normal(shape)).astype(np.float32)

    tensors = {"wte.weight": normal(vocab, width), "wpe.weight": normal(positions, width),
               "ln_f.weight": np.ones(width, np.float32), "ln_f.bias": np.zeros(width, np.float32)}  # fmt: skip
    for i in range(layers):
        for name, shape in (("attn.c_attn", (width, 3 * width)), ("attn.c_proj", (width, width)),
                            ("mlp.c_fc", (width, 4 * width)), ("mlp.c_proj", (4 * width, width))):  # fmt: skip
            tensors[f"h.{i}.{name}.weight"] = normal(*shape)
            tensors[f"h.{i}.{name}.bias"] = np.zeros(shape[1], np.float32)
        for norm in ("ln_1", "ln_2"):
            tensors[f"h.{i}.{norm}.weight"] = np.ones(width, np.float32)
            tensors[f"h.{i}.{norm}.bias"] = np.zeros(width, np.float32)
    folder.mkdir(parents=True)
    save_file(tensors, str(folder / "model.safetensors"))
    eot_id = backend.token_to_id(eot)
    config = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_layer": layers,
              "n_embd": width, "n_head": 4, "n_positions": positions, "n_ctx": positions,
              "vocab_size": vocab, "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5,
              "bos_token_id": eot_id, "eos_token_id": eot_id, "resid_pdrop": 0.0,
              "embd_pdrop": 0.0, "attn_pdrop": 0.0, "tie_word_embeddings": True}  # fmt: skip
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    backend.save(str(folder / "tokenizer.json"))


def _measure(command: list[str], side: str) -> dict[str, float]:
    done = subprocess.run(command, capture_output=True, text=True)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        said = [x for x in (done.stderr + done.stdout).splitlines() if x.strip()]
        raise SystemExit(
            f"harness: {side} failed (exit status {done.returncode}): "
            + (said[-1].strip() if said else "no output")
        )
    return dict(json.loads(lines[-1]))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument(
        "--ours-only", action="store_true", help="no torch here: time theseus's model alone"
    )
    _report.add_arguments(p)
    args = p.parse_args(argv)
    rounds, questions, documents = (1, 40, 4) if args.quick else (args.rounds, 400, 40)
    theirs_python = (
        None
        if args.ours_only
        else torch_python(("accelerate", "lm-eval==0.4.13"), name="torch-eval")
    )
    ours_rps, theirs_rps, programs, buckets = [], [], [], []
    with tempfile.TemporaryDirectory(prefix="harness-") as tmp:
        here = Path(tmp)
        text, requests = _tasks(here, questions, documents)
        (here / "text.txt").write_text(text)
        folder = here / "gpt2"
        if theirs_python is None:
            _numpy_folder(folder, text)
        else:
            subprocess.run([theirs_python, "-c", _FOLDER, str(folder), str(here / "text.txt")],
                           check=True)  # fmt: skip
        on_cpu = dict(os.environ, JAX_PLATFORMS="cpu")
        subprocess.run([sys.executable, "-c", _IMPORT, str(folder), str(here / "root")],
                       check=True, env=on_cpu)  # fmt: skip
        for r in range(rounds):
            sides = {"ours": [sys.executable, "-c", _OURS, str(here / "root"), str(here)]}
            if theirs_python is not None:
                sides["theirs"] = [theirs_python, "-c", _THEIRS, str(folder), str(here)]
            order = list(sides) if r % 2 == 0 else list(sides)[::-1]
            measured = {side: _measure(sides[side], side) for side in order}
            ours_rps.append(requests / measured["ours"]["seconds"])
            if "theirs" in measured:
                theirs_rps.append(requests / measured["theirs"]["seconds"])
            programs.append(measured["ours"]["programs"])
            buckets.append(measured["ours"]["buckets"])
            print(
                f"round {r + 1}: ours {measured['ours']['seconds']:.2f} s"
                + (
                    f", theirs {measured['theirs']['seconds']:.2f} s"
                    if "theirs" in measured
                    else ""
                )
                + f" for {requests} requests; ours compiled {programs[-1]} program(s) for "
                f"{buckets[-1]} length bucket(s)"
            )
    shape = f"GPT-2 4x128, {questions} questions x 4 choices + {documents} documents"
    if theirs_python is None:
        speed = _report.info_row(
            f"lm-eval requests/s: theseus eval's model alone ({shape})",
            f"{statistics.median(ours_rps):,.0f} requests/s",
            ours_rps,
            unit="requests/s",
            note=f"{rounds} rounds, fresh processes; ours includes compiling; information "
            "only: the harness's hf model needs torch, which this host lacks (--ours-only)",
        )
    else:
        speed = _report.compare(
            f"lm-eval requests/s: theseus eval's model vs the harness's hf model ({shape})",
            ours_rps,
            theirs_rps,
            unit="requests/s",
            fmt="{:,.0f} requests/s",
            ratio="ours/theirs",
            meaning="ours requests/s / theirs requests/s (the same round)",
            goal=(">=", GOAL),
            note=f"{rounds} rounds, alternating order, fresh processes; ours includes compiling",
        )
    rows = [
        speed,
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
    return _report.exit_status(rows)


if __name__ == "__main__":
    sys.exit(main())
