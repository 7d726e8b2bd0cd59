"""`theseus import gpt2`: a Hugging Face GPT-2 folder becomes a lineage that works like any.

Reference: `gpt2_folder.reference_forward`, GPT-2 written from its definition in
float64 NumPy over the folder's own tensors (independent of `GPT`), and the folder's
tokenizer read by `tokenizers` directly. Tolerance: float32 on CPU, logits within 1e-5
of their scale (max |difference| <= 1e-5 max |logit|), attention probabilities within
1e-5. (The same import against `transformers` itself: test_gpt2_transformers.py, in the
torch session.)
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from click.testing import CliRunner

from theseus.cli import main
from theseus.config import load
from theseus.data import DataError, replacing
from theseus.data.datasets import TextFiles
from theseus.experiments.models.gpt2 import GPT2, import_gpt2
from theseus.model.gpt2 import GPT2FolderError, read_gpt2
from theseus.model.hf._config import settings_of
from theseus.model.hf._families import plan
from theseus.model.models import GPT
from theseus.quick import quick
from theseus.registry import import_module_or_file
from theseus.store import Store
from theseus.training.base import TrainerError

pytestmark = pytest.mark.tokenizers

folders = import_module_or_file(str(Path(__file__).with_name("gpt2_folder.py")))

RELATIVE = 1e-5
TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "A",
    "naïve café, 12345: the model reads the tokens",
]


def _assert_close(ours: object, reference: np.ndarray) -> None:
    error = float(np.abs(np.asarray(ours) - reference).max())
    assert error <= RELATIVE * float(np.abs(reference).max()), error


@contextlib.contextmanager
def _open(root: Path, run: str = "gpt2", **config: object) -> Iterator[Any]:
    """A `GPT2` job resumed at the imported lineage (no data under the root)."""
    with quick(root) as q:
        q.build(GPT2, "look")
        q.find().spec(run=run).checkpoint().latest().resume()
        for key, value in config.items():
            q.config[key] = value
        yield q.create()


_APPLY: dict[Any, Any] = {}


def _logits(job, ids: np.ndarray) -> np.ndarray:  # type: ignore[no-untyped-def]
    """The model's logits at `ids`: padded to the context and cut back (causal attention
    makes the first positions independent of the padding), so each model compiles once."""
    apply = _APPLY.setdefault(job.model, jax.jit(job.model.apply))
    padded = np.zeros((1, job.block_size), np.int32)
    padded[0, : len(ids)] = ids
    logits, _ = apply({"params": job.state.params}, jnp.asarray(padded))
    return np.asarray(logits[0, : len(ids)])


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    base = tmp_path_factory.mktemp("gpt2")
    src = folders.write_gpt2_folder(base / "hf-gpt2")
    import_gpt2(src, base / "root")
    return src, base / "root"


def test_imported_logits_and_tokenizer_match_gpt2(imported: tuple[Path, Path]) -> None:
    from tokenizers import Tokenizer

    src, root = imported
    theirs = Tokenizer.from_file(str(src / "tokenizer.json"))
    with _open(root) as job:
        assert job.configuration["architecture/positions"] == "learned"
        assert job.tokenizer.name.startswith("gpt2-") and job.tokenizer.eot == theirs.token_to_id(
            "<|endoftext|>"
        )
        long = (TEXTS[0] + " ") * 4
        for text in [*TEXTS, long]:
            ids = job.tokenizer.encode(text)
            assert ids.tolist() == theirs.encode(text, add_special_tokens=False).ids
            assert job.tokenizer.decode(ids) == text
            ids = ids[: job.block_size]
            reference, _ = folders.reference_forward(src, ids.tolist())
            _assert_close(_logits(job, ids), reference)
        assert len(job.tokenizer.encode(long)) > job.block_size - 8  # near the context


@pytest.mark.parametrize(
    "variant",
    [
        {"activation": "gelu", "n_inner": 96, "eps": 1e-6},
        {"prefix": "transformer.", "tokenizer_json": False},  # vocab.json + merges.txt only
        {"vocab_size": 320, "n_head": 2},  # an embedding padded past the tokenizer
    ],
    ids=["exact-gelu-n-inner-eps", "prefixed-vocab-merges", "padded-vocabulary"],
)
def test_other_gpt2_configurations_load(tmp_path: Path, variant: dict) -> None:
    src = folders.write_gpt2_folder(tmp_path / "src", **variant)
    import_gpt2(src, tmp_path / "root", "variant")
    with _open(tmp_path / "root", "variant") as job:
        ids = job.tokenizer.encode(TEXTS[2])
        reference, _ = folders.reference_forward(src, ids.tolist())
        _assert_close(_logits(job, ids), reference)
        assert job.configuration["architecture/norm_eps"] == variant.get("eps", 1e-5)


def _greedy_reference(src: Path, ids: list[int], n: int) -> list[int]:
    ids = list(ids)
    for _ in range(n):
        logits, _ = folders.reference_forward(src, ids)
        ids.append(int(np.argmax(logits[-1])))
    return ids


def test_sample_and_generate_are_gpt2s_greedy_continuation(imported: tuple[Path, Path]) -> None:
    from tokenizers import Tokenizer

    src, root = imported
    theirs = Tokenizer.from_file(str(src / "tokenizer.json"))
    prompt = "The quick brown"
    ids = theirs.encode(prompt, add_special_tokens=False).ids
    expected = _greedy_reference(src, ids, 10)
    with Store(root / "store") as store:
        before = [(n, store.values(n)) for n in store.query().all()]
    sampled = CliRunner().invoke(
        main, ["sample", str(root), "gpt2", prompt, "--temperature", "0", "--max-new-tokens", "10"]
    )
    assert sampled.exit_code == 0, sampled.output
    assert sampled.stdout == theirs.decode(expected, skip_special_tokens=True) + "\n"
    with Store(root / "store") as store:  # sampling wrote nothing
        assert [(n, store.values(n)) for n in store.query().all()] == before
    with _open(root) as job:
        assert job.generate([ids], 10, temperature=0) == [expected[len(ids) :]]


def test_sharded_generation_and_logits_equal_the_reference(imported: tuple[Path, Path]) -> None:
    assert len(jax.devices()) == 4  # the suite's four virtual devices
    src, root = imported
    with _open(root, **{"training/shard": 2}) as job:
        embedding = job.state.params["wte"]["embedding"]
        assert embedding.sharding.shard_shape(embedding.shape)[0] < embedding.shape[0]  # split
        ids = job.tokenizer.encode(TEXTS[0])
        reference, _ = folders.reference_forward(src, ids.tolist())
        _assert_close(_logits(job, ids), reference)
        expected = _greedy_reference(src, ids.tolist()[:5], 8)
        assert job.generate([ids.tolist()[:5]], 8, temperature=0) == [expected[5:]]


def test_a_prompt_that_does_not_fit_is_one_line(imported: tuple[Path, Path]) -> None:
    """`prompt_batch`, what an analysis's `inspection/prompt` becomes (theseus-analysis
    declares the setting; tests/test_gpt2_analysis.py traces one)."""
    _, root = imported
    with (
        _open(root) as job,
        pytest.raises(TrainerError, match=r"inspection/prompt is \d+ tokens .* 1 to"),
    ):
        job.prompt_batch("word " * 200)


@pytest.mark.slow  # lineage mechanics are the default suite's elsewhere; ~10 s
def _gpt2_yaml(folder: Path) -> Path:
    """`theseus configure gpt2` into `folder`: the file a fine-tuning `theseus run` reads."""
    written = CliRunner().invoke(main, ["configure", "gpt2", str(folder / "gpt2.yaml")])
    assert written.exit_code == 0, written.output
    return folder / "gpt2.yaml"


@pytest.mark.slow  # the default suite's budget: nox -s slow runs it
def test_fine_tuning_a_branch_on_text_in_gpt2s_tokens(
    imported: tuple[Path, Path], tmp_path: Path
) -> None:
    _, root = imported
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(40):  # 40 documents of ~200 tokens: two held out for validation
        (corpus / f"{i}.txt").write_text(" ".join(folders.CORPUS[i % 6 :]))
    with _open(root) as job:
        name = job.tokenizer.name
        start = jax.tree.map(np.asarray, job.state.params)
    # no text prepared: the command the branch prints prepares it in GPT-2's ids
    branch = CliRunner().invoke(
        main, ["run", "tuned", str(_gpt2_yaml(tmp_path)), str(root), "--branch", "gpt2"]
    )
    assert branch.exit_code == 1 and "DataNotPreparedError" in branch.output, branch.output
    hint = f"theseus data prepare text --root {shlex.quote(str(root))} --source DIR"
    assert f"{hint} --tokenizer {name} (Run with --debug" in branch.output, branch.output
    # text in bytes is refused: the model reads GPT-2's ids
    TextFiles.prepare(root, source=corpus)
    with quick(root) as q, pytest.raises(TrainerError, match=f"--tokenizer {name} --replace"):
        q.build(GPT2, "tuned")
        q.find().spec(run="gpt2").checkpoint().latest().branch()
        q.create()
    with pytest.raises(DataError, match="already holds other prepared tokens"):
        TextFiles.prepare(root, source=corpus, tokenizer=name)  # without --replace: kept
    with replacing():  # what the hint's --replace does
        TextFiles.prepare(root, source=corpus, tokenizer=name)
    with quick(root) as q:
        q.build(GPT2, "tuned")
        q.find().spec(run="gpt2").checkpoint().latest().branch()
        q.config["training/tokens"] = 3 * 4 * 64
        q.config["training/batch_size"] = 4
        q.config["logging/validation_interval"] = 3
        tuned = q.create()
        first = tuned.batch("train")
        assert int(first["x"].max()) < tuned.tokenizer.vocab_size
        tuned()
        assert int(tuned.state.step) == 3
        moved = jax.tree.map(
            lambda a, b: float(np.abs(np.asarray(a) - b).max()), tuned.state.params, start
        )
        assert min(jax.tree.leaves(moved)) > 0  # every parameter was trained
        values = q.store.values(tuned.node)
        assert np.isfinite(values["val/loss"])
    with quick(root) as q:  # resume the tuned lineage: it trains on from step 3
        q.build(GPT2, "tuned")
        q.find().spec(run="tuned").checkpoint().latest().resume()
        q.config["training/tokens"] = 5 * 4 * 64
        resumed = q.create()
        assert int(resumed.state.step) == 3
        resumed()
        assert int(resumed.state.step) == 5 and resumed.node.nonce == tuned.node.nonce


def test_gpt2_small_shapes_built_abstractly() -> None:
    """GPT-2 small (124M): its config.json's sizes give the published parameter count
    (124,439,808 with the unembedding tied) and exactly the model's tree and shapes."""
    config = {
        "model_type": "gpt2", "n_layer": 12, "n_embd": 768, "n_head": 12,
        "n_positions": 1024, "vocab_size": 50257, "activation_function": "gelu_new",
        "layer_norm_epsilon": 1e-5,
    }  # fmt: skip
    settings, _ = settings_of(config, Path("config.json"))
    leaves = plan("gpt2", settings, "")
    shapes = {name: shape for leaf in leaves.values() for name, shape in leaf.sources.items()}
    assert sum(int(np.prod(s)) for s in shapes.values()) == 124_439_808
    as_arrays: dict[str, Any] = {}
    for path, leaf in leaves.items():  # "blocks_0/attn/c_attn/kernel" -> nested dicts
        *parents, last = path.split("/")
        node = as_arrays
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = leaf.make([np.broadcast_to(np.float32(0), s) for s in leaf.sources.values()])
    keys = {k.removeprefix("architecture/"): v for k, v in settings.items()}
    model = GPT.build(**keys)
    abstract = jax.eval_shape(
        lambda: __import__("flax").linen.unbox(
            model.init(jax.random.key(0), jnp.zeros((1, 8), jnp.int32))
        )["params"]
    )
    assert jax.tree.map(lambda a: a.shape, abstract) == jax.tree.map(lambda a: a.shape, as_arrays)


# ------------------------------------------------------------------ bad folders
def _write(path: Path, text: str) -> None:
    path.write_text(text)


def _truncate(src: Path) -> None:
    data = (src / "model.safetensors").read_bytes()
    (src / "model.safetensors").write_bytes(data[: len(data) // 2])


def _pickle_only(src: Path) -> None:
    (src / "model.safetensors").rename(src / "pytorch_model.bin")


def _no_tokenizer(src: Path) -> None:
    for name in ("tokenizer.json", "vocab.json", "merges.txt"):
        (src / name).unlink()


def _no_end_of_text(src: Path) -> None:
    data = json.loads((src / "tokenizer.json").read_text())
    data["added_tokens"] = []
    data["model"]["vocab"].pop("<|endoftext|>")
    (src / "tokenizer.json").write_text(json.dumps(data))


def _vocabulary_without_end_of_text(src: Path) -> None:
    (src / "tokenizer.json").unlink()  # GPT-2's slow tokenizer files only
    vocab = json.loads((src / "vocab.json").read_text())
    vocab.pop("<|endoftext|>")
    (src / "vocab.json").write_text(json.dumps(vocab))


BAD = {
    "no-config": (lambda src: (src / "config.json").unlink(), "has no config.json"),
    "config-not-json": (lambda src: _write(src / "config.json", "{nope"), "not valid JSON"),
    "llama": (folders.edit_config(model_type="llama", architectures=["LlamaForCausalLM"]), "model_type 'llama'"),
    "swish": (folders.edit_config(activation_function="swish"), "activation_function 'swish'"),
    "inverse-layer-scaling": (folders.edit_config(scale_attn_by_inverse_layer_idx=True), "scale_attn_by_inverse_layer_idx"),
    "bad-n-inner": (folders.edit_config(n_inner=50), "n_inner is 50"),
    "negative-layers": (folders.edit_config(n_layer=-1), "n_layer is -1"),
    "pickle-only": (_pickle_only, "pytorch_model.bin"),
    "truncated-weights": (_truncate, "not a readable safetensors file"),
    "missing-tensor": (folders.edit_weights(lambda t: t.pop("h.1.mlp.c_fc.bias")), "no h.1.mlp.c_fc.bias"),
    "wrong-shape": (folders.edit_weights(lambda t: t.update({"wpe.weight": t["wpe.weight"][:10]})), "wpe.weight has shape [10, 32]"),
    "more-layers-than-config": (folders.edit_config(n_layer=1), "h.1."),
    "fewer-layers-than-config": (folders.edit_config(n_layer=3), "no h.2."),
    "no-tokenizer": (_no_tokenizer, "has no tokenizer"),
    "no-end-of-text": (_no_end_of_text, "eos_token_id 0 is not in tokenizer.json's vocabulary"),
    "vocab-without-end-of-text": (_vocabulary_without_end_of_text, "vocab.json has no <|endoftext|> token"),
    "config-vocabulary-not-the-weights": (folders.edit_config(vocab_size=100), "wte.weight has shape [300, 32], but"),
}  # fmt: skip


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return folders.write_gpt2_folder(tmp_path_factory.mktemp("pristine") / "src")


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_folder_that_is_not_gpt2_is_one_line_and_writes_nothing(
    case: str, pristine: Path, tmp_path: Path
) -> None:
    import shutil

    src = tmp_path / "src"
    shutil.copytree(pristine, src)
    breaks, message = BAD[case]
    breaks(src)
    root = tmp_path / "root"
    with pytest.raises(GPT2FolderError, match=message.replace("[", r"\[").replace("|", r"\|")):
        import_gpt2(src, root)
    assert not root.exists()  # nothing written, not even the root
    result = CliRunner().invoke(main, ["import", "gpt2", str(src), str(root)])
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error (GPT2FolderError):"), result.output
    assert not root.exists()


def test_a_tokenizer_larger_than_the_embedding_is_refused(tmp_path: Path) -> None:
    src = folders.write_gpt2_folder(tmp_path / "src", vocab_size=100)
    with pytest.raises(
        GPT2FolderError, match=r"tokenizer has 300 tokens but config\.json's vocab_size is 100"
    ):
        import_gpt2(src, tmp_path / "root")
    assert not (tmp_path / "root").exists()


def test_not_a_folder_and_an_existing_root_are_untouched(pristine: Path, tmp_path: Path) -> None:
    with pytest.raises(GPT2FolderError, match="is not a folder"):
        read_gpt2(tmp_path / "missing")
    root = tmp_path / "root"
    import_gpt2(pristine, root, "first")
    before = sorted((p.relative_to(root), p.stat().st_size) for p in root.rglob("*") if p.is_file())
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{}")
    with pytest.raises(GPT2FolderError):
        import_gpt2(broken, root, "second")
    after = sorted((p.relative_to(root), p.stat().st_size) for p in root.rglob("*") if p.is_file())
    assert after == before


def test_the_command_imports_and_prints_what_to_run_next(pristine: Path, tmp_path: Path) -> None:
    root = tmp_path / "my root"
    result = CliRunner().invoke(main, ["import", "gpt2", str(pristine), str(root), "--run", "base"])
    assert result.exit_code == 0, result.output
    assert "Importing GPT-2 from" in result.stderr and "2 layers, 32 wide" in result.stderr
    assert f"theseus sample '{root}' base~" in result.stdout
    assert "--tokenizer gpt2-" in result.stdout
    printed = next(line for line in result.stdout.splitlines() if line.startswith("Sample:"))
    argv = shlex.split(printed.removeprefix("Sample:"))
    sampled = CliRunner().invoke(main, argv[1:])  # the command as printed
    assert sampled.exit_code == 0 and sampled.stdout.startswith("Hello, my name is"), sampled.output
    with Store(root / "store") as store:
        (node,) = store.query().spec(run="base").all()
        assert store.values(node)["job/status"] == "finished"
        (saved,) = store.checkpoints(node)
        assert saved.step == 0 and Path(saved.path).is_relative_to(root)
        assert load(store.job_config(node))["gpt2"]["source"] == str(pristine)
    # the same tokenizer imported twice is kept once
    again = CliRunner().invoke(main, ["import", "gpt2", str(pristine), str(root), "--run", "again"])
    assert again.exit_code == 0, again.output
    assert len(os.listdir(root / "tokenizers")) == 1
    # a run that exists, or a name that cannot be one, is refused before anything is written
    before = sorted((p.relative_to(root), p.stat().st_size) for p in root.rglob("*") if p.is_file())
    for run, message in [
        ("base", "run general.default.base already has lineage(s) general.default.base~"),
        ("x" * 300, "at most 200 characters"),
        ("../x", "ASCII letters (A-Z, a-z), digits"),
    ]:
        refused = CliRunner().invoke(
            main, ["import", "gpt2", str(pristine), str(root), "--run", run]
        )
        assert refused.exit_code == 1 and message in refused.output, refused.output
        assert len(refused.output.strip().splitlines()) == 1
    after = sorted((p.relative_to(root), p.stat().st_size) for p in root.rglob("*") if p.is_file())
    assert after == before


def test_a_fresh_gpt2_run_without_a_source_says_how_to_import(tmp_path: Path) -> None:
    with quick(tmp_path) as q, pytest.raises(TrainerError, match="theseus import gpt2 FOLDER ROOT"):
        q.build(GPT2, "nothing")
        q.create()


def test_a_character_split_over_tokens_streams_once_whole(tmp_path: Path) -> None:
    """Weights built so greedy decoding writes the two byte tokens of "é" (Ã, ©), then ©s:
    the blocks add nothing and each position's embedding points at the token to write."""
    from safetensors.numpy import load_file, save_file
    from tokenizers import Tokenizer

    src = folders.write_gpt2_folder(tmp_path / "src")
    theirs = Tokenizer.from_file(str(src / "tokenizer.json"))
    first, second = theirs.get_vocab()["Ã"], theirs.get_vocab()["©"]
    weights = load_file(str(src / "model.safetensors"))
    rng = np.random.default_rng(1)
    wte = rng.standard_normal(weights["wte.weight"].shape)
    wte -= wte.mean(1, keepdims=True)
    wte /= np.linalg.norm(wte, axis=1, keepdims=True)
    prompt = theirs.encode("Hi", add_special_tokens=False).ids
    wpe = np.zeros_like(weights["wpe.weight"])
    wpe[len(prompt) - 1], wpe[len(prompt) :] = 50 * wte[first], 50 * wte[second]
    weights["wte.weight"], weights["wpe.weight"] = wte.astype(np.float32), wpe
    for name in weights:
        if name.endswith(("c_proj.weight", "c_proj.bias")):
            weights[name][...] = 0
    save_file(weights, str(src / "model.safetensors"))
    expected = _greedy_reference(src, prompt, 4)
    assert expected[len(prompt) :] == [first, second, second, second]
    import_gpt2(src, tmp_path / "root")
    streamed: list[str] = []
    with _open(tmp_path / "root") as job:
        text = job.generate("Hi", 4, temperature=0, stream=streamed.append)
    whole = theirs.decode(expected, skip_special_tokens=True)
    assert "Hi" + text == whole and whole.startswith("Hié")
    assert "".join(streamed) == text and "\ufffd" not in streamed[0]
