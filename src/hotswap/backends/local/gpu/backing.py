"""GPU-backed slices of the local backend: which of this machine's GPUs back which slice.

A local cluster is either *emulated* (its workers get no GPU: ``CUDA_VISIBLE_DEVICES=""``) or
*GPU-backed* (``cluster create --gpus``): every slice owns a disjoint set of the machine's
GPUs, the device type's GPUs per host for each of its hosts, and each worker process sees only
its host's. The mapping is the ``gpus`` entry of the cluster's settings (``settings.py``'s
record), written by the cluster's controller with the round that adds the slices.

Backing is a property of the whole cluster and a cluster has one device type; the core places a
workload only on slices of its device type in its cluster, so a hotswap never moves a job
between GPU-backed and emulated slices, with no change to the core.

Which GPUs a new or resized cluster may take is decided in ``claims.py``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from hotswap.api.catalog import AcceleratorKind, DeviceType
from hotswap.api.cluster import node_name
from hotswap.api.errors import ConflictError, InvalidInputError
from hotswap.backends.local.gpu.nvml import GpuInfo
from hotswap.core import events as ev

SETTINGS_KEY = "gpus"


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

    def after_resize(self, events: Iterable[ev.Event], pool: Sequence[GpuInfo] | None) -> Backing:
        """The backing once a resize's slices come and go: removed slices free their GPUs,
        added ones take the ``pool``'s (the GPUs ``cluster create`` claimed for the whole
        cluster; None: the ones it holds)."""
        added = [e for e in events if isinstance(e, ev.SliceAdded)]
        removed = [e.name for e in events if isinstance(e, ev.SliceRemoved)]
        gpus = list(pool) if pool is not None else self.gpus()
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
