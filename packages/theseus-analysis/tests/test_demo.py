"""`theseus demo`: trains, analyzes in tandem and on the latest checkpoint, says where it all is.

The browser test drives Debian's Chromium through Playwright (as theseus-store's
tests/test_ui_browser.py) over a copy of the demo's root with the induction score and the
logit lens run `--over` its lineage, and saves a screenshot of each frame (under
`THESEUS_UI_SCREENSHOTS` if set, else the test's temporary folder).
"""

from __future__ import annotations

import ast
import contextlib
import io
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import jax.numpy as jnp
import numpy as np
import pytest
from click.testing import CliRunner, Result
from hypothesis import example, given, settings
from hypothesis import strategies as st

from theseus.analysis._demo_cli import python_line
from theseus.analysis.demo import AttentionPattern
from theseus.cli import main
from theseus.data.datasets import Synthetic
from theseus.job import store_root
from theseus.quick import quick
from theseus.registry import import_module_or_file
from theseus.store import Node, Store

STORE_TESTS = Path(__file__).parents[2] / "theseus-store" / "tests"


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
    assert len(pdfs) == 5  # three tandem analyses, the checkpoint analysis, the intervention
    for pdf in pdfs:
        assert pdf.read_bytes().startswith(b"%PDF")
    assert [pdf.name for pdf in pdfs[:3]] == [
        "attention-input.pdf", "attention-pattern.pdf", "induction.pdf"
    ]  # fmt: skip
    assert "6 PDFs kept as artifacts" in result.output  # 3 analyses x 2 validations
    # three held-out prompts, each continued by 40 tokens of the synthetic alphabet
    samples = re.findall(r"^    ('.*') -> ('.*')$", result.output, flags=re.MULTILINE)
    assert len(samples) == 3
    for prompt, sample in samples:
        assert (
            len(eval(prompt).encode()) == 8 and 0 < len(eval(sample)) <= 40
        )  # one char a token at most
    browse = _browse(result)
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
        assert pattern[1].content == pdfs[3].read_bytes()
        assert pattern[0].content == pattern[1].content  # same weights and batch
        [ablation] = store.history(node, "head-ablation")
        assert ablation.content == pdfs[4].read_bytes() and pdfs[4].name == "head-ablation.pdf"
        [induction] = store.history(node, "induction")  # the tandem run's, at the last validation
        assert induction.content == pdfs[2].read_bytes()
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
    (line,) = [line for line in result.output.splitlines() if "theseus.quick" in line]
    code = shlex.split(line)[-1]  # `PYTHON -c CODE`, as printed
    printed_node = io.StringIO()
    with contextlib.redirect_stdout(printed_node):
        exec(code, {})
    assert printed_node.getvalue().strip() == str(node)
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


def _browse(result: Result) -> list[str]:
    """The `theseus-store ui ROOT` command the demo prints, as a shell would split it."""
    (line,) = [line for line in result.output.splitlines() if "theseus-store ui " in line]
    browse = shlex.split(line)
    return browse[2:] if browse[:2] == ["uv", "run"] else browse  # started by `uv run`


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=30) as answer:
        assert answer.status == 200, url
        return bytes(answer.read())


def test_demo_prints_the_induction_score_and_pages_that_open_when_pasted(demo) -> None:
    """The induction score at each validation as the store holds it, and the printed
    `theseus-store ui` command, started as pasted (on a free port instead of 8765, which
    a test cannot count on), serving the printed pages: the heatmap's frames at both
    validations and the highest head's curve."""
    pytest.importorskip("starlette", reason="the browser is theseus-store's [ui] extra")
    root, result = demo
    assert result.exit_code == 0, result.output
    out = result.output
    even = re.search(r"induction score \(library/induction, .* a head that attends evenly scores "
                     r"([\d.]+)\):", out)  # fmt: skip
    # mean of 1 / (q + 1) over the second half's queries, q = 32 .. 63 (a 64-token block)
    assert even and float(even.group(1)) == pytest.approx(sum(1 / k for k in range(33, 65)) / 32,
                                                          abs=5e-4)  # fmt: skip
    rows = re.findall(
        r"^    seq +(\d+): highest (L\dH\d) ([\d.]+); loss on the repeat ([\d.]+), on its "
        r"first occurrence ([\d.]+) nats/token$", out, flags=re.MULTILINE,
    )  # fmt: skip
    assert [int(seq) for seq, *_ in rows] == [0, 1]  # the two validations
    with Store(store_root(root)) as store:
        last = store.query().spec(run="demo").checkpoint().latest().first()
        assert last is not None
        lineage = f"{last.name}~{last.nonce}"
        for seq, head, score, repeat, first in rows:
            values = store.values(Node(last.name, last.nonce, int(seq)))
            heads = {k: v for k, v in values.items() if k.startswith("dynamics/induction/L")}
            assert len(heads) == 2 * 4  # every head of the demo's 2 layers x 4 heads
            assert float(score) == pytest.approx(max(heads.values()), abs=5e-4)
            assert float(score) == pytest.approx(heads[f"dynamics/induction/{head}"], abs=5e-4)
            assert float(score) == pytest.approx(values["dynamics/induction/max"], abs=5e-4)
            for printed, key in ((repeat, "second"), (first, "first")):
                assert float(printed) == pytest.approx(
                    values[f"dynamics/induction/{key}_half_loss"], abs=5e-4
                )

    # The pages it names: the slider on `induction` and the curve of its maximum.
    pages = [line.strip() for line in out.splitlines() if line.strip().startswith("http://")]
    assert len(pages) == 2, pages
    slider, curve = (urlsplit(page) for page in pages)
    assert (slider.path, parse_qs(slider.query)) == (
        "/slider",
        {"l": [lineage], "name": ["induction"]},
    )
    assert (curve.path, parse_qs(curve.query)) == (
        "/curves", {"l": [lineage], "key": ["dynamics/induction/max"]}
    )  # fmt: skip
    browse = _browse(result)
    program = browse[0] if "/" in browse[0] else str(Path(sys.executable).with_name(browse[0]))
    helped = subprocess.run([program, "ui", "--help"], capture_output=True, text=True, timeout=60)
    assert slider.netloc == "127.0.0.1:8765" and "(default 8765)" in helped.stdout
    port = _free_port()
    server = subprocess.Popen(
        [program, *browse[1:], "--port", str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        here = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            assert server.poll() is None, server.communicate()[0]
            try:
                _get(here + "/api/runs")
                break
            except OSError:
                assert time.monotonic() < deadline, "theseus-store ui did not answer in 60 s"
                time.sleep(0.2)
        page = _get(f"{here}{slider.path}?{slider.query}").decode()
        assert 'data-name="induction"' in page
        frames = json.loads(_get(f"{here}/api/frames?{slider.query}"))["frames"]
        assert [f["seq"] for f in frames] == [0, 1]
        assert _get(here + frames[-1]["image"]).startswith(b"\x89PNG")  # the heatmap, drawn
        assert "dynamics/induction/max" in _get(f"{here}{curve.path}?{curve.query}").decode()
        series = json.loads(_get(f"{here}/api/series?{curve.query}"))["series"]
        assert [s["x"] for s in series] == [[0, 1]]
        assert series[0]["y"] == pytest.approx([float(r[2]) for r in rows], abs=5e-4)
    finally:
        server.terminate()
        server.communicate(timeout=30)  # its output read and its pipe closed


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


@pytest.fixture(scope="module")
def walked(demo, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A copy of the demo's root (its own nodes stay as the demo left them) with the
    induction score and the logit lens run `--over` the demo's lineage, as README "The
    first analyses" runs them; the root and the lineage."""
    root, ran = demo
    assert ran.exit_code == 0, ran.output
    copy = tmp_path_factory.mktemp("walked") / "root"
    shutil.copytree(root, copy)
    config = copy / "first.yaml"
    runner = CliRunner()
    made = runner.invoke(main, ["configure", "library/first", str(config)])
    assert made.exit_code == 0, made.output
    over = ["--over", "demo", "library.analyses=[induction,logit-lens]"]
    walk = runner.invoke(main, ["run", "first", str(config), str(copy), *over,
                                "library.induction.tokens=data"])  # fmt: skip
    assert walk.exit_code == 0, walk.output
    assert "analyzed 2 of 2 checkpoints" in walk.output
    with Store(store_root(copy)) as store:
        node = store.query().spec(run="demo").checkpoint().latest().first()
        assert node is not None
    # the line on what else each node holds names the last node and the root, not
    # placeholders, and its store command works as printed (less how it is called)
    (line,) = [ln for ln in walk.output.splitlines() if "each node also holds" in ln]
    shown = shlex.split(line.split("(the last: ", 1)[1].split(";", 1)[0])
    at = shown.index("show")
    assert shown[at:] == ["show", str(store_root(copy)), str(node)], line
    assert line.endswith(f"curves over training: {' '.join(shown[:at])} ui {copy})"), line
    from theseus.store.cli import main as store_main

    assert store_main(shown[at:]) == 0
    return copy, f"{node.name}~{node.nonce}"


def test_the_first_analyses_walk_the_demos_lineage_from_the_command_line(walked) -> None:
    """README "The first analyses": `theseus run first ... --over demo` (the `walked`
    fixture, which also checks its "analyzed 2 of 2 checkpoints") left the induction score
    and the logit lens, pictures and values, on each checkpoint of the demo's lineage. The
    default suite's `theseus run --over` from the command line (the browser test below
    reads the same walk, in the slow set)."""
    root, lineage = walked
    with Store(store_root(root), readonly=True) as store:
        for seq in (0, 1):
            node = Node(*lineage.split("~"), seq)
            for name in ("induction", "logit-lens"):
                assert store.history(node, name)[-1].content.startswith(b"%PDF"), (seq, name)
            values = store.values(node)
            assert "dynamics/induction/max" in values, seq
            assert "dynamics/logit_lens/L1/loss" in values, seq


def _drawn(tab: Any) -> str:
    """The slider's picture once drawn (a polled evaluate: the page's CSP refuses
    `wait_for_function`'s string evaluation); its address."""
    image = tab.locator("#frame-image")
    deadline = time.monotonic() + 20
    while not image.evaluate("img => img.complete && img.naturalWidth > 0"):
        assert time.monotonic() < deadline, "the frame's picture did not load in 20 s"
        time.sleep(0.05)
    return str(image.get_attribute("src"))


@pytest.mark.slow  # Chromium over the walk (~4 s); the default suite keeps the walk (above),
# the demo's printed slider and curve pages served, and Chromium stepping a slider
# (tests/test_suite_browser.py)
def test_the_browser_steps_the_heatmap_and_the_lens_through_training(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """The time slider on the demo's lineage: the induction heatmap and the logit lens at
    each of its two checkpoints (the newest version at each node, the walk's), the
    frame's line on one line; the curves of the highest induction score and of the
    last layer's lens loss, one point per checkpoint; no error logged."""
    pytest.importorskip("starlette", reason="the browser is theseus-store's [ui] extra")
    pytest.importorskip("playwright", reason="playwright is not installed (the dev group has it)")
    if not (STORE_TESTS / "_ui_store.py").is_file():  # nox -s isolated: not beside
        pytest.skip("needs theseus-store's test helpers (the workspace)")
    from playwright.sync_api import expect, sync_playwright

    from theseus.store.ui import running

    chromium = import_module_or_file(str(STORE_TESTS / "_ui_store.py")).chromium()
    shots = Path(os.environ.get("THESEUS_UI_SCREENSHOTS", tmp_path / "screenshots"))
    shots.mkdir(parents=True, exist_ok=True)
    root, lineage = request.getfixturevalue("walked")  # once a browser is there to use it
    with running(root) as url, sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=chromium, args=["--no-sandbox", "--disable-gpu"]
        )
        tab = browser.new_page(viewport={"width": 1280, "height": 1040})
        problems: list[str] = []
        tab.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
        tab.on("pageerror", lambda e: problems.append(str(e)))
        info = tab.locator("#frame-info")
        for name in ("induction", "logit-lens"):
            tab.goto(f"{url}/slider?{urlencode({'l': lineage, 'name': name})}")
            seen = []
            for seq in (0, 1):
                if seq:
                    tab.keyboard.press("ArrowRight")
                expect(info).to_contain_text(f"{seq + 1}/2 · {lineage}~{seq} · seq {seq} · ")
                expect(info).to_contain_text(f"step {seq + 1} ·")
                source = _drawn(tab)
                shown = parse_qs(urlsplit(source).query)
                with Store(store_root(root), readonly=True) as store:
                    newest = store.history(Node(*lineage.split("~"), seq), name)[-1]
                assert shown == {"node": [f"{lineage}~{seq}"], "name": [name],
                                 "version": [str(newest.version)]}  # fmt: skip
                assert newest.content.startswith(b"%PDF")
                height, font = info.evaluate(
                    "e => [e.getBoundingClientRect().height, "
                    "parseFloat(getComputedStyle(e).fontSize)]"
                )
                assert height < 1.8 * font, "the frame's line wraps"
                seen.append(source)
                tab.screenshot(path=shots / f"demo-{name}-{seq}.png", full_page=True)
            assert seen[0] != seen[1]
        tab.set_viewport_size({"width": 1280, "height": 700})
        for key in ("dynamics/induction/max", "dynamics/logit_lens/L1/loss"):
            tab.goto(f"{url}/curves?{urlencode({'key': key, 'l': lineage})}")
            expect(tab.locator("#legend")).to_contain_text(f"{lineage} (2 of 2 points)")
            expect(tab.locator("#chart")).to_have_attribute("aria-label", f"{key} over nodes")
            tab.screenshot(path=shots / f"demo-curves-{key.replace('/', '-')}.png")
        browser.close()
    assert problems == []


@settings(max_examples=200, deadline=None)
@example('o\'brien "$HOME" `x`')
@example("undecodable-\udcff")  # a byte that is not UTF-8, as os.fsdecode gives it
@given(st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00/"), min_size=1))
def test_the_printed_python_line_is_one_shell_word_of_code_whatever_the_root(name: str) -> None:
    """A root named `o'brien`, `$HOME`, `a "b"` or `é`: the shell gives Python the code
    whole, and the code names the root as it is."""
    root = Path("/tmp") / name
    words = shlex.split(python_line("python", root))
    assert words[:2] == ["python", "-c"] and len(words) == 3
    tree = ast.parse(words[2])
    [call] = [
        n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "init"
    ]
    assert ast.literal_eval(call.args[0]) == str(root)
