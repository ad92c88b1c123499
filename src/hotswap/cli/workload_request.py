"""``workload create`` as parse → prepare → create: the command's options become a
:class:`CreateRequest`; :func:`target_of` finds the cluster's record and backend; :func:`prepare`
checks the options against that backend's capabilities and builds the spec and the launch; the
backend then creates the workload (or, with --dry-run, shows it).

The checks run in this order, each with its own one line: the messages are what users see.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from hotswap.api.errors import InvalidInputError

if TYPE_CHECKING:  # pydantic loads only where specs are built: reads stay fast
    from hotswap.api.launch import Launch
    from hotswap.api.spec import WorkloadSpec
    from hotswap.backends.base import Backend
    from hotswap.backends.capabilities import Capabilities
    from hotswap.store.state import ClusterRecord


@dataclass(frozen=True)
class CreateRequest:
    """What ``workload create`` was asked, as given (``user_env``: --env-file, then --env)."""

    workload: str
    cluster: str
    command: str
    num_slices: int
    device_type: str | None
    priority: str
    max_restarts: int
    restart_strategy: str
    restart_on_exit_codes: str
    min_slices: int | None
    termination_grace_period_s: float
    hang_timeout_s: float | None
    checkpoint_dir: str | None
    resume_from: str | None
    fresh: bool
    user_env: dict[str, str]
    docker_image: str | None
    base_docker_image: str | None
    script_dir: str | None
    docker_name: str | None
    debug_dump_gcs: str | None
    checkpoint_volume: str | None
    dry_run: bool
    backend: str | None  # --backend: for a dry run without a cluster record


def user_env_of(pairs: list[str], env_file: Path | None) -> dict[str, str]:
    """The workers' variables: the --env-file's, then each --env NAME=value over them."""
    from hotswap.api.envfile import parse_env_pairs, read_env_file

    user_env: dict[str, str] = {}
    if env_file is not None:
        user_env.update(read_env_file(env_file, os.environ))
    user_env.update(parse_env_pairs(pairs))
    return user_env


@dataclass(frozen=True)
class Target:
    """Where the workload goes: the cluster's record (None for a dry run without one) and its backend."""

    record: ClusterRecord | None
    backend: Backend


def target_of(request: CreateRequest) -> Target:
    from hotswap.api.errors import NotFoundError
    from hotswap.cli.backends import named
    from hotswap.store import registry

    try:
        record = registry.record_of(request.cluster)
    except NotFoundError:
        if not (request.dry_run and request.backend):
            raise
        record = None  # a dry run for a backend needs no cluster record
    if record is not None and request.backend is not None and request.backend != record.backend:
        raise InvalidInputError(f"cluster {request.cluster} uses the {record.backend} backend, not {request.backend}")
    return Target(record, named(request.backend or record.backend))  # type: ignore[union-attr]


@dataclass(frozen=True)
class PreparedWorkload:
    """What the backend is handed: the spec, the launch (:func:`~hotswap.backends.base.launch_record`),
    the cluster a dry run renders for, and an image given that the backend will not use."""

    spec: WorkloadSpec
    launch: Launch
    dry_run_cluster: str | None
    unused_image: str | None


def prepare(request: CreateRequest, record: ClusterRecord | None, capabilities: Capabilities) -> PreparedWorkload:
    """Check the options against each other and against what the backend can do, then build
    the spec and the launch of a new run. Changes nothing."""
    from hotswap.api.limits import check_text
    from hotswap.api.spec import workload_spec
    from hotswap.api.worker import HOTSWAP_DEBUG_DUMP_TO
    from hotswap.backends.base import launch_record, new_run
    from hotswap.store.paths import ClusterPaths

    if request.checkpoint_volume is not None and not capabilities.checkpoint_volumes:
        raise InvalidInputError("--checkpoint-volume is only for --backend kubernetes (use --checkpoint-dir)")
    debug_dump_gcs = dump_location(request.debug_dump_gcs, capabilities)
    if request.docker_name is not None and not capabilities.runs_containers:
        raise InvalidInputError("--docker-name names the workers' container on Kubernetes; the local backend runs processes, not containers")
    if request.device_type is None and record is None:
        raise InvalidInputError("--device-type is needed when there is no cluster record to take it from")
    if request.device_type is not None and not request.device_type.strip():
        raise InvalidInputError("--device-type must not be empty (leave it out to use the cluster's)")
    spec = workload_spec(
        name=request.workload,
        command=request.command,
        device_type=request.device_type or record.device_type,  # type: ignore[union-attr]
        num_slices=request.num_slices,
        min_slices=request.min_slices,
        priority=request.priority,
        max_restarts=request.max_restarts,
        restart_strategy=request.restart_strategy,
        restart_on_exit_codes=request.restart_on_exit_codes,
        termination_grace_period_s=request.termination_grace_period_s,
        hang_timeout_s=request.hang_timeout_s,
        checkpoint_dir=request.checkpoint_dir,
        env=request.user_env,
        docker_image=request.docker_image,
        base_docker_image=request.base_docker_image,
        script_dir=request.script_dir,
        docker_name=request.docker_name,
        debug_dump_gcs=debug_dump_gcs,
    )
    script_dir, checkpoint_dir = request.script_dir, request.checkpoint_dir
    workdir = os.path.abspath(script_dir) if script_dir else os.getcwd()
    if script_dir and capabilities.local_paths and not os.path.isdir(workdir):
        raise InvalidInputError(f"--script-dir {script_dir}: no such directory")
    checkpoints = os.path.abspath(checkpoint_dir) if checkpoint_dir and capabilities.local_paths else (
        checkpoint_dir or str(ClusterPaths.of(request.cluster).checkpoint_dir(request.workload))
    )
    if request.fresh and request.resume_from is not None:
        raise InvalidInputError("--fresh and --resume-from contradict each other: give one")
    run = new_run(request.resume_from, request.fresh)
    user_env = request.user_env
    worker_env = (
        {**user_env, HOTSWAP_DEBUG_DUMP_TO: debug_dump_gcs} if debug_dump_gcs and capabilities.debug_dumps_to_directory else user_env
    )
    launch = launch_record(
        environ=dict(os.environ), cwd=workdir, user_env=worker_env, checkpoint_dir=os.path.join(checkpoints, run.id), run=run
    )
    if request.checkpoint_volume is not None:
        launch = dataclasses.replace(launch, checkpoint_volume=check_text("--checkpoint-volume", request.checkpoint_volume))
    image = request.docker_image or request.base_docker_image
    return PreparedWorkload(
        spec=spec,
        launch=launch,
        # Without a record, a dry run renders for the named cluster only where the backend's
        # documents carry the cluster's name (a JobSet's labels).
        dry_run_cluster=request.cluster if record is not None or capabilities.dry_run_names_unrecorded_cluster else None,
        unused_image=image if image and not capabilities.runs_containers else None,
    )


def dump_location(location: str | None, capabilities: Capabilities) -> str | None:
    """--debug-dump-gcs for the backend: an absolute directory of this machine where the
    workers run here, else a gs:// path (the pods copy with gsutil, as xpk's do)."""
    if location is None:
        return None
    if not location.strip():
        raise InvalidInputError("--debug-dump-gcs must not be empty")
    remote = location.startswith("gs://")
    if capabilities.debug_dumps_to_directory:
        if remote or "://" in location:
            raise InvalidInputError(
                f"--debug-dump-gcs {location}: the local backend copies XLA dumps to a directory of this machine; give a path"
            )
        return os.path.abspath(os.path.expanduser(location))
    if not remote or len(location) <= len("gs://"):
        raise InvalidInputError(f"--debug-dump-gcs {location}: on Kubernetes give a gs://bucket[/path] for the pods to copy to")
    return location
