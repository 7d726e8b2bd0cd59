"""What a root's copy brings besides its store is what theseus-core reads from a root.

`theseus-store copy` brings the folders `theseus.store._root.ROOT_FOLDERS` names (the
store imports no other theseus package, so it cannot ask); the reference is theseus-core's
own `dataset_dir` and `tokenizer_dir`, which must name entries of exactly those folders.
"""

from __future__ import annotations

from pathlib import Path

from theseus.data.prepared import dataset_dir
from theseus.data.tokenizer import tokenizer_dir
from theseus.store._root import ROOT_FOLDERS


def test_the_copy_brings_the_folders_core_reads_datasets_and_tokenizers_from() -> None:
    root = Path("/some/root")
    read = [dataset_dir(root, "name"), tokenizer_dir(root, "name")]
    assert all(path.parent.parent == root and path.name == "name" for path in read)
    assert sorted(path.parent.name for path in read) == sorted(ROOT_FOLDERS)
