"""A writer process for the PostgreSQL load tests: ``python _pg_writer.py URL WHO COUNT``.

Writer ``WHO`` writes ``COUNT`` rounds, each one value, one artifact version and one
checkpoint registration on its own node, and prints ``done`` at the end. Round ``k``'s
value is ``k``, its artifact's bytes ``WHO:k``, its checkpoint step ``k``.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from theseus.store import Node, Store


def main(url: str, who: str, count: int) -> None:
    store = Store(url)
    node = Node("load.writers." + who, "0000abcd", 0)
    checkpoints = Path(tempfile.mkdtemp(prefix=f"ckpt-{who}-"))
    for k in range(count):
        store.log(node, {f"v{k}": k})
        store.put(node, "round", "round.txt", f"{who}:{k}".encode())
        folder = checkpoints / str(k)
        folder.mkdir()
        store.checkpoint(node, folder, {"k": k}, step=k)
        print(k, flush=True)
    store.close()
    print("done", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
