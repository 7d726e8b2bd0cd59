"""`theseus import hf`: a Hugging Face folder of each family becomes a lineage.

References: `hf_folder.hf_forward`, each family written from its Hugging Face modeling
definition in float64 NumPy over the folder's own tensors (independent of `GPT` and of
the import's mapping), and `hf_folder.tree_forward`, the contract's block over a
parameter tree. Tolerance: float32 on CPU, logits within 1e-5 of their scale.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from click.testing import CliRunner

from theseus.cli import main
from theseus.experiments.models.hf import HF, import_hf
from theseus.model.hf import HFFolderError, read_hf
from theseus.model.hf._config import settings_of
from theseus.quick import quick
from theseus.registry import import_module_or_file
from theseus.training.base import TrainerError

pytestmark = pytest.mark.tokenizers

H = import_module_or_file(str(Path(__file__).with_name("hf_folder.py")))
G = import_module_or_file(str(Path(__file__).with_name("gpt2_folder.py")))
RELATIVE = 1e-5
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 16}  # fmt: skip


def _close(ours: object, reference: np.ndarray) -> None:
    error = float(np.abs(np.asarray(ours) - reference).max())
    assert error <= RELATIVE * float(np.abs(reference).max()), error


# -------------------------------------------------------------- config mapping
def _settings(family: str, spelling: str = "old", **changes: Any) -> dict[str, Any]:
    settings, _ = settings_of(H.config_of(family, spelling, **changes), Path("config.json"))
    return {k.removeprefix("architecture/"): v for k, v in settings.items()}


SIZES = {"n_layers": 2, "n_embd": 32, "n_head": 4, "block_size": 64, "vocab_size": 320,
         "mlp_width": 48, "dropout": 0.0, "positions": "rotary"}  # fmt: skip
NEOX = {**SIZES, "rotary_fraction": 0.5, "rope_base": 10000.0, "activation": "gelu",
        "norm": "layernorm", "norm_eps": 1e-5, "residual": "parallel", "bias": True,
        "qkv_bias": True, "attn_out_bias": True, "tie_embeddings": False}  # fmt: skip
LLAMA = {**SIZES, "rotary_fraction": 1.0, "rope_base": 500000.0, "n_kv_head": 2,
         "activation": "silu", "gated_mlp": True, "norm": "rmsnorm", "norm_eps": 1e-6,
         "residual": "sequential", "qk_norm": False, "bias": False, "qkv_bias": False,
         "attn_out_bias": False, "mlp_bias": False, "tie_embeddings": False}  # fmt: skip
SCALED = {"rope_scaling/kind": "llama3", "rope_scaling/factor": 8.0,
          "rope_scaling/low_freq_factor": 1.0, "rope_scaling/high_freq_factor": 4.0,
          "rope_scaling/original_context": 16}  # fmt: skip
MAPPINGS = {
    "gpt_neox": ("gpt_neox", {}, NEOX),
    "gpt_neox-sequential": ("gpt_neox", {"use_parallel_residual": False}, {**NEOX, "residual": "sequential"}),
    "gpt_neox-exact-tanh": ("gpt_neox", {"hidden_act": "gelu_new"}, {**NEOX, "activation": "gelu_tanh"}),
    "llama": ("llama", {}, LLAMA),
    "llama-biases-tied": ("llama", {"attention_bias": True, "mlp_bias": True, "tie_word_embeddings": True},
                          {**LLAMA, "qkv_bias": True, "attn_out_bias": True, "mlp_bias": True, "tie_embeddings": True}),
    "mistral": ("mistral", {}, LLAMA),
    "qwen2": ("qwen2", {}, {**LLAMA, "qkv_bias": True}),
    "olmo2": ("olmo2", {}, {**LLAMA, "residual": "post_norm", "qk_norm": True}),
}  # fmt: skip


@pytest.mark.parametrize("spelling", ["old", "rope_parameters"])
@pytest.mark.parametrize("case", sorted(MAPPINGS))
def test_config_json_maps_to_the_blocks_settings(case: str, spelling: str) -> None:
    family, changes, expected = MAPPINGS[case]
    assert _settings(family, spelling, **changes) == expected


@pytest.mark.parametrize(
    "changes",
    [
        {"rope_scaling": {"rope_type": "llama3", **LLAMA3}},  # transformers 4.4x
        {
            "rope_scaling": {
                "type": "llama3",
                **{k: v for k, v in LLAMA3.items() if k != "rope_type"},
            }
        },
        {"rope_parameters": {"rope_theta": 500000.0, **LLAMA3}},  # transformers 5
    ],
    ids=["rope_scaling-rope_type", "rope_scaling-type", "rope_parameters"],
)
def test_llama3_rope_scaling_in_every_spelling(changes: dict) -> None:
    assert _settings("llama", "old", **changes) == {**LLAMA, **SCALED}


def test_a_sliding_window_shorter_than_the_context_caps_it_and_says_so() -> None:
    config = H.config_of("mistral", sliding_window=16)
    settings, notes = settings_of(config, Path("config.json"))
    assert settings["architecture/block_size"] == 16
    assert len(notes) == 1 and "capped to 16" in notes[0]
    settings, notes = settings_of(H.config_of("mistral", sliding_window=4096), Path("c"))
    assert settings["architecture/block_size"] == 64 and not notes


# ---------------------------------------------------- the model vs the reference
FOLDERS = {  # family -> how its folder is written (spelling, shards, dtype, changes)
    "gpt_neox": {"shards": 3},
    "llama": {"spelling": "rope_parameters", "rope_parameters": {"rope_theta": 5e5, **LLAMA3}},
    "mistral": {"dtype": "bfloat16", "tie_word_embeddings": True},
    "qwen2": {"dtype": np.float16, "spelling": "rope_parameters"},
    "olmo2": {"shards": 2, "attention_bias": True},
}


def _write(family: str, folder: Path, **more: Any) -> Path:
    import ml_dtypes

    options = {**FOLDERS[family], **more}
    if options.get("dtype") == "bfloat16":
        options["dtype"] = ml_dtypes.bfloat16
    return H.write_folder(family, folder, **options)


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Path], Path]:
    base = tmp_path_factory.mktemp("hf")
    sources = {family: _write(family, base / family) for family in FOLDERS}
    for family, src in sources.items():
        import_hf(src, base / "root", family)
    return sources, base / "root"


@contextlib.contextmanager
def _open(root: Path, run: str, **config: object) -> Iterator[Any]:
    """An `HF` job resumed at the imported lineage `run` (no data under the root)."""
    with quick(root) as q:
        q.build(HF, "look")
        q.find().spec(run=run).checkpoint().latest().resume()
        for key, value in config.items():
            q.config[key] = value
        yield q.create()


@pytest.mark.parametrize("family", sorted(FOLDERS))
def test_imported_logits_equal_the_hugging_face_definition(
    family: str, imported: tuple[dict[str, Path], Path]
) -> None:
    sources, root = imported
    with _open(root, family) as job:
        apply = jax.jit(job.model.apply)
        for length in (1, 7, job.block_size):
            ids = [(7 * i + 3) % 300 for i in range(length)]
            logits, _ = apply({"params": job.state.params}, jnp.asarray([ids], jnp.int32))
            _close(logits[0], H.hf_forward(sources[family], ids))


@pytest.mark.parametrize("family", sorted(FOLDERS))
def test_the_parameter_tree_is_the_contracts(family: str, tmp_path: Path) -> None:
    """Independently of the model: the contract's block over the imported tree is the
    Hugging Face definition over the folder's tensors."""
    from theseus.model.hf import load_params

    src = _write(family, tmp_path / family)
    folder = read_hf(src)

    def shape(leaf: Any) -> Any:
        parts = [np.zeros(s, np.float32) for s in leaf.sources.values()]
        return jax.ShapeDtypeStruct(leaf.make(parts).shape, jnp.float32)

    abstract: dict[str, Any] = {}
    for name, leaf in folder.leaves.items():
        *path, last = name.split("/")
        node = abstract
        for part in path:
            node = node.setdefault(part, {})
        node[last] = shape(leaf)
    params = jax.tree.map(np.asarray, load_params(folder, abstract))
    ids = [(5 * i + 1) % 300 for i in range(20)]
    _close(H.tree_forward(params, folder.settings, ids), H.hf_forward(src, ids))


# ------------------------------------------------------------------- bad folders
def _sharded_index_names_a_missing_file(src: Path) -> None:
    from safetensors.numpy import load_file, save_file

    tensors = load_file(str(src / "model.safetensors"))
    (src / "model.safetensors").unlink()
    save_file(tensors, str(src / "model-00001-of-00002.safetensors"))
    weight_map = dict.fromkeys(tensors, "model-00001-of-00002.safetensors")
    weight_map["lm_head.weight"] = "model-00002-of-00002.safetensors"
    (src / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))


Q = "model.layers.1.self_attn.q_proj.weight"
BAD = {
    "unknown-model-type": (G.edit_config(model_type="falcon"), "model_type 'falcon'; theseus import hf reads gpt2, gpt_neox, llama, mistral, olmo2, qwen2"),
    "unknown-rope-type": (G.edit_config(rope_scaling={"rope_type": "yarn", "factor": 4.0}), "rope type 'yarn'"),
    "unknown-rope-type-v5": (G.edit_config(rope_parameters={"rope_type": "dynamic", "factor": 2.0}), "rope type 'dynamic'"),
    "other-activation": (G.edit_config(hidden_act="gelu"), "hidden_act 'gelu'"),
    "head-dim": (G.edit_config(head_dim=16), "head_dim is 16"),
    "missing-tensor": (G.edit_weights(lambda t: t.pop(Q)), f"no {Q}, which a 2-layer llama"),
    "wrong-shape": (G.edit_weights(lambda t: t.update({Q: t[Q][:16]})), f"{Q} has shape [16, 32], but"),
    "extra-tensor": (G.edit_weights(lambda t: t.update({"model.layers.2.mlp.up_proj.weight": t[Q]})), "hold model.layers.2.mlp.up_proj.weight, which"),
    "integer-tensor": (G.edit_weights(lambda t: t.update({Q: t[Q].astype(np.int32)})), f"{Q} is I32"),
    "index-names-a-missing-file": (_sharded_index_names_a_missing_file, "names model-00002-of-00002.safetensors, which is not a file"),
    "no-tokenizer": (lambda src: (src / "tokenizer.json").unlink(), "has no tokenizer.json"),
    "eos-not-in-vocabulary": (G.edit_config(eos_token_id=9999), "eos_token_id 9999 is not in"),
    "no-config": (lambda src: (src / "config.json").unlink(), "has no config.json"),
}  # fmt: skip


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return H.write_folder("llama", tmp_path_factory.mktemp("pristine") / "src")


def _digest(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_folder_is_one_line_and_writes_nothing(
    case: str, pristine: Path, tmp_path: Path
) -> None:
    src = tmp_path / "src"
    shutil.copytree(pristine, src)
    breaks, message = BAD[case]
    breaks(src)
    with pytest.raises(HFFolderError) as raised:
        read_hf(src)
    assert message in str(raised.value) and "\n" not in str(raised.value)
    root = tmp_path / "root"
    result = CliRunner().invoke(main, ["import", "hf", str(src), str(root)])
    lines = result.output.strip().splitlines()
    assert result.exit_code == 1 and len(lines) == 1, result.output
    assert lines[0].startswith("Error (HFFolderError):") and message in lines[0]
    assert not root.exists()  # not even the root


def test_an_existing_root_is_untouched_by_a_bad_folder_or_override(
    pristine: Path, tmp_path: Path
) -> None:
    root = tmp_path / "root"
    import_hf(pristine, root, "first")
    before = _digest(root)
    broken = tmp_path / "broken"
    shutil.copytree(pristine, broken)
    G.edit_weights(lambda t: t.pop(Q))(broken)
    for argv in (
        ["import", "hf", str(broken), str(root), "--run", "second"],
        ["import", "hf", str(pristine), str(root), "--run", "second", "architecture.n_head=2"],
        ["import", "hf", str(pristine), str(root), "--run", "second", "training.strategy=nope"],
        ["import", "hf", str(pristine), str(root), "--run", "second", "training.shard=3"],
        ["import", "hf", str(pristine), str(root), "--run", "second", "training.batch_size=6"],
        ["import", "hf", str(pristine), str(root), "--run", "first"],
    ):
        result = CliRunner().invoke(main, argv)
        assert result.exit_code == 1 and len(result.output.strip().splitlines()) == 1, result.output
    assert _digest(root) == before
    fresh = tmp_path / "fresh"  # a root that did not exist is not created
    for override in ("training.shard=3", "training.batch_size=6", "architecture.n_head=2"):
        result = CliRunner().invoke(main, ["import", "hf", str(pristine), str(fresh), override])
        assert result.exit_code == 1 and len(result.output.strip().splitlines()) == 1, result.output
        assert not fresh.exists()


# --------------------------------------------------------- tokenizer, sample, fsdp
def test_sample_adds_the_tokenizers_start_token_and_stops_at_the_models_eos(
    tmp_path: Path,
) -> None:
    from tokenizers import Tokenizer

    src = H.write_folder("llama", tmp_path / "src", bos=True)
    theirs = Tokenizer.from_file(str(src / "tokenizer.json"))
    start, end = theirs.token_to_id("<|begin_of_text|>"), theirs.token_to_id("<|end_of_text|>")
    config = json.loads((src / "config.json").read_text())
    config["eos_token_id"] = end  # Llama 3's end of text, not GPT-2's <|endoftext|>
    (src / "config.json").write_text(json.dumps(config))
    root = tmp_path / "root"
    imported = CliRunner().invoke(main, ["import", "hf", str(src), str(root), "--run", "l3"])
    assert imported.exit_code == 0, imported.output
    prompt = "The quick brown"
    ids = theirs.encode(prompt).ids  # the post-processor's BOS first, as transformers encodes
    assert ids[0] == start
    expected = list(ids)
    for _ in range(6):
        expected.append(int(np.argmax(H.hf_forward(src, expected)[-1])))
    sampled = CliRunner().invoke(
        main, ["sample", str(root), "l3", prompt, "--temperature", "0", "--max-new-tokens", "6"]
    )
    assert sampled.exit_code == 0, sampled.output
    assert sampled.stdout == theirs.decode(expected, skip_special_tokens=True) + "\n"
    with _open(root, "l3") as job:
        assert job.tokenizer.encode(prompt).tolist() == ids
        assert job.tokenizer.eot == end


def test_import_under_fsdp_places_sharded_arrays_equal_to_the_folder(tmp_path: Path) -> None:
    assert len(jax.devices()) == 4  # the suite's four virtual devices
    src = H.write_folder("llama", tmp_path / "src", shards=2)
    root = tmp_path / "root"
    result = CliRunner().invoke(
        main, ["import", "hf", str(src), str(root), "training.strategy=fsdp"]
    )
    assert result.exit_code == 0, result.output
    w = H.load_weights(src)
    with _open(root, "hf", **{"training/strategy": "fsdp"}) as job:
        params = job.state.params
        attn = "model.layers.1.self_attn."
        expected = {
            ("wte", "embedding"): w["model.embed_tokens.weight"],
            ("blocks_1", "attn", "c_attn", "kernel"): np.concatenate(
                [w[attn + "q_proj.weight"], w[attn + "k_proj.weight"], w[attn + "v_proj.weight"]]
            ).T,
            ("blocks_1", "mlp", "c_gate", "kernel"): w["model.layers.1.mlp.gate_proj.weight"].T,
            ("lm_head", "kernel"): w["lm_head.weight"].T,
        }
        for path, value in expected.items():
            array = params
            for key in path:
                array = array[key]
            assert array.sharding.shard_shape(array.shape) != array.shape, path  # split
            np.testing.assert_array_equal(np.asarray(array), value.astype(np.float32))


def test_write_revision_saves_another_folders_weights_at_the_jobs_node(tmp_path: Path) -> None:
    """The seam for suites: a job set up at a node, one folder's weights as its checkpoint."""
    from theseus.experiments.models.hf import write_revision

    first = H.write_folder("gpt_neox", tmp_path / "first", seed=1)
    second = H.write_folder("gpt_neox", tmp_path / "second", seed=2)
    root = tmp_path / "root"
    with quick(root) as q:
        q.build(HF, "suite")
        folder = read_hf(first)
        for key, value in folder.settings.items():
            q.config[key] = value
        q.config["hf/source"] = str(first)
        job = q.create()  # set up at its first node, holding the first folder's weights
        write_revision(job, read_hf(second))
        job.on_finish()  # the checkpoint is committed and registered
        node = job.node
    with _open(root, "suite") as resumed:
        assert resumed.node.nonce == node.nonce
        np.testing.assert_array_equal(
            np.asarray(resumed.state.params["wte"]["embedding"]),
            H.load_weights(second)["gpt_neox.embed_in.weight"].astype(np.float32),
        )
    with quick(root) as q, pytest.raises(TrainerError, match="n_layers is 2, but the weights"):
        q.build(HF, "other")
        for key, value in folder.settings.items():
            q.config[key] = value
        q.config["hf/source"] = str(first)
        job = q.create()
        write_revision(
            job, read_hf(H.write_folder("gpt_neox", tmp_path / "deep", num_hidden_layers=3))
        )


def test_a_long_context_imports_and_samples(tmp_path: Path) -> None:
    """Llama 3.1's 131,072 positions: more than the default `training/tokens` holds in one
    batch, which an import (that never trains) must not refuse."""
    src = H.write_folder("llama", tmp_path / "src", max_position_embeddings=131072)
    root = tmp_path / "root"
    import_hf(src, root, "long")
    sampled = CliRunner().invoke(
        main, ["sample", str(root), "long", "The quick", "--temperature", "0",
               "--max-new-tokens", "3"],
    )  # fmt: skip
    assert sampled.exit_code == 0, sampled.output
    with _open(root, "long") as job:
        assert job.block_size == 131072
