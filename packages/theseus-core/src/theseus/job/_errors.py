"""`JobError`: the error of a job that cannot go on, and its earlier names.

It lives apart from `_basic.py` so that the modules `_basic` imports (`_hosts`,
`_cluster`) can raise it without an import cycle; `theseus.job` re-exports it.
`HostZeroError` and `ClusterJoinError` were classes of their own; no caller told them
apart from the rest, so they are `JobError` under their old names.
"""

from __future__ import annotations

from theseus.errors import TheseusError

__all__ = ["ClusterJoinError", "HostZeroError", "JobError", "JobTypeError"]


class JobError(TheseusError, RuntimeError):
    """A job that cannot go on: used out of order (not set up, set up twice in different
    modes, ...), a multi-host cluster that did not form, or a failure on host zero that
    reached the other hosts only as its text."""


#: The earlier name of JobError (a job constructed with an argument of the wrong type), kept for old imports.
JobTypeError = JobError

#: The earlier name of JobError (host zero raised inside `from_host_zero` an exception that
#: would not unpickle: the other hosts raise its type and message), kept for old imports.
HostZeroError = JobError

#: The earlier name of JobError (this process could not join its cluster: a process never
#: arrived, or JAX failed), kept for old imports.
ClusterJoinError = JobError
