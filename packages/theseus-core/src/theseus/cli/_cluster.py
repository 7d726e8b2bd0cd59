"""``--cluster``, ``--coordinator``, ``--num-processes``, ``--process-id``, ``--join-timeout``.

:func:`cluster_options` adds them to a verb (``run``; theseus-analysis's ``demo``). The
options are eager, so click reads all of them before ``--import`` runs user code; the
process joins its cluster (:func:`theseus.job.join_cluster`) before the first import
and before the verb's body, so nothing touches JAX devices earlier.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import click

from theseus.job._cluster import (
    CLUSTER_MODES,
    DEFAULT_JOIN_TIMEOUT,
    ENV_CLUSTER,
    ENV_COORDINATOR,
    ENV_JOIN_TIMEOUT,
    ENV_NUM_PROCESSES,
    ENV_PROCESS_ID,
    JAX_COORDINATOR,
    ClusterUsageError,
    join_cluster,
    plan_cluster,
)

F = TypeVar("F", bound=Callable[..., Any])

_VALUES = "theseus.cluster.values"
_DONE = "theseus.cluster.done"


def _remember(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    assert param.name is not None
    ctx.meta.setdefault(_VALUES, {})[param.name] = value
    return value


def join_from_context(ctx: click.Context) -> None:
    """Join the cluster the verb's options and the environment ask for (once per process).

    Raises:
        click.UsageError: incomplete or contradictory settings.
        JobError: the cluster did not form (reported as ``Error (JobError): ...``).
    """
    values = ctx.meta.get(_VALUES)
    if values is None or ctx.meta.get(_DONE):
        return
    ctx.meta[_DONE] = True
    try:
        plan = plan_cluster(
            cluster=values.get("cluster"),
            coordinator=values.get("coordinator"),
            num_processes=values.get("num_processes"),
            process_id=values.get("process_id"),
            timeout=values.get("join_timeout"),
        )
    except ClusterUsageError as exc:
        raise click.UsageError(str(exc), ctx) from exc
    if plan is not None:
        join_cluster(plan)


def cluster_options(f: F) -> F:
    """Add the options that join a multi-host cluster; the verb joins before its body."""

    @functools.wraps(f)
    def joined(*args: Any, **kwargs: Any) -> Any:
        join_from_context(click.get_current_context())
        return f(*args, **kwargs)

    options: list[tuple[str, dict[str, Any]]] = [
        (
            "--join-timeout",
            {
                "type": click.IntRange(min=1),
                "metavar": "SECONDS",
                "help": (
                    f"Seconds to wait until every process has joined (default "
                    f"{DEFAULT_JOIN_TIMEOUT}; env {ENV_JOIN_TIMEOUT}); then the processes "
                    "that came fail with an error that names the ones that did not."
                ),
            },
        ),
        (
            "--process-id",
            {
                "type": click.IntRange(min=0),
                "metavar": "I",
                "help": (
                    f"This process's id, 0 to N-1 (env {ENV_PROCESS_ID}); process 0 is the "
                    "coordinator and the only one that writes the store."
                ),
            },
        ),
        (
            "--num-processes",
            {
                "type": click.IntRange(min=1),
                "metavar": "N",
                "help": f"How many processes join (env {ENV_NUM_PROCESSES}).",
            },
        ),
        (
            "--coordinator",
            {
                "metavar": "HOST:PORT",
                "help": (
                    "Process 0's address and a free port, the same on every process (env "
                    f"{ENV_COORDINATOR} or {JAX_COORDINATOR})."
                ),
            },
        ),
        (
            "--cluster",
            {
                "type": click.Choice(CLUSTER_MODES, case_sensitive=False),
                "help": (
                    "auto: let JAX find the cluster and join it (TPU pods, Kubernetes, "
                    "SLURM, Open MPI); off: run alone whatever the environment says (env "
                    f"{ENV_CLUSTER}). Default: join when --coordinator, --num-processes and "
                    "--process-id (or their variables) are given, or under srun or mpirun "
                    "with several tasks."
                ),
            },
        ),
    ]
    wrapped: Any = joined
    for name, settings in options:
        wrapped = click.option(
            name,
            default=None,
            is_eager=True,  # read before --import runs user code, which joins first
            expose_value=False,
            callback=_remember,
            **settings,
        )(wrapped)
    return wrapped
