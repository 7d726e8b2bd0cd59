"""Suite integrity: every revision's tensors hashed, and what the hashes say about the suite.

Published suites hold broken revisions nobody flags: branches that serve another
step's weights, early steps all identical, a step holding another revision's shard.
At import each revision is fingerprinted from its safetensors files, without loading
a tensor into an array: the SHA-256 of each tensor's bytes as they lie in the file's
data section (read in blocks), the revision's weights digest (the SHA-256 of the lines
`name<TAB>tensor digest<LF>` over its tensors sorted by name: `import/sha256`), and each
shard file's digest (the same over that file's tensors alone). `check` compares them:

- two revisions with the same weights digest: the later one (by step) is a duplicate,
  `import/duplicate_of` holding the earliest's name;
- two revisions with different weights but a shard digest in common: each gets
  `import/shared_shards_with`, the other revisions' names;
- gaps: where the steps follow a regular schedule (the most common difference between
  consecutive steps, at least twice and for at least half of the differences, as
  Pythia's every 1000 after its log-spaced start), a difference that is a multiple of
  it leaves schedule steps missing; the revision after the gap gets
  `import/missing_before`, how many.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import struct
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from theseus.experiments.models._revisions import RevisionError

__all__ = [
    "Findings",
    "Fingerprint",
    "check",
    "digest_of",
    "fingerprint",
    "table",
    "tensor_digests",
]

_BLOCK = 1 << 24  # bytes read at a time while hashing a tensor


@dataclass(frozen=True)
class Fingerprint:
    """What a revision's weights hash to.

    Attributes:
        name: the revision.
        step: its step (None: a name without one).
        sha256: the weights digest (hex).
        shards: each shard file's digest (hex), in file name order.
    """

    name: str
    step: int | None
    sha256: str
    shards: tuple[str, ...]


@dataclass
class Findings:
    """What `check` found, keyed by revision name.

    Attributes:
        duplicate_of: revision -> the earliest revision with identical weights.
        shared_shards_with: revision -> the revisions it shares a shard file with.
        missing_before: revision -> schedule steps missing just before it.
        stride: the regular schedule's step (None: no regular schedule).
    """

    duplicate_of: dict[str, str] = field(default_factory=dict)
    shared_shards_with: dict[str, list[str]] = field(default_factory=dict)
    missing_before: dict[str, int] = field(default_factory=dict)
    stride: int | None = None

    def values(self, name: str) -> dict[str, str | int]:
        """The `import/...` values the findings put on revision `name`'s node."""
        values: dict[str, str | int] = {}
        if name in self.duplicate_of:
            values["import/duplicate_of"] = self.duplicate_of[name]
        if name in self.shared_shards_with:
            values["import/shared_shards_with"] = ",".join(self.shared_shards_with[name])
        if name in self.missing_before:
            values["import/missing_before"] = self.missing_before[name]
        return values

    def flags(self, name: str) -> str:
        """The findings on revision `name` in words (empty: nothing found)."""
        said = []
        if name in self.duplicate_of:
            said.append(f"DUPLICATE of {self.duplicate_of[name]}")
        if name in self.shared_shards_with:
            said.append(f"SHARES SHARDS with {', '.join(self.shared_shards_with[name])}")
        if name in self.missing_before:
            said.append(f"GAP: {self.missing_before[name]} step(s) of {self.stride} missing before")
        return "; ".join(said)


def digest_of(tensors: dict[str, str]) -> str:
    """The SHA-256 (hex) of `name<TAB>digest<LF>` over tensors sorted by name."""
    lines = "".join(f"{name}\t{tensors[name]}\n" for name in sorted(tensors))
    return hashlib.sha256(lines.encode("utf-8")).hexdigest()


def tensor_digests(file: Path) -> dict[str, str]:
    """`{tensor name: SHA-256 hex of its bytes}` of one safetensors file, read in blocks.

    Raises:
        RevisionError: the file is not a safetensors file (header or offsets wrong).
    """
    with file.open("rb") as handle:
        head = handle.read(8)
        if len(head) != 8:
            raise RevisionError(f"{file} is not a safetensors file (shorter than its header)")
        (size,) = struct.unpack("<Q", head)
        try:
            header = json.loads(handle.read(size).decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError, MemoryError, OverflowError):
            raise RevisionError(f"{file} is not a safetensors file (unreadable header)") from None
        if not isinstance(header, dict):
            raise RevisionError(f"{file} is not a safetensors file (its header is not an object)")
        start = 8 + size
        digests: dict[str, str] = {}
        for name, entry in header.items():
            if name == "__metadata__":
                continue
            try:
                begin, end = (int(x) for x in entry["data_offsets"])
            except (TypeError, KeyError, ValueError):
                raise RevisionError(f"{file}: tensor {name} has no data_offsets") from None
            handle.seek(start + begin)
            sha, left = hashlib.sha256(), end - begin
            while left > 0:
                block = handle.read(min(left, _BLOCK))
                if not block:
                    raise RevisionError(
                        f"{file} ends inside tensor {name}; the file is truncated (download "
                        "it again)"
                    )
                sha.update(block)
                left -= len(block)
            digests[name] = sha.hexdigest()
    return digests


def fingerprint(name: str, step: int | None, files: list[Path]) -> Fingerprint:
    """Hash a revision's safetensors `files` (its shards, or its one file).

    Raises:
        RevisionError: a file is not a safetensors file, or two files hold one tensor.
    """
    every: dict[str, str] = {}
    shards = []
    for file in sorted(files, key=lambda f: f.name):
        digests = tensor_digests(file)
        twice = sorted(set(digests) & set(every))
        if twice:
            raise RevisionError(f"revision {name}: tensor {twice[0]} is in two of its files")
        every.update(digests)
        shards.append(digest_of(digests))
    return Fingerprint(name, step, digest_of(every), tuple(shards))


def check(prints: list[Fingerprint], schedule: list[tuple[int, str]]) -> Findings:
    """Compare fingerprints: duplicates, shared shards, schedule gaps (module docstring).

    Args:
        prints: every revision of the lineage (those imported before and now), in
            lineage order (step order, names without a step last).
        schedule: `(step, revision)` of every revision with a step that the suite
            and the lineage hold (imported or not), in step order: the gaps are the
            suite's, not the choice of `--revisions`.
    """
    findings = Findings()
    first: dict[str, str] = {}
    for item in prints:
        if item.sha256 in first:
            findings.duplicate_of[item.name] = first[item.sha256]
        else:
            first[item.sha256] = item.name
    for item in prints:
        others = [
            other.name
            for other in prints
            if other.name != item.name
            and other.sha256 != item.sha256
            and set(other.shards) & set(item.shards)
        ]
        if others:
            findings.shared_shards_with[item.name] = others
    steps = sorted(dict(schedule).items())
    differences = [b - a for (a, _), (b, _) in itertools.pairwise(steps)]
    counts = Counter(d for d in differences if d > 0)
    if counts:
        count, stride = max((n, d) for d, n in counts.items())  # a tie: the wider step
        if count >= 2 and 2 * count >= len(differences):
            findings.stride = stride
            for difference, (_, name) in zip(differences, steps[1:], strict=True):
                if difference > stride and difference % stride == 0:
                    findings.missing_before[name] = difference // stride - 1
    return findings


def table(
    rows: list[tuple[str, int | None, int | None, str]], findings: Findings, new: set[str]
) -> str:
    """The printed table: revision, step, tokens, weights digest (short), flags.

    Args:
        rows: `(revision, step, tokens, sha256)` in lineage order.
        findings: what `check` found.
        new: the revisions imported now (the others were imported before: `(kept)`).
    """
    header = ("revision", "step", "tokens", "sha256", "flags")
    cells = [
        (
            name,
            "-" if step is None else str(step),
            "-" if tokens is None else _tokens(tokens),
            sha[:12],
            findings.flags(name) or ("ok" if name in new else "ok (imported before)"),
        )
        for name, step, tokens, sha in rows
    ]
    widths = [max(len(row[i]) for row in [header, *cells]) for i in range(4)]
    lines = [
        "  ".join(
            [*(cell.ljust(width) for cell, width in zip(row[:4], widths, strict=True)), row[4]]
        )
        for row in [header, *cells]
    ]
    return "\n".join(line.rstrip() for line in lines)


def _tokens(count: int) -> str:
    """`50000000000` -> `50B`, `1500000000` -> `1.5B`: the largest suffix that writes the
    count exactly with at most two decimals; else its digits."""
    for suffix, scale in (("T", 10**12), ("B", 10**9), ("M", 10**6), ("K", 10**3)):
        if count >= scale and count % (scale // 100) == 0:
            whole, cents = divmod(count // (scale // 100), 100)
            return f"{whole}.{cents:02d}".rstrip("0").rstrip(".") + suffix
    return str(count)
