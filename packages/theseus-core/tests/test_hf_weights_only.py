"""An import saves the weights alone; restoring them starts the optimizer fresh.

Adam's two moments are zeros before any training: computing and writing them took about
a third of an import's time (orbax compresses the zeros, so not its disk). The
checkpoint of an imported node must hold the step and the parameters only (read from
orbax's own tree metadata, `state/_METADATA`), and a resume of it must give the
parameters exactly and an optimizer state that is the fresh one: every moment zero and
every count zero, laid out in the parameters' shardings.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import jax
import numpy as np

from theseus.experiments.models.hf import HF, import_hf
from theseus.quick import quick
from theseus.registry import import_module_or_file

H = import_module_or_file(str(Path(__file__).with_name("hf_folder.py")))


def _saved_parts(step_dir: Path) -> set[str]:
    """The top-level keys of the train state orbax wrote (its tree metadata file)."""
    tree = json.loads((step_dir / "state" / "_METADATA").read_text())["tree_metadata"]
    return {ast.literal_eval(key)[0] for key in tree}  # keys are tuples: "('params', ...)"


def test_an_import_checkpoint_holds_the_weights_and_restores_a_fresh_optimizer(
    tmp_path: Path,
) -> None:
    source = H.write_folder("llama", tmp_path / "llama", num_key_value_heads=2)
    weights = H.load_weights(source)
    root = tmp_path / "root"
    import_hf(source, root, "m")
    (step_dir,) = [p for p in (root / "checkpoints").rglob("*") if p.name == "0" and p.is_dir()]
    assert _saved_parts(step_dir) == {"step", "params"}
    with quick(root) as q:
        q.build(HF, "look")
        q.find().spec(run="m").checkpoint().latest().resume()
        job = q.create()
        embedding = np.asarray(job.state.params["wte"]["embedding"])
        np.testing.assert_array_equal(embedding, weights["model.embed_tokens.weight"])
        leaves = jax.tree.leaves(job.state.opt_state)
        assert leaves and all(not np.asarray(leaf).any() for leaf in leaves)  # zeros, count 0
        moments = [
            leaf for leaf in leaves if getattr(leaf, "shape", ()) == embedding.shape
        ]  # Adam's mu and nu of the embedding
        assert len(moments) == 2
        assert all(m.sharding == job.state.params["wte"]["embedding"].sharding for m in moments)
