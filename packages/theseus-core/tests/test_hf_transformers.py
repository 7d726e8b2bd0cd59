"""`import_hf` against Hugging Face transformers' own models, one per family.

Tiny random `GPTNeoXForCausalLM` (parallel and sequential residual, partial rotary),
`LlamaForCausalLM` (grouped-query heads, Llama 3 rope scaling, attention and MLP
biases, a Llama 3 tokenizer whose post-processor adds `<|begin_of_text|>`),
`MistralForCausalLM`, `Qwen2ForCausalLM` (untied, and tied with one key/value head) and `Olmo2ForCausalLM` in float32, saved with
`save_pretrained` with their tokenizer, imported into a Theseus root and compared with
transformers: token ids, logits at prompt lengths 1 to the block size, and greedy
`theseus sample` against greedy `generate`. Tolerance: float32 on CPU, logits within
1e-5 of their scale.

Run with torch and transformers installed (the nox `torch` session); skipped otherwise.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from click.testing import CliRunner  # noqa: E402

from theseus.cli import main  # noqa: E402
from theseus.experiments.models.hf import HF, import_hf  # noqa: E402
from theseus.quick import quick  # noqa: E402

pytestmark = pytest.mark.torch

RELATIVE = 1e-5
BLOCK = 64
NEW_TOKENS = 10
SIZES = {"hidden_size": 32, "num_hidden_layers": 2,
         "num_attention_heads": 4, "intermediate_size": 48,
         "max_position_embeddings": BLOCK, "tie_word_embeddings": False}  # fmt: skip
LLAMA3 = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
          "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 16}  # fmt: skip
MODELS: dict[str, tuple[str, dict[str, Any]]] = {
    "gpt_neox": ("GPTNeoXConfig", {"rotary_pct": 0.5, "hidden_act": "gelu"}),
    "gpt_neox-sequential": ("GPTNeoXConfig", {"rotary_pct": 0.25, "use_parallel_residual": False}),
    "llama3-biases": ("LlamaConfig", {"num_key_value_heads": 2, "rope_parameters": LLAMA3,
                                      "attention_bias": True, "mlp_bias": True}),
    "mistral": ("MistralConfig", {"num_key_value_heads": 2, "sliding_window": None}),
    "qwen2": ("Qwen2Config", {"num_key_value_heads": 2}),
    "qwen2-tied": ("Qwen2Config", {"num_key_value_heads": 1, "tie_word_embeddings": True}),
    "olmo2": ("Olmo2Config", {"num_key_value_heads": 1}),
}  # fmt: skip
TEXT = [
    "The ship of Theseus was kept in the harbour of Athens for a thousand years.",
    "As each plank rotted away, the shipwrights replaced it with a new one.",
    "A river is never the same river twice, for the water in it is always new.",
] * 3


def _tokenizer(start: bool) -> Any:
    """A byte-level BPE with `<|endoftext|>`; with `start`, Llama 3's start token added
    by a `TemplateProcessing` post-processor."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    special = ["<|endoftext|>", "<|begin_of_text|>"] if start else ["<|endoftext|>"]
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=special, show_progress=False)
    backend.train_from_iterator(TEXT, trainer)
    if start:
        backend.post_processor = processors.TemplateProcessing(
            single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", 1)]
        )
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token="<|endoftext|>",
        bos_token="<|begin_of_text|>" if start else None,
    )  # fmt: skip


def _folder(case: str, where: Path) -> tuple[Path, Any, Any]:
    kind, settings = MODELS[case]
    tokenizer = _tokenizer(start=case.startswith("llama3"))
    # the vocabulary is the tokenizer's: sampling draws only decodable ids
    sizes = {**SIZES, "vocab_size": len(tokenizer), **settings}
    config = getattr(transformers, kind)(**sizes, bos_token_id=0, eos_token_id=0, pad_token_id=0)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).to(torch.float32).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" in name and name.endswith(".weight"):
                parameter.uniform_(0.5, 1.5)
            else:
                parameter.normal_(0.0, 0.3)
    folder = where / case
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder, model, tokenizer


@pytest.mark.parametrize("case", sorted(MODELS))
def test_logits_tokens_and_greedy_sampling_match_transformers(case: str, tmp_path: Path) -> None:
    folder, model, tokenizer = _folder(case, tmp_path)
    root = tmp_path / "root"
    import_hf(folder, root, "m")
    with quick(root) as q:
        q.build(HF, "look")
        q.find().spec(run="m").checkpoint().latest().resume()
        job = q.create()
        for text in TEXT[:3]:
            assert job.tokenizer.encode(text).tolist() == tokenizer.encode(text)
        apply = jax.jit(job.model.apply)
        rng = np.random.default_rng(0)
        for length in (1, 2, 7, 33, BLOCK):
            ids = rng.integers(0, len(tokenizer), length).tolist()
            logits, _ = apply({"params": job.state.params}, jnp.asarray([ids], jnp.int32))
            with torch.no_grad():
                reference = model(torch.tensor([ids])).logits[0].numpy()
            error = float(np.abs(np.asarray(logits[0]) - reference).max())
            assert error <= RELATIVE * float(np.abs(reference).max()), (length, error)
    prompt = "The ship of"
    ids = tokenizer.encode(prompt)
    with torch.no_grad():
        out = model.generate(
            torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False,
            eos_token_id=None, pad_token_id=0, output_scores=True, return_dict_in_generate=True,
        )  # fmt: skip
    for scores in out.scores:  # no near-tie that float32 rounding could flip
        first, second = scores[0].topk(2).values.tolist()
        assert first - second > 1e-4 * float(scores[0].abs().max())
    expected = tokenizer.decode(
        out.sequences[0].tolist(), skip_special_tokens=True, clean_up_tokenization_spaces=False
    )
    sampled = CliRunner().invoke(
        main,
        ["sample", str(root), "m", prompt, "--temperature", "0",
         "--max-new-tokens", str(NEW_TOKENS)],
    )  # fmt: skip
    assert sampled.exit_code == 0, sampled.output
    assert sampled.stdout == expected + "\n"
