"""Where a warned run stops: every process at the same step boundary.

A scheduler warns a job before its time limit or a preemption with a signal
(``THESEUS_PREEMPTION``; see ``theseus.job._signals``). One process alone can stop at
its next step boundary. Processes of one run cannot each stop where their own warning
arrived: the signal reaches them at different moments, each may be a step ahead of
another in dispatching work, and a process that stops while another starts the next
step leaves that one waiting in a collective forever. So at every step boundary each
process casts a vote (was it warned?) into a tiny collective, the maximum over all
processes, and stops when the vote of the step before says so. Every process reads
the same number, so all stop after the same step and can checkpoint it together. The
vote is read a step late, so the host never waits for the step it just dispatched.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from theseus.job import Preempted, preemption_requested, preemption_signal

__all__ = ["StopVote"]


class StopVote:
    """Ask :meth:`stop_now` at each step boundary of a run that a scheduler may warn."""

    def __init__(self) -> None:
        self.signal = preemption_signal()
        self.multi = jax.process_count() > 1
        self._cast: Any = None  # the previous boundary's vote, not read yet
        if self.multi and self.signal is not None:
            mesh = Mesh(np.array(jax.devices()), ("processes",))
            self._sharding = NamedSharding(mesh, PartitionSpec("processes"))
            self._shape = (len(jax.devices()),)
            self._places = self._sharding.addressable_devices_indices_map(self._shape)
            self._max = jax.jit(jnp.max, out_shardings=NamedSharding(mesh, PartitionSpec()))

    @property
    def active(self) -> bool:
        """Whether the run watches for a warning at all (``THESEUS_PREEMPTION`` is set)."""
        return self.signal is not None

    def stop_now(self) -> bool:
        """Whether the run stops at this boundary (the same answer on every process)."""
        if self.signal is None:
            return False
        warned = preemption_requested()
        if not self.multi:
            return warned
        earlier, flag = self._cast, np.array([int(warned)], np.int32)
        shards = [jax.device_put(flag, device) for device in self._places]
        votes = jax.make_array_from_single_device_arrays(self._shape, self._sharding, shards)
        self._cast = self._max(votes)
        return earlier is not None and bool(earlier)

    def preempted(self) -> Preempted:
        """What the run raises once :meth:`stop_now` said to stop."""
        assert self.signal is not None, "only a run that watches for a warning stops"
        return Preempted(int(self.signal))
