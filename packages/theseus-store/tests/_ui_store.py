"""A small store for the browser's tests: a fresh lineage, a resume, a branch, hostile text."""

from __future__ import annotations

import json
import math
from pathlib import Path

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
