"""Data: tokenizers, datasets prepared offline under a root, and the batch plan.

A dataset is prepared once into ``ROOT/data/<name>/`` (``theseus data prepare NAME``
or ``Dataset.prepare(root)``) and read back as memory-mapped token arrays; a
``MixturePlan`` turns one or more prepared datasets into the global batch at any
cursor, the same on every host. Nothing here touches the network.

Example:
    >>> import tempfile
    >>> from theseus.data import Synthetic
    >>> root = tempfile.mkdtemp()
    >>> _ = Synthetic.prepare(root, tokens=4_096, val_tokens=1_024)
    >>> Synthetic.open(root).header["count"]
    {'train': 4096, 'val': 1024}
"""

from theseus.data._errors import DataError
from theseus.data.batches import IGNORE, Batch, MixturePlan, Style
from theseus.data.datasets import (
    Dataset,
    FineWeb,
    LocalDocuments,
    SourceError,
    Synthetic,
    TextFiles,
)
from theseus.data.prepared import (
    DataNotPreparedError,
    PreparedData,
    Split,
    dataset_dir,
    replacing,
)
from theseus.data.synthetic import MarkovLanguage
from theseus.data.tokenizer import (
    BPETokenizer,
    ByteTokenizer,
    Tokenizer,
    TokenizerError,
    get_tokenizer,
)

__all__ = [
    "IGNORE",
    "BPETokenizer",
    "Batch",
    "ByteTokenizer",
    "DataError",
    "DataNotPreparedError",
    "Dataset",
    "FineWeb",
    "LocalDocuments",
    "MarkovLanguage",
    "MixturePlan",
    "PreparedData",
    "SourceError",
    "Split",
    "Style",
    "Synthetic",
    "TextFiles",
    "Tokenizer",
    "TokenizerError",
    "dataset_dir",
    "get_tokenizer",
    "replacing",
]
