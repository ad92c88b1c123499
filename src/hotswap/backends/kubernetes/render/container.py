"""The worker container of a JobSet pod: its command (the contract's shell prelude, then the
user's command), the worker environment of :mod:`hotswap.api.worker`, SIGTERM wiring, and the
checkpoint and membership volumes it mounts."""

from __future__ import annotations

import shlex
from typing import Any

from hotswap.api import worker as contract
from hotswap.api.worker_report import IN_CLUSTER
from hotswap.api.catalog import AcceleratorKind, DeviceType
from hotswap.api.launch import Run
from hotswap.api.runs import RESUME_AUTO
from hotswap.api.spec import WorkloadSpec
from hotswap.backends.kubernetes import labels
from hotswap.backends.kubernetes.checkpoint_volume import CheckpointVolume, checkpoint_dir, resume_value, run_directory

# Characters that need a shell; a command without them runs exec'd (the shell then execs a
# simple command, as on the local backend), unless its first word is one only a shell knows.
_SHELL_SYNTAX = set("|&;<>()$`*?[]#~{}\n")
# Shell builtins without a program of that name, and reserved words: `exit 1` means the shell's.
_SHELL_WORDS = frozenset(
    "! . : [[ alias bg break case cd command continue declare do done elif else esac eval exec exit"
    " export fg fi for function getopts hash if in jobs let local readonly read return select set"
    " shift source then time times trap type typeset ulimit umask unalias unset until wait while {"
    .split()
)

# Run by /bin/sh before the user's command: the contract's derived values (RANK, HOTSWAP_ATTEMPT)
# cannot come from the downward API (they are sums), so the shell computes them from the indices
# it does give, with the contract's own formulas.
_PRELUDE = contract.derived_shell_exports()
# preStop for commands that need a shell: the shell is PID 1 and, as PID 1, never receives
# SIGTERM's default action, so it cannot pass the signal on. The hook signals every other
# process in the container (kill -1 spares PID 1 and the hook itself); the program checkpoints,
# exits, and the shell exits with its code.
_FORWARD_SIGTERM = ["/bin/sh", "-c", "kill -TERM -1 2>/dev/null; exit 0"]

# One worker process per pod (one pod per host), as on the local backend: torchrun's local
# rank 0 of a local world of 1.
_PROCESSES_PER_POD = 1


def _field(path: str) -> dict[str, Any]:
    return {"valueFrom": {"fieldRef": {"fieldPath": path}}}


def worker_env(
    spec: WorkloadSpec, cluster: str, device: DeviceType, volume: CheckpointVolume | None, run: Run | None = None,
    failed_runs: tuple[str, ...] = (),
) -> list[dict[str, Any]]:
    """The worker environment of :mod:`hotswap.api.worker`: JobSet's indices from the pod's labels
    through the downward API, the rest as values. The user's variables come first so that the
    contract's win, as on the local backend."""
    hosts = device.hosts_per_slice
    env: list[dict[str, Any]] = [{"name": key, "value": value} for key, value in spec.env.items()]
    contract_env: list[tuple[str, Any]] = [
        (contract.JOBSET_NAME, _field(f"metadata.labels['{labels.JOBSET_NAME_LABEL}']")),
        (contract.REPLICATED_JOB_NAME, _field(f"metadata.labels['{labels.REPLICATED_JOB_NAME_LABEL}']")),
        (contract.JOB_INDEX, _field(f"metadata.labels['{labels.JOB_INDEX_LABEL}']")),
        (contract.JOB_COMPLETION_INDEX, _field(f"metadata.annotations['{labels.JOB_COMPLETION_INDEX_ANNOTATION}']")),
        (contract.MEGASCALE_SLICE_ID, _field(f"metadata.labels['{labels.JOB_INDEX_LABEL}']")),
        (contract.MEGASCALE_NUM_SLICES, str(spec.num_slices)),
        (contract.MASTER_ADDR, contract.coordinator_host(spec.name)),
        (contract.MASTER_PORT, str(contract.DEFAULT_MASTER_PORT)),
        (contract.WORLD_SIZE, str(contract.world_size(spec.num_slices, hosts))),
        (contract.LOCAL_RANK, "0"),
        (contract.LOCAL_WORLD_SIZE, str(_PROCESSES_PER_POD)),
        (contract.HOTSWAP_CLUSTER, cluster),
        (contract.HOTSWAP_WORKLOAD, spec.name),
        (contract.HOTSWAP_HOSTS_PER_SLICE, str(hosts)),
        (contract.HOTSWAP_TERMINATION_GRACE_S, f"{spec.termination_grace_period_s:g}"),
        # Written by the controller when it releases the pod (restarts of any cause: its own and
        # JobSet's), so it is right before the container starts. JobSet's restart-attempt label
        # counts only JobSet's own restarts.
        (contract.HOTSWAP_RESTART_COUNT, _field(f"metadata.annotations['{labels.RESTART_COUNT_ANNOTATION}']")),
        (contract.HOTSWAP_SLICE, _field(f"metadata.annotations['{labels.SLICE_ANNOTATION}']")),
        (contract.HOTSWAP_START_CAUSE, _field(f"metadata.annotations['{labels.START_CAUSE_ANNOTATION}']")),
        # Where each replica's first process writes its record: the pod's own API server and
        # namespace (train/report_channel.py), as its ServiceAccount may (render/reports.py).
        (contract.HOTSWAP_REPORT_LEASES, IN_CLUSTER),
    ]
    if spec.debug_dump_gcs:
        user_flags = spec.env.get(contract.XLA_FLAGS)
        env = [e for e in env if e["name"] != contract.XLA_FLAGS]
        contract_env.append((contract.XLA_FLAGS, contract.with_xla_dump(user_flags, contract.CONTAINER_XLA_DUMP_DIR)))
    if device.kind is AcceleratorKind.TPU:
        # GKE's values (its webhook sets the same on multi-host slices); $(JOB_INDEX) is expanded
        # by the kubelet from the variable above.
        contract_env.append((contract.TPU_WORKER_ID, _field(f"metadata.annotations['{labels.JOB_COMPLETION_INDEX_ANNOTATION}']")))
        contract_env.append((contract.TPU_WORKER_HOSTNAMES, contract.slice_hostnames(spec.name, f"$({contract.JOB_INDEX})", hosts)))
    directory = checkpoint_dir(spec, cluster, volume)
    if run is not None:
        contract_env.append((contract.HOTSWAP_RUN_ID, run.id))
    if directory is not None and run is not None:
        contract_env.append((contract.HOTSWAP_CHECKPOINT_DIR, run_directory(directory, run)))
        contract_env.append((contract.HOTSWAP_RESUME_FROM, resume_value(run, directory)))
        if failed_runs and resume_value(run, directory) == RESUME_AUTO:  # the workers choose: never these
            contract_env.append((contract.HOTSWAP_FAILED_RUNS, ",".join(failed_runs)))
    elif directory is not None:
        contract_env.append((contract.HOTSWAP_CHECKPOINT_DIR, directory))
    if spec.elastic:
        contract_env.append((contract.HOTSWAP_MEMBERSHIP_FILE, f"{labels.MEMBERSHIP_DIR}/{labels.MEMBERSHIP_FILE}"))
        # JAX: the coordination service of every generation is the coordinator pod's (.coordination).
        contract_env.append((contract.HOTSWAP_JAX_COORDINATOR, contract.coordination_service_host(spec.name)))
    for name, value in contract_env:
        env.append({"name": name, **(value if isinstance(value, dict) else {"value": value})})
    return env


def needs_shell(command: str) -> bool:
    if _SHELL_SYNTAX.intersection(command):
        return True
    try:
        words = shlex.split(command)
    except ValueError:
        return True
    return not words or "=" in words[0] or words[0] in _SHELL_WORDS


def container_command(command: str) -> list[str]:
    """``/bin/sh`` computes the derived values (RANK), then a simple command is exec'd (it is PID 1 and gets SIGTERM
    itself); a command that needs a shell runs in that shell."""
    if needs_shell(command):
        return ["/bin/sh", "-c", _PRELUDE + command]
    return ["/bin/sh", "-c", _PRELUDE + 'exec "$@"', "hotswap-worker", *shlex.split(command)]


def container_name(spec: WorkloadSpec) -> str:
    return spec.docker_name or labels.CONTAINER_NAME


def run_command(spec: WorkloadSpec) -> str:
    """The user's command; with --debug-dump-gcs, followed by xpk's copy of the XLA dumps to the
    bucket (gsutil, which the image must have, as with xpk), keeping the command's exit code."""
    if not spec.debug_dump_gcs:
        return spec.command
    target = shlex.quote(spec.debug_dump_gcs.rstrip("/") + "/")
    return (
        f"{spec.command}\nstatus=$?\n"
        f'gsutil -m cp -r {contract.CONTAINER_XLA_DUMP_DIR} {target}"$HOSTNAME"/ || echo "hotswap: could not copy XLA dumps" >&2\n'
        'exit "$status"'
    )


def worker_container(
    spec: WorkloadSpec, cluster: str, device: DeviceType, volume: CheckpointVolume | None, run: Run | None = None,
    failed_runs: tuple[str, ...] = (),
) -> dict[str, Any]:
    """The pod's one container: the user's image and command, the contract's environment, the
    host's accelerators."""
    container: dict[str, Any] = {
        "name": container_name(spec),
        "image": spec.docker_image or spec.base_docker_image or labels.DEFAULT_IMAGE,
        "command": container_command(run_command(spec)),
        "env": worker_env(spec, cluster, device, volume, run, failed_runs),
        "resources": {"limits": {device.resource_name: device.chips_per_host}},
    }
    if needs_shell(run_command(spec)):
        container["lifecycle"] = {"preStop": {"exec": {"command": list(_FORWARD_SIGTERM)}}}
    mounts = []
    if volume is not None:
        mounts.append({"name": CheckpointVolume.VOLUME_NAME, "mountPath": labels.CHECKPOINT_MOUNT})
    if spec.elastic:
        mounts.append({"name": "hotswap-membership", "mountPath": labels.MEMBERSHIP_DIR, "readOnly": True})
    if mounts:
        container["volumeMounts"] = mounts
    return container


def worker_volumes(spec: WorkloadSpec, volume: CheckpointVolume | None) -> list[dict[str, Any]]:
    """The pod's volumes: checkpoints (a claim or a gcsfuse bucket) and the membership file."""
    volumes: list[dict[str, Any]] = []
    if volume is not None and volume.kind == "pvc":
        volumes.append({"name": CheckpointVolume.VOLUME_NAME, "persistentVolumeClaim": {"claimName": volume.source}})
    elif volume is not None:
        volumes.append(
            {
                "name": CheckpointVolume.VOLUME_NAME,
                "csi": {
                    "driver": "gcsfuse.csi.storage.gke.io",
                    "volumeAttributes": {"bucketName": volume.source, "mountOptions": "implicit-dirs"},
                },
            }
        )
    if spec.elastic:
        volumes.append(membership_volume())
    return volumes


def membership_volume() -> dict[str, Any]:
    """The membership file of an elastic workload's pods (workers and coordinator): the
    controller writes the membership record into a pod annotation; the kubelet keeps this file
    in step with it (eventually: it refreshes projected files periodically)."""
    return {
        "name": "hotswap-membership",
        "downwardAPI": {
            "items": [
                {
                    "path": labels.MEMBERSHIP_FILE,
                    "fieldRef": {"fieldPath": f"metadata.annotations['{labels.MEMBERSHIP_ANNOTATION}']"},
                }
            ]
        },
    }
