"""How many warm spare workers a local cluster keeps when the user did not say (``--warm-workers
auto``, the default): pure, from the cluster's shape and a reading of free memory.

A spare is a worker process that has imported PyTorch and waits (backends/local/workers/warm.py); a
restart handed to spares skips Python's start and the import (seconds with a CUDA build). The
policy keeps enough spares to restart the workers of two slices at once (a two-slice job
restarted as a whole, or a slice replaced under a larger job), one per host, and never lets
the idle spares hold more than a quarter of the memory that is free when the cluster is
created. With too little memory for one spare it keeps none: restarts are cold, as before.

The zygote (backends/local/workers/zygote.py: one pre-imported process per cluster that forks spares
and workers) is kept when that quarter of the free memory holds one process, and counts as
one: the spares are then one fewer where memory is what limits them. A forked spare shares its
pages with the zygote copy-on-write, but Python's reference counts and the worker's own
allocations dirty them as it runs, so each spare is still counted at the full
``SPARE_BYTES``: the count is an upper bound, never a hope.
"""

from __future__ import annotations

# Resident memory of an idle spare: the CUDA build of PyTorch 2.13 imported with
# torch.distributed, torch.optim and torch._dynamo measured 0.67 GB (the CPU build 0.30 GB);
# rounded up for the interpreter's growth.
SPARE_BYTES = 1 << 30
SLICES_COVERED = 2  # restarts of up to this many slices' workers find spares
MEMORY_SHARE = 0.25  # of the free memory, at most, held by idle spares


def auto_zygote(available_bytes: int | None) -> bool:
    """Whether a new cluster keeps a zygote: its one process fits ``MEMORY_SHARE`` of the free
    memory (None: memory unknown, no)."""
    return available_bytes is not None and int(available_bytes * MEMORY_SHARE) >= SPARE_BYTES


def auto_warm_workers(
    num_slices: int, hosts_per_slice: int, available_bytes: int | None, maximum: int, zygote: bool = False
) -> int:
    """The number of spares ``--warm-workers auto`` keeps: one per host of
    ``min(num_slices, SLICES_COVERED)`` slices, within ``MEMORY_SHARE`` of ``available_bytes``
    (None: memory unknown, none) and ``maximum``; with a ``zygote``, its process takes one
    spare's share of that memory."""
    if available_bytes is None or num_slices < 1 or hosts_per_slice < 1:
        return 0
    wanted = min(num_slices, SLICES_COVERED) * hosts_per_slice
    affordable = int(available_bytes * MEMORY_SHARE) // SPARE_BYTES - (1 if zygote else 0)
    return max(0, min(wanted, affordable, maximum))
