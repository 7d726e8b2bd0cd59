"""An imported training suite works as a trained lineage: `--over`, `q.find()`, the store's
command line and the browser's curves and time slider read it.

Reference: each revision's attention probabilities written in float64 NumPy from the
model's definition over that revision's own folder (theseus-core's tests/gpt2_folder.py),
within 1e-5; the lineage's nodes and values as the import wrote them.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from theseus.analysis import AnalysisBase
from theseus.analysis.library import InductionHeads
from theseus.cli import main
from theseus.experiments.models.gpt import PretrainGPT
from theseus.experiments.models.suite import import_suite
from theseus.model.attention.base import SelfAttention
from theseus.quick import quick
from theseus.registry import import_module_or_file
from theseus.store import Node, Store
from theseus.store.cli import main as store_main

pytestmark = pytest.mark.tokenizers

CORE = Path(__file__).parents[1] / "packages" / "theseus-core"
folders = import_module_or_file(str(CORE / "tests" / "gpt2_folder.py"))
suites = import_module_or_file(str(CORE / "tests" / "suite_folders.py"))
hf_folders = import_module_or_file(str(CORE / "tests" / "hf_folder.py"))
PROMPT = "All that glitters is not gold"


class LastLayer(AnalysisBase, PretrainGPT):
    """The last layer's head-averaged attention on the prompt (a JSON result)."""

    TARGET = SelfAttention
    NAME = "attention"

    def select(self, paths):  # type: ignore[no-untyped-def]
        return paths[-1]

    def analyze(self, layer, inputs):  # type: ignore[no-untyped-def]
        return layer.weights(inputs.x[:1])[0].mean(axis=0)

    def plot(self, values):  # type: ignore[no-untyped-def]
        return values.tolist()  # published as JSON


@pytest.fixture(scope="module")
def suite(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Path], str]:
    """A cache of three GPT-2 revisions (step2000 a copy of step1000) imported as `tiny`."""
    base = tmp_path_factory.mktemp("suite")
    revisions = {
        name: folders.write_gpt2_folder(
            base / "src" / name, n_layer=2, n_embd=16, n_head=2, seed=seed
        )
        for name, seed in (("step0", 0), ("step1000", 1), ("step2000", 1))
    }
    cache = suites.hf_cache(base / "models--org--tiny", revisions)
    result = import_suite(cache, base / "root", "tiny")
    return base / "root", revisions, result.lineage


def test_over_an_imported_suite_reads_each_revisions_weights(
    suite: tuple[Path, dict[str, Path], str],
) -> None:
    root, revisions, _ = suite
    with quick(root) as q:
        q.build(LastLayer, "look")
        nodes = q.find().spec(run="tiny").over()
        q.config["inspection/prompt"] = PROMPT
        job = q.create()
        ids = job.tokenizer.encode(PROMPT).tolist()
        result = job()
    assert [n.seq for n in nodes] == [0, 1000, 2000]
    assert [r.node for r in result.results] == nodes
    for answer, revision in zip(result.results, ("step0", "step1000", "step2000"), strict=True):
        _, attention = folders.reference_forward(revisions[revision], ids)
        np.testing.assert_allclose(answer.values, attention[-1].mean(axis=0), atol=1e-5)
    np.testing.assert_array_equal(result.results[1].values, result.results[2].values)


def test_the_store_command_line_and_the_browser_read_the_suite(
    suite: tuple[Path, dict[str, Path], str], capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("starlette", reason="the store browser needs theseus-store[ui]")
    root, _, lineage = suite
    assert store_main(["show", str(root / "store"), f"{lineage}~2000"]) == 0
    shown = capsys.readouterr().out
    assert "import/duplicate_of" in shown and "step1000" in shown
    assert store_main(["lineage", str(root / "store"), lineage]) == 0
    assert "~1000" in capsys.readouterr().out
    from starlette.testclient import TestClient

    from theseus.store.ui import create_app, open_readonly

    store = open_readonly(root / "store")
    try:
        with TestClient(create_app(store)) as client:
            answer = client.get("/api/series", params={"key": "import/step", "l": lineage})
            assert answer.status_code == 200, answer.text
            (series,) = answer.json()["series"]
            assert series["x"] == series["y"] == [0, 1000, 2000]  # x is the seq: the step
            assert series["node"] == [f"{lineage}~{seq}" for seq in (0, 1000, 2000)]
            page = client.get("/curves", params={"l": lineage, "key": "import/step"})
            assert page.status_code == 200
    finally:
        store.close()


@pytest.mark.slow  # ~4 s; the README test below runs the same command on GPT-NeoX
def test_theseus_run_over_the_suite_from_the_command_line(
    suite: tuple[Path, dict[str, Path], str], tmp_path: Path
) -> None:
    root, _, lineage = suite
    runner = CliRunner()
    config = tmp_path / "ablation.yaml"
    imports = ["--import", "theseus.analysis.demo"]
    made = runner.invoke(main, ["configure", "demo/intervene/head-ablation", str(config), *imports])
    assert made.exit_code == 0, made.output
    ran = runner.invoke(
        main,
        [
            "run",
            "ablation",
            str(config),
            str(root),
            "--over",
            lineage.split(".")[-1],
            *imports,
            f"inspection/prompt={PROMPT}",
        ],
    )
    assert ran.exit_code == 0, ran.output
    assert f"analyzed 3 of 3 checkpoints of {lineage} (seq 0 to 2000)" in ran.stdout
    with Store(root / "store") as store:
        held: dict[int, Any] = {
            n.seq: store.get(n).get("head-ablation") for n in store.query().all()
        }
    assert all(held[seq] is not None for seq in (0, 1000, 2000))
    from starlette.testclient import TestClient

    from theseus.store.ui import create_app, open_readonly

    store = open_readonly(root / "store")
    try:
        with TestClient(create_app(store)) as client:  # the time slider's frames
            answer = client.get("/api/frames", params={"l": lineage, "name": "head-ablation"})
            assert answer.status_code == 200, answer.text
            frames = answer.json()["frames"]
            assert [f["node"] for f in frames] == [f"{lineage}~{s}" for s in (0, 1000, 2000)]
            assert client.get("/slider", params={"l": lineage}).status_code == 200
    finally:
        store.close()


README = Path(__file__).parents[1] / "README.md"


def _section() -> list[str]:
    text = README.read_text()
    section = text.split("## Watch a circuit form in Pythia", 1)[1].split("\n## ", 1)[0]
    (block,) = re.findall(r"```bash\n(.*?)```", section, flags=re.DOTALL)
    return block.splitlines()


def test_the_watch_a_circuit_form_in_pythia_section_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The README's commands, verbatim, on a tiny random GPT-NeoX suite of four revisions
    (step2000 a copy of step1000, which the import must flag) in a Hugging Face cache
    under a HOME of the test's own; `theseus-store ui` is served by Starlette's test
    client instead of a socket. Each revision's induction and previous-token scores are
    then checked against GPT-NeoX's attention written in float64 NumPy from its
    definition, on the analysis's own rows of repeated random tokens, within 1e-5."""
    pytest.importorskip("starlette", reason="the store browser needs theseus-store[ui]")
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    seeds = {"step0": 0, "step1000": 1, "step2000": 1, "step3000": 3}
    revisions = {
        name: hf_folders.write_folder("gpt_neox", tmp_path / "made" / name, seed=seed)
        for name, seed in seeds.items()
    }
    hub = tmp_path / ".cache" / "huggingface" / "hub"
    suites.hf_cache(
        hub / "models--EleutherAI--pythia-160m", revisions, aliases={"main": "step3000"}
    )
    runner = CliRunner()
    outputs = []
    for line in _section():
        argv = shlex.split(line)
        assert "--import" not in argv, "the induction score is built in"
        if argv[0] == "theseus":
            result = runner.invoke(main, argv[1:])
            assert result.exit_code == 0, result.output
            outputs.append(result.output)
        elif argv[:2] == ["theseus-store", "ui"]:
            outputs.append(_slider(Path(argv[2])))
        else:
            assert argv[0] == "theseus-store", line
            assert store_main(argv[1:]) == 0
            outputs.append(capsys.readouterr().out)
    table = outputs[0]
    assert [row.split()[0] for row in table.splitlines()[1:5]] == list(seeds)  # not main
    assert "step2000  2000  -       " in table and "DUPLICATE of step1000" in table
    lineage = re.search(r"as nodes of (\S+) \(seq = step\)", table)
    assert lineage is not None
    assert f"analyzed 4 of 4 checkpoints of {lineage.group(1)} (seq 0 to 3000)" in outputs[2]
    assert f"{lineage.group(1)}~3000" in outputs[3]  # theseus-store lineage
    frames, curve = outputs[4]
    assert frames == [f"{lineage.group(1)}~{s}" for s in (0, 1000, 2000, 3000)]

    # The reference: each revision's attention on the rows the analysis read.
    with quick(Path("results")) as q:
        q.build(InductionHeads, "rows")
        q.find().spec(run="pythia-160m").checkpoint().latest().branch()
        rows = q.create().repeated_batch()["x"]  # [rows, 2n]: n random tokens, then again
    n = rows.shape[1] // 2
    assert (rows[:, :n] == rows[:, n:]).all() and n == 32  # the 64-position model's half
    later, after = np.arange(n, 2 * n), np.arange(1, 2 * n)
    run, nonce = lineage.group(1).split("~")
    maxima = []
    with Store(Path("results") / "store") as store:
        for name in seeds:
            values = store.values(Node(run, nonce, int(name.removeprefix("step"))))
            per_row = [suites.neox_attention(revisions[name], row.tolist()) for row in rows]
            attention = np.stack([np.stack(layers) for layers in per_row])  # [row, l, h, q, k]
            induction = attention[..., later, later - n + 1].mean(axis=(0, 3))  # [l, h]
            previous = attention[..., after, after - 1].mean(axis=(0, 3))
            for (layer, head), score in np.ndenumerate(induction):
                got = values[f"dynamics/induction/L{layer}H{head}"]
                assert got == pytest.approx(score, abs=1e-5), (name, layer, head)
                got = values[f"dynamics/previous_token/L{layer}H{head}"]
                assert got == pytest.approx(previous[layer, head], abs=1e-5), (name, layer, head)
            assert values["dynamics/induction/max"] == pytest.approx(induction.max(), abs=1e-5)
            maxima.append(values["dynamics/induction/max"])
    assert curve == maxima  # the browser's curve: the values the nodes hold


def _slider(root: Path) -> tuple[list[str], list[float]]:
    """What `theseus-store ui ROOT` serves: the time slider's frames of the induction
    heatmap (each drawn), and the curve of `dynamics/induction/max`."""
    from starlette.testclient import TestClient

    from theseus.store.ui import create_app, open_readonly

    store = open_readonly(root / "store")
    try:
        with TestClient(create_app(store)) as client:
            (row,) = client.get("/api/runs").json()["rows"]  # the one lineage
            name = row["lineage"]
            assert row["checkpoints"] == 4
            page = client.get("/slider", params={"l": name, "name": "induction"})
            assert page.status_code == 200 and 'data-name="induction"' in page.text
            frames = client.get("/api/frames", params={"l": name, "name": "induction"})
            assert frames.status_code == 200, frames.text
            for frame in frames.json()["frames"]:
                drawn = client.get(frame["image"])  # the heatmap, a PNG rendered from its PDF
                assert drawn.status_code == 200 and drawn.content.startswith(b"\x89PNG")
            key = "dynamics/induction/max"
            assert client.get("/curves", params={"l": name, "key": key}).status_code == 200
            (series,) = client.get("/api/series", params={"l": name, "key": key}).json()["series"]
            assert series["x"] == [0, 1000, 2000, 3000]
            return [frame["node"] for frame in frames.json()["frames"]], series["y"]
    finally:
        store.close()
