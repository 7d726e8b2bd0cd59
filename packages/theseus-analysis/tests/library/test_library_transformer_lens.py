"""TransformerLens, the reference: induction and previous-token scores and the logit lens
of tiny random GPT-2 and GPT-NeoX models made with transformers (torch session).

Each model (float32, weights of scale 0.3 so attention is far from uniform) is saved
with `save_pretrained` and a tokenizer, imported (`import_hf`) and analyzed by
`FirstAnalyses` (`induction`, `logit-lens`) on text prepared with its tokenizer.
TransformerLens loads the same model through `TransformerBridge.boot_transformers`
(TransformerLens 4's entry point, present in 3.x too) and runs the same token rows:
each head's induction and previous-token score from its cached `hook_pattern`, by the
definitions (the mean over the second half's queries of the attention to the token
after the previous occurrence, and over every query after the first of the attention
to the previous token), and the logit lens from its `accumulated_resid()` through its
own `ln_final` and `unembed`: each stream's mean loss and `KL(final || layer)` over the
counted targets. Within 1e-5.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")
bridge_module = pytest.importorskip("transformer_lens.model_bridge")

from theseus.analysis.library import FirstAnalyses  # noqa: E402
from theseus.data.datasets import TextFiles  # noqa: E402
from theseus.experiments.models.hf import import_hf  # noqa: E402
from theseus.quick import quick  # noqa: E402
from theseus.registry import import_module_or_file  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.tokenizers]

CORE = Path(__file__).parents[3] / "theseus-core" / "tests"
gpt2 = import_module_or_file(str(CORE / "gpt2_folder.py"))
families = import_module_or_file(str(Path(__file__).with_name("test_library_families.py")))

SIZES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "gpt2": ("GPT2LMHeadModel", "GPT2Config", {"n_layer": 2, "n_embd": 32, "n_head": 4,
             "n_positions": 64}),
    "gpt_neox": ("GPTNeoXForCausalLM", "GPTNeoXConfig", {"num_hidden_layers": 2,
                 "hidden_size": 32, "num_attention_heads": 4, "intermediate_size": 64,
                 "max_position_embeddings": 64, "rotary_pct": 0.5, "hidden_act": "gelu",
                 "tie_word_embeddings": False}),
}  # fmt: skip


def make_model(family: str, folder: Path) -> Any:
    """A random float32 model of `family` with a 300-token BPE, saved to `folder`."""
    model_class, config_class, sizes = SIZES[family]
    torch.manual_seed(0)
    config = getattr(transformers, config_class)(
        vocab_size=300, initializer_range=0.3, bos_token_id=0, eos_token_id=0, **sizes
    )
    model = getattr(transformers, model_class)(config).eval()
    model.save_pretrained(folder, safe_serialization=True)
    gpt2.train_tokenizer().save(str(folder / "tokenizer.json"))
    return model


def log_softmax(z: Any) -> Any:
    return torch.log_softmax(z.double(), dim=-1)


@pytest.mark.parametrize("family", ["gpt2", "gpt_neox"])
def test_scores_and_logit_lens_equal_transformer_lens(family: str, tmp_path: Path) -> None:
    folder = tmp_path / "hf"
    model = make_model(family, folder)
    root = tmp_path / "root"
    import_hf(folder, root, "tiny")
    (tokenizer,) = (p.name for p in (root / "tokenizers").iterdir())
    docs = families.write_documents(tmp_path / "docs")
    TextFiles.prepare(root, source=str(docs), tokenizer=tokenizer)
    with quick(root) as q:
        q.build(FirstAnalyses, "look")
        settings = {
            "library/analyses": ["induction", "logit-lens"],
            "library/dataset": "text",
            "library/batches": 2,
            "library/induction/length": 16,
            "library/induction/rows": 4,
        }
        for key, value in settings.items():
            q.config[key] = value
        q.find().spec(run="tiny").checkpoint().latest().resume()
        job = q.create()
        got = job()
        rows = np.asarray(job.repeated_batch()["x"])
        batches = job.validation_batches()

    fast = transformers.PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"))
    lens_model = bridge_module.TransformerBridge.boot_transformers(
        str(folder), hf_model=model, tokenizer=fast, device="cpu"
    )
    with torch.no_grad():
        _, cache = lens_model.run_with_cache(torch.as_tensor(rows, dtype=torch.long))
        layers = lens_model.cfg.n_layers
        n = rows.shape[1] // 2
        later, after = torch.arange(n, 2 * n), torch.arange(1, 2 * n)
        induction, previous = [], []
        for layer in range(layers):
            pattern = cache[f"blocks.{layer}.attn.hook_pattern"].double()  # [b, h, q, k]
            induction.append(pattern[:, :, later, later - n + 1].mean(dim=(0, 2)).numpy())
            previous.append(pattern[:, :, after, after - 1].mean(dim=(0, 2)).numpy())
        np.testing.assert_allclose(got.values["induction"]["induction"], induction, atol=1e-5)
        np.testing.assert_allclose(got.values["induction"]["previous_token"], previous, atol=1e-5)

        loss = np.zeros(layers + 1)
        kl = np.zeros(layers + 1)
        count = 0
        for batch in batches:
            x = torch.as_tensor(np.asarray(batch["x"]), dtype=torch.long)
            y = torch.as_tensor(np.asarray(batch["y"]), dtype=torch.long)
            counted = (y >= 0) & torch.as_tensor(np.asarray(batch["padding_mask"]))
            logits, cache = lens_model.run_with_cache(x)
            final = log_softmax(logits)
            for i, stream in enumerate(cache.accumulated_resid()):
                logp = log_softmax(lens_model.unembed(lens_model.ln_final(stream)))
                nll = -logp.gather(-1, y.clamp(min=0)[..., None])[..., 0]
                div = (final.exp() * (final - logp)).sum(-1)
                loss[i] += nll[counted].sum().item()
                kl[i] += div[counted].sum().item()
            count += int(counted.sum())
    lens = got.values["logit-lens"]
    np.testing.assert_allclose(lens["loss"], loss / count, atol=1e-5)
    np.testing.assert_allclose(lens["kl"], kl / count, atol=1e-5)
