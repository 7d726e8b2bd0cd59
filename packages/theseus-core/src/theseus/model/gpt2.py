"""A Hugging Face GPT-2 folder, read as `theseus import hf` reads it: `read_gpt2`.

`theseus import gpt2` is the Hugging Face import restricted to `model_type` `gpt2`.
`read_gpt2(folder)` is `theseus.model.hf.read_hf` with that restriction: the same check
of `config.json` (GPT-2's settings), of every tensor's name, shape and dtype from the
safetensors headers (one file or shards), and of the tokenizer (`tokenizer.json`, or
GPT-2's `vocab.json` with `merges.txt`), before anything is written; its errors are
`GPT2FolderError`s. The weights then stream into a trainer's layout through
`theseus.model.hf.load_state`, as every family's do.

GPT-2 is the `GPT` module with learned positions, biases in every dense layer and
norm, tied embeddings, GELU with the tanh approximation (`gelu_new`) and layer norm
epsilon 1e-5; module paths are the same as a trained GPT's (`blocks_0/attn`, ...).
The gpt2 family's tensor names and how they make the parameter tree are in
`theseus.model.hf._families`, its `config.json` settings in `theseus.model.hf._config`.
Nothing is downloaded: the folder is the user's.
"""

from __future__ import annotations

import os

from theseus.model.hf import HFFolder, HFFolderError, read_hf

__all__ = ["GPT2FolderError", "read_gpt2"]


class GPT2FolderError(HFFolderError):
    """A folder that is not a GPT-2 this model can load (the message names what is wrong)."""


def read_gpt2(src: str | os.PathLike[str]) -> HFFolder:
    """Check a Hugging Face GPT-2 folder and describe it (no weight is loaded).

    Returns:
        The checked folder (`model_type` `gpt2`), as `read_hf` describes one.

    Raises:
        GPT2FolderError: a missing or unreadable file, another `model_type`, a setting
            this model cannot reproduce, or a tensor missing, unexpected or of the
            wrong shape; one line naming the file and what to do.
    """
    try:
        return read_hf(src, only="gpt2")
    except HFFolderError as error:
        raise GPT2FolderError(str(error)) from None
