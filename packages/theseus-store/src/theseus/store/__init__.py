"""theseus-store: the lineage, values, checkpoints and artifacts of every run.

One SQLite database (WAL mode) plus a content-addressed blob folder under a
root, standard library only.

Example:
    >>> import tempfile
    >>> from theseus.store import Node, Store
    >>> with Store(tempfile.mkdtemp()) as store:
    ...     node = Node.new("train")
    ...     store.log(node, {"train/loss": 2.5})
    ...     _ = store.put(node, "notes", "notes.txt", b"hello")
    ...     store.query().node(node).artifact().select(keys=["name", "content"])
    [{'name': 'notes', 'content': b'hello'}]
"""

from theseus.store._errors import (
    AmbiguousNodeError,
    BlobHashError,
    CheckpointNotFoundError,
    CorruptStoreError,
    InvalidNodeError,
    MissingBlobError,
    NotAStoreError,
    QueryError,
    StoreBusyError,
    StoreError,
    StorePermissionError,
    UnknownKeyError,
    UnknownNodeError,
    ValueTypeError,
)
from theseus.store._folders import (
    COMMIT_MARKER,
    FolderBusyError,
    FolderLock,
    named_checkpoints,
    open_lineage_folder,
    registered_checkpoints,
    set_aside,
    strays,
)
from theseus.store._fsck import FsckReport
from theseus.store._node import Node
from theseus.store._paths import canonical_path
from theseus.store._query import Query
from theseus.store._reading import StoreReader
from theseus.store._records import Artifact, Checkpoint, Scalar
from theseus.store._root import CLAIM, RootFolders
from theseus.store._store import MARKER, Store

__all__ = [
    "CLAIM",
    "COMMIT_MARKER",
    "MARKER",
    "AmbiguousNodeError",
    "Artifact",
    "BlobHashError",
    "Checkpoint",
    "CheckpointNotFoundError",
    "CorruptStoreError",
    "FolderBusyError",
    "FolderLock",
    "FsckReport",
    "InvalidNodeError",
    "MissingBlobError",
    "Node",
    "NotAStoreError",
    "Query",
    "QueryError",
    "RootFolders",
    "Scalar",
    "Store",
    "StoreBusyError",
    "StoreError",
    "StorePermissionError",
    "StoreReader",
    "UnknownKeyError",
    "UnknownNodeError",
    "ValueTypeError",
    "canonical_path",
    "named_checkpoints",
    "open_lineage_folder",
    "registered_checkpoints",
    "set_aside",
    "strays",
]
