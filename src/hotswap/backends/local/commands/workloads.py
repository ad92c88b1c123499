"""``workload create`` and ``workload delete`` on a local cluster: checked here, in the CLI's
process (the cluster's device type and size, the checkpoint directory, what a new run resumes
from), then requested of the controller."""

from __future__ import annotations

import contextlib
import dataclasses
import os
from pathlib import Path
from typing import TYPE_CHECKING

from hotswap.api.errors import CapacityError, ConflictError, InvalidInputError, NotFoundError, never_fits
from hotswap.api.launch import Launch
from hotswap.backends.local.commands import client, runs
from hotswap.backends.local.queries.records import open_store, slice_count, workload_record
from hotswap.store.paths import ClusterPaths, check_private
from hotswap.store.registry import existing, record_of

if TYPE_CHECKING:  # pydantic loads only where specs are built or validated: reads stay fast
    from hotswap.api.spec import WorkloadSpec


def create_workload(cluster: str, spec: WorkloadSpec, launch: Launch) -> None:
    from hotswap.backends.local.requests import CreateWorkload  # loaded for requests only (see requests.py)

    paths = existing(cluster)
    record = record_of(cluster)
    if spec.device_type != record.device_type:
        raise InvalidInputError(
            f"cluster {cluster} has {record.device_type} slices; the workload asks for {spec.device_type}"
        )
    with open_store(paths) as store:
        store.check_writable()  # said first: the checkpoint directory is often inside the state
    # The root the user named (or the default) is checked: the run's directory inside it is ours.
    root = str(Path(launch.checkpoint_dir).parent) if launch.run is not None else launch.checkpoint_dir
    check_checkpoint_dir(root, "--checkpoint-dir" if spec.checkpoint_dir else "the checkpoint directory")
    if launch.run is not None:
        with contextlib.suppress(NotFoundError):  # said at once, not after waiting on its workers
            workload_record(paths, spec.name)
            raise ConflictError(f"a workload named {spec.name} already exists")  # the core's words
        launch = dataclasses.replace(launch, run=runs.resolve_new(paths, spec, launch))
    _check_fits(paths, spec)  # said at once, in the core's words (exit 5, as on Kubernetes)
    outcome = client.request(paths, CreateWorkload(spec, launch))
    if outcome.status != "done":
        _check_fits(paths, spec)  # the cluster shrank meanwhile: still a capacity refusal
        raise ConflictError(outcome.message)


def _check_fits(paths: ClusterPaths, spec: WorkloadSpec) -> None:
    never = never_fits(spec.num_slices, spec.device_type, slice_count(paths))  # a local cluster has one device type
    if never is not None:
        raise CapacityError(f"workload {spec.name} rejected: {never}")


def delete_workload(cluster: str, name: str) -> None:
    from hotswap.backends.local.requests import DeleteWorkload  # loaded for requests only (see requests.py)

    paths = existing(cluster)
    workload_record(paths, name)  # a clear error before anything is queued
    outcome = client.request(paths, DeleteWorkload(name))
    if outcome.status != "done":
        raise NotFoundError(outcome.message)


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
