"""Generation with a key-value cache, against the plain forward recomputed at every step.

Reference: `GPT.__call__` on the whole sequence so far (no cache, no padding), its
logits at the last position, and greedy decoding by argmax over them. Tolerance: float32
on CPU, logits within 1e-5 of their scale (max |difference| <= 1e-5 max |logit|).
"""

from __future__ import annotations

import functools
import hashlib
import shutil
from pathlib import Path

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from theseus.cli import main
from theseus.data.datasets import Synthetic
from theseus.model import generation
from theseus.model.generation import GenerationError, generate
from theseus.model.models import GPT
from theseus.quick import quick
from theseus.registry import JOBS as REGISTERED
from theseus.registry import import_module_or_file
from theseus.store import Store

JOBS = str(Path(__file__).with_name("trainer_jobs.py"))
jobs = import_module_or_file(JOBS)

VOCAB, BLOCK = 40, 32
RELATIVE = 1e-5  # of the logits' scale: max |ours - reference| <= 1e-5 * max |reference|


def _assert_close(ours: object, reference: np.ndarray) -> None:
    error = float(np.abs(np.asarray(ours) - reference).max())
    assert error <= RELATIVE * float(np.abs(reference).max()), error


REFERENCE = GPT.build(
    n_layers=2, n_embd=32, n_head=4, block_size=BLOCK, vocab_size=VOCAB, tie_embeddings=False
)


@pytest.fixture(scope="module")
def model_and_params() -> tuple[GPT, dict]:
    model = REFERENCE
    params = nn.unbox(jax.jit(model.init)(jax.random.key(0), jnp.zeros((1, 8), jnp.int32)))[
        "params"
    ]
    # larger weights than the init's 0.02, so the argmax moves from token to token
    params = jax.tree.map(lambda p: p * 8.0, params)
    return model, params


@jax.jit
def _last_logits(params: dict, ids: jax.Array, last: jax.Array) -> jax.Array:
    logits, _ = REFERENCE.apply({"params": params}, ids)
    return logits[0, last]


def _full_logits(model: GPT, params: dict, ids: list[int]) -> np.ndarray:
    """The plain forward's logits at the last of `ids`: padded to the context (causal
    attention keeps every earlier position independent of the padding), compiled once."""
    assert model == REFERENCE
    padded = np.zeros((1, BLOCK), np.int32)
    padded[0, : len(ids)] = ids
    return np.asarray(_last_logits(params, jnp.asarray(padded), jnp.int32(len(ids) - 1)))


def _greedy_by_recompute(model: GPT, params: dict, prompt: list[int], n: int) -> list[int]:
    ids = list(prompt)
    for _ in range(n):
        ids.append(int(np.argmax(_full_logits(model, params, ids))))
    return ids[len(prompt) :]


PROMPTS = [[3, 17, 5, 9, 22, 1, 30], [11, 2], [39, 0, 8, 8]]


def test_cached_logits_equal_the_full_forward_at_every_step(model_and_params) -> None:
    model, params = model_and_params
    seen: list[np.ndarray] = []
    tokens = generate(model, params, PROMPTS, 12, temperature=0, on_token=seen.append)
    assert [list(map(int, row)) for row in np.stack(seen, axis=1)] == tokens
    for prompt, new in zip(PROMPTS, tokens, strict=True):
        assert len(new) == 12
        # the logits the cache gave at each step are the ones the plain forward gives
        for n in range(12):
            ids = prompt + new[:n]
            reference = _full_logits(model, params, ids)
            assert new[n] == int(np.argmax(reference))
        assert new == _greedy_by_recompute(model, params, prompt, 12)
    assert len({tuple(t) for t in tokens}) == 3 and len(set(tokens[0])) > 3  # not degenerate


def test_the_cached_forward_itself_matches_within_1e_5(model_and_params) -> None:
    model, params = model_and_params
    prompt = PROMPTS[0]
    width = generation.prompt_bucket(len(prompt), BLOCK - 4)
    padded = jnp.asarray([[0] * (width - len(prompt)) + prompt])
    start = jnp.asarray([width - len(prompt)], jnp.int32)
    last, caches = generation._prefill(model, params, padded, start, BLOCK)
    _assert_close(last[0], _full_logits(model, params, prompt))
    ids = list(prompt)
    for n in range(4):
        token = int(np.argmax(last[0]))
        ids.append(token)
        last, caches = generation._step(model, params, caches, jnp.asarray([token], jnp.int32))
        assert int(caches[0].length) == width + n + 1
        _assert_close(last[0], _full_logits(model, params, ids))


def test_a_batch_gives_each_prompt_what_it_gives_alone(model_and_params) -> None:
    model, params = model_and_params
    together = generate(model, params, PROMPTS, 8, temperature=0)
    alone = [generate(model, params, [p], 8, temperature=0)[0] for p in PROMPTS]
    assert together == alone


def test_sampling_is_reproducible_from_its_key_and_honours_top_k_and_top_p(
    model_and_params,
) -> None:
    model, params = model_and_params

    def sample(seed: int, **settings: object) -> list[list[int]]:
        return generate(model, params, PROMPTS, 10, key=jax.random.key(seed), **settings)  # type: ignore[arg-type]

    assert sample(1) == sample(1)
    assert sample(1) != sample(2)
    greedy = generate(model, params, PROMPTS, 10, temperature=0)
    assert sample(1, top_k=1) == greedy  # only the most likely token is left
    assert sample(1, top_p=1e-6) == greedy  # the smallest set reaching p is the top token
    # a top_p that float32 rounds to 0 still keeps the top token (not token 0, drawn
    # when the nucleus kept nothing)
    assert any(token != 0 for row in greedy for token in row)
    assert sample(1, top_p=1e-300) == greedy
    # with top_k=3 every drawn token is among the 3 most likely under the plain forward
    for prompt, new in zip(PROMPTS, sample(5, top_k=3, temperature=2.0), strict=True):
        for n, token in enumerate(new):
            top3 = np.argsort(_full_logits(model, params, prompt + new[:n]))[-3:]
            assert token in top3


def _stream(key: jax.Array, prompt: list[int], repeat: int = 0) -> jax.Array:
    """The documented stream of a prompt, written out: the key folded with the first 31
    bits of BLAKE2b over its ids (little-endian int64), then with its repeat count."""
    digest = hashlib.blake2b(np.asarray(prompt, "<i8").tobytes(), digest_size=4).digest()
    folded = jax.random.fold_in(key, int.from_bytes(digest, "little") & 0x7FFFFFFF)
    return jax.random.fold_in(folded, repeat)


def test_a_prompt_draws_from_its_own_documented_stream(model_and_params) -> None:
    model, params = model_and_params
    prompt, key = PROMPTS[1], jax.random.key(7)
    new = generate(model, params, [PROMPTS[0], prompt, prompt], 6, temperature=1.5, key=key)
    for repeat, row in enumerate(new[1:]):
        stream = _stream(key, prompt, repeat)
        for n, token in enumerate(row):  # reference: the plain forward and one draw
            logits = _full_logits(model, params, prompt + row[:n]) / 1.5
            assert token == int(jax.random.categorical(jax.random.fold_in(stream, n), logits))
    assert new[1] != new[2]  # a repeated prompt gets a fresh stream


SETTINGS = [{"temperature": 1.3}, {"temperature": 0.8, "top_k": 8, "top_p": 0.95}]


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    others=st.lists(
        st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=7), min_size=1, max_size=2
    ),
    where=st.integers(0, 2),
    chosen=st.sampled_from(SETTINGS),
    seed=st.integers(0, 2**31 - 1),
)
def test_a_prompt_samples_the_same_alone_and_in_any_batch(
    model_and_params, others, where, chosen, seed
) -> None:
    model, params = model_and_params
    prompt = PROMPTS[2]
    others = [p for p in others if p != prompt]  # (a repeat would get the next stream)
    batch = [*others[:where], prompt, *others[where:]]
    key = jax.random.key(seed)
    alone = generate(model, params, [prompt], 6, key=key, **chosen)[0]  # type: ignore[arg-type]
    together = generate(model, params, batch, 6, key=key, **chosen)  # type: ignore[arg-type]
    assert together[batch.index(prompt)] == alone


def test_a_shorter_cache_gives_the_same_tokens(model_and_params, monkeypatch) -> None:
    """`cache_slots` = the longest prompt plus the new tokens: the cache made is that long,
    and the greedy tokens are the plain forward's, as with the whole context cached."""
    from theseus.model.attention.base import KVCache

    model, params = model_and_params
    made: list[int] = []
    empty = KVCache.empty.__func__  # type: ignore[attr-defined]

    def spy(cls, config, batch, slots, start=None):  # type: ignore[no-untyped-def]
        made.append(slots)
        return empty(cls, config, batch, slots, start)

    monkeypatch.setattr(KVCache, "empty", classmethod(spy))
    generation._prefill.clear_cache()
    short = generate(model, params, PROMPTS, 9, temperature=0, cache_slots=7 + 9)
    assert set(made) == {16}
    assert short == generate(model, params, PROMPTS, 9, temperature=0)
    assert set(made) == {16, BLOCK}
    for prompt, new in zip(PROMPTS, short, strict=True):
        assert new == _greedy_by_recompute(model, params, prompt, 9)
    for bad in (15, BLOCK + 1, 16.0, True):
        with pytest.raises(GenerationError, match="cache_slots must be an int from 16"):
            generate(model, params, PROMPTS, 9, temperature=0, cache_slots=bad)  # type: ignore[arg-type]


def test_a_16_bit_model_decodes_from_a_cast_copy_where_it_fits(monkeypatch, caplog) -> None:
    """A bfloat16 model decodes from its float32 matrices cast once (the same tokens as
    from the float32 ones); where the device reports less free memory than twice the
    copy, from the float32 ones, said once."""
    model = GPT.build(
        n_layers=2, n_embd=32, n_head=4, block_size=BLOCK, vocab_size=VOCAB, dtype="bfloat16"
    )
    params = nn.unbox(jax.jit(model.init)(jax.random.key(0), jnp.zeros((1, 8), jnp.int32)))
    params = jax.tree.map(lambda p: p * 8.0, params["params"])
    cast = generation.decoding_params(model, params)
    assert cast["wte"]["embedding"].dtype == jnp.bfloat16
    assert generation.decoding_params(model, cast) is cast  # a caller can cast once
    copy = sum(a.size * 2 for a in jax.tree.leaves(params) if a.ndim >= 2)
    free = [2 * copy - 1]
    monkeypatch.setattr(generation, "_free_bytes", lambda leaf: free[0])
    monkeypatch.setattr(generation, "_SAID", set())
    with caplog.at_level("WARNING", logger=generation.__name__):
        assert generation.decoding_params(model, params) is params
        float32 = generate(model, params, PROMPTS, 12, temperature=0)
    said = [r.getMessage() for r in caplog.records if "decoding from the float32" in r.getMessage()]
    assert len(said) == 1, said
    free[0] = 2 * copy
    assert generation.decoding_params(model, params)["wte"]["embedding"].dtype == jnp.bfloat16
    assert generate(model, params, PROMPTS, 12, temperature=0) == float32


def test_one_compiled_step_serves_every_token_and_every_prompt_of_a_bucket(
    model_and_params,
) -> None:
    model, params = model_and_params
    generation._prefill.clear_cache()  # earlier tests compiled batches of every shape
    generation._decoder.cache_clear()
    greedy = functools.partial(generation._decoder, model, True, None, False)
    generate(model, params, [[1, 2, 3], [4, 5]], 5, temperature=0)  # batch 2, bucket 8
    prefills = generation._prefill._cache_size()
    assert greedy()._cache_size() == 1
    generate(model, params, [[7, 7, 7, 7, 7, 7], [9]], 20, temperature=0)  # same bucket
    assert greedy()._cache_size() == 1  # no recompilation per prompt or token
    generate(model, params, [[5, 6], [1, 2, 3, 4]], 3, temperature=0.7, top_k=4)
    generate(model, params, [[5], [1, 2, 3, 4]], 7, temperature=1.3, top_k=4)
    assert generation._prefill._cache_size() == prefills  # no recompilation per prompt
    assert generation._decoder(model, False, 4, False)._cache_size() == 1  # top-k: its own
    generate(model, params, [list(range(1, 12)), [2]], 3, temperature=0)  # bucket 16
    assert generation._prefill._cache_size() == prefills + 1
    assert greedy()._cache_size() == 1  # the step does not depend on the bucket
    assert generation._decoder.cache_info().currsize == 2


def test_ids_beyond_the_tokenizers_vocabulary_are_never_drawn(model_and_params) -> None:
    """A padded embedding (GPT-NeoX's 50304 rows for 50277 tokens): the rows past the
    tokenizer's vocabulary are made to win; `vocab` keeps every draw below it, greedy
    takes the argmax over the allowed ids of the plain forward, and one compiled pick
    serves every bound."""
    model, params = model_and_params
    allowed = 30
    padded = jax.tree_util.tree_map(lambda p: p, params)
    padded["lm_head"]["kernel"] = padded["lm_head"]["kernel"].at[:, allowed:].mul(50.0)
    padded["lm_head"]["kernel"] = (
        padded["lm_head"]["kernel"].at[:, allowed:].add(jnp.abs(padded["lm_head"]["kernel"]).max())
    )
    unbounded = generate(model, padded, PROMPTS, 6, temperature=0)
    assert any(t >= allowed for row in unbounded for t in row)  # the padding would win
    generation._pick.clear_cache()
    greedy = generate(model, padded, PROMPTS, 6, temperature=0, vocab=allowed)
    for prompt, new in zip(PROMPTS, greedy, strict=True):
        for n in range(6):
            reference = _full_logits(model, padded, prompt + new[:n])
            assert new[n] == int(np.argmax(reference[:allowed]))
    compiled = generation._pick._cache_size()
    generate(model, padded, PROMPTS, 6, temperature=0, vocab=allowed - 7)
    assert generation._pick._cache_size() == compiled  # the bound is traced, not static
    for settings_ in ({"temperature": 1.0}, {"temperature": 2.0, "top_k": 50}, {"top_p": 0.99}):
        drawn = generate(
            model, padded, PROMPTS, 8, key=jax.random.key(3), vocab=allowed, **settings_
        )
        assert max(t for row in drawn for t in row) < allowed, settings_


@pytest.mark.parametrize(
    ("prompts", "n", "settings", "message"),
    [
        ("hello", 4, {}, "non-empty list of token-id lists"),
        ([[]], 4, {}, "non-empty list of token ids"),
        ([[1, VOCAB]], 4, {}, rf"must lie in \[0, {VOCAB}\)"),
        ([[1, 2]], 0, {}, "max_new_tokens must be a positive int"),
        ([[1] * 30], 5, {}, "exceeds the model's context, architecture/block_size = 32"),
        ([[1]], 4, {"temperature": -1.0}, "temperature must be >= 0"),
        ([[1]], 4, {"top_k": 0}, "top_k must be a positive int"),
        ([[1]], 4, {"top_p": 1.5}, r"top_p must be in \(0, 1\]"),
    ],
)
def test_bad_prompts_and_settings_are_one_line_errors(
    model_and_params, prompts, n, settings, message
) -> None:
    model, params = model_and_params
    with pytest.raises(GenerationError, match=message) as caught:
        generate(model, params, prompts, n, **settings)
    assert "\n" not in str(caught.value)


def test_a_trainer_generates_text_from_its_state(tmp_path: Path) -> None:
    Synthetic.prepare(tmp_path, tokens=20_000, val_tokens=4_000)
    trainer = jobs.train_tiny(tmp_path, jobs.SyntheticTrainer, "writer", 4)
    text = trainer.generate("the ", 12, temperature=0)
    assert isinstance(text, str)
    ids = trainer.generate([list(b"the ")], 12, temperature=0)
    assert text == bytes(ids[0]).decode("utf-8", "replace")  # the byte tokenizer's ids
    assert trainer.generate(["the ", "a"], 5, key=jax.random.key(3)) == trainer.generate(
        ["the ", "a"], 5, key=jax.random.key(3)
    )
    with quick(tmp_path) as q:  # a resumed checkpoint generates what the trainer did
        q.build(jobs.SyntheticTrainer, "writer")
        q.find().nonce(trainer.node.nonce).checkpoint().latest().resume()
        assert q.create().generate("the ", 12, temperature=0) == text
    streamed: list[str] = []
    assert trainer.generate("the ", 12, temperature=0, stream=streamed.append) == text
    assert "".join(streamed) == text

    # the command line: the run's name alone is its latest checkpoint; nothing is written
    with Store(tmp_path / "store") as store:
        before = [(n, store.values(n)) for n in store.query().all()]
    runner = CliRunner()
    sampled = runner.invoke(
        main, ["--import", JOBS, "sample", str(tmp_path), "writer", "the ",
               "--temperature", "0", "--max-new-tokens", "12"],
    )  # fmt: skip
    assert sampled.exit_code == 0, sampled.output
    assert sampled.stdout == "the " + text + "\n"
    assert f"{trainer.node} (step 4):" in sampled.stderr
    again = runner.invoke(
        main, ["--import", JOBS, "sample", str(tmp_path), "writer", "the ", "--seed", "7"]
    )
    assert (
        again.stdout
        == runner.invoke(
            main, ["--import", JOBS, "sample", str(tmp_path), "writer", "the ", "--seed", "7"]
        ).stdout
    )
    with Store(tmp_path / "store") as store:
        assert [(n, store.values(n)) for n in store.query().all()] == before
    too_long = runner.invoke(
        main, ["--import", JOBS, "sample", str(tmp_path), "writer", "x", "--max-new-tokens", "99"]
    )
    assert too_long.exit_code == 2 and "exceeds the model's context" in too_long.output
    _sample_command_checks(tmp_path, trainer)


def _sample_command_checks(root: Path, trainer: object) -> None:
    """`theseus sample`'s default, its options' ranges, and what it refuses before loading."""
    runner = CliRunner()

    def sample(*args: str, jobs_file: bool = True) -> object:
        before = ["--import", JOBS] if jobs_file else []
        return runner.invoke(main, [*before, "sample", str(root), "writer", *args])

    # the default fits the context (block_size 32, a 4-token prompt: 28 new tokens) and says so
    fitted = sample("the ", "--temperature", "0")
    assert fitted.exit_code == 0, fitted.output
    assert fitted.stdout == "the " + trainer.generate("the ", 28, temperature=0) + "\n"  # type: ignore[attr-defined]
    assert (
        "--max-new-tokens 28: what the model's context (architecture/block_size = 32) "
        "leaves after the 4-token prompt" in fitted.stderr
    )
    # options out of their range are refused by the option, in one line that names it
    for option, value, shown in [
        ("--temperature", "nan", "the range x>=0"),
        ("--temperature", "inf", "the range x>=0"),
        ("--temperature", "-1", "the range x>=0"),
        ("--top-p", "nan", "the range 0<x<=1"),
        ("--top-p", "0", "the range 0<x<=1"),
        ("--top-k", "0", "the range x>=1"),
        ("--max-new-tokens", "0", "the range x>=1"),
        ("--seed", str(2**64), "the range"),
    ]:
        refused = sample("the ", option, value)
        assert refused.exit_code == 2, (option, value, refused.output)
        line = refused.output.strip().splitlines()[-1]
        assert line.startswith(f"Error: Invalid value for '{option}': ") and shown in line
    # without the checkpoint, PROMPT and --max-new-tokens are still checked first
    shutil.rmtree(root / "checkpoints")
    for prompt, extra, message in [
        ("", [], "Invalid value for PROMPT: is empty"),
        ("x" * 40, [], "the prompt is 40 tokens and the model's context (architecture/block_size) "
         "is 32, which leaves no room for a new token; keep it under 32 tokens"),
        ("x" * 30, ["--max-new-tokens", "3"], "the prompt (30 tokens) plus 3 new tokens "
         "exceeds the model's context, architecture/block_size = 32; ask for at most 2"),
    ]:  # fmt: skip
        refused = sample(prompt, *extra)
        assert refused.exit_code == 2 and message in refused.output, refused.output
    # a job this environment does not know: the message names the module its run recorded
    cls = REGISTERED["test/synthetic/train"]
    REGISTERED.unregister("test/synthetic/train")
    try:
        unknown = sample("the ", jobs_file=False)
    finally:
        REGISTERED.register("test/synthetic/train", cls)
    assert unknown.exit_code == 1
    assert (
        "job 'test/synthetic/train', which this environment has not registered; its run "
        f"recorded module {jobs.__name__!r}: pass --import {jobs.__name__}" in unknown.output
    )
