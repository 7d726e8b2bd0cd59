"""Jobs: ``BasicJob`` (the lifecycle), ``JobSpec`` (identity and root), hosts, clusters, signals."""

from theseus.job._basic import BasicJob, Mode
from theseus.job._cluster import ClusterPlan, ClusterUsageError, join_cluster, plan_cluster
from theseus.job._errors import ClusterJoinError, HostZeroError, JobError, JobTypeError
from theseus.job._hosts import (
    HostZeroStore,
    agree_on_nonce,
    from_host_zero,
    is_primary,
    open_store,
    process_count,
    process_index,
    sync_hosts,
)
from theseus.job._signals import (
    ENV_PREEMPTION,
    STOP_SIGNALS,
    Interrupted,
    Preempted,
    StopSignal,
    Terminated,
    deferred_stop,
    preemption_requested,
    preemption_signal,
    stop_on_signals,
)
from theseus.job._spec import JobSpec, store_root
from theseus.job._walk import CheckpointWalker

__all__ = [
    "ENV_PREEMPTION",
    "STOP_SIGNALS",
    "BasicJob",
    "CheckpointWalker",
    "ClusterJoinError",
    "ClusterPlan",
    "ClusterUsageError",
    "HostZeroError",
    "HostZeroStore",
    "Interrupted",
    "JobError",
    "JobSpec",
    "JobTypeError",
    "Mode",
    "Preempted",
    "StopSignal",
    "Terminated",
    "agree_on_nonce",
    "deferred_stop",
    "from_host_zero",
    "is_primary",
    "join_cluster",
    "open_store",
    "plan_cluster",
    "preemption_requested",
    "preemption_signal",
    "process_count",
    "process_index",
    "stop_on_signals",
    "store_root",
    "sync_hosts",
]
