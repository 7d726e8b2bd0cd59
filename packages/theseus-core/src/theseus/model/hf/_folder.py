"""`read_hf(folder)`: a Hugging Face model folder checked whole, before anything is written.

The folder holds `config.json` (its `model_type` names the family), the weights
(`model.safetensors`, or shards listed by `model.safetensors.index.json`; every
tensor's name, shape and dtype are read from the file headers, no weight is loaded),
and `tokenizer.json` (a GPT-2 folder may hold its slow tokenizer's `vocab.json` and
`merges.txt` instead: GPT-2's byte-level BPE is built from them). The end-of-text token
is the model's own: `eos_token_id` of `config.json` or `generation_config.json`, else
`eos_token` of `tokenizer_config.json`, else `<|endoftext|>`. The check names the first
file, tensor or setting that is wrong.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from theseus.model.hf._config import FAMILIES, HFFolderError, settings_of
from theseus.model.hf._families import BUFFERS, Leaf, plan
from theseus.model.hf._safetensors import DTYPES, SafetensorsError, TensorInfo, read_header

__all__ = ["HFFolder", "read_hf"]

_PREFIXES = {"gpt2": ("transformer.", ""), "gpt_neox": ("gpt_neox.", ""),
             "llama": ("model.", ""), "olmo2": ("model.", "")}  # fmt: skip
_HEADS = ("lm_head.weight", "embed_out.weight")


@dataclass(frozen=True)
class HFFolder:
    """A checked Hugging Face model folder.

    Attributes:
        path: the folder (absolute).
        model_type: config.json's `model_type` (`gpt2`, `gpt_neox`, `llama`, ...).
        settings: configuration keys (`architecture/...`) that reproduce the model.
        tokenizer: the `tokenizer.json` text.
        eot: the end-of-text token's text (the model's `eos`).
        tensors: `{checkpoint name: TensorInfo}` of every tensor the model reads.
        leaves: `{"blocks_0/attn/c_attn/kernel": Leaf, ...}`, the parameter tree's recipe.
        notes: what the import changed to fit (printed by the command).
    """

    path: Path
    model_type: str
    settings: dict[str, Any]
    tokenizer: str
    eot: str
    tensors: dict[str, TensorInfo] = field(repr=False)
    leaves: dict[str, Leaf] = field(repr=False)
    notes: tuple[str, ...] = ()

    @property
    def parameter_count(self) -> int:
        """Parameters of the model (a tied unembedding counted once)."""
        return sum(int(np.prod(info.shape)) for info in self.tensors.values())

    @property
    def files(self) -> list[Path]:
        """The weight files, in the order their tensors are read."""
        return sorted({info.file for info in self.tensors.values()})


def read_hf(src: str | os.PathLike[str], *, only: str | None = None) -> HFFolder:
    """Check a Hugging Face model folder and describe it (no weight is loaded).

    Args:
        only: the one `model_type` the caller reads (`theseus import gpt2` reads
            `gpt2`); a folder of another is refused before anything else is read.

    Raises:
        HFFolderError: a missing or unreadable file, an unsupported `model_type` or
            setting, a tensor missing, unexpected, of the wrong shape or dtype, or a
            tokenizer without the model's end-of-text token; one line naming it.
    """
    folder = Path(src).expanduser().absolute()
    if not folder.is_dir():
        raise HFFolderError(
            f"{folder} is not a folder; pass a local Hugging Face model folder (config.json, "
            "model.safetensors, tokenizer.json)"
        )
    config = _json(folder / "config.json", required=True)
    kind = config.get("model_type")
    if kind is None and "GPT2LMHeadModel" in (config.get("architectures") or []):
        config["model_type"] = kind = "gpt2"
    if only is not None and kind != only:
        architectures = config.get("architectures") or []
        raise HFFolderError(
            f"{folder / 'config.json'} describes model_type {kind!r}"
            + (f" ({', '.join(map(str, architectures))})" if architectures else "")
            + f"; theseus import {only} reads model_type {only!r} only, theseus import hf "
            f"reads {', '.join(sorted(FAMILIES))}"
        )
    settings, notes = settings_of(config, folder / "config.json")
    family = FAMILIES[str(kind)]
    found = _headers(folder)
    prefix = next((p for p in _PREFIXES[family] if any(n.startswith(p) for n in found)), "")
    leaves = plan(family, settings, prefix)
    tensors = _check(folder, found, leaves, str(kind), settings)
    tokenizer, eot = _tokenizer(folder, config)
    return HFFolder(folder, str(kind), settings, tokenizer, eot, tensors, leaves, tuple(notes))


def _json(path: Path, required: bool = False) -> dict[str, Any]:
    if not path.is_file():
        if required:
            raise HFFolderError(
                f"{path.parent} has no {path.name}; a Hugging Face model folder holds "
                "config.json, model.safetensors and tokenizer.json"
            )
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise HFFolderError(f"{path} is not valid JSON ({error})") from None
    if not isinstance(data, dict):
        raise HFFolderError(f"{path} holds {type(data).__name__}, not a JSON object")
    return data


def _weight_files(folder: Path) -> list[Path]:
    single, index = folder / "model.safetensors", folder / "model.safetensors.index.json"
    if single.is_file():
        return [single]
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            names = sorted({str(name) for name in weight_map.values()})
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, AttributeError):
            raise HFFolderError(
                f"{index} is not a safetensors index (a JSON object with a weight_map)"
            ) from None
        for name in names:
            if Path(name).name != name or not (folder / name).is_file():
                raise HFFolderError(f"{index} names {name}, which is not a file in {folder}")
        return [folder / name for name in names]
    pickled = [n for n in ("pytorch_model.bin", "tf_model.h5") if (folder / n).is_file()]
    hint = (
        f" (it has {pickled[0]}: save it again with transformers' save_pretrained(folder, "
        "safe_serialization=True); Theseus never unpickles weights)"
        if pickled
        else ""
    )
    raise HFFolderError(f"{folder} has no model.safetensors nor model.safetensors.index.json{hint}")


def _headers(folder: Path) -> dict[str, TensorInfo]:
    found: dict[str, TensorInfo] = {}
    for file in _weight_files(folder):
        try:
            found.update(read_header(file))
        except (SafetensorsError, OSError) as error:
            raise HFFolderError(f"{file} is not a readable safetensors file ({error})") from None
    return found


def _check(
    folder: Path, found: dict[str, TensorInfo], leaves: dict[str, Leaf], kind: str,
    settings: dict[str, Any],
) -> dict[str, TensorInfo]:  # fmt: skip
    layers = settings["architecture/n_layers"]
    described = f"a {layers}-layer {kind} as config.json describes"
    expected = {name: shape for leaf in leaves.values() for name, shape in leaf.sources.items()}
    for name, shape in expected.items():
        if name not in found:
            raise HFFolderError(f"{folder}'s weights have no {name}, which {described} needs")
        info = found[name]
        if info.shape != shape:
            raise HFFolderError(
                f"{folder}'s {name} has shape {list(info.shape)}, but config.json's sizes "
                f"need {list(shape)}"
            )
        if info.dtype not in DTYPES:
            raise HFFolderError(
                f"{folder}'s {name} is {info.dtype}; the import reads "
                f"{', '.join(sorted(DTYPES))} weights"
            )
    tied = settings["architecture/tie_embeddings"]
    for name in found:
        if name in expected or name.endswith(BUFFERS) or (tied and name in _HEADS):
            continue
        raise HFFolderError(
            f"{folder}'s weights hold {name}, which {described} has no place for; the "
            "weights and config.json disagree"
        )
    return {name: found[name] for name in expected}


def _eos_id(config: dict[str, Any]) -> int | None:
    value = config.get("eos_token_id")
    if isinstance(value, list):
        value = value[0] if value else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _gpt2_bpe(folder: Path) -> str:
    """GPT-2's tokenizer.json text built from its slow tokenizer's `vocab.json` and
    `merges.txt`: byte-level BPE, no prefix space, `<|endoftext|>` a special token."""
    from theseus.data.tokenizer import END_OF_TEXT, _tokenizers

    vocab, merges = folder / "vocab.json", folder / "merges.txt"
    if not (vocab.is_file() and merges.is_file()):
        raise HFFolderError(
            f"{folder} has no tokenizer: expected tokenizer.json, or vocab.json and "
            "merges.txt (GPT-2's byte-level BPE)"
        )
    hf = _tokenizers()
    try:
        backend = hf.Tokenizer(hf.models.BPE.from_file(str(vocab), str(merges)))
    except Exception as error:  # the Rust reader's own message says what is wrong
        message = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise HFFolderError(f"{vocab} and {merges} are not a BPE vocabulary ({message})") from None
    backend.pre_tokenizer = hf.pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = hf.decoders.ByteLevel()
    if backend.token_to_id(END_OF_TEXT) is None:
        raise HFFolderError(f"{vocab} has no {END_OF_TEXT} token")
    backend.add_special_tokens([END_OF_TEXT])
    return str(backend.to_str())


def _tokenizer(folder: Path, config: dict[str, Any]) -> tuple[str, str]:
    from theseus.data.tokenizer import END_OF_TEXT, TokenizerError, parse_tokenizer

    path = folder / "tokenizer.json"
    if path.is_file():
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise HFFolderError(f"{path} is not UTF-8 text") from None
    elif config.get("model_type") == "gpt2":
        text, path = _gpt2_bpe(folder), folder / "vocab.json"
    else:
        raise HFFolderError(
            f"{folder} has no tokenizer.json; save the tokenizer with transformers' "
            "save_pretrained (a fast tokenizer) into the folder"
        )
    try:
        backend = parse_tokenizer(text, str(path), eot=None)
    except TokenizerError as error:
        raise HFFolderError(str(error)) from None
    eos = None
    for source in (config, _json(folder / "generation_config.json")):
        identifier = _eos_id(source)
        if identifier is not None:
            eos = backend.id_to_token(identifier)
            if eos is None:
                raise HFFolderError(
                    f"{folder}: eos_token_id {identifier} is not in {path.name}'s vocabulary"
                )
            break
    if eos is None:
        token = _json(folder / "tokenizer_config.json").get("eos_token")
        eos = token.get("content") if isinstance(token, dict) else token
    if eos is None and backend.token_to_id(END_OF_TEXT) is not None:
        eos = END_OF_TEXT
    if not isinstance(eos, str) or backend.token_to_id(eos) is None:
        raise HFFolderError(
            f"{folder} names no end-of-text token that tokenizer.json has (eos_token_id in "
            f"config.json or generation_config.json, eos_token in tokenizer_config.json; got "
            f"{eos!r}); Theseus separates documents with it"
        )
    size = backend.get_vocab_size(with_added_tokens=True)
    vocab = config.get("vocab_size", config.get("n_vocab"))
    if isinstance(vocab, int) and size > vocab:
        raise HFFolderError(
            f"{folder}'s tokenizer has {size} tokens but config.json's vocab_size is {vocab}; "
            "they come from different models"
        )
    return text, eos
