"""theseus-store: the lineage, values, checkpoints and artifacts of every run.

One SQLite database (WAL mode) plus a content-addressed blob folder under a
root, standard library only; or, with the ``postgres`` extra, the rows in a PostgreSQL
database and the files in a folder every host sees.

Besides the writers and readers of nodes, ``Store`` offers the reads the store
browser (``theseus.store.ui``) is built on, each one snapshot and no SQL for the
caller: ``data_version``, ``write_mark`` and ``written_since`` (what changed since a
mark: ``WrittenNode``), ``lineage_growth`` (``LineageGrowth``), ``holding_totals``,
``holdings_by_lineage``, ``last_statuses``, ``status_values``, ``numeric_keys``,
``held_keys``, ``last_value``, ``branch_point``, ``lineage_end``, ``lineage_chain``,
``numeric_series``, ``numeric_values``, ``job_in_lineage``, ``lineage_outline``,
``artifact_frames``, ``artifact_files`` and ``artifact_names``.

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

from theseus.store._browse import LineageGrowth, WrittenNode
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
    UnknownQueryKeyError,
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
from theseus.store._netfs import NetworkFilesystemWarning
from theseus.store._node import Node
from theseus.store._paths import canonical_path
from theseus.store._place import Location, bind_root, locate
from theseus.store._postgres._url import is_database_url
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
    "LineageGrowth",
    "Location",
    "MissingBlobError",
    "NetworkFilesystemWarning",
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
    "UnknownQueryKeyError",
    "ValueTypeError",
    "WrittenNode",
    "bind_root",
    "canonical_path",
    "is_database_url",
    "locate",
    "named_checkpoints",
    "open_lineage_folder",
    "registered_checkpoints",
    "set_aside",
    "strays",
]
