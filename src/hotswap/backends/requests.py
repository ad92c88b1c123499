"""What ``cluster create`` and ``workload create`` were asked, as typed records the CLI parses once
and hands to a backend, which turns them into what it runs (``Backend.prepare_workload``,
``Backend.create_cluster``). They name no backend: each backend reads the fields it takes and
answers for the features it lacks (:mod:`hotswap.backends.features`).

Also the steps every backend's preparation shares, with their one-line errors: the spec of a
request (:func:`spec_of`) and a new run (:func:`new_run`). Light at import: pydantic loads only
when a spec is built.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hotswap.api.errors import InvalidInputError
from hotswap.api.launch import RUN_AUTO, RUN_FRESH, RUN_FROM, Run
from hotswap.backends.features import Feature

if TYPE_CHECKING:  # pydantic loads only where specs are built: reads stay fast
    from hotswap.api.launch import Launch
    from hotswap.api.spec import WorkloadSpec
    from hotswap.store.state import ClusterRecord


@dataclass(frozen=True)
class WorkloadRequest:
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

    def features(self) -> dict[Feature, str]:
        """The features this request asks for, each with the flag that asks."""
        asked = {Feature.CHECKPOINT_VOLUMES: "--checkpoint-volume", Feature.CONTAINER_NAMES: "--docker-name"}
        given = {Feature.CHECKPOINT_VOLUMES: self.checkpoint_volume, Feature.CONTAINER_NAMES: self.docker_name}
        return {feature: flag for feature, flag in asked.items() if given[feature] is not None}

    def debug_dump(self) -> str | None:
        """--debug-dump-gcs as given, refused when blank (each backend then reads it its own way)."""
        if self.debug_dump_gcs is not None and not self.debug_dump_gcs.strip():
            raise InvalidInputError("--debug-dump-gcs must not be empty")
        return self.debug_dump_gcs

    @property
    def image(self) -> str | None:
        """The image the user named, if any (--docker-image, else --base-docker-image)."""
        return self.docker_image or self.base_docker_image


@dataclass(frozen=True)
class PreparedWorkload:
    """What a backend made of a :class:`WorkloadRequest`: the spec and the launch it creates
    from, the cluster a dry run shows (None: none, for a cluster with no record), and notes for
    the user once it is created (each one line, in the backend's words)."""

    spec: WorkloadSpec
    launch: Launch
    dry_run_cluster: str | None
    notes: tuple[str, ...] = ()


def spec_of(request: WorkloadRequest, record: ClusterRecord | None, debug_dump_gcs: str | None) -> WorkloadSpec:
    """The spec of a request, validated once (``debug_dump_gcs``: as the backend reads it); the
    device type defaults to the cluster's."""
    from hotswap.api.spec import workload_spec

    if request.device_type is None and record is None:
        raise InvalidInputError("--device-type is needed when there is no cluster record to take it from")
    if request.device_type is not None and not request.device_type.strip():
        raise InvalidInputError("--device-type must not be empty (leave it out to use the cluster's)")
    return workload_spec(
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


def new_run(resume_from: str | None, fresh: bool) -> Run:
    """A new run of ``workload create``: its id, and what the user asked it to resume from
    (``--resume-from``: a run id or a directory; ``--fresh``: nothing; neither: a pending
    migration checkpoint of its predecessor, if any). A backend resolves what it resumes from."""
    from hotswap.api.limits import check_text

    if fresh and resume_from is not None:
        raise InvalidInputError("--fresh and --resume-from contradict each other: give one")
    run_id = time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + os.urandom(3).hex()  # api.runs.is_run_id
    if fresh:
        return Run(run_id, RUN_FRESH)
    if resume_from is not None:
        return Run(run_id, RUN_FROM, source=check_text("--resume-from", resume_from))
    return Run(run_id, RUN_AUTO)


@dataclass(frozen=True)
class ClusterRequest:
    """What ``cluster create`` was asked, as given (None: not given). Each backend takes the
    flags it has and answers for the features the others ask (:meth:`features`)."""

    cluster: str
    device_type: str | None = None
    num_slices: int | None = None
    force: bool = False
    # A cluster reached through an API server.
    context: str | None = None
    namespace: str | None = None
    kueue: bool = False
    cluster_queue: str | None = None
    local_queue: str | None = None
    node_pool_label: str | None = None
    accelerator_label: str | None = None
    topology_label: str | None = None
    gpu_accelerator_label: str | None = None
    checkpoint_volume: str | None = None
    # Slices that are processes of this machine.
    warm_workers: int | str | None = None
    gpus: str | None = None
    # xpk's node-pool flags, which every backend refuses.
    custom_tpu_nodepool_arguments: str | None = None
    cluster_cpu_machine_type: str | None = None

    def api_server_settings(self) -> dict[str, Any]:
        """The API server settings given, by their settings' names (--kueue only when set)."""
        names = ("context", "namespace", "kueue", "cluster_queue", "local_queue", "node_pool_label",
                 "accelerator_label", "topology_label", "gpu_accelerator_label", "checkpoint_volume")
        given = {name: getattr(self, name) for name in names} | {"kueue": self.kueue or None}
        return {name: value for name, value in given.items() if value is not None}

    def machine_settings(self) -> dict[str, Any]:
        """The settings given for slices that are processes of this machine, by their names."""
        names = ("warm_workers", "gpus")
        return {name: getattr(self, name) for name in names if getattr(self, name) is not None}

    def features(self) -> dict[Feature, str]:
        """The features this request asks for, each with what asks: node pools by the first
        such flag, the settings by all theirs (API server settings in the order of the flags,
        this machine's sorted)."""
        asked: dict[Feature, str] = {}
        pools = [name for name in ("custom_tpu_nodepool_arguments", "cluster_cpu_machine_type") if getattr(self, name) is not None]
        if pools:
            asked[Feature.NODE_POOLS] = _flag(pools[0])
        if _of_this_machine(self.device_type):
            asked[Feature.MACHINE_DEVICE_TYPES] = str(self.device_type)
        if self.api_server_settings():
            asked[Feature.API_SERVER_SETTINGS] = ", ".join(_flag(name) for name in self.api_server_settings())
        if self.machine_settings():
            asked[Feature.MACHINE_PROCESSES] = ", ".join(_flag(name) for name in sorted(self.machine_settings()))
        return asked


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _of_this_machine(device_type: str | None) -> bool:
    """Whether a device type is a shape of this machine's GPUs (an unknown one is not: its own
    lookup says so, later, in the backend's order)."""
    from hotswap.api.catalog import get_device_type

    if device_type is None:
        return False
    try:
        return get_device_type(device_type).local_only
    except InvalidInputError:
        return False

