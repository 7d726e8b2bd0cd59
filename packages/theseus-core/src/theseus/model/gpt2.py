"""Reading a Hugging Face GPT-2 folder: its configuration, weights and tokenizer.

`read_gpt2(folder)` checks everything a folder must hold before anything is written
anywhere: `config.json` (a GPT-2, with settings this model reproduces), the weights
(`model.safetensors`, or shards named by `model.safetensors.index.json`) with every
tensor's name and shape, read from the file headers without loading them, and the
tokenizer (`tokenizer.json`, or `vocab.json` with `merges.txt`). `GPT2Folder.params()`
then loads the weights into `GPT`'s parameter tree.

GPT-2 is the `GPT` module with learned positions, biases in every dense layer and
norm, tied embeddings, GELU with the tanh approximation (`gelu_new`) and layer norm
epsilon 1e-5; module paths are the same as a trained GPT's (`blocks_0/attn`, ...).
Hugging Face's `Conv1D` weights are stored `[in, out]`, as Flax's `Dense` kernels are,
and the fused `c_attn` columns are queries, keys, values, each split into heads, the
layout `SelfAttention.project` reads. Nothing is downloaded: the folder is the user's.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from theseus.errors import TheseusError

__all__ = ["GPT2Folder", "GPT2FolderError", "read_gpt2"]

# `activation_function` values and the `architecture/activation` that computes them
# (`gelu_fast` is the same tanh approximation as `gelu_new`, written another way).
_ACTIVATIONS = {
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_fast": "gelu_tanh",
    "gelu": "gelu",
    "relu": "relu",
}
# Settings of GPT2Config that change the computation, with the value this model computes.
_FIXED = {
    "scale_attn_weights": True,
    "scale_attn_by_inverse_layer_idx": False,
    "add_cross_attention": False,
}
# Buffers some checkpoints carry (the causal mask), not parameters.
_BUFFERS = ("attn.bias", "attn.masked_bias")


class GPT2FolderError(TheseusError, ValueError):
    """A folder that is not a GPT-2 this model can load (the message names what is wrong)."""


@dataclass(frozen=True)
class GPT2Folder:
    """A checked GPT-2 folder.

    Attributes:
        path: the folder (absolute).
        settings: configuration keys (`architecture/...`) that reproduce the model.
        tokenizer: the `tokenizer.json` text (built from `vocab.json` and `merges.txt`
            when the folder has no `tokenizer.json`).
        tensors: `{checkpoint name: (file, shape)}` of every parameter.
        prefix: `""` or `"transformer."`, how the folder names the body's tensors.
    """

    path: Path
    settings: dict[str, Any]
    tokenizer: str
    tensors: dict[str, tuple[Path, tuple[int, ...]]]
    prefix: str

    @property
    def parameter_count(self) -> int:
        """Parameters of the model (a tied unembedding counted once)."""
        names = _expected(self.settings, self.prefix)
        return sum(int(np.prod(self.tensors[name][1])) for name in names)

    def params(self) -> dict[str, Any]:
        """The weights as `GPT`'s parameter tree of float32 NumPy arrays."""
        from safetensors import safe_open

        handles: dict[Path, Any] = {}
        try:

            def read(name: str) -> np.ndarray:
                file = self.tensors[name][0]
                if file not in handles:
                    handles[file] = safe_open(str(file), framework="numpy")
                return np.asarray(handles[file].get_tensor(name), dtype=np.float32)

            return _tree(self.settings, self.prefix, read)
        finally:
            handles.clear()


def read_gpt2(src: str | os.PathLike[str]) -> GPT2Folder:
    """Check a Hugging Face GPT-2 folder and describe it (no weight is loaded).

    Raises:
        GPT2FolderError: a missing or unreadable file, another architecture, a setting
            this model cannot reproduce, or a tensor missing, unexpected or of the
            wrong shape; one line naming the file and what to do.
    """
    folder = Path(src).expanduser().absolute()
    if not folder.is_dir():
        raise GPT2FolderError(
            f"{folder} is not a folder; pass a local Hugging Face GPT-2 folder (config.json, "
            "model.safetensors, tokenizer.json)"
        )
    config = _config(folder)
    settings = _settings(config, folder / "config.json")
    prefix, tensors = _tensors(folder, settings)
    tokenizer = _tokenizer(folder)
    _check_vocabulary(tokenizer, settings, folder)
    return GPT2Folder(folder, settings, tokenizer, tensors, prefix)


# ------------------------------------------------------------------ config.json
def _config(folder: Path) -> dict[str, Any]:
    path = folder / "config.json"
    if not path.is_file():
        raise GPT2FolderError(
            f"{folder} has no config.json; a Hugging Face GPT-2 folder holds config.json, "
            "model.safetensors and tokenizer.json"
        )
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise GPT2FolderError(f"{path} is not valid JSON ({error})") from None
    if not isinstance(config, dict):
        raise GPT2FolderError(f"{path} holds {type(config).__name__}, not a JSON object")
    kind = config.get("model_type")
    architectures = config.get("architectures") or []
    if kind != "gpt2" and not (kind is None and "GPT2LMHeadModel" in architectures):
        raise GPT2FolderError(
            f"{path} describes model_type {kind!r}"
            + (f" ({', '.join(map(str, architectures))})" if architectures else "")
            + "; theseus import gpt2 reads GPT-2 folders (model_type 'gpt2')"
        )
    return config


def _integer(config: dict[str, Any], key: str, where: Path, *aliases: str) -> int:
    for name in (key, *aliases):
        value = config.get(name)
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise GPT2FolderError(f"{where}: {name} is {value!r}; expected a positive integer")
            return value
    raise GPT2FolderError(f"{where} has no {key}; a GPT-2 config.json sets it")


def _settings(config: dict[str, Any], where: Path) -> dict[str, Any]:
    for key, wanted in _FIXED.items():
        if key in config and config[key] != wanted:
            raise GPT2FolderError(
                f"{where}: {key} is {config[key]!r}; this model computes GPT-2 with "
                f"{key} = {wanted}"
            )
    n_layer = _integer(config, "n_layer", where, "num_hidden_layers")
    n_embd = _integer(config, "n_embd", where, "hidden_size")
    n_head = _integer(config, "n_head", where, "num_attention_heads")
    n_positions = _integer(config, "n_positions", where, "n_ctx", "max_position_embeddings")
    vocab_size = _integer(config, "vocab_size", where)
    if n_embd % n_head:
        raise GPT2FolderError(f"{where}: n_embd {n_embd} does not split into n_head {n_head}")
    inner = config.get("n_inner") or 4 * n_embd
    if not isinstance(inner, int) or inner % n_embd:
        raise GPT2FolderError(
            f"{where}: n_inner is {inner!r}; this model needs a multiple of n_embd ({n_embd})"
        )
    activation = config.get("activation_function", "gelu_new")
    if activation not in _ACTIVATIONS:
        raise GPT2FolderError(
            f"{where}: activation_function {activation!r} is not one this model computes; "
            f"supported: {', '.join(sorted(_ACTIVATIONS))}"
        )
    eps = config.get("layer_norm_epsilon", 1e-5)
    if isinstance(eps, bool) or not isinstance(eps, int | float) or not 0 < eps < 1:
        raise GPT2FolderError(f"{where}: layer_norm_epsilon is {eps!r}; expected a small number")
    dropout = config.get("resid_pdrop", 0.1)
    if isinstance(dropout, bool) or not isinstance(dropout, int | float) or not 0 <= dropout < 1:
        raise GPT2FolderError(f"{where}: resid_pdrop is {dropout!r}; expected a probability")
    return {
        "architecture/n_layers": n_layer,
        "architecture/n_embd": n_embd,
        "architecture/n_head": n_head,
        "architecture/block_size": n_positions,
        "architecture/vocab_size": vocab_size,
        "architecture/mlp_ratio": inner // n_embd,
        "architecture/activation": _ACTIVATIONS[activation],
        "architecture/norm_eps": float(eps),
        "architecture/dropout": float(dropout),
        "architecture/positions": "learned",
        "architecture/bias": True,
        "architecture/tie_embeddings": bool(config.get("tie_word_embeddings", True)),
    }


# ---------------------------------------------------------------------- weights
def _expected(settings: dict[str, Any], prefix: str) -> dict[str, tuple[int, ...]]:
    """Every parameter tensor's checkpoint name and shape."""
    d, vocab = settings["architecture/n_embd"], settings["architecture/vocab_size"]
    inner = settings["architecture/mlp_ratio"] * d
    shapes = {
        "wte.weight": (vocab, d),
        "wpe.weight": (settings["architecture/block_size"], d),
        "ln_f.weight": (d,),
        "ln_f.bias": (d,),
    }
    for i in range(settings["architecture/n_layers"]):
        for norm in ("ln_1", "ln_2"):
            shapes[f"h.{i}.{norm}.weight"] = shapes[f"h.{i}.{norm}.bias"] = (d,)
        for name, fan_in, fan_out in (
            ("attn.c_attn", d, 3 * d),
            ("attn.c_proj", d, d),
            ("mlp.c_fc", d, inner),
            ("mlp.c_proj", inner, d),
        ):
            shapes[f"h.{i}.{name}.weight"] = (fan_in, fan_out)
            shapes[f"h.{i}.{name}.bias"] = (fan_out,)
    named = {prefix + name: shape for name, shape in shapes.items()}
    if not settings["architecture/tie_embeddings"]:
        named["lm_head.weight"] = (vocab, d)
    return named


def _weight_files(folder: Path) -> list[Path]:
    single = folder / "model.safetensors"
    index = folder / "model.safetensors.index.json"
    if single.is_file():
        return [single]
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            files = sorted({folder / str(name) for name in weight_map.values()})
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, AttributeError):
            raise GPT2FolderError(
                f"{index} is not a safetensors index (a JSON object with a weight_map)"
            ) from None
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise GPT2FolderError(f"{index} names {missing[0]}, which is not in {folder}")
        return files
    pickled = [name for name in ("pytorch_model.bin", "tf_model.h5") if (folder / name).is_file()]
    hint = (
        f" (it has {pickled[0]}: save it again with transformers' "
        "save_pretrained(folder, safe_serialization=True); Theseus never unpickles weights)"
        if pickled
        else ""
    )
    raise GPT2FolderError(f"{folder} has no model.safetensors{hint}")


def _tensors(
    folder: Path, settings: dict[str, Any]
) -> tuple[str, dict[str, tuple[Path, tuple[int, ...]]]]:
    try:
        from safetensors import safe_open
    except ImportError:
        raise GPT2FolderError(
            'reading GPT-2 weights needs safetensors: pip install "theseus-core[gpt2]"'
        ) from None
    found: dict[str, tuple[Path, tuple[int, ...]]] = {}
    for file in _weight_files(folder):
        try:
            with safe_open(str(file), framework="numpy") as handle:
                for name in handle.keys():  # noqa: SIM118 (a safetensors handle, not a dict)
                    found[name] = (file, tuple(handle.get_slice(name).get_shape()))
        except Exception as error:  # the Rust reader's message says what is wrong
            message = str(error).splitlines()[0] if str(error) else type(error).__name__
            raise GPT2FolderError(
                f"{file} is not a readable safetensors file ({message})"
            ) from None
    prefix = "transformer." if "transformer.wte.weight" in found else ""
    if prefix + "wte.weight" not in found:
        raise GPT2FolderError(
            f"{folder}'s weights have no wte.weight (nor transformer.wte.weight); they are not "
            "a GPT-2's"
        )
    expected = _expected(settings, prefix)
    n_layer = settings["architecture/n_layers"]
    for name, shape in expected.items():
        if name not in found:
            raise GPT2FolderError(
                f"{folder}'s weights have no {name}, which a {n_layer}-layer GPT-2 "
                "(config.json) needs"
            )
        if found[name][1] != shape:
            raise GPT2FolderError(
                f"{folder}'s {name} has shape {list(found[name][1])}, but config.json's sizes "
                f"need {list(shape)}"
            )
    ignored = {prefix + "lm_head.weight", "lm_head.weight"}  # tied: the embedding serves
    for name in found:
        if name in expected or name in ignored or name.endswith(_BUFFERS):
            continue
        raise GPT2FolderError(
            f"{folder}'s weights hold {name}, which a {n_layer}-layer GPT-2 as config.json "
            "describes has no place for; the weights and config.json disagree"
        )
    return prefix, {name: found[name] for name in expected}


def _tree(settings: dict[str, Any], prefix: str, read: Any) -> dict[str, Any]:
    """`GPT`'s parameter tree from `read(checkpoint name) -> array`."""

    def dense(name: str) -> dict[str, np.ndarray]:
        return {"kernel": read(f"{name}.weight"), "bias": read(f"{name}.bias")}

    def norm(name: str) -> dict[str, np.ndarray]:
        return {"scale": read(f"{name}.weight"), "bias": read(f"{name}.bias")}

    tree: dict[str, Any] = {
        "wte": {"embedding": read(prefix + "wte.weight")},
        "wpe": {"embedding": read(prefix + "wpe.weight")},
        "ln_f": norm(prefix + "ln_f"),
    }
    for i in range(settings["architecture/n_layers"]):
        h = f"{prefix}h.{i}"
        tree[f"blocks_{i}"] = {
            "ln_1": norm(f"{h}.ln_1"),
            "attn": {"c_attn": dense(f"{h}.attn.c_attn"), "c_proj": dense(f"{h}.attn.c_proj")},
            "ln_2": norm(f"{h}.ln_2"),
            "mlp": {"c_fc": dense(f"{h}.mlp.c_fc"), "c_proj": dense(f"{h}.mlp.c_proj")},
        }
    if not settings["architecture/tie_embeddings"]:
        tree["lm_head"] = {"kernel": np.ascontiguousarray(read("lm_head.weight").T)}
    return tree


# -------------------------------------------------------------------- tokenizer
def _tokenizer(folder: Path) -> str:
    from theseus.data.tokenizer import END_OF_TEXT, TokenizerError, _tokenizers, parse_tokenizer

    path = folder / "tokenizer.json"
    try:
        if path.is_file():
            text = path.read_text(encoding="utf-8")
            parse_tokenizer(text, str(path))
            return text
        vocab, merges = folder / "vocab.json", folder / "merges.txt"
        if not (vocab.is_file() and merges.is_file()):
            raise GPT2FolderError(
                f"{folder} has no tokenizer: expected tokenizer.json, or vocab.json and "
                "merges.txt (GPT-2's byte-level BPE)"
            )
        hf = _tokenizers()
        try:
            backend = hf.Tokenizer(hf.models.BPE.from_file(str(vocab), str(merges)))
        except Exception as error:
            message = str(error).splitlines()[0] if str(error) else type(error).__name__
            raise GPT2FolderError(
                f"{vocab} and {merges} are not a BPE vocabulary ({message})"
            ) from None
        backend.pre_tokenizer = hf.pre_tokenizers.ByteLevel(add_prefix_space=False)
        backend.decoder = hf.decoders.ByteLevel()
        if backend.token_to_id(END_OF_TEXT) is None:
            raise GPT2FolderError(f"{vocab} has no {END_OF_TEXT} token")
        backend.add_special_tokens([END_OF_TEXT])
        return str(backend.to_str())
    except TokenizerError as error:
        raise GPT2FolderError(str(error)) from None
    except UnicodeDecodeError:
        raise GPT2FolderError(f"{path} is not UTF-8 text") from None


def _check_vocabulary(tokenizer: str, settings: dict[str, Any], folder: Path) -> None:
    from theseus.data.tokenizer import parse_tokenizer

    size = parse_tokenizer(tokenizer, str(folder)).get_vocab_size(with_added_tokens=True)
    if size > settings["architecture/vocab_size"]:
        raise GPT2FolderError(
            f"{folder}'s tokenizer has {size} tokens but config.json's vocab_size is "
            f"{settings['architecture/vocab_size']}; they come from different models"
        )
