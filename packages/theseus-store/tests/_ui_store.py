"""A small store for the browser's tests: a fresh lineage, a resume, a branch, hostile text."""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

import pytest

from theseus.store import Node, Store

HOSTILE = "<script>alert(1)</script>"
HOSTILE_IMG = '<img src=x onerror="alert(2)">'


def tiny_pdf(rgb: tuple[float, float, float] = (1.0, 0.0, 0.0), detail: int = 0) -> bytes:
    """A one-page PDF (200 x 100 points): white, with a filled rectangle at (20, 20)-(80, 80).

    ``detail`` grey words in Helvetica are written right of x = 100 first (text makes
    PDFium load fonts, its shared state).
    """
    words = "".join(
        f"BT /F1 {4 + i % 9} Tf {100 + (7 * i) % 90} {(13 * i) % 95} Td (w{i}) Tj ET "
        for i in range(detail)
    )
    stream = f"0.5 g {words}{rgb[0]} {rgb[1]} {rgb[2]} rg 20 20 60 60 re f".encode()
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 200 100] /Contents 4 0 R"
        b" /Resources << /Font << /F1 << /Type /Font /Subtype /Type1 /BaseFont /Helvetica >> >> >> >>",
        b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream",
    ]
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for i, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % i + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % o for o in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (
        len(objects) + 1,
        xref,
    )
    return bytes(out)


def build(root: Path) -> dict[str, Node]:
    """Write the test store under ``root`` (a store folder) and return its landmark nodes.

    ``lm.base.train`` runs 12 nodes (checkpoints at seq 5 and 11, a job started again at
    seq 6: a resume), ``lm.base.tune`` branches from its seq 5 and runs 4 nodes. Every
    node logs ``val/loss`` and ``train/step``; every third node of the base holds a PDF
    ``picture``; the hostile strings sit in a value, the config, an artifact's name,
    its filename and its JSON content. The branch is a SLURM job's (``slurm/*``), running
    again after a requeue.
    """
    with Store(root) as store:
        base = Node.new("train", project="lm", group="base")
        store.record_job(base, "gpt/train/pretrain", f"lr: 0.001\nnote: '{HOSTILE}'\n")
        node = base
        nodes = {"base0": base}
        for seq in range(12):
            if seq:
                node = node.next()
            if seq == 6:
                store.record_job(node, "gpt/train/pretrain", "lr: 0.001\nnote: resumed\n")
            store.log(
                node,
                {"val/loss": 3.0 / (1 + seq) + 0.1, "train/step": 10 * seq, "note": HOSTILE},
            )
            if seq % 3 == 0:
                store.put(node, "picture", "picture.pdf", tiny_pdf((1.0, seq / 12, 0.0)))
            if seq in (5, 11):
                folder = root.parent / "checkpoints" / f"{seq}"
                folder.mkdir(parents=True)
                (folder / "state").write_bytes(b"x")
                store.checkpoint(node, folder, step=10 * seq)
            nodes[f"base{seq}"] = node
        tail = store.put(node, "metrics", "metrics.json", json.dumps({"a": 1}).encode())
        store.put(
            node,
            "metrics",
            "metrics.json",
            json.dumps({"loss": [1.5, 1.25], "nested": {"x": None, "tag": HOSTILE}}).encode(),
        )
        assert tail.version == 1
        store.put(node, HOSTILE, f"{HOSTILE_IMG}.txt", f"text {HOSTILE}".encode())
        store.put(node, "notes", "notes.txt", b"plain text\nsecond line\n")
        branch = Node.new("tune", project="lm", group="base", parent=nodes["base5"])
        store.record_job(branch, "gpt/train/pretrain", "lr: 0.0001\nnote: tuned\n")
        node = branch
        for seq in range(4):
            if seq:
                node = node.next()
            store.log(node, {"val/loss": 0.5 - 0.01 * seq, "train/step": 60 + 10 * seq})
            nodes[f"tune{seq}"] = node
        store.log(nodes["tune3"], {"job/status": "running", "val/nan": math.nan})
        # the branch runs as a requeued SLURM job (theseus submit's records)
        scheduled = {"slurm/job": "4242", "slurm/state": "running", "slurm/restarts": 1}
        store.log(nodes["tune3"], scheduled)
        store.log(nodes["base11"], {"job/status": "finished"})
    return nodes


# -- SAE features (the features page): a chain of SAEs along one lineage ------------------------

SAE = "features/blocks_1/mlp/8"  # NAME/LABEL: the artifact is SAE + "/features.json"
SAE_WIDTH = 8
# A window of 16 tokens (12 before the activating token, 3 after), the hostile and the
# blank ones among them; each context is a rotation of it.
SAE_TOKENS = [
    "The", " cat", " sat", "\n", HOSTILE, " ", '"', "quoted", "'", "\t", " on", "<b>",
    "  ", "", " mat", ".",
]  # fmt: skip
# Each SAE's matches: feature -> its match in the previous SAE (None: born). Along them
# #1 at the first SAE is #3, #0, #6 at the next ones; the second SAE leaves #5 of the
# first unmatched (gone) and has #2 born; the third leaves #1 of the second (gone) and
# has #1 born. #7 is never active (dead).
SAE_MATCHES: list[dict[int, int | None]] = [
    {},
    {0: 0, 1: 4, 2: None, 3: 1, 4: 3, 5: 6, 6: 7, 7: 2},
    {0: 3, 1: None, 2: 2, 3: 0, 4: 4, 5: 5, 6: 6, 7: 7},
    {0: 1, 1: 2, 2: 3, 3: 4, 4: 5, 5: 6, 6: 0, 7: 7},
]
SAE_SEQS = (1, 3, 5, 7)  # the nodes of lm.sae.train that hold an SAE (of seqs 0..8)


def features_doc(
    node: Node,
    previous: Node | None,
    matches: dict[int, int | None],
    width: int = SAE_WIDTH,
    dead: tuple[int, ...] = (7,),
) -> dict:
    """A features.json (format ``theseus-sae-features/1``) of ``width`` features for the SAE
    at ``node``, matched to the one at ``previous`` by ``matches`` (feature -> its match);
    each active feature has three contexts, its activation peaking at the window's token
    12, the feature's own index deciding the rotation of the window."""
    features = []
    for index in range(width):
        peak = 0.0 if index in dead else round(1.0 + 0.5 * index + 0.1 * node.seq, 3)
        top = []
        for k in range(0 if index in dead else 3):
            shift = (index + 2 * k) % len(SAE_TOKENS)
            tokens = SAE_TOKENS[shift:] + SAE_TOKENS[:shift]
            value = round(peak * (1.0 - 0.2 * k), 4)
            activations = [round(value * ((i % 4) / 8), 4) if i < 12 else 0.0 for i in range(16)]
            activations[12] = value
            activations[13] = round(value * 0.5, 4)
            top.append(
                {
                    "activation": value,
                    "row": k,
                    "position": 12 + index,
                    "tokens": tokens,
                    "activations": activations,
                    "at": 12,
                }
            )
        match = matches.get(index) if previous is not None else None
        features.append(
            {
                "index": index,
                "density": 0.0 if index in dead else round(0.4 / (1 + index), 4),
                "max": peak,
                "previous": match,
                "cosine": None if match is None else round(0.99 - 0.01 * index, 2),
                "top": top,
            }
        )
    born = sum(1 for f in features if f["previous"] is None) if previous else 0
    gone = width - len({f["previous"] for f in features} - {None}) if previous else 0
    measures: dict = {"l0": 2.5 + node.seq / 10, "fvu": 0.3 - node.seq / 100, "dead": 1 / 8}
    measures["loss_recovered"] = 0.8 + node.seq / 100
    if previous is not None:
        measures.update({"matched": (width - born) / width, "born": born, "gone": gone})
    site = SAE.split("/", 1)[1].rpartition("/")[0]
    return {
        "format": "theseus-sae-features/1",
        "analysis": SAE.split("/")[0],
        "sae": SAE.split("/", 1)[1],
        "site": site,
        "width": width,
        "architecture": "topk",
        "node": node.serialize(),
        "seq": node.seq,
        "previous": None if previous is None else previous.serialize(),
        "measures": measures,
        "context": {"before": 12, "after": 3},
        "features": features,
    }


def build_features(root: Path) -> dict[str, Node]:
    """Write a store whose lineage ``lm.sae.train`` (seqs 0..8) holds an SAE's features.json
    at seqs 1, 3, 5, 7 (:data:`SAE_MATCHES`) and the values ``sae/...`` an SAE analysis logs
    beside it; a second SAE, ``features/blocks_0/mlp/8``, whose features.json at seq 3 is not
    JSON and at seq 5 is another format; and ``lm.plain.train``, a lineage with no SAE.

    Returns the nodes: ``sae0`` .. ``sae3`` (the four that hold the SAE), ``seq0`` ..
    ``seq8``, ``plain``.
    """
    with Store(root) as store:
        node = Node.new("train", project="lm", group="sae")
        nodes = {}
        for seq in range(9):
            if seq:
                node = node.next()
            store.log(node, {"val/loss": 3.0 / (1 + seq), "train/step": 100 * seq})
            nodes[f"seq{seq}"] = node
        previous = None
        for k, seq in enumerate(SAE_SEQS):
            node = nodes[f"seq{seq}"]
            doc = features_doc(node, previous, SAE_MATCHES[k])
            store.put(node, f"{SAE}/features.json", "features.json", json.dumps(doc).encode())
            store.log(node, {f"sae/{SAE}/{m}": v for m, v in doc["measures"].items()})
            other = "features/blocks_0/mlp/8/features.json"
            if seq == 3:
                store.put(node, other, "features.json", b"{not json")
            elif seq == 5:
                store.put(node, other, "features.json", json.dumps({"format": "x/2"}).encode())
            else:
                other_doc = features_doc(node, None, {})
                store.put(node, other, "features.json", json.dumps(other_doc).encode())
            nodes[f"sae{k}"] = node
            previous = node
        plain = Node.new("train", project="lm", group="plain")
        store.log(plain, {"val/loss": 1.0})
        store.put(plain, "notes", "notes.txt", b"no SAE here\n")
        nodes["plain"] = plain
    return nodes


def chromium() -> str:
    """Debian's Chromium for the browser tests; a skip without it (a failure on CI)."""
    for candidate in (
        "/usr/bin/chromium",
        shutil.which("chromium"),
        shutil.which("chromium-browser"),
    ):
        if candidate and Path(candidate).exists():
            return candidate
    message = (
        "no Chromium at /usr/bin/chromium: install it with "
        "`apt-get install -y --no-install-recommends chromium` (.ci/run does)"
    )
    if os.environ.get("CI"):
        pytest.fail(f"CI is set and {message}")
    pytest.skip(message)
