"""The ``theseus-store`` command line: look through a store without writing Python.

Commands::

    theseus-store runs ROOT                     a table of lineages
    theseus-store show ROOT NODE                values, checkpoints, artifacts of a node
    theseus-store get ROOT NODE NAME [-o FILE]  the exact bytes of an artifact
    theseus-store lineage ROOT NODE             ancestors, children and job of a node
    theseus-store fsck ROOT [--repair]          check blobs and checkpoint folders; clear leftovers
    theseus-store ui ROOT [--host H] [--port P] [--open]
                                                a read-only web browser of the store (extra [ui])
    theseus-store copy SRC DST [--merge]        copy a whole store (SQLite or PostgreSQL)

ROOT is a Theseus root, its store folder (``ROOT/store``) or a PostgreSQL store's
``postgresql://USER@HOST:PORT/DB?files=DIR`` (``theseus.store.locate`` decides which).
NODE is a serialized node (``project.group.run~nonce~seq``, as ``runs`` and
``show`` print it), or ``project.group.run~nonce`` for the last node of that lineage.
Exit status: 0 on success, 1 when ``fsck`` finds problems, 2 on an error, 130 when
``copy`` is interrupted (Ctrl-C).
"""

from __future__ import annotations

import argparse
import datetime
import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from theseus.store._errors import InvalidNodeError, StoreError, UnknownNodeError
from theseus.store._fsck import unfinished_copy
from theseus.store._node import Node
from theseus.store._place import FORMS, Location, locate
from theseus.store._postgres._url import DatabaseURL, is_database_url
from theseus.store._scheduler import scheduler_state
from theseus.store._store import Store

__all__ = ["main"]


def _when(stamp: float) -> str:
    return datetime.datetime.fromtimestamp(stamp).strftime("%Y-%m-%d %H:%M:%S")


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [list(map(str, header))] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
    )


def _node(store: Store, text: str) -> Node:
    return store.resolve(text)


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _runs(store: Store, args: argparse.Namespace) -> int:
    rows, failed = [], []
    for r in store.runs():
        lineage = f"{r['name']}~{r['nonce']}"
        error = store.never_started(r)
        if error is not None:
            error = error.splitlines()[0] if error else "?"
            failed.append((f"  {lineage}", _when(r["last_write"]), _cut(error, 100)))
            continue
        rows.append(
            (
                lineage,
                r["nodes"],
                r["last_seq"],
                r["checkpoints"],
                r["artifacts"],
                _when(r["last_write"]),
            )
        )
    header = ("lineage", "nodes", "last seq", "checkpoints", "artifacts", "last write")
    print(_table(header, rows) if rows else f"{store.root}: no runs yet")
    if failed:
        print(
            f"\nnever started ({len(failed)}; failed or killed while setting up, nothing "
            "trained or saved; `theseus-store show ROOT NODE` has the whole error)"
        )
        print(_table(("  lineage", "when", "error"), failed))
    return 0


def _show(store: Store, args: argparse.Namespace) -> int:
    node = _node(store, args.node)
    values = store.values(node)
    print(f"node {node.serialize()}")
    print(f"job  {store.job_of(node) or '-'}")
    scheduled = scheduler_state(store, node.name, node.nonce)
    if scheduled is not None:
        print(f"     {scheduled}")
    print(f"\nvalues ({len(values)})")
    for key, value in values.items():
        print(f"  {key} = {value!r}")
    checkpoints = store.checkpoints(node)
    print(f"\ncheckpoints ({len(checkpoints)})")
    for entry in checkpoints:
        print(f"  step {entry.step}  {entry.path}  {_when(entry.created)}")
    artifacts = store.get(node)
    print(f"\nartifacts ({len(artifacts)})")
    if artifacts:
        rows = [
            (a.name, a.filename, a.size, a.version, a.hash[:12], _when(a.created))
            for a in artifacts.values()
        ]
        print(
            _table(
                ("  name", "filename", "bytes", "version", "sha256", "created"),
                [("  " + r[0], *r[1:]) for r in rows],
            )
        )
    return 0


def _get(store: Store, args: argparse.Namespace) -> int:
    node = _node(store, args.node)
    artifacts = store.get(node)
    if args.name not in artifacts:
        names = ", ".join(artifacts) or "none"
        raise UnknownNodeError(
            f"Node {node.serialize()} has no artifact {args.name!r} (it has: {names})."
        )
    artifact = artifacts[args.name]
    content = artifact.content
    to_stdout = args.output in (None, "-")  # `-o -` is standard output, as elsewhere
    if to_stdout and sys.stdout.isatty() and _binary(content):
        raise StoreError(
            f"The artifact {args.name!r} of {node.serialize()} ({artifact.filename}, "
            f"{len(content)} bytes) is binary and would garble the terminal. Save it with "
            f"-o {artifact.filename} (or redirect: > {artifact.filename})."
        )
    if not to_stdout:
        _write_file(Path(args.output), content, artifact.filename)
    else:
        sys.stdout.flush()
        sys.stdout.buffer.write(content)
        sys.stdout.buffer.flush()
    return 0


def _write_file(path: Path, content: bytes, filename: str) -> None:
    """Write ``content`` to ``path`` (``get -o``); a path that cannot be written is one line.

    Raises:
        StoreError: the folder is missing, it or a folder above it is a file, the path is
            a folder, or the write failed (naming the path and the reason).
    """
    folder = path.parent
    if not folder.is_dir():
        # The folder, or the nearest one above it, that is there: a file there, mkdir -p fails.
        blocker = next((p for p in (folder, *folder.parents) if p.exists()), None)
        if blocker is not None and not blocker.is_dir():
            raise StoreError(
                f"Cannot write {path}: {blocker} is a file, not a folder. Pass -o a path in "
                f"an existing folder, e.g. -o {shlex.quote(path.name)} (the current folder)."
            )
        raise StoreError(
            f"Cannot write {path}: the folder {folder} does not exist. Create the folder first "
            f"(mkdir -p {shlex.quote(str(folder))}), or pass -o a file in an existing folder."
        )
    if path.is_dir():
        raise StoreError(
            f"Cannot write {path}: it is a folder. Pass -o a file's path, e.g. "
            f"-o {shlex.quote(str(path / filename))}."
        )
    try:
        with open(path, "wb") as handle:
            handle.write(content)
    except OSError as err:
        raise StoreError(f"Cannot write {path}: {err.strerror or err}.") from err


def _stretches(ancestors: list[Node]) -> list[list[Node]]:
    """Ancestors (nearest first) cut into straight stretches: one lineage, seqs in a row."""
    stretches: list[list[Node]] = []
    for node in ancestors:
        last = stretches[-1][-1] if stretches else None
        if (
            last is not None
            and (node.name, node.nonce) == (last.name, last.nonce)
            and node.seq == last.seq - 1
        ):
            stretches[-1].append(node)
        else:
            stretches.append([node])
    return stretches


def _stretch_line(store: Store, stretch: list[Node]) -> str:
    """`name~nonce~hi..lo (n nodes; checkpoints at seq a, b)` for one straight stretch."""
    top, bottom = stretch[0], stretch[-1]
    seqs = {n.seq for n in stretch}
    saved = sorted(
        {
            c.node.seq
            for c in store.query().nonce(top.nonce).checkpoints()
            if c.node.name == top.name and c.node.seq in seqs
        }
    )
    where = f"{top.serialize()}" if len(stretch) == 1 else f"{top.serialize()}..{bottom.seq}"
    marks = f"checkpoints at seq {', '.join(map(str, saved))}" if saved else "no checkpoint"
    return f"{where}  ({len(stretch)} node{'s' if len(stretch) > 1 else ''}; {marks})"


def _binary(content: bytes) -> bool:
    """Whether `content` is not text a terminal can show (a NUL byte, or not UTF-8)."""
    if b"\x00" in content:
        return True
    try:
        content.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


def _lineage(store: Store, args: argparse.Namespace) -> int:
    node = _node(store, args.node)
    print(f"node      {node.serialize()}")
    print(f"job       {store.job_of(node) or '-'}")
    scheduled = scheduler_state(store, node.name, node.nonce)
    if scheduled is not None:
        print(f"          {scheduled}")
    ancestors = store.ancestors(node)
    print(f"ancestors ({len(ancestors)}, nearest first)")
    if args.all:
        for ancestor in ancestors:
            print(f"  {ancestor.serialize()}")
    else:
        stretches = _stretches(ancestors)
        below = node  # a stretch of another lineage than the node below it is a branch point
        for stretch in stretches[: args.limit]:
            branched = (stretch[0].name, stretch[0].nonce) != (below.name, below.nonce)
            print(f"  {'branched from ' if branched else ''}{_stretch_line(store, stretch)}")
            below = stretch[-1]
        if len(stretches) > args.limit:
            rest = stretches[args.limit :]
            print(
                f"  ... {len(rest)} more stretch(es), {sum(map(len, rest))} nodes "
                "(--all lists every ancestor)"
            )
    children = store.children(node)
    print(f"children  ({len(children)})")
    for child in children:
        print(f"  {child.serialize()}")
    return 0


def _fsck(store: Store, args: argparse.Namespace) -> int:
    report = store.fsck(repair=args.repair)
    print(report.render())
    return 0 if report.clean else 1


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="theseus-store", description="Look through a theseus-store root."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    runs = sub.add_parser("runs", help="list lineages")
    runs.set_defaults(fn=_runs)
    show = sub.add_parser("show", help="values, checkpoints and artifacts of a node")
    show.set_defaults(fn=_show)
    get = sub.add_parser("get", help="write an artifact's exact bytes")
    get.set_defaults(fn=_get)
    lineage = sub.add_parser("lineage", help="ancestors and children of a node")
    lineage.set_defaults(fn=_lineage)
    fsck = sub.add_parser(
        "fsck", help="check every blob against its hash and every checkpoint folder"
    )
    fsck.set_defaults(fn=_fsck)
    ui = sub.add_parser(
        "ui", help="browse the store in a web browser (read-only; needs theseus-store[ui])"
    )
    copy = sub.add_parser(
        "copy",
        help="copy a whole store into another (SQLite or PostgreSQL): rows, blobs, checkpoints",
    )
    copy.add_argument("src", help=f"the store to copy: {FORMS}")
    copy.add_argument(
        "dst",
        help=f"where to: {FORMS}; a new folder becomes a Theseus root (its store goes to "
        "DST/store), a new folder named store the store folder of the root above it",
    )
    copy.add_argument(
        "--merge", action="store_true", help="add to a destination that holds other nodes"
    )
    for command in (runs, show, get, lineage, fsck, ui):
        command.add_argument("root", metavar="ROOT", help=FORMS)
    ui.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    ui.add_argument("--port", type=int, default=8765, help="port (default 8765)")
    ui.add_argument("--open", action="store_true", help="open the page in a web browser")
    for command in (show, get, lineage):
        command.add_argument(
            "node",
            help="project.group.run~nonce~seq, or ...~nonce or a run with one lineage: its last node",
        )
    lineage.add_argument(
        "--limit",
        type=int,
        default=20,
        help="straight stretches of ancestors to list, one line each (default 20)",
    )
    lineage.add_argument("--all", action="store_true", help="list every ancestor on its own line")
    get.add_argument("name", help="the artifact's name")
    get.add_argument("-o", "--output", help="write to this file instead of standard output")
    fsck.add_argument(
        "--repair",
        action="store_true",
        help=(
            "remove orphan temporary files and unreferenced blobs; move stray checkpoint "
            "folders into unregistered/"
        ),
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line.

    Args:
        argv: the arguments (default: ``sys.argv[1:]``).

    Returns:
        The exit status: 0 success, 1 fsck found problems, 2 error, 130 copy interrupted.
    """
    args = _parser().parse_args(argv)
    if args.command == "copy":
        return _copy(args)
    try:
        where = locate(args.root)  # never creates: a missing store is one line
    except StoreError as err:
        print(f"theseus-store: error: {err}", file=sys.stderr)
        return 2
    if args.command == "ui":
        return _ui(args, where)
    try:
        with Store(where.opens, create=False) as store:
            if args.command != "fsck":  # fsck reports it among its problems
                _warn_if_unfinished(store)
            return int(args.fn(store, args))
    except (StoreError, InvalidNodeError) as err:
        print(f"theseus-store: error: {err}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # The reader went away (`... | head`): stop quietly, like other Unix tools.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as err:
        print(f"theseus-store: error: {err}", file=sys.stderr)
        return 2


def _warn_if_unfinished(store: Store) -> None:
    """One line on stderr where the store is a copy that was stopped before it finished."""
    from theseus.store._copy import unfinished

    source = unfinished(store)
    if source is not None:
        print(f"theseus-store: warning: {unfinished_copy(store, source)}", file=sys.stderr)


def _ui(args: argparse.Namespace, where: Location) -> int:
    """``theseus-store ui``: imports the extra only here, so the other verbs never need it."""
    try:
        from theseus.store.ui import open_readonly, serve
    except ImportError as err:
        print(
            f"theseus-store: error: the browser needs the ui extra ({err}). Install it with "
            'pip install "theseus-store[ui]".',
            file=sys.stderr,
        )
        return 2
    try:
        open_readonly(where.opens).close()  # a store it cannot read: one line, before serving
        serve(where.opens, host=args.host, port=args.port, open_=args.open)
    except (StoreError, InvalidNodeError, OSError) as err:
        print(f"theseus-store: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 0
    return 0


def _copy(args: argparse.Namespace) -> int:
    """``theseus-store copy SRC DST``; Ctrl-C is one line that says where the copy stands."""
    from theseus.store._copy import copy_store

    said: list[str] = []

    def say(line: str) -> None:
        said.append(line)
        print("  " + line, flush=True)

    try:
        source, target = locate(args.src), locate(args.dst, create=True)
        with (
            Store(source.opens, create=False, readonly=True) as src,
            Store(target.opens) as dst,
        ):
            print(
                f"copying {src.database} into {dst.database} (files in {dst.root.parent})",
                flush=True,
            )
            said.append("started")
            copy_store(src, dst, merge=args.merge, say=say)
    except StoreError as err:
        print(f"theseus-store: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"theseus-store: {_interrupted(args, said)}", file=sys.stderr)
        return 130
    print("copied and verified; running it again adds nothing")
    return 0


def _without_password(spelled: str) -> str:
    """A ROOT as a message shows it: a URL without its password (its files folder kept)."""
    if not is_database_url(spelled):
        return spelled
    url = DatabaseURL.parse(spelled, need_files=False)
    if url.files is None:
        return url.shown
    return f"{url.shown}{'&' if '?' in url.shown else '?'}files={url.files}"


def _interrupted(args: argparse.Namespace, said: list[str]) -> str:
    """The one line for a copy stopped by Ctrl-C: what it had done, and how to finish.

    Each batch of rows is one transaction, and a row is written after the blob or the
    checkpoint folder it names (a folder under a temporary name until whole), so an
    interrupted copy holds whole rows; the destination is marked an unfinished copy until
    a run verifies it (``fsck`` and ``runs`` say so); the source is opened read-only.
    """
    src, dst = _without_password(args.src), _without_password(args.dst)
    if not said:
        return f"copy interrupted (Ctrl-C) before any row was copied; {src} is untouched."
    unfinished = "marked an unfinished copy until then (fsck and runs say so)"
    if said[-1].startswith("verifying"):  # every stage done; stopped while verifying
        return (
            f"copy interrupted (Ctrl-C) while verifying: {dst} holds the whole copy, not "
            f"yet verified, {unfinished}; {src} is untouched. Run the same command "
            "again to verify it (it adds nothing)."
        )
    done = f"after the stage '{said[-1]}'" if len(said) > 1 else "in its first stage (nodes)"
    return (
        f"copy interrupted (Ctrl-C) {done}: {dst} holds part of the copy (whole rows, "
        f"each with its bytes), {unfinished}; {src} is untouched. Run the same command "
        "again to finish it: it adds only what is missing, then verifies the whole."
    )


if __name__ == "__main__":
    sys.exit(main())
