"""The revisions of a published training suite: where they are, and the step each names.

A suite comes in one of two layouts. A Hugging Face cache folder (`models--ORG--NAME`,
as `huggingface_hub` writes it): `refs/<revision>` is a file holding a commit hash
(a revision with a `/` in its name is a nested file; `refs/pr/` are pull requests and
are not revisions of the suite), `snapshots/<commit>/` holds that commit's files,
each a symlink into `../../blobs/`. Or a plain folder with one subfolder per revision,
named by the revision. `discover(src)` lists them; `select(revisions, spec)` reads
`--revisions` (`all`, or `R1,R2,...`).

A revision's name gives its training step and, where it says so, its tokens:
`step1000`, `step-1000`, `step_1000`, `stage1-step11931-tokens50B` (step 11931, 50e9
tokens; the suffixes K, M, B, T multiply by 1e3, 1e6, 1e9, 1e12). `parse_name` returns
numbers, never strings. `all` takes every revision whose name carries a step, in step
order; a name without one (`main`) is imported only when named, after the last step.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path

from theseus.errors import TheseusError

__all__ = [
    "Revision",
    "RevisionError",
    "discover",
    "parse_name",
    "select",
]

# A step: `step` then an optional `-` or `_`, then digits, between separators or the ends.
_STEP = re.compile(r"(?:^|[-_./])step[-_]?(\d+)(?=$|[-_./])", re.IGNORECASE)
# Tokens: `tokens` then an optional `-` or `_`, a number, an optional K/M/B/T suffix.
_TOKENS = re.compile(r"(?:^|[-_./])tokens[-_]?(\d+(?:\.\d+)?)([KMBT]?)(?=$|[-_./])", re.IGNORECASE)
_SCALE = {"": 1, "K": 10**3, "M": 10**6, "B": 10**9, "T": 10**12}
# What marks a folder as one model's (a revision of the suite).
_MODEL_FILE = "config.json"


class RevisionError(TheseusError, ValueError):
    """A suite folder or a `--revisions` choice that cannot be imported (one line says why)."""


@dataclass(frozen=True)
class Revision:
    """One revision of a suite.

    Attributes:
        name: the revision's name (`step1000`, `main`, a commit hash for a snapshot no
            ref names).
        folder: its model folder (a snapshot, or a subfolder).
        step: the training step its name gives, or None.
        tokens: the tokens its name gives, or None.
        commit: the commit hash (Hugging Face cache), or None.
    """

    name: str
    folder: Path
    step: int | None
    tokens: int | None
    commit: str | None = None


def parse_name(name: str) -> tuple[int | None, int | None]:
    """`(step, tokens)` a revision's name gives; None for what it does not say.

    >>> parse_name("stage1-step11931-tokens50B")
    (11931, 50000000000)
    >>> parse_name("step-1000"), parse_name("main")
    ((1000, None), (None, None))
    """
    steps = _STEP.findall(name)
    step = int(steps[0]) if len(steps) == 1 else None
    found = _TOKENS.findall(name)
    tokens = None
    if len(found) == 1:
        number, suffix = found[0]
        try:
            value = Decimal(number) * _SCALE[suffix.upper()]
        except InvalidOperation:  # pragma: no cover - the pattern admits only numbers
            value = None
        if value is not None and value == value.to_integral_value():
            tokens = int(value)
    return step, tokens


def _revision(name: str, folder: Path, commit: str | None = None) -> Revision:
    step, tokens = parse_name(name)
    return Revision(name, folder, step, tokens, commit)


def discover(src: str | Path) -> list[Revision]:
    """Every revision of the suite at `src`, in name order.

    Raises:
        RevisionError: `src` is not a folder, is one model's folder rather than a
            suite's, or holds no revision.
    """
    folder = Path(src).expanduser().absolute()
    if not folder.is_dir():
        raise RevisionError(
            f"{folder} is not a folder; pass a Hugging Face cache folder (models--ORG--NAME, "
            "with refs/ and snapshots/) or a folder with one subfolder per revision"
        )
    if (folder / "refs").is_dir() and (folder / "snapshots").is_dir():
        found = _cache_revisions(folder)
    elif (folder / _MODEL_FILE).is_file():
        raise RevisionError(
            f"{folder} is one model's folder (it has {_MODEL_FILE}), not a suite; drop "
            "--revisions to import it, or pass the folder that holds one subfolder per revision"
        )
    else:
        found = [
            _revision(child.name, child)
            for child in sorted(folder.iterdir())
            if child.is_dir() and (child / _MODEL_FILE).is_file()
        ]
    repositories = sorted(c.name for c in folder.iterdir() if c.name.startswith("models--"))
    if not found and repositories:
        raise RevisionError(
            f"{folder} is a Hugging Face cache of several repositories; pass the folder of "
            f"one: {', '.join(str(folder / name) for name in repositories)}"
        )
    if not found:
        raise RevisionError(
            f"{folder} holds no revision: expected refs/ and snapshots/ (a Hugging Face cache "
            f"folder) or subfolders with a {_MODEL_FILE}"
        )
    return sorted(found, key=lambda r: r.name)


def _cache_revisions(folder: Path) -> list[Revision]:
    """The revisions of a Hugging Face cache folder: each ref, then each unnamed snapshot."""
    found: list[Revision] = []
    named: set[str] = set()
    refs = folder / "refs"
    for ref in sorted(refs.rglob("*")):
        name = ref.relative_to(refs).as_posix()
        if not ref.is_file() or name.startswith("pr/"):
            continue
        commit = ref.read_text(encoding="utf-8").strip()
        snapshot = folder / "snapshots" / commit
        if not (snapshot / _MODEL_FILE).is_file():
            continue  # a ref whose files were never downloaded is not a revision here
        found.append(_revision(name, snapshot, commit))
        named.add(commit)
    for snapshot in sorted((folder / "snapshots").iterdir()):
        if snapshot.name not in named and (snapshot / _MODEL_FILE).is_file():
            found.append(_revision(snapshot.name, snapshot, snapshot.name))
    return found


def select(revisions: list[Revision], spec: str) -> list[Revision]:
    """The revisions `--revisions` names, in step order (names without a step last).

    Args:
        revisions: what `discover` found.
        spec: `all` (every revision whose name carries a step) or `R1,R2,...`.

    Raises:
        RevisionError: an empty or unknown name (the message lists those there are),
            no revision with a step for `all`, or two chosen revisions at one step.
    """
    by_name = {r.name: r for r in revisions}
    text = spec.strip()
    if text == "all":
        chosen = [r for r in revisions if r.step is not None]
        if not chosen:
            raise RevisionError(
                f"--revisions all takes the revisions whose names carry a step, and none of "
                f"{_listing(revisions)} does; name the ones to import: --revisions R1,R2"
            )
    else:
        names = [part.strip() for part in text.split(",")]
        if not text or any(not name for name in names):
            raise RevisionError(
                f"--revisions is {spec!r}; expected all, or revision names separated by "
                f"commas, from {_listing(revisions)}"
            )
        unknown = [name for name in names if name not in by_name]
        if unknown:
            raise RevisionError(
                f"revision {unknown[0]!r} is not in the suite; it has {_listing(revisions)}"
            )
        chosen = [by_name[name] for name in dict.fromkeys(names)]
    stepped = sorted((r for r in chosen if r.step is not None), key=lambda r: r.step or 0)
    for a, b in itertools.pairwise(stepped):
        if a.step == b.step:
            raise RevisionError(
                f"revisions {a.name} and {b.name} both name step {a.step}; one lineage holds "
                "one node per step, so name one of them with --revisions"
            )
    return stepped + [r for r in chosen if r.step is None]


def _listing(revisions: list[Revision]) -> str:
    """Every revision's name for a message, in step order (names without a step last)."""
    ordered = sorted(revisions, key=lambda r: (r.step is None, r.step or 0, r.name))
    return ", ".join(r.name for r in ordered)
