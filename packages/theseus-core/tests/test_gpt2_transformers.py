"""`import_gpt2` against Hugging Face transformers' GPT-2, the independent reference.

A small random `GPT2LMHeadModel` and a byte-level BPE tokenizer trained here are saved
as a Hugging Face folder (`save_pretrained`: config.json, model.safetensors,
tokenizer.json), imported into a Theseus root, loaded back through `quick`, and compared
with transformers: the tokenizer's ids, the logits of several prompts, and greedy
generation through `theseus sample`. Tolerance: float32 on CPU, logits within 1e-5 of
their scale (max |theseus - transformers| <= 1e-5 max |transformers|).

Run with torch and transformers installed (the nox `torch` session); skipped otherwise.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

import jax.numpy as jnp  # noqa: E402
from click.testing import CliRunner  # noqa: E402

from theseus.cli import main  # noqa: E402
from theseus.experiments.models.gpt2 import GPT2, import_gpt2  # noqa: E402
from theseus.quick import quick  # noqa: E402

pytestmark = pytest.mark.torch

RELATIVE = 1e-5  # of the logits' scale: max |ours - reference| <= 1e-5 * max |reference|
EOT = "<|endoftext|>"
N_POSITIONS = 64
NEW_TOKENS = 12

# The tokenizer's training text. Its alphabet is the characters below (not all 256
# bytes), so every token decodes to ASCII text on its own and a continuation streamed
# piece by piece reads the same as one decoded at once.
TEXT = """\
The ship of Theseus was kept in the harbour of Athens for a thousand years.
As each plank rotted away, the shipwrights replaced it with a new one of the same shape.
Philosophers asked whether the ship that sailed at the end was still the ship of Theseus.
Some said that a thing is its form, and the form was never lost along the way.
Others said that a thing is its matter, and the matter was all gone, plank by plank.
A river is never the same river twice, for the water that runs in it is always new.
The old sailors only laughed and mended their nets while the learned men argued.
Small models learn small languages: they count words, guess the next one, and improve.
A tokenizer splits text into pieces, and a model predicts which piece comes next.
Quick brown foxes jump over lazy dogs; zebras and yaks quietly vex the judge.
"""


def _tokenizer() -> transformers.GPT2TokenizerFast:
    """A byte-level BPE tokenizer (GPT-2's kind) with a few hundred tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=[EOT], show_progress=False)
    backend.train_from_iterator(TEXT.splitlines(), trainer)
    fast = transformers.GPT2TokenizerFast(
        tokenizer_object=backend, bos_token=EOT, eos_token=EOT, unk_token=EOT
    )
    assert 300 <= len(fast) <= 400
    return fast


def _model(vocab_size: int, eot: int, **settings: object) -> transformers.GPT2LMHeadModel:
    """A random GPT-2 in eval mode, every parameter drawn (biases and norms included).

    Nonzero biases and layer-norm affine parts catch a parameter mapped to the wrong
    place; weights larger than GPT-2's init (0.02) spread the logits (scale about 5) and
    make exact and tanh GELU differ by about 2e-4 of it, 20 times the tolerance.
    """
    config = transformers.GPT2Config(
        n_layer=2, n_embd=32, n_head=4, n_positions=N_POSITIONS, vocab_size=vocab_size,
        bos_token_id=eot, eos_token_id=eot, **settings,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config).to(torch.float32).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if ".ln_" in name and name.endswith(".weight"):
                parameter.uniform_(0.5, 1.5)
            else:
                parameter.normal_(0.0, 0.3)
    return model


def _train(model: object, tokenizer: object, steps: int = 100) -> None:
    """Fit the model to TEXT a little (Adam; deterministic on CPU), then eval mode.

    A model that has learnt the text continues it, which a wrong position or cache
    entry would break; a random one mostly repeats a token.
    """
    lines = [tokenizer.encode(line, add_special_tokens=False) for line in TEXT.splitlines()]
    lines = [[*line, tokenizer.eos_token_id] for line in lines]
    width = max(map(len, lines))
    ids = torch.tensor([line + [0] * (width - len(line)) for line in lines])
    labels = torch.tensor([line + [-100] * (width - len(line)) for line in lines])
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(steps):
        loss = model(ids, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    assert loss.item() < 0.1  # it has learnt TEXT


def _folder(where: Path, *, train: bool = False, **settings: object) -> tuple[Path, object, object]:
    """Save a random (or briefly trained) GPT-2 and its tokenizer as one Hugging Face folder."""
    tokenizer = _tokenizer()
    model = _model(len(tokenizer), tokenizer.eos_token_id, **settings)
    if train:
        _train(model, tokenizer)
    folder = where / "hf"
    model.save_pretrained(folder)  # model.safetensors
    tokenizer.save_pretrained(folder)
    assert (folder / "model.safetensors").is_file()
    return folder, model, tokenizer


def _prompts(tokenizer: object) -> list[str]:
    """Texts of 1 token, a few tokens, a sentence, and just under n_positions tokens."""

    def length(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False))

    words = TEXT.split()
    long = words[0]
    for word in words[1:]:
        if length(f"{long} {word}") > N_POSITIONS - 1:
            break
        long = f"{long} {word}"
    prompts = ["The", "the ship of", "A river is never the same river twice.", long]
    assert length(prompts[0]) == 1 and N_POSITIONS - 8 <= length(long) <= N_POSITIONS - 1
    return prompts


def _assert_close(ours: object, reference: np.ndarray) -> None:
    error = float(np.abs(np.asarray(ours) - reference).max())
    assert error <= RELATIVE * float(np.abs(reference).max()), (
        error,
        float(np.abs(reference).max()),
    )


def _assert_logits_match(folder: Path, root: Path, model: object, tokenizer: object) -> None:
    node = import_gpt2(folder, root, run="gpt2")
    assert node is not None
    with quick(root) as q:
        q.build(GPT2, "look")
        q.find().spec(run="gpt2").checkpoint().latest().resume()
        job = q.create()
        for text in _prompts(tokenizer):
            ids = job.tokenizer.encode(text)
            expected = tokenizer.encode(text, add_special_tokens=False)
            assert list(map(int, ids)) == expected, text
            logits, _ = job.model.apply({"params": job.state.params}, jnp.asarray(ids)[None])
            with torch.no_grad():
                reference = model(torch.tensor([expected])).logits.numpy()
            assert np.asarray(logits).shape == reference.shape
            _assert_close(logits, reference)


def test_logits_and_tokens_match_transformers(tmp_path: Path) -> None:
    folder, model, tokenizer = _folder(tmp_path)
    _assert_logits_match(folder, tmp_path / "root", model, tokenizer)


def test_exact_gelu_wider_mlp_and_epsilon_match_transformers(tmp_path: Path) -> None:
    folder, model, tokenizer = _folder(
        tmp_path, activation_function="gelu", n_inner=3 * 32, layer_norm_epsilon=1e-6
    )
    _assert_logits_match(folder, tmp_path / "root", model, tokenizer)


def test_greedy_sampling_matches_transformers_generate(tmp_path: Path) -> None:
    no_dropout = {"resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}
    folder, model, tokenizer = _folder(tmp_path, train=True, **no_dropout)
    root = tmp_path / "root"
    import_gpt2(folder, root, run="gpt2")
    runner = CliRunner()
    # one token; one whose continuation leaves TEXT (and draws end-of-text, which both
    # decoders drop); one the model continues as it learnt it
    for prompt in ["The", "the ship of", "Philosophers asked"]:
        ids = tokenizer.encode(prompt, add_special_tokens=False)
        with torch.no_grad():
            out = model.generate(
                torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False,
                eos_token_id=None, pad_token_id=tokenizer.eos_token_id,
                output_scores=True, return_dict_in_generate=True,
            )  # fmt: skip
        sequence = out.sequences[0].tolist()
        # the Theseus sampler never stops early, so neither may transformers
        assert len(sequence) == len(ids) + NEW_TOKENS
        for scores in out.scores:  # no near-tie that float32 rounding could flip
            first, second = scores[0].topk(2).values.tolist()
            assert first - second > 1e-4 * float(scores[0].abs().max()), prompt
        expected = tokenizer.decode(
            sequence, skip_special_tokens=True, clean_up_tokenization_spaces=False
        )
        sampled = runner.invoke(
            main,
            ["sample", str(root), "gpt2", prompt, "--temperature", "0",
             "--max-new-tokens", str(NEW_TOKENS)],
        )  # fmt: skip
        assert sampled.exit_code == 0, sampled.output
        assert sampled.stdout == expected + "\n", (sequence, sampled.stdout)
