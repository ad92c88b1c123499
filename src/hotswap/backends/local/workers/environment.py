"""What a worker of the local backend is started with: its environment, by the contract in
:mod:`hotswap.api.worker` (JobSet's indices, MEGASCALE's slice id and count, torch.distributed's
rendezvous, and hotswap's own variables), and its rendezvous port.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hotswap.api import worker as contract

if TYPE_CHECKING:
    from hotswap.api.spec import WorkloadSpec

MASTER_ADDR = contract.DEFAULT_MASTER_ADDR  # every worker of a local cluster is on this machine


def free_port() -> int:
    """A TCP port free right now on :data:`MASTER_ADDR` (each attempt and generation gets its own)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((MASTER_ADDR, 0))
        return int(probe.getsockname()[1])


def user_variables(spec: WorkloadSpec) -> dict[str, str]:
    """The variables a worker gets from what the user asked (the spec): theirs (--env, --env-file)
    and, with --debug-dump-gcs (a directory of this machine), where its shim copies XLA dumps."""
    variables = dict(spec.env)
    if spec.debug_dump_gcs:
        variables[contract.HOTSWAP_DEBUG_DUMP_TO] = spec.debug_dump_gcs
    return variables


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
    """The full environment of one worker (its local rank 0): the one it starts from (``base``:
    the launch's), the user's (``user``: :func:`user_variables`), then the contract's (the indices, and RANK and HOTSWAP_ATTEMPT computed from them by the
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
