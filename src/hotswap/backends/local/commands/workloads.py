"""``workload create`` and ``workload delete`` on a local cluster: prepared and checked here, in
the CLI's process (paths of this machine, the cluster's device type and size, the checkpoint
directory, what a new run resumes from), then requested of the controller."""

from __future__ import annotations

import contextlib
import dataclasses
import os
from pathlib import Path
from typing import TYPE_CHECKING

from hotswap.api.errors import CapacityError, ConflictError, InvalidInputError, NotFoundError, never_fits
from hotswap.api.launch import Launch
from hotswap.backends.local.commands import client, runs
from hotswap.backends.requests import PreparedWorkload, WorkloadRequest, new_run, spec_of
from hotswap.backends.local.queries.records import open_store, slice_count, workload_record
from hotswap.store.paths import ClusterPaths, check_private
from hotswap.store.registry import existing, record_of

if TYPE_CHECKING:  # pydantic loads only where specs are built or validated: reads stay fast
    from hotswap.api.spec import WorkloadSpec
    from hotswap.store.state import ClusterRecord


def prepare_workload(request: WorkloadRequest, record: ClusterRecord | None) -> PreparedWorkload:
    """A request as the local backend runs it: its workers are processes of this machine, run
    where the user is, so the paths given are this machine's (--script-dir must exist, the
    checkpoint root is made absolute), XLA dumps go to a directory here, and an image is only
    recorded. Changes nothing."""
    from hotswap.store.paths import ClusterPaths

    dump = _dump_directory(request.debug_dump())
    spec = spec_of(request, record, debug_dump_gcs=dump)
    script_dir = request.script_dir
    workdir = os.path.abspath(script_dir) if script_dir else os.getcwd()
    if script_dir and not os.path.isdir(workdir):
        raise InvalidInputError(f"--script-dir {script_dir}: no such directory")
    run = new_run(request.resume_from, request.fresh)
    root = (
        os.path.abspath(request.checkpoint_dir) if request.checkpoint_dir
        else str(ClusterPaths.of(request.cluster).checkpoint_dir(request.workload))
    )
    launch = Launch(environ=dict(os.environ), cwd=workdir, checkpoint_dir=os.path.join(root, run.id), run=run)
    image = request.image
    return PreparedWorkload(
        spec=spec,
        launch=launch,
        dry_run_cluster=request.cluster if record is not None else None,  # a dry run shows no cluster it has no record of
        notes=(f"image {image} recorded, not used: the local backend runs the command on this machine (it is used on Kubernetes)",)
        if image else (),
    )


def _dump_directory(location: str | None) -> str | None:
    """--debug-dump-gcs: an absolute directory of this machine (its workers copy their XLA dumps there)."""
    if location is None:
        return None
    if "://" in location:
        raise InvalidInputError(
            f"--debug-dump-gcs {location}: the local backend copies XLA dumps to a directory of this machine; give a path"
        )
    return os.path.abspath(os.path.expanduser(location))


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
