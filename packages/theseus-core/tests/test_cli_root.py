"""ROOT on the `theseus` command line: the root folder, its store folder, or a URL, for every verb.

The reference is the layout on disk (``ROOT/store`` holds the marker; nothing else holds
one) and the store's own reads: a run started through one spelling and resumed through
another lands in the one store, and no spelling makes ``store/store`` or a folder named
``postgresql:``. Then the messages a new user met: ``sample`` of a node that is not in
the store or holds no checkpoint, ``submit --resume`` on a root without a store.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner, Result

from theseus.cli import ROOT_HELP, RootPath, main
from theseus.registry import DATASETS, dataset
from theseus.store import MARKER, Node, Store

JOBS_FILE = str(Path(__file__).with_name("core_jobs.py"))
TRAINER_JOBS = str(Path(__file__).with_name("trainer_jobs.py"))
#: Every verb of theseus-core that takes a root, as its words on the command line.
VERBS = (
    ("run",),
    ("submit",),
    ("sample",),
    ("import", "gpt2"),
    ("import", "hf"),
    ("data", "prepare"),
)


def invoke(*args: str) -> Result:
    return CliRunner().invoke(main, list(args), catch_exceptions=True)


def one_line(result: Result) -> str:
    """The one-line error of a command that failed (no usage text, no traceback)."""
    assert result.exit_code == 1, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error ("), result.stderr
    return lines[0]


def stores_under(folder: Path) -> list[Path]:
    """Every store folder under ``folder`` (each holds the marker)."""
    return sorted(marker.parent for marker in folder.rglob(MARKER))


def _command(words: tuple[str, ...]) -> click.Command:
    command: click.Command = main
    ctx = click.Context(main)
    for word in words:
        assert isinstance(command, click.Group)
        found = command.get_command(ctx, word)
        assert found is not None, words
        command = found
    return command


@pytest.mark.parametrize("words", VERBS, ids=" ".join)
def test_every_verb_takes_root_through_one_type_and_says_a_url_works(
    words: tuple[str, ...],
) -> None:
    command = _command(words)
    roots = [p for p in command.params if p.name in ("root", "root_option")]
    assert roots and all(isinstance(p.type, RootPath) for p in roots)
    shown = " ".join(invoke(*words, "--help").output.split())
    assert " ".join(ROOT_HELP.split()) in shown
    assert "postgresql://USER@HOST:PORT/DB?files=DIR" in shown


def test_a_run_through_the_store_folder_goes_on_in_the_same_store(tmp_path: Path) -> None:
    config = tmp_path / "counter.yaml"
    assert invoke("configure", "tests/counter", str(config), "counter.steps=2",
                  "--import", JOBS_FILE).exit_code == 0  # fmt: skip
    root = tmp_path / "root"
    fresh = invoke("run", "train", str(config), str(root / "store"), "--import", JOBS_FILE)
    assert fresh.exit_code == 0, fresh.output  # a new root, named by its store folder
    assert stores_under(tmp_path) == [root / "store"]
    with Store(root / "store") as store:
        first = store.query().spec(run="train").latest().first()
    assert first is not None and first.seq == 2
    lineage = f"{first.name}~{first.nonce}"
    for spelled in (f"{root}/store/", str(root), f"{root}/store/blobs/.."):
        again = invoke("run", "train", str(config), spelled, "--resume", lineage,
                       "--import", JOBS_FILE)  # fmt: skip
        assert again.exit_code == 0, again.output
    assert stores_under(tmp_path) == [root / "store"]  # never store/store
    with Store(root / "store") as store:
        last = store.query().nonce(first.nonce).latest().first()
        assert last is not None and last.seq == 8  # three resumes of two steps each
        assert store.values(last)["counter/value"] == 2.0**8


@pytest.fixture
def tiny_dataset() -> Iterator[list[Path]]:
    roots: list[Path] = []

    @dataset("tests-root-tiny")
    class Tiny:
        @classmethod
        def prepare(cls, root: Path, **options: object) -> None:
            roots.append(root)

    yield roots
    DATASETS.unregister("tests-root-tiny")


def test_data_prepare_takes_root_as_every_verb_does(
    tmp_path: Path, tiny_dataset: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    Store(tmp_path / "proj" / "store").close()
    for args in (
        ("proj",),
        ("proj/store",),
        ("proj/store/", "--n", "3"),
        ("--root", "proj"),
        ("--root", "proj/store"),
    ):
        done = invoke("data", "prepare", "tests-root-tiny", *args)
        assert done.exit_code == 0, done.output
    assert [os.path.realpath(r) for r in tiny_dataset] == [str((tmp_path / "proj").resolve())] * 5
    twice = one_line(invoke("data", "prepare", "tests-root-tiny", "proj", "--root", "proj"))
    assert "ROOT is given twice" in twice
    assert "No ROOT" in one_line(invoke("data", "prepare", "tests-root-tiny"))
    assert stores_under(tmp_path) == [tmp_path / "proj" / "store"]


def test_data_prepare_with_a_url_makes_no_postgresql_folder(
    tmp_path: Path, tiny_dataset: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    files = tmp_path / "shared"
    url = f"postgresql://me@127.0.0.1:1/db?files={files}"  # nothing listens on port 1
    for args in (("--root", url), (url,)):
        said = one_line(invoke("data", "prepare", "tests-root-tiny", *args))
        # the server refused, or (theseus-core installed alone) no psycopg to ask it with
        assert "127.0.0.1" in said or "needs psycopg 3" in said
    assert tiny_dataset == []  # refused before the dataset was prepared anywhere
    assert not [p for p in tmp_path.rglob("*") if p.name.startswith("postgres")]
    assert all(files in p.parents or p == files for p in tmp_path.rglob("*"))


def test_a_file_or_a_store_of_its_own_is_not_a_root(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("job: tests/counter\n")
    said = one_line(invoke("run", "r", str(config), str(config), "--import", JOBS_FILE))
    assert f"{config} is a file, not a store folder or a Theseus root" in said
    Store(tmp_path / "bare").close()
    said = one_line(invoke("run", "r", str(config), str(tmp_path / "bare"), "--import", JOBS_FILE))
    assert "a store folder of its own" in said
    assert stores_under(tmp_path) == [tmp_path / "bare"]


def _lineage_with_gaps(store_folder: Path) -> Node:
    """A lineage of 5 nodes whose checkpoints are at seq 1 and 3 (the folders exist)."""
    node = Node.new("writer", project="p", group="g")
    with Store(store_folder) as store:
        for seq in range(5):
            here = Node(node.name, node.nonce, seq)
            store.touch(here)
            if seq in (1, 3):
                folder = store_folder.parent / "checkpoints" / f"c{seq}"
                folder.mkdir(parents=True)
                store.checkpoint(here, folder, step=seq + 1)
    return node


def test_sample_names_what_the_store_lacks_and_how_to_list_it(tmp_path: Path) -> None:
    root = tmp_path / "root"
    node = _lineage_with_gaps(root / "store")
    lineage = f"{node.name}~{node.nonce}"
    store_folder = (root / "store").resolve()
    listing = f"`theseus-store lineage {store_folder} "
    for spelled in (str(root), f"{root}/store"):
        missing = one_line(invoke("sample", spelled, f"writer~{node.nonce}~10", "hi"))
        assert (
            f"The store has no node {lineage}~10: the 5 nodes of lineage {lineage} run from seq 0 to 4"
            in missing
        )
        assert f"{listing}{lineage}` lists them with their checkpoints" in missing
        assert "fresh run" not in missing
    bare = one_line(invoke("sample", str(root), f"{lineage}~2", "hi"))
    assert f"{lineage}~2 holds no checkpoint, so there are no weights to read" in bare
    assert (
        f"checkpoints are at seq 1, 3. Pass {lineage}~1 (the closest before it), {lineage} (its latest)"
        in bare
    )
    assert f"{listing}{lineage}~2` lists its nodes and their checkpoints" in bare
    first = one_line(invoke("sample", str(root), f"{lineage}~0", "hi"))
    assert f"seq 1, 3. Pass {lineage} (its latest)" in first and "closest" not in first
    nowhere = one_line(invoke("sample", str(tmp_path / "nowhere"), lineage, "hi"))
    assert f"{tmp_path / 'nowhere'} does not exist" in nowhere
    assert not (tmp_path / "nowhere").exists()
    assert stores_under(tmp_path) == [root / "store"]


def test_submit_resume_on_a_root_without_a_store_says_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    made = invoke("--import", TRAINER_JOBS, "configure", "test/synthetic/train", "c.yaml")
    assert made.exit_code == 0, made.output
    said = one_line(invoke("--import", TRAINER_JOBS, "submit", "r", "c.yaml", "fresh", "--slurm",
                           "--dry-run", "--resume", "r~abcdef12"))  # fmt: skip
    assert f"{tmp_path / 'fresh'} holds no store yet" in said
    assert "leave out --resume to start a new one" in said and "create=True" not in said
    assert not (tmp_path / "fresh").exists()
    with Store(tmp_path / "proj" / "store") as store:
        store.touch(Node("general.default.r", "abcdef12", 0))
    script = invoke("--import", TRAINER_JOBS, "submit", "r", "c.yaml", "proj/store", "--slurm",
                    "--dry-run", "--resume", "r~abcdef12")  # fmt: skip
    assert script.exit_code == 0, script.output
    (srun,) = [line for line in script.output.splitlines() if line.startswith("srun ")]
    assert f" {tmp_path / 'proj'} " in srun  # the run gets the root, never the store folder
    assert stores_under(tmp_path) == [tmp_path / "proj" / "store"]


def test_quick_and_jobspec_take_the_store_folder_as_the_commands_do(tmp_path: Path) -> None:
    from theseus.job import JobSpec, store_root
    from theseus.quick import quick

    root = tmp_path / "root"
    Store(root / "store").close()
    for spelled in (root, root / "store", f"{root}/store/", tmp_path / "root" / "store" / ".."):
        assert os.path.realpath(JobSpec("r", root=spelled).root) == str(root.resolve())
        assert os.path.realpath(store_root(spelled)) == str((root / "store").resolve())
        with quick(spelled) as q:
            assert os.path.realpath(q.store.root) == str((root / "store").resolve())
    assert stores_under(tmp_path) == [root / "store"]


def test_a_misspelled_root_is_left_as_it_was(tmp_path: Path) -> None:
    """A fresh run into a ROOT that does not exist finds no data there (a typo, as a new
    user made): the error says so and the folder is not made. Where the ROOT existed,
    the lineage that never started keeps its record of why."""
    config = tmp_path / "train.yaml"
    written = invoke("--import", TRAINER_JOBS, "configure", "test/synthetic/train", str(config))
    assert written.exit_code == 0, written.output
    misspelled = tmp_path / "ROTO" / "runs" / "root"  # none of the three exists
    line = one_line(invoke("--import", TRAINER_JOBS, "run", "r", str(config), str(misspelled)))
    assert "DataNotPreparedError" in line and "is not prepared under" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.yaml"]
    existing = tmp_path / "root"
    existing.mkdir()
    one_line(invoke("--import", TRAINER_JOBS, "run", "r", str(config), str(existing)))
    with Store(existing / "store") as store:
        (node,) = store.query().spec(run="r").all()
        assert store.values(node)["job/failed_in"] == "setup"
