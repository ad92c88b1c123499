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
from hotswap.api.worker import Membership

LOCALHOST = "127.0.0.1"


def free_port() -> int:
    """A TCP port free right now on localhost (each attempt and generation gets its own)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((LOCALHOST, 0))
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


def membership_path(workload_dir: Path) -> Path:
    return workload_dir / "membership.json"


def publish_membership(workload_dir: Path, membership: Membership) -> Path:
    """Replace the membership file atomically (workers may read it at any moment)."""
    target = membership_path(workload_dir)
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary = target.with_suffix(".tmp")
    with open(temporary, "w") as handle:
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
) -> dict[str, str]:
    """The full environment of one worker: the creator's, the user's, then the contract's."""
    env = dict(base)
    env.update(user)
    contract_vars: dict[str, Any] = {
        contract.JOBSET_NAME: workload,
        contract.REPLICATED_JOB_NAME: contract.REPLICATED_JOB,
        contract.JOB_INDEX: replica,
        contract.JOB_COMPLETION_INDEX: host,
        contract.MEGASCALE_NUM_SLICES: num_slices,  # the workload's size; elastic workers read the active count
        contract.MEGASCALE_SLICE_ID: replica,
        contract.MASTER_ADDR: LOCALHOST,
        contract.MASTER_PORT: master_port,
        contract.RANK: replica * hosts_per_slice + host,
        contract.WORLD_SIZE: len(slices) * hosts_per_slice,
        contract.LOCAL_RANK: 0,
        contract.HOTSWAP_CLUSTER: cluster,
        contract.HOTSWAP_WORKLOAD: workload,
        contract.HOTSWAP_CHECKPOINT_DIR: checkpoint_dir,
        contract.HOTSWAP_RESTART_COUNT: attempt - 1,
        contract.HOTSWAP_ATTEMPT: attempt,
        contract.HOTSWAP_SLICE: slices[replica],
        contract.HOTSWAP_HOSTS_PER_SLICE: hosts_per_slice,
        contract.HOTSWAP_TERMINATION_GRACE_S: grace_s,
    }
    if events_file is not None:
        contract_vars[contract.HOTSWAP_EVENTS_FILE] = events_file
    if membership_file is not None:
        contract_vars[contract.HOTSWAP_MEMBERSHIP_FILE] = membership_file
    env.update({key: str(value) for key, value in contract_vars.items()})
    env["PYTHONUNBUFFERED"] = env.get("PYTHONUNBUFFERED", "1")  # logs appear as they happen
    return env


def launch_record(
    *,
    environ: dict[str, str],
    cwd: str,
    user_env: dict[str, str],
    checkpoint_dir: str,
) -> dict[str, Any]:
    """What the store keeps about how to start a workload's workers."""
    return {"environ": environ, "cwd": cwd, "user_env": user_env, "checkpoint_dir": checkpoint_dir}


def read_membership(workload_dir: Path) -> Membership | None:
    try:
        return Membership.from_json(membership_path(workload_dir).read_text())
    except (FileNotFoundError, json.JSONDecodeError, KeyError):
        return None
