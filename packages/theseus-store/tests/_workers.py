"""Worker processes for the reliability tests (run with ``sys.executable _workers.py ROLE ...``).

* ``crash ROOT SEED``: writes artifacts of random sizes (0 bytes to 3 MiB), values
  and checkpoints forever, printing one line per acknowledged write:
  ``ack NODE NAME SHA256 SIZE``. The test kills it with SIGKILL.
* ``writer ROOT SECONDS TAG``: writes records whose parts must agree (``i``,
  ``twice`` = 2i, ``tag``, and an artifact whose bytes derive from i) for a while.
* ``reader ROOT SECONDS``: reads the newest records in a loop and checks that no
  record is torn; prints ``checks N`` at the end.

Any exception ends the process with status 1 and a traceback on stderr.
"""

from __future__ import annotations

import hashlib
import random
import sys
import time
from pathlib import Path

from theseus.store import Node, Store

MIB = 1 << 20


def payload(i: int, size: int) -> bytes:
    """Deterministic bytes for write ``i``."""
    return random.Random(i).randbytes(size)


def crash(root: str, seed: int) -> None:
    """Write until killed, acknowledging each durable write on stdout."""
    rng = random.Random(seed)
    with Store(root) as store:
        node = Node.new(f"crash-{seed}")
        print("ready", flush=True)
        for i in range(10**9):
            size = rng.choice([0, rng.randrange(1, 4096), rng.randrange(4096, 3 * MIB)])
            content = payload(seed * 100_000 + i, size)
            name = f"a{i}"
            store.put(node, name, f"{name}.bin", content)
            print(
                f"ack {node.serialize()} {name} {hashlib.sha256(content).hexdigest()} {size}",
                flush=True,
            )
            store.log(node, {"i": i, "size": size})
            if i % 3 == 2:
                path = Path(root) / "ckpt" / f"{seed}-{i}"
                path.mkdir(parents=True)
                store.checkpoint(node, path)
                node = node.next()


def writer(root: str, seconds: float, tag: str) -> None:
    """Write self-consistent records for ``seconds``; print the last index written."""
    deadline = time.monotonic() + seconds
    i = 0
    with Store(root) as store:
        node = Node.new(f"writer-{tag}")
        while time.monotonic() < deadline:
            store.log(node, {"i": i, "twice": 2 * i, "tag": f"{tag}-{i}"})
            store.put(node, "blob", f"{i}.bin", payload(i, 1 + (i * 7919) % 200_000))
            node = node.next()
            i += 1
    print(f"wrote {i} {node.nonce}", flush=True)


def reader(root: str, seconds: float) -> None:
    """Check newest records until ``seconds`` pass; fail loudly on a torn one."""
    deadline = time.monotonic() + seconds
    checks = 0
    with Store(root) as store:
        while not store.query().has("i").count():  # sort() on a key no node has is an error
            time.sleep(0.01)
        while time.monotonic() < deadline:
            for node, values in (
                store.query().has("i").sort("i", ascending=False).select(return_nodes=True)[:5]
            ):
                i = values["i"]
                assert isinstance(i, int)
                assert values["twice"] == 2 * i, (node, values)
                assert str(values["tag"]).endswith(f"-{i}"), (node, values)
                checks += 1
            for row in store.query().artifact("blob").latest().select():
                i = int(row["filename"].split(".")[0])
                assert row["content"] == payload(i, 1 + (i * 7919) % 200_000), row["node"]
                checks += 1
    print(f"checks {checks}", flush=True)


if __name__ == "__main__":
    role, root, *rest = sys.argv[1:]
    if role == "crash":
        crash(root, int(rest[0]))
    elif role == "writer":
        writer(root, float(rest[0]), rest[1])
    elif role == "reader":
        reader(root, float(rest[0]))
    else:
        raise SystemExit(f"unknown role {role!r}")
