"""Which of this machine's GPUs a GPU-backed local cluster may hold (``cluster create --gpus``),
run in the CLI's process.

Claims are race-free across concurrent ``cluster create`` runs: :func:`claims_lock` is one
lock for the machine, held from reading every cluster's GPUs until the controller has
committed the new mapping (see ``commands/clusters.py``).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterable, Mapping, Sequence

from hotswap.api.catalog import DeviceType
from hotswap.api.errors import ConflictError, InvalidInputError
from hotswap.backends.local.gpu.backing import Backing, gpus_per_host
from hotswap.backends.local.gpu.nvml import GpuInfo, NvmlError, discover
from hotswap.store.paths import clusters_root, file_lock, private_dir
from hotswap.store.registry import cluster_names, find

SELECTION_HELP = "all, a count (2), or GPUs by NVML index or UUID: device=0,1 (or 0,1,3)"


# ---------------------------------------------------------------------- --gpus


@dataclasses.dataclass(frozen=True)
class GpuSelection:
    """What ``--gpus`` asked for: ``all``, a count, or named GPUs (indices or UUIDs)."""

    count: int | None = None  # None with no devices: all
    devices: tuple[str, ...] = ()

    @classmethod
    def parse(cls, text: str) -> GpuSelection:
        value = text.strip()
        if value.lower() == "all":
            return cls()
        named = value[len("device="):] if value.lower().startswith("device=") else value
        if named != value or "," in value:
            devices = tuple(item.strip() for item in named.split(","))
            if not all(devices):
                raise InvalidInputError(f"--gpus {text}: an empty GPU name; use {SELECTION_HELP}")
            return cls(devices=devices)
        if value.isdigit() and int(value) > 0:
            return cls(count=int(value))
        raise InvalidInputError(f"--gpus {text}: use {SELECTION_HELP} (a bare number is a count; name GPU 0 as device=0)")


def choose_pool(
    selection: GpuSelection | None,
    machine: Sequence[GpuInfo],
    held: Mapping[str, str],
    own: Iterable[str],
    per_slice: int,
    num_slices: int | None,
) -> tuple[list[GpuInfo], int]:
    """The GPUs a cluster may hold after this ``cluster create`` (its controller gives the slices
    that stay their own, and the new ones the rest), and its slice count.

    ``held``: GPUs other clusters hold (UUID -> cluster); ``own``: this cluster's, first in
    line; ``selection`` None re-uses a backed cluster's GPUs and takes free ones as ``all``
    does. Named GPUs are exactly the ones it may hold. Every error is one line and changes
    nothing."""
    mine = set(own)
    if selection is not None and selection.devices:
        chosen = _named(selection.devices, machine, held)
        num_slices = _slices_of(len(chosen), per_slice, num_slices, f"--gpus {','.join(selection.devices)}")
        return chosen, num_slices
    available = sorted((g for g in machine if g.uuid not in held), key=lambda g: (g.uuid not in mine, g.index))
    if selection is not None and selection.count is not None:
        num_slices = _slices_of(selection.count, per_slice, num_slices, f"--gpus {selection.count}")
    elif num_slices is None:
        num_slices = len(available) // per_slice
        if num_slices == 0:
            raise ConflictError(_shortage(per_slice, available, machine, held))
    needed = num_slices * per_slice
    if len(available) < needed:
        raise ConflictError(_shortage(needed, available, machine, held))
    # All its own GPUs (the controller keeps those of the slices that stay), and free ones for
    # the rest.
    return available[: max(needed, len(mine & {g.uuid for g in available}))], num_slices


def _named(devices: Sequence[str], machine: Sequence[GpuInfo], held: Mapping[str, str]) -> list[GpuInfo]:
    by_index = {str(g.index): g for g in machine}
    by_uuid = {g.uuid.lower(): g for g in machine}
    chosen: list[GpuInfo] = []
    for name in devices:
        gpu = by_index.get(name) or by_uuid.get(name.lower())
        if gpu is None:
            have = f"GPUs 0-{len(machine) - 1}" if machine else "no GPU"
            raise InvalidInputError(f"--gpus: no GPU {name} on this machine (it has {have}; see nvidia-smi -L)")
        if gpu in chosen:
            raise InvalidInputError(f"--gpus names {gpu.label()} twice")
        if gpu.uuid in held:
            raise ConflictError(f"--gpus: {gpu.label()} is held by local cluster {held[gpu.uuid]}")
        chosen.append(gpu)
    return chosen


def _slices_of(gpus: int, per_slice: int, num_slices: int | None, flag: str) -> int:
    if num_slices is None:
        if gpus % per_slice:
            raise InvalidInputError(f"{flag}: {gpus} GPU(s) do not make whole slices of {per_slice}")
        return gpus // per_slice
    if gpus != num_slices * per_slice:
        raise InvalidInputError(
            f"{flag} gives {gpus} GPU(s); {num_slices} slice(s) of {per_slice} need {num_slices * per_slice}"
        )
    return num_slices


def _shortage(needed: int, available: Sequence[GpuInfo], machine: Sequence[GpuInfo], held: Mapping[str, str]) -> str:
    others = sorted(set(held.values()))
    where = f" (the others are held by {', '.join(others)})" if others else ""
    return f"--gpus: {needed} GPU(s) needed; {len(available)} of this machine's {len(machine)} are free{where}"


# ---------------------------------------------------------------------- claims


def claims_lock() -> contextlib.AbstractContextManager[None]:
    """The machine's one lock on GPU claims (concurrent creates queue on it)."""
    return file_lock(private_dir(clusters_root()) / ".gpu-claims.lock")


def claim(
    cluster: str, device: DeviceType, selection: GpuSelection | None, num_slices: int | None, backing: Backing
) -> tuple[list[GpuInfo], int]:
    """The GPUs ``cluster`` will hold once this ``cluster create`` is done, and its slice count:
    the machine's (NVML), less other clusters' (call it under :func:`claims_lock`)."""
    try:
        machine = discover()
    except NvmlError as error:
        raise InvalidInputError(f"--gpus: {error}; without NVML, slices can only be emulated") from None
    per_slice = gpus_per_host(device) * device.hosts_per_slice
    return choose_pool(selection, machine, held_by_clusters(cluster), backing.uuids(), per_slice, num_slices)


def held_by_clusters(except_cluster: str) -> dict[str, str]:
    """GPU UUID -> the local cluster (other than ``except_cluster``) that holds it."""
    held: dict[str, str] = {}
    for name in cluster_names():
        if name == except_cluster:
            continue
        try:
            record = find(name)
        except Exception:  # a cluster being created or deleted: its claims are not readable
            continue
        backing = Backing.of(record.settings) if record is not None else None
        for uuid in backing.uuids() if backing else ():
            held[uuid] = name
    return held
