"""The GPU hand-over on GPU-backed (exclusive) slices.

A GPU is held by a process until it exits, as a Kubernetes device plugin holds it for a pod until
the pod is gone: a worker whose node still runs another worker (a preempted job saving its state,
the previous attempt) waits, committed but not started, until that one has exited. Never two
processes on one GPU. :class:`~hotswap.backends.local.workers.lifecycle.Workers` finds the holder and starts
the waiting workers after an exit; this keeps who waits.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from hotswap.backends.local.workers.supervisor import WorkerLaunch
from hotswap.backends.local.tables import WorkerRow


class GpuHandOver:
    def __init__(self, exclusive: Callable[[str], bool]) -> None:
        """``exclusive``: whether a slice's nodes run one worker at a time (GPU-backed slices)."""
        self.exclusive = exclusive
        # Committed workers waiting for their node's previous worker to exit.
        self.waiting: dict[int, tuple[WorkerRow, WorkerLaunch | None]] = {}

    def wait_for(self, holder: WorkerRow | None, row: WorkerRow, launch: WorkerLaunch | None) -> bool:
        """Whether the worker must wait for ``holder``, the other process on its node (said once
        in the worker's log)."""
        if holder is None:
            self.waiting.pop(row.id, None)
            return False
        if row.id not in self.waiting:
            self.waiting[row.id] = (row, launch)
            who = row.identity
            with contextlib.suppress(OSError), open((launch or WorkerLaunch.saved(row)).log, "a") as log:
                log.write(
                    f"--- hotswap: attempt {who.attempt} of {who.workload} waits for {holder.identity.workload}"
                    f" (attempt {holder.identity.attempt}, pid {holder.pid}) to leave node {who.node}'s GPUs ---\n"
                )
        return True

    def release(self, worker_id: int) -> bool:
        """Forget a waiting worker (told to stop before it started); whether it was waiting."""
        return self.waiting.pop(worker_id, None) is not None

    def pending(self) -> list[tuple[WorkerRow, WorkerLaunch | None]]:
        return list(self.waiting.values())
