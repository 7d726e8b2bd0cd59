"""`theseus demo`: trains, analyzes in tandem and on the latest checkpoint, says where it all is."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
from click.testing import CliRunner, Result

from theseus.analysis.demo import AttentionPattern
from theseus.cli import main
from theseus.data.datasets import Synthetic
from theseus.job import store_root
from theseus.quick import quick
from theseus.store import Store


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Result]:
    """`theseus demo ROOT --steps 2`, run once: two validations, the fewest that show cadence."""
    root = tmp_path_factory.mktemp("demo")
    Synthetic.prepare(root, tokens=60_000, val_tokens=8_000)  # smaller than the demo's own
    return root, CliRunner().invoke(main, ["demo", str(root), "--steps", "2"])


def test_demo_trains_analyzes_and_prints_where_everything_is(demo) -> None:
    root, result = demo
    assert result.exit_code == 0, result.output
    assert "already prepared" in result.output
    match = re.search(r"val loss:\s+([\d.]+) -> ([\d.]+)", result.output)
    assert match and float(match.group(2)) < float(match.group(1))
    assert "entropy bound" in result.output and str(root / "store") in result.output
    pdfs = [Path(p) for p in re.findall(r"(/\S+\.pdf)", result.output)]
    assert len(pdfs) == 4  # two tandem analyses, the checkpoint analysis, the intervention
    for pdf in pdfs:
        assert pdf.read_bytes().startswith(b"%PDF")
    assert "4 PDFs kept as artifacts" in result.output  # 2 analyses x 2 validations
    # three held-out prompts, each continued by 40 tokens of the synthetic alphabet
    samples = re.findall(r"^    ('.*') -> ('.*')$", result.output, flags=re.MULTILINE)
    assert len(samples) == 3
    for prompt, sample in samples:
        assert (
            len(eval(prompt).encode()) == 8 and 0 < len(eval(sample)) <= 40
        )  # one char a token at most
    browse = shlex.split(result.output.strip().splitlines()[-1])  # the demo ends with it
    browse = browse[2:] if browse[:2] == ["uv", "run"] else browse  # started by `uv run`
    assert Path(browse[0]).name == "theseus-store" and browse[1:] == ["ui", str(root)]
    (command,) = [line for line in result.output.splitlines() if " sample " in line]
    argv = shlex.split(command)
    sampled = CliRunner().invoke(main, argv[argv.index("--import") :])  # as printed
    assert sampled.exit_code == 0, sampled.output
    assert sampled.stdout.startswith(eval(samples[0][0]))
    with Store(store_root(root)) as store:
        node = store.query().spec(run="demo").checkpoint().latest().first()
        assert node is not None and node.seq == 1
        assert [c.step for c in store.checkpoints(node)] == [2]
        pattern = store.history(node, "attention-pattern")
        assert len(pattern) == 2  # the tandem run's, then the checkpoint analysis's
        assert pattern[1].content == pdfs[2].read_bytes()
        assert pattern[0].content == pattern[1].content  # same weights and batch
        [ablation] = store.history(node, "head-ablation")
        assert ablation.content == pdfs[3].read_bytes() and pdfs[3].name == "head-ablation.pdf"
        values = store.values(node)  # the evaluation the demo printed, kept on the node
    printed = re.search(r"synthetic_mc  acc ([\d.]+) \+/- ([\d.]+)", result.output)
    assert printed and float(printed.group(1)) == pytest.approx(
        values["eval/synthetic_mc/acc"], abs=5e-4
    )
    assert values["eval/synthetic_mc/sample_len"] == 200
    bits = re.search(r"synthetic_ppl ([\d.]+) bits/byte", result.output)
    assert bits and float(bits.group(1)) == pytest.approx(
        values["eval/synthetic_ppl/bits_per_byte"], abs=5e-4
    )
    (command,) = [line for line in result.output.splitlines() if " eval " in line]
    argv = shlex.split(command)
    # as printed, on one document per task (the walk itself is test_eval_cli's)
    over = CliRunner().invoke(main, [*argv[argv.index("--import") :], "--limit", "1"])
    assert over.exit_code == 0, over.output
    assert "skipped" in over.output  # the last node holds both tasks already
    match = re.search(r"without layer (\d) head (\d): ([+-][\d.]+) nats", result.output)
    assert match and int(match.group(1)) < 2 and int(match.group(2)) < 4
    # the SAE commands it prints are the README's (tests/test_readme_features.py runs
    # those) with this root and lineage: a configuration beside the store, then --over
    configure, run = (
        shlex.split(line)
        for line in result.output.splitlines()
        if "demo/analyze/features" in line or " run features " in line
    )
    names = [Path(word).name for word in configure]
    start = names.index("theseus")
    assert configure[start + 1 :] == [
        "configure", "demo/analyze/features", str(root / "features.yaml"),
        "--import", "theseus.analysis.demo",
    ]  # fmt: skip
    lineage = f"{node.name}~{node.nonce}"  # the demo lineage's latest checkpoint, above
    assert run[[Path(word).name for word in run].index("theseus") + 1 :] == [
        "run", "features", str(root / "features.yaml"), str(root), "--over", lineage,
        "--import", "theseus.analysis.demo",
    ]  # fmt: skip


def test_demo_refuses_a_step_count_out_of_range(tmp_path: Path) -> None:
    # 2**31 steps overflowed the 32-bit step counter after the store and data were written
    for steps in ("0", "-3", str(2**31)):
        result = CliRunner().invoke(main, ["demo", str(tmp_path / "d"), "--steps", steps])
        assert result.exit_code == 2, result.output
        assert f"{steps} is not in the range 1<=x<=2147483647" in result.output
    assert not (tmp_path / "d").exists()


def test_attention_pattern_is_the_layers_own_attention(demo) -> None:
    root, ran = demo  # the demo's trained 2-layer model (block_size 64; the analysis crops 32)
    assert ran.exit_code == 0, ran.output
    with quick(root) as q:
        q.build(AttentionPattern, "pattern")
        # A branch: the demo's own nodes and their artifacts stay as the demo left them.
        q.find().spec(run="demo").checkpoint().latest().branch()
        job = q.create()
        result = job()
    weights = result.values  # [query, key], mean over heads, first sequence
    assert weights.shape == (32, 32)
    np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-5)
    assert np.all(np.triu(weights, k=1) == 0)  # causal
    # The probabilities, applied to the values, give the layer's own output.
    layer, inputs = job.debug("blocks_1/attn")
    x = inputs.x[:1, :32]  # what the analysis reads: the first sequence, 32 tokens
    probs = layer.weights(x)  # [1, heads, q, k]
    _, _, v = layer.project(x)
    mixed = jnp.einsum("bhqk,bkhd->bqhd", probs, v).reshape(x.shape)
    np.testing.assert_allclose(layer.c_proj(mixed), layer(x), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(weights, np.asarray(probs[0]).mean(0), rtol=1e-6, atol=1e-7)
    assert json.loads(json.dumps(weights.tolist()))  # plain numbers, host side
    assert result.path is not None and result.path.name == "attention-pattern.pdf"
