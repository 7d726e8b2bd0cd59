"""`DataError`: data that cannot make the batches asked of it."""

from theseus.errors import TheseusError

__all__ = ["DataError"]


class DataError(TheseusError, ValueError):
    """Prepared data that does not fit the request (too short, ids beyond the vocabulary,
    a batch that does not split over the hosts); the message says what to change."""
