"""Analyses on imported GPT-2 weights: theseus-core's README section "Look inside GPT-2"
runs as written, and an analysis written for a trained GPT reads GPT-2 on a prompt
(`inspection/prompt`, which its `find` and `debug` trace too).

Reference: attention probabilities of GPT-2 written in float64 NumPy from its definition
over the folder's tensors (theseus-core's tests/gpt2_folder.py), within 1e-5.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from theseus.analysis import AnalysisBase
from theseus.cli import main
from theseus.experiments.models.gpt import PretrainGPT
from theseus.experiments.models.gpt2 import import_gpt2
from theseus.model.attention.base import SelfAttention
from theseus.quick import quick
from theseus.registry import import_module_or_file

pytestmark = pytest.mark.tokenizers

CORE = Path(__file__).parents[1] / "packages" / "theseus-core"
README = CORE / "README.md"
folders = import_module_or_file(str(CORE / "tests" / "gpt2_folder.py"))


@pytest.mark.slow  # the README section verbatim (~10 s); the next test keeps its checks
def test_the_look_inside_gpt2_section_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    section = README.read_text().split("### Look inside GPT-2", 1)[1].split("\n## ", 1)[0]
    commands = re.findall(r"```bash\n(.*?)```", section, flags=re.DOTALL)[0].splitlines()
    (code,) = re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)
    monkeypatch.chdir(tmp_path)
    folders.write_gpt2_folder(Path("gpt2"))  # the user's folder, small and random here
    runner = CliRunner()
    outputs = []
    for line in commands:
        argv = shlex.split(line)
        assert argv[0] == "theseus"
        result = runner.invoke(main, argv[1:])
        assert result.exit_code == 0, result.output
        outputs.append(result.stdout)
    assert outputs[1].startswith("The meaning of life is") and len(outputs[1]) > 23
    namespace: dict[str, object] = {"__name__": "readme_gpt2"}
    exec(compile(code, str(README), "exec"), namespace)
    result = namespace["result"]
    prompt = "The quick brown fox jumps over the lazy dog"
    from tokenizers import Tokenizer

    tokens = Tokenizer.from_file("gpt2/tokenizer.json").encode(prompt).ids
    _, attention = folders.reference_forward(Path("gpt2"), tokens)
    np.testing.assert_allclose(result.values, attention[0], atol=1e-5)  # [heads, q, k]
    assert (
        result.path.resolve()
        == tmp_path / "results/analyses/general/default/look/gpt2-attention.pdf"
    )
    assert result.path.read_bytes().startswith(b"%PDF")


class LastLayer(AnalysisBase, PretrainGPT):
    """Written for a GPT trained on the synthetic data, as in the analysis README."""

    TARGET = SelfAttention
    NAME = "attention"

    def select(self, paths):  # type: ignore[no-untyped-def]
        return paths[-1]

    def analyze(self, layer, inputs):  # type: ignore[no-untyped-def]
        return layer.weights(inputs.x[:1])[0].mean(axis=0)

    def plot(self, values):  # type: ignore[no-untyped-def]
        return self.heatmap(values, xlabel="Key", ylabel="Query")


def test_an_analysis_written_for_a_trained_gpt_reads_gpt2(tmp_path: Path) -> None:
    src = folders.write_gpt2_folder(tmp_path / "src", n_layer=3)
    node = import_gpt2(src, tmp_path / "root")
    prompt = "All that glitters is not gold"
    with quick(tmp_path / "root") as q:
        q.build(LastLayer, "inspect")
        q.find().node(node).resume()
        q.config["inspection/prompt"] = prompt
        analysis = q.create()
        ids = analysis.tokenizer.encode(prompt).tolist()
        _, attention = folders.reference_forward(src, ids)
        # the analysis's find and debug trace the prompt too (the root holds no data)
        assert analysis.find(SelfAttention) == [f"blocks_{i}/attn" for i in range(3)]
        session = analysis.debug("blocks_1/attn")
        weights = np.asarray(session.layer.weights(session.inputs.x))  # [rows, heads, q, k]
        assert weights.shape[-1] == len(ids)
        for row in weights:  # every data shard traces the same prompt
            np.testing.assert_allclose(row, attention[1], atol=1e-5)
        result = analysis()
    np.testing.assert_allclose(result.values, attention[2].mean(axis=0), atol=1e-5)
    assert result.node == node  # attached to the imported checkpoint's node
