"""What a worker of the local backend is started with: its environment, files and log.

The environment follows the contract in :mod:`hotswap.api.worker`: JobSet's indices,
MEGASCALE's slice id and count, torch.distributed's rendezvous, and hotswap's own variables.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any

from hotswap.api import worker as contract
from hotswap.api.membership import Membership
from hotswap.api.errors import InvalidInputError
from hotswap.store.paths import check_private, new_dirs_private, open_private

MASTER_ADDR = contract.DEFAULT_MASTER_ADDR  # every worker of a local cluster is on this machine


def free_port() -> int:
    """A TCP port free right now on :data:`MASTER_ADDR` (each attempt and generation gets its own)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((MASTER_ADDR, 0))
        return int(probe.getsockname()[1])


def log_path(workload_dir: Path, replica: int, host: int) -> Path:
    """One log per replica index and host, appended across attempts: replica 0 host 0 is
    always rank 0, so its log is the job's main log."""
    return workload_dir / "logs" / f"slice-{replica}-host-{host}.log"


def worker_dir(workload_dir: Path, worker_id: int) -> Path:
    """One directory per worker process (its row in the worker table)."""
    return workload_dir / "workers" / str(worker_id)


def events_path(workload_dir: Path, attempt: int, replica: int, host: int, worker_id: int) -> Path:
    """One goodput events file per worker process: ``<attempt>-<replica>-<host>-<worker>``."""
    return workload_dir / "events" / f"{attempt}-{replica}-{host}-{worker_id}.jsonl"


def local_events_path(events: Path, local_rank: int) -> Path:
    """The events file of local process ``local_rank`` of a worker whose events file is
    ``events`` (local rank 0's is the worker's own, which goodput reads as rank 0's)."""
    return events if local_rank == 0 else events.with_name(f"{events.name}.local{local_rank}")


def local_log_path(log: Path, local_rank: int) -> Path:
    """The log of local process ``local_rank``: local rank 0 writes the host's own log."""
    return log if local_rank == 0 else log.with_name(f"{log.stem}.local{local_rank}{log.suffix}")


def membership_path(workload_dir: Path) -> Path:
    return workload_dir / "membership.json"


def publish_membership(workload_dir: Path, membership: Membership) -> Path:
    """Replace the membership file atomically (workers may read it at any moment)."""
    target = membership_path(workload_dir)
    new_dirs_private(target.parent)
    temporary = target.with_suffix(".tmp")
    with os.fdopen(open_private(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), "w") as handle:
        handle.write(membership.to_json())
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, target)
    return target


def worker_environment(
    *,
    base: dict[str, str],
    user: dict[str, str],
    cluster: str,
    workload: str,
    slices: tuple[str, ...],
    num_slices: int,
    replica: int,
    host: int,
    hosts_per_slice: int,
    attempt: int,
    master_port: int,
    checkpoint_dir: str,
    events_file: Path | None,
    grace_s: float,
    membership_file: Path | None,
    gpus: tuple[int, ...] = (),
    tpu: bool = False,
    slice_name: str | None = None,
) -> dict[str, str]:
    """The full environment of one worker (its local rank 0): the creator's, the user's, then
    the contract's (the indices, and RANK and HOTSWAP_ATTEMPT computed from them by the
    contract's formulas). ``gpus``: the NVML indices of the host's GPUs on a GPU-backed slice,
    one process each (see :func:`local_process_environment`); none on an emulated one. ``tpu``:
    a TPU device type (GKE's TPU worker variables). ``slice_name``: the slice replica ``replica``
    runs on (default ``slices[replica]``; an elastic joiner's index is a parked one)."""
    env = dict(base)
    env.update(user)
    local_world_size = max(1, len(gpus))
    indices = {
        contract.JOB_INDEX: replica,
        contract.JOB_COMPLETION_INDEX: host,
        contract.HOTSWAP_HOSTS_PER_SLICE: hosts_per_slice,
        contract.HOTSWAP_RESTART_COUNT: attempt - 1,
        contract.LOCAL_RANK: 0,
        contract.LOCAL_WORLD_SIZE: local_world_size,
    }
    contract_vars: dict[str, Any] = {
        **indices,
        **contract.derived_values(indices),
        contract.JOBSET_NAME: workload,
        contract.REPLICATED_JOB_NAME: contract.REPLICATED_JOB,
        contract.MEGASCALE_NUM_SLICES: num_slices,  # the workload's size; elastic workers read the active count
        contract.MEGASCALE_SLICE_ID: replica,
        contract.MASTER_ADDR: MASTER_ADDR,
        contract.MASTER_PORT: master_port,
        contract.WORLD_SIZE: contract.world_size(len(slices), hosts_per_slice, local_world_size),
        contract.CUDA_VISIBLE_DEVICES: contract.visible_devices(gpus),
        contract.HOTSWAP_CLUSTER: cluster,
        contract.HOTSWAP_WORKLOAD: workload,
        contract.HOTSWAP_CHECKPOINT_DIR: checkpoint_dir,
        contract.HOTSWAP_SLICE: slice_name if slice_name is not None else slices[replica],
        contract.HOTSWAP_TERMINATION_GRACE_S: grace_s,
    }
    if events_file is not None:
        contract_vars[contract.HOTSWAP_EVENTS_FILE] = events_file
    if membership_file is not None:
        contract_vars[contract.HOTSWAP_MEMBERSHIP_FILE] = membership_file
    if gpus:
        contract_vars[contract.CUDA_DEVICE_ORDER] = contract.PCI_BUS_ORDER
    if tpu:  # every emulated host of the slice is on this machine
        contract_vars[contract.TPU_WORKER_ID] = host
        contract_vars[contract.TPU_WORKER_HOSTNAMES] = ",".join([MASTER_ADDR] * hosts_per_slice)
    env.update({key: str(value) for key, value in contract_vars.items()})
    env["PYTHONUNBUFFERED"] = env.get("PYTHONUNBUFFERED", "1")  # logs appear as they happen
    return env


def local_process_environment(env: dict[str, str], local_rank: int) -> dict[str, str]:
    """What local process ``local_rank`` of a multi-GPU host changes in its worker's
    environment (:func:`worker_environment`'s): its local rank, and its RANK by the contract's
    formula."""
    indices = {
        name: int(env[name])
        for name in (contract.JOB_INDEX, contract.JOB_COMPLETION_INDEX, contract.HOTSWAP_HOSTS_PER_SLICE,
                     contract.LOCAL_WORLD_SIZE, contract.HOTSWAP_RESTART_COUNT)
    }
    indices[contract.LOCAL_RANK] = local_rank
    return {contract.LOCAL_RANK: str(local_rank), contract.RANK: str(contract.derived_values(indices)[contract.RANK])}


def read_membership(workload_dir: Path) -> Membership | None:
    try:
        return Membership.from_json(membership_path(workload_dir).read_text())
    except (FileNotFoundError, json.JSONDecodeError, KeyError):
        return None


def check_checkpoint_dir(path: str, what: str) -> None:
    """Refuse, before anything is queued, a checkpoint directory of another user or open to
    others' writes (its contents are restored into the job), or one that can be neither used
    nor created (under a regular file, in a directory we cannot write)."""
    existing_part = Path(path)
    while not existing_part.exists() and existing_part != existing_part.parent:
        existing_part = existing_part.parent
    if not existing_part.is_dir():
        raise InvalidInputError(f"{what} {path}: {existing_part} is not a directory")
    if existing_part == Path(path):
        check_private(existing_part, what, remedy="use a directory of yours", error=InvalidInputError)
    if not os.access(existing_part, os.W_OK | os.X_OK):
        raise InvalidInputError(f"{what} {path}: {existing_part} is not writable by you")
