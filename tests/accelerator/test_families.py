"""Every family the Hugging Face import reads, on the accelerator, against float64 NumPy.

For each `model_type` of the import's family table (`theseus.model.hf.FAMILIES`: gpt2,
gpt_neox, llama, mistral, qwen2, olmo2) a small random folder is written without
transformers, read as the import reads it (`read_hf`: the settings `settings_of` gives,
the weights mapped by `_families.plan`), and the model's logits on the accelerator, in
float32 under `precise()`, are compared with the float64 NumPy forward written from each
family's Hugging Face definition: `gpt2_folder.reference_forward` (learned positions,
LayerNorm with biases, `gelu_new`) and `hf_folder.hf_forward` (GPT-NeoX's partial
rotary and parallel residual, Llama 3's rope scaling, grouped-query heads, RMSNorm,
SwiGLU, Qwen2's QKV biases, OLMo-2's QK-norm and post-norms). Tolerance: `reference`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import _run
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _tolerances import assert_close, precise

from theseus.model.hf import FAMILIES, load_params, read_hf
from theseus.model.models import GPT
from theseus.registry import import_module_or_file

pytestmark = [pytest.mark.accelerator, pytest.mark.tokenizers]

LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 16}  # fmt: skip
# How each folder is written beyond its family's defaults (hf_folder.config_of).
FOLDERS: dict[str, dict[str, Any]] = {
    "gpt_neox": {},
    "llama": {"spelling": "rope_parameters", "rope_parameters": {"rope_theta": 5e5, **LLAMA3}},
    "mistral": {"tie_word_embeddings": True},
    "qwen2": {},
    "olmo2": {"attention_bias": True},
}
LENGTH = 24


def _helpers() -> tuple[Any, Any]:
    return (
        import_module_or_file(str(_run.CORE_TESTS / "gpt2_folder.py")),
        import_module_or_file(str(_run.CORE_TESTS / "hf_folder.py")),
    )


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    gpt2, hf = _helpers()
    base = tmp_path_factory.mktemp("families")
    written = {"gpt2": gpt2.write_gpt2_folder(base / "gpt2")}
    for model_type, options in FOLDERS.items():
        written[model_type] = hf.write_folder(model_type, base / model_type, **options)
    assert sorted(written) == sorted(FAMILIES)
    return written


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_logits_equal_the_float64_definition(model_type: str, folders: dict[str, Path]) -> None:
    gpt2, hf = _helpers()
    source = folders[model_type]
    folder = read_hf(source)
    model = GPT.build(**folder.settings)
    ids = [(7 * i + 3) % 300 for i in range(LENGTH)]
    x = jnp.asarray([ids], jnp.int32)
    abstract = jax.eval_shape(
        lambda: nn.unbox(model.init(jax.random.key(0), jnp.zeros((1, LENGTH), jnp.int32)))
    )["params"]
    params = load_params(folder, abstract)
    assert {leaf.platform for p in jax.tree.leaves(params) for leaf in p.devices()} == {
        jax.default_backend()
    }
    with precise():
        logits, _ = jax.jit(model.apply)({"params": params}, x)
    if model_type == "gpt2":
        reference = gpt2.reference_forward(source, ids)[0]
    else:
        reference = hf.hf_forward(source, ids)
    assert_close(np.asarray(logits[0]), reference, "reference", what=f"{model_type} logits")
