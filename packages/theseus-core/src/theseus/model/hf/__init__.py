"""Hugging Face model folders: checked whole, then streamed into the one decoder block.

`read_hf(folder)` reads `config.json` (`model_type` gpt2, gpt_neox, llama, mistral,
qwen2, olmo2), every weight tensor's name, shape and dtype from the safetensors headers
(one file or shards), and `tokenizer.json`, and refuses in one line anything the block
cannot reproduce, before anything is written. `load_state` / `load_params` then read
the tensors one at a time into arrays laid out for the trainer's sharding.
"""

from theseus.model.hf._config import FAMILIES, HFFolderError
from theseus.model.hf._folder import HFFolder, read_hf
from theseus.model.hf._stream import load_params, load_state

__all__ = ["FAMILIES", "HFFolder", "HFFolderError", "load_params", "load_state", "read_hf"]
