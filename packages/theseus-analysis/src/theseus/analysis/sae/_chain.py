"""The SAE a node's SAE starts from: the latest earlier node of the lineage that holds one.

`previous_saes` looks along the stitched lineage (through its branch points) for each
SAE's latest earlier node whose `sae/NAME/config` is this configuration's digest, on host
zero (`from_host_zero`), and prefers the SAE in memory (`chain`, what a walk or a tandem
view trained last) when it is that node's or a later one of the same lineage.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from theseus.analysis.sae._records import alive_features
from theseus.analysis.sae._saelens import read_saelens
from theseus.job import from_host_zero
from theseus.store import Node, Store

__all__ = ["previous_saes"]


def previous_saes(
    store: Store,
    name: str,
    node: Node,
    digest: str,
    labels: list[str],
    chain: Mapping[str, dict[str, Any]],
) -> dict[str, dict[str, Any]]:
    """For each label with a previous SAE: `{"node", "params", "alive"}` (from the store)
    or the entry of `chain` (in memory).

    Args:
        store: the analysis's store.
        name: the analysis's `NAME`.
        node: the node being analyzed.
        digest: this configuration's `sae/NAME/config`.
        labels: the SAEs' labels (`SITE/WIDTH`).
        chain: label -> the SAE in memory (`{"node", "params", "alive"}`).
    """

    def stored() -> dict[str, tuple[Node, dict[str, np.ndarray] | None, Any]]:
        found: dict[str, tuple[Node, dict[str, np.ndarray] | None, Any]] = {}
        for label in labels:
            frames = store.artifact_frames(
                node.name, node.nonce, f"{name}/{label}/sae_weights.safetensors"
            )
            for frame in reversed(frames):
                at = Node.deserialize(frame["node"])
                if (at.name, at.nonce) == (node.name, node.nonce) and at.seq >= node.seq:
                    continue
                if store.values(at).get(f"sae/{name}/config") != digest:
                    continue
                memory = chain.get(label)
                if memory is not None and memory["node"] == at:
                    found[label] = (at, None, None)  # the one in memory
                else:
                    held = store.get(at)
                    files = {
                        f: held[f"{name}/{label}/{f}"].content
                        for f in ("cfg.json", "sae_weights.safetensors")
                    }
                    found[label] = (at, read_saelens(files)[1], alive_features(held, name, label))
                break
        return found

    from_store = from_host_zero(stored)
    previous: dict[str, dict[str, Any]] = {}
    for label in labels:
        memory = chain.get(label)
        usable = (
            memory is not None
            and (memory["node"].name, memory["node"].nonce) == (node.name, node.nonce)
            and memory["node"].seq < node.seq
        )
        if label in from_store:
            at, params, alive = from_store[label]
            if params is None or (usable and memory is not None and memory["node"].seq > at.seq):
                assert memory is not None
                previous[label] = memory
            else:
                previous[label] = {"node": at, "params": params, "alive": alive}
        elif usable:
            assert memory is not None
            previous[label] = memory
    return previous
