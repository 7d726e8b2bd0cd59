"""`theseus import gpt2` reads through the Hugging Face import: the same folder, the same model.

Both commands import one small random GPT-2 folder (`gpt2_folder.py`, written here, no
network) into one root: `theseus import gpt2 DIR ROOT` (job `gpt2`) and `theseus import
hf DIR ROOT` (job `hf`). References: the folder's own tensors at the parameter tree's
paths (`gpt2_folder.theseus_params`, read with `safetensors`; float32 in, float32 out,
so exact) and GPT-2 written in float64 NumPy (`reference_forward`; logits within 1e-5 of
their scale). Between the two imports: every parameter bit for bit, the logits bit for
bit (one configuration compiles one program), the architecture and training settings,
one kept tokenizer, and checkpoints that hold the weights alone.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from click.testing import CliRunner

from theseus.cli import main
from theseus.config import load
from theseus.experiments.models.gpt2 import GPT2
from theseus.experiments.models.hf import HF
from theseus.quick import quick
from theseus.registry import import_module_or_file
from theseus.store import Store

pytestmark = pytest.mark.tokenizers

folders = import_module_or_file(str(Path(__file__).with_name("gpt2_folder.py")))
RELATIVE = 1e-5
TEXT = "The quick brown fox jumps over the lazy dog. naïve café, 12345"


def _imported(root: Path, job: type, run: str) -> tuple[dict[str, np.ndarray], np.ndarray, dict]:
    """The parameters (`{"blocks_0/attn/c_attn/kernel": array}`), the logits of `TEXT`
    `[tokens, vocab]` and the saved configuration of run `run`'s imported node."""
    with quick(root) as q:
        q.build(job, "look")
        q.find().spec(run=run).checkpoint().latest().resume()
        opened = q.create()
        flat = jax.tree_util.tree_flatten_with_path(opened.state.params)[0]
        params = {"/".join(k.key for k in path): np.asarray(v) for path, v in flat}
        ids = opened.tokenizer.encode(TEXT)
        logits, _ = jax.jit(opened.model.apply)(
            {"params": opened.state.params}, jnp.asarray(ids)[None]
        )
        (node,) = q.store.query().spec(run=run).all()
        (saved,) = q.store.checkpoints(node)
        tree = json.loads((Path(saved.path) / "state" / "_METADATA").read_text())
        parts = {ast.literal_eval(key)[0] for key in tree["tree_metadata"]}
        assert parts == {"step", "params"}  # the weights alone (a resume starts Adam afresh)
        return params, np.asarray(logits[0]), load(q.store.job_config(node))


@pytest.mark.parametrize(
    "variant",
    [  # the second in the slow set (the default suite's budget)
        {},
        pytest.param(
            {"prefix": "transformer.", "tokenizer_json": False, "vocab_size": 320},
            marks=pytest.mark.slow,
        ),
    ],
    ids=["safetensors-tokenizer-json", "prefixed-vocab-merges-padded"],
)
def test_import_gpt2_and_import_hf_give_the_same_model(tmp_path: Path, variant: dict) -> None:
    src = folders.write_gpt2_folder(tmp_path / "gpt2", **variant)
    root = tmp_path / "root"
    runs = {}
    for kind in ("gpt2", "hf"):
        result = CliRunner().invoke(main, ["import", kind, str(src), str(root)])
        assert result.exit_code == 0, result.output
        runs[kind] = result
    described = runs["gpt2"].stderr.removeprefix("Importing GPT-2 from ").rstrip(".\n")
    assert runs["hf"].stderr.startswith(f"Importing gpt2 from {described}, 1 weight file(s).")
    tokenizer = [line for line in runs["gpt2"].stdout.splitlines() if line.startswith("Tokenizer")]
    assert tokenizer[0].startswith("Tokenizer: gpt2-") and tokenizer[0] in runs["hf"].stdout
    assert len(list((root / "tokenizers").iterdir())) == 1  # one tokenizer, kept once

    gpt2, gpt2_logits, gpt2_config = _imported(root, GPT2, "gpt2")
    hf, hf_logits, hf_config = _imported(root, HF, "hf")
    expected = folders.theseus_params(src)
    assert gpt2.keys() == hf.keys() == expected.keys()
    for name, value in expected.items():
        for imported in (gpt2[name], hf[name]):
            assert imported.dtype == np.float32 and imported.shape == value.shape, name
            assert imported.tobytes() == value.tobytes(), name  # bit for bit
    assert gpt2_logits.tobytes() == hf_logits.tobytes()
    reference, _ = folders.reference_forward(src, _ids(root, gpt2_config))
    error = float(np.abs(gpt2_logits - reference).max())
    assert error <= RELATIVE * float(np.abs(reference).max()), error

    assert gpt2_config["job"] == "gpt2" and hf_config["job"] == "hf"
    assert gpt2_config["gpt2"]["source"] == hf_config["hf"]["source"] == str(src)
    for section in ("architecture", "training"):
        assert gpt2_config[section] == hf_config[section], section
    assert gpt2_config["architecture"]["positions"] == "learned"


def _ids(root: Path, config: dict[str, Any]) -> list[int]:
    """`TEXT` in the imported tokenizer's ids, read by `tokenizers` from the root's copy."""
    from tokenizers import Tokenizer

    name = config["architecture"]["tokenizer"]
    theirs = Tokenizer.from_file(str(root / "tokenizers" / name / "tokenizer.json"))
    return theirs.encode(TEXT, add_special_tokens=False).ids


def test_import_gpt2_refuses_another_family_that_import_hf_reads(tmp_path: Path) -> None:
    """A Llama folder: `import hf` takes it, `import gpt2` refuses it in one line."""
    hf_folders = import_module_or_file(str(Path(__file__).with_name("hf_folder.py")))
    src = hf_folders.write_folder("llama", tmp_path / "llama")
    root = tmp_path / "root"
    refused = CliRunner().invoke(main, ["import", "gpt2", str(src), str(root)])
    lines = refused.output.strip().splitlines()
    assert refused.exit_code == 1 and len(lines) == 1, refused.output
    assert lines[0].startswith("Error (GPT2FolderError):") and "model_type 'llama'" in lines[0]
    assert "theseus import hf reads gpt2, gpt_neox, llama" in lines[0]
    assert not root.exists()
    taken = CliRunner().invoke(main, ["import", "hf", str(src), str(root)])
    assert taken.exit_code == 0, taken.output
    with Store(root / "store") as store:
        assert [n.name for n in store.query().all()] == ["general.default.hf"]
