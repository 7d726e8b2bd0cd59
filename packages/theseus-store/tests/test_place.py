"""`locate`: a Theseus root, its store folder or a URL, however spelled, names one store.

The reference is the layout itself: a root made at a known folder, its store at
``ROOT/store``, compared by canonical path (``os.path.realpath``, not the code under
test). The property: every spelling of the root or of its store folder (a trailing
slash, ``.`` and ``..`` segments, a path relative to the working folder, a symlink to
either) locates that one store, makes nothing on disk (no ``store/store``), and the
command line reads the same runs through it. Then the command line's errors: a path that
holds no store, a file, ``get -o`` into a missing folder, ``copy`` from a missing source,
and a real Ctrl-C (SIGINT) during ``copy``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from theseus.store import Location, Node, NotAStoreError, Store, StoreError, bind_root, locate
from theseus.store.cli import main

#: How a path to a folder ``X`` may be written: each turns a spelling into another.
TWISTS = ("trailing-slash", "dot", "child-dotdot", "relative")


def _real(path: str | os.PathLike[str]) -> str:
    return os.path.realpath(path)


def stores_under(folder: Path) -> list[Path]:
    """Every store folder under ``folder`` (each holds the marker)."""
    return sorted(marker.parent for marker in folder.rglob("theseus-store.json"))


def _tree(folder: Path) -> list[str]:
    """Every path under ``folder`` (files and folders), for a before/after comparison."""
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def _spell(path: Path, twists: list[str]) -> str:
    """``path`` written another way (an existing child ``blobs`` or ``data`` for ``..``)."""
    text = str(path)
    for twist in twists:
        if twist == "trailing-slash":
            text = text.rstrip("/") + "/"
        elif twist == "dot":
            text = text.rstrip("/") + "/."
        elif twist == "child-dotdot":
            child = "blobs" if (Path(text) / "blobs").is_dir() else "data"
            text = text.rstrip("/") + f"/{child}/.."
        elif twist == "relative":
            text = os.path.relpath(text)
    return text


@pytest.fixture(scope="module")
def root() -> Path:
    """A Theseus root with one run, a data folder, and symlinks to it and to its store."""
    folder = Path(tempfile.mkdtemp(prefix="theseus-place-")) / "proj"
    with Store(folder / "store") as store:
        store.log(Node.new("r", project="p", group="g"), {"x": 1.5})
    (folder / "data").mkdir()
    (folder.parent / "to-root").symlink_to(folder)
    (folder.parent / "to-store").symlink_to(folder / "store")
    return folder


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    start=st.sampled_from(["root", "store", "to-root", "to-store"]),
    twists=st.lists(st.sampled_from(TWISTS), max_size=3),
)
def test_every_spelling_of_a_root_or_its_store_names_one_store(
    root: Path, start: str, twists: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    base = {
        "root": root,
        "store": root / "store",
        "to-root": root.parent / "to-root",
        "to-store": root.parent / "to-store",
    }[start]
    spelled = _spell(base, twists)
    before = _tree(root.parent)
    for create in (False, True):
        where = locate(spelled, create=create)
        assert where.exists and where.root is not None
        assert _real(where.store) == _real(root / "store")
        assert _real(where.root) == _real(root)
        assert _real(where.opens) == _real(root / "store")
        assert _real(bind_root(spelled)) == _real(root)
        again = locate(where.root)  # the root it gives names the same store
        assert _real(again.store) == _real(root / "store")
    assert main(["runs", spelled]) == 0
    assert "p.g.r~" in capsys.readouterr().out
    assert _tree(root.parent) == before  # nothing made: no store/store, no new folder


@settings(max_examples=40, deadline=None)
@given(
    named=st.sampled_from(["root", "store"]),
    twists=st.lists(st.sampled_from(["trailing-slash", "dot", "relative"]), max_size=2),
    then=st.sampled_from(["root", "store"]),
)
def test_a_new_root_is_one_root_whichever_folder_started_it(
    named: str, twists: list[str], then: str
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "new"
        first = root if named == "root" else root / "store"
        where = locate(_spell(first, twists), create=True)
        assert not where.exists and where.root is not None
        assert _real(where.root) == _real(root) and _real(where.store) == _real(root / "store")
        assert not root.exists()  # locate makes nothing
        Store(where.opens).close()
        other = locate(root if then == "root" else root / "store")
        assert other.exists and _real(other.store) == _real(root / "store")
        assert not (root / "store" / "store").exists()


def test_what_each_folder_is(tmp_path: Path) -> None:
    bare = tmp_path / "bare"  # a store of its own: no root
    Store(bare).close()
    where = locate(bare)
    assert where == Location(None, bare, bare, True)
    with pytest.raises(NotAStoreError, match="a store folder of its own") as err:
        bind_root(bare)
    assert "\n" not in str(err.value)
    (tmp_path / "alias").symlink_to(tmp_path / "r" / "store")  # another name for a root's store
    Store(tmp_path / "r" / "store").close()
    assert locate(tmp_path / "alias").root == (tmp_path / "r").resolve()
    old = tmp_path / "old" / "store"  # a root named store that an earlier version made
    Store(old / "store").close()
    assert locate(old) == Location(old, old / "store", old / "store", True)
    with pytest.raises(NotAStoreError, match="store/store could be"):
        locate(tmp_path / "new" / "store" / "store", create=True)
    afile = tmp_path / "notes.txt"
    afile.write_text("x")
    with pytest.raises(NotAStoreError, match="is a file"):
        locate(afile, create=True)
    with pytest.raises(NotAStoreError, match="does not exist"):
        locate(tmp_path / "missing")
    assert not (tmp_path / "missing").exists() and not (tmp_path / "new").exists()


def test_a_url_is_never_a_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    url = f"postgresql://me@127.0.0.1:1/db?files={tmp_path / 'files'}"
    with pytest.raises(NotAStoreError, match="has no store with the files folder") as err:
        locate(url)  # no store there: refused before any connection
    assert "\n" not in str(err.value) and "create=True" not in str(err.value)
    with pytest.raises(StoreError) as err:  # nothing answers on port 1
        locate(url, create=True)
    assert "\n" not in str(err.value)
    assert not any(p.name.startswith("postgresql") for p in tmp_path.rglob("*"))


def test_get_into_a_missing_folder_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    node = Node.new("r")
    with Store(tmp_path / "store") as store:
        store.put(node, "notes", "notes.txt", b"hello")
    missing = tmp_path / "missing" / "dir"
    assert main(["get", str(tmp_path), node.serialize(), "notes", "-o", str(missing / "x")]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line == (
        f"theseus-store: error: Cannot write {missing / 'x'}: the folder {missing} does not "
        f"exist. Create the folder first (mkdir -p {missing}), or pass -o a file in an "
        "existing folder."
    )
    assert main(["get", str(tmp_path), node.serialize(), "notes", "-o", str(tmp_path)]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert f"Cannot write {tmp_path}: it is a folder" in line
    assert f"-o {tmp_path / 'notes.txt'}" in line
    out = tmp_path / "got.txt"
    assert main(["get", str(tmp_path / "store"), node.serialize(), "notes", "-o", str(out)]) == 0
    assert out.read_bytes() == b"hello"


def test_get_into_a_file_as_folder_names_the_file_and_no_mkdir(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A file where a folder should be, as -o's folder or above it: mkdir -p cannot help,
    so the line names the file and another place to write, and says nothing of mkdir."""
    node = Node.new("r")
    with Store(tmp_path / "store") as store:
        store.put(node, "notes", "notes.txt", b"hello")
    afile = tmp_path / "afile"
    afile.write_text("x")
    for out in (afile / "x.pdf", afile / "sub" / "x.pdf"):
        assert main(["get", str(tmp_path), node.serialize(), "notes", "-o", str(out)]) == 2
        [line] = capsys.readouterr().err.splitlines()
        assert line == (
            f"theseus-store: error: Cannot write {out}: {afile} is a file, not a folder. "
            "Pass -o a path in an existing folder, e.g. -o x.pdf (the current folder)."
        )
    assert afile.read_text() == "x" and not (tmp_path / "x.pdf").exists()


def test_a_copy_from_nowhere_says_what_to_pass_and_makes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["copy", str(tmp_path / "nothere"), str(tmp_path / "dst")]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(f"theseus-store: error: {tmp_path / 'nothere'} does not exist.")
    assert "Theseus root folder, its store folder" in line and "create=True" not in line
    assert _tree(tmp_path) == []


def _big_source(folder: Path) -> dict[str, float]:
    """A store whose copy takes a while: one node with many values, written in one call."""
    values = {f"v/{i:06d}": i / 7 for i in range(150_000)}
    with Store(folder) as store:
        node = Node.new("big")
        store.log(node, values)
        store.put(node, "notes", "notes.txt", b"x" * 100_000)
    return values


def test_ctrl_c_during_a_copy_is_one_line_and_a_second_run_finishes_it(tmp_path: Path) -> None:
    values = _big_source(tmp_path / "a" / "store")
    paths = [str(tmp_path / "a"), str(tmp_path / "b")]
    # The interrupted run holds still between the values and the blobs until the signal
    # comes, so Ctrl-C lands inside the copy however fast or loaded the machine is. It
    # holds in short sleeps (a signal the interpreter has noted is acted on when one ends).
    # The child takes Ctrl-C as at a terminal: a suite started as a shell's background
    # job (`pytest ... &`) hands its children SIGINT ignored, and Python then installs no
    # KeyboardInterrupt handler, so the copy would run on (how this test once timed out).
    held = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "from theseus.store import _copy\n"
        "bring = _copy._copy_bytes\n"
        "def held(*args):\n"
        "    print('  holding before the blobs', flush=True)\n"
        "    for _ in range(2400):\n"
        "        time.sleep(0.05)\n"
        "    return bring(*args)\n"
        "_copy._copy_bytes = held\n"
        "from theseus.store.cli import main\n"
        "sys.exit(main(['copy', *sys.argv[1:]]))\n"
    )
    command = [sys.executable, "-c", held, *paths]
    copying = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert copying.stdout is not None
    lines = [copying.stdout.readline() for _ in range(4)]  # copying, nodes, values, holding
    assert lines[0].startswith("copying") and lines[1].startswith("  nodes: 1 (1 added)"), lines
    assert lines[3] == "  holding before the blobs\n", lines
    copying.send_signal(signal.SIGINT)
    out, err = copying.communicate(timeout=120)
    assert copying.returncode == 130, (out, err)
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    assert err.startswith("theseus-store: copy interrupted (Ctrl-C)")
    assert "Run the same command again to" in err and "is untouched" in err
    with Store(tmp_path / "b" / "store", create=False, readonly=True) as part:
        for node in part.query().all():  # what the part holds is the source's, whole
            assert {k: v for k, v in part.values(node).items()} == {
                k: values[k] for k in part.values(node)
            }
    again = [sys.executable, "-m", "theseus.store.cli", "copy", *paths]
    done = subprocess.run(again, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    with Store(tmp_path / "b" / "store", create=False, readonly=True) as copy:
        [node] = copy.query().all()
        assert copy.values(node) == values
        assert copy.get(node)["notes"].content == b"x" * 100_000


@pytest.mark.postgres
def test_a_url_its_files_folder_and_its_store_folder_name_one_store(
    pg_url: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    files = tmp_path / "shared"
    url = pg_url(files)
    with pytest.raises(NotAStoreError, match="has no store with the files folder"):
        locate(url)  # not made yet, and a reader never makes it
    made = locate(url, create=True)
    assert made == Location(files, files / "store", url, True)
    with Store(url) as store:
        store.log(Node.new("r", project="p", group="g"), {"x": 1})
    for spelled in (url, str(files), str(files / "store"), f"{files}/store/"):
        assert main(["runs", spelled]) == 0
        assert "p.g.r~" in capsys.readouterr().out
        assert locate(spelled).root == files
    assert stores_under(tmp_path) == [files / "store"]
    assert not list(Path.cwd().glob("postgres*"))
