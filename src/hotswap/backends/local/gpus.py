"""GPU-backed slices of the local backend: which of this machine's GPUs back which slice.

A local cluster is either *emulated* (its workers get no GPU: ``CUDA_VISIBLE_DEVICES=""``) or
*GPU-backed* (``cluster create --gpus``): every slice owns a disjoint set of the machine's
GPUs, the device type's GPUs per host for each of its hosts, and each worker process sees only
its host's. The mapping lives in the cluster record's settings (``gpus``), written by the
cluster's controller before the round that adds the slices.

Backing is a property of the whole cluster and a cluster has one device type; the core places a
workload only on slices of its device type in its cluster, so a hotswap never moves a job
between GPU-backed and emulated slices, with no change to the core.

Claims are race-free across concurrent ``cluster create`` runs: :func:`claims_lock` is one
lock for the machine, held from reading every cluster's GPUs until the controller has
committed the new mapping (see ``operations.create_cluster``).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from hotswap.api.catalog import AcceleratorKind, DeviceType
from hotswap.api.cluster import node_name
from hotswap.api.errors import ConflictError, InvalidInputError
from hotswap.backends.local.nvml import GpuInfo, NvmlError, discover
from hotswap.core import events as ev
from hotswap.store.paths import clusters_root, file_lock, private_dir
from hotswap.store.registry import cluster_names, find

SETTINGS_KEY = "gpus"
SELECTION_HELP = "all, a count (2), or GPUs by NVML index or UUID: device=0,1 (or 0,1,3)"


# ---------------------------------------------------------------------- the mapping


@dataclasses.dataclass(frozen=True)
class Backing:
    """The GPUs of a backed cluster: ``per_host`` GPUs for each host of each slice, host-major."""

    per_host: int
    slices: Mapping[str, tuple[GpuInfo, ...]] = dataclasses.field(default_factory=dict)

    @classmethod
    def of(cls, settings: Mapping[str, Any]) -> Backing | None:
        """The backing recorded in a cluster's settings; None for an emulated cluster."""
        data = settings.get(SETTINGS_KEY)
        if data is None:
            return None
        slices = {name: tuple(GpuInfo.from_json(g) for g in gpus) for name, gpus in data.get("slices", {}).items()}
        return cls(int(data["per_host"]), slices)

    def to_settings(self) -> dict[str, Any]:
        return {"per_host": self.per_host, "slices": {n: [g.to_json() for g in gpus] for n, gpus in self.slices.items()}}

    def host_gpus(self, slice_name: str, host: int) -> tuple[GpuInfo, ...]:
        gpus = self.slices.get(slice_name, ())
        return gpus[host * self.per_host : (host + 1) * self.per_host]

    def node_gpus(self) -> dict[str, tuple[GpuInfo, ...]]:
        """node name -> its GPUs."""
        found = {}
        for name, gpus in self.slices.items():
            for host in range(len(gpus) // max(1, self.per_host)):
                found[node_name(name, host)] = self.host_gpus(name, host)
        return found

    def gpus(self) -> list[GpuInfo]:
        return sorted((g for gpus in self.slices.values() for g in gpus), key=lambda g: g.index)

    def uuids(self) -> set[str]:
        return {g.uuid for gpus in self.slices.values() for g in gpus}

    def after_resize(self, events: Iterable[ev.Event], pool: Sequence[dict[str, Any]] | None) -> Backing:
        """The backing once a resize's slices come and go: removed slices free their GPUs,
        added ones take the ``pool``'s (the GPUs ``cluster create`` claimed for the whole
        cluster; None: the ones it holds)."""
        added = [e for e in events if isinstance(e, ev.SliceAdded)]
        removed = [e.name for e in events if isinstance(e, ev.SliceRemoved)]
        gpus = [GpuInfo.from_json(g) for g in pool] if pool is not None else self.gpus()
        hosts = len(added[0].nodes) if added else 1
        return self.reassigned([e.name for e in added], removed, gpus, hosts)

    def reassigned(self, added: Sequence[str], removed: Iterable[str], pool: Sequence[GpuInfo], hosts: int) -> Backing:
        """The backing once ``removed`` slices go and ``added`` ones come: slices that stay keep
        their GPUs, which must be in ``pool``; new slices take the pool's other GPUs in order."""
        gone = set(removed)
        staying = {n: g for n, g in self.slices.items() if n not in gone}
        in_pool = {g.uuid for g in pool}
        for name, gpus in staying.items():
            outside = [g for g in gpus if g.uuid not in in_pool]
            if outside:
                raise ConflictError(
                    f"{outside[0].label()} backs slice {name}, which stays: --gpus must include it"
                )
        used = {g.uuid for gpus in staying.values() for g in gpus}
        free = [g for g in pool if g.uuid not in used]
        each = self.per_host * hosts
        if len(free) < each * len(added):
            raise ConflictError(f"{len(added)} new slice(s) need {each * len(added)} GPU(s); {len(free)} are left")
        slices = dict(staying)
        for position, name in enumerate(added):
            slices[name] = tuple(free[position * each : (position + 1) * each])
        return Backing(self.per_host, slices)


def gpus_per_host(device: DeviceType) -> int:
    """The GPUs each host of a slice of ``device`` is backed by; a one-line error for device
    types that GPUs cannot back."""
    if device.kind is not AcceleratorKind.GPU:
        raise InvalidInputError(
            f"--gpus backs GPU device types (local-gpu-1, h100-80gb-8, ...); {device.name} is a TPU type"
        )
    return device.chips_per_host


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
