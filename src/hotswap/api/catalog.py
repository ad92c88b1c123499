"""The accelerator device catalog: every device type name hotswap accepts, and its shape.

Names and shapes follow xpk's system characteristics table
(``src/xpk/core/system_characteristics.py`` in AI-Hypercomputer/xpk), so a user can type the
same device type they give xpk. The GKE node-label values, topologies and machine types are the
ones xpk uses and GKE documents ("Plan TPUs in GKE", cloud.google.com/kubernetes-engine/docs/
concepts/plan-tpus; GPU machine types in the Compute Engine docs). The tables of
:mod:`hotswap.api.device_tables` are our own restatement of those facts; the canonical names are
built from them at import (a few hundred entries, about a millisecond), the rarely needed
spelled-out topologies on first use.

TPU names
    ``<family>-<N>`` where N counts **TensorCores** for v4, v5p and tpu7x (two per chip, so
    ``v5p-16`` is 8 chips) and **chips** for v5litepod (v5e) and v6e (one core per chip).
    Every supported topology is also accepted spelled out, ``<family>-<topology>`` (``v6e-4x4``,
    ``v5p-4x8x16``), as xpk accepts it. When several topologies have the same size, the size
    name means the family's default topology for it (``v5p-1024`` is ``8x8x8``, not
    ``4x8x16``); the other topologies are reachable only by their spelled-out name.
    A slice is one TPU slice: ``hosts_per_slice`` VMs of ``chips_per_host`` chips each (one
    chip for the single-chip ``1x1``/``1x1x1`` shapes, four otherwise).

GPU names
    ``<family>-<GPUs per VM>`` (``h100-80gb-8``). As in xpk, a GPU "slice" is one VM: one node
    with all of its GPUs, so ``hosts_per_slice`` is 1 and a job that wants N slices of a GPU
    type wants N such nodes. GPUs have no TPU-style topology; we record ``1x<GPUs per VM>`` so
    that every entry has a well-formed topology string (xpk writes ``N/A``, and ``1x72`` for
    GB200, meaning its 72-GPU NVLink domain rather than the shape of one VM).

Local GPU names
    ``local-gpu-<K>`` (K from 1 to 16): a slice of K GPUs of *this* machine, whatever their
    model, for the local backend's GPU-backed slices (``cluster create --gpus``) on machines
    whose GPU count matches no cloud VM shape (one H100 makes one ``local-gpu-1`` slice). They
    are not xpk names: :func:`device_types` and :func:`device_type_names` leave them out, and
    ``local_only`` marks them for backends that place onto cloud nodes.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import math
import re
import types
from collections.abc import Iterable, Mapping

from hotswap.api.device_tables import FAMILY_HINTS, GPU_SHAPES, TPU_FAMILIES, TpuFamily
from hotswap.api.errors import InvalidInputError

__all__ = [
    "AcceleratorKind",
    "DeviceType",
    "accepted_device_type_names",
    "device_type_names",
    "device_types",
    "families",
    "get_device_type",
]

TPU_RESOURCE = "google.com/tpu"
GPU_RESOURCE = "nvidia.com/gpu"
TPU_ACCELERATOR_LABEL = "cloud.google.com/gke-tpu-accelerator"
TPU_TOPOLOGY_LABEL = "cloud.google.com/gke-tpu-topology"
GPU_ACCELERATOR_LABEL = "cloud.google.com/gke-accelerator"


class AcceleratorKind(str, enum.Enum):
    """Which kind of accelerator a device type carries."""

    TPU = "tpu"
    GPU = "gpu"


@dataclasses.dataclass(frozen=True, slots=True)
class DeviceType:
    """One accelerator shape: what a single slice of this type is made of.

    ``chips_per_host`` is TPU chips per VM for TPUs and GPUs per VM for GPUs.
    """

    name: str
    kind: AcceleratorKind
    family: str
    topology: str
    hosts_per_slice: int
    chips_per_host: int
    gke_accelerator: str
    machine_type: str
    resource_name: str
    local_only: bool = False  # a local-gpu-K shape: no cloud node carries it

    @property
    def chips_per_slice(self) -> int:
        return self.hosts_per_slice * self.chips_per_host

    @property
    def node_label_key(self) -> str:
        """The node label whose value is ``gke_accelerator``."""
        return TPU_ACCELERATOR_LABEL if self.kind is AcceleratorKind.TPU else GPU_ACCELERATOR_LABEL

    @property
    def topology_label_key(self) -> str | None:
        """The node label whose value is ``topology``; GPUs have none."""
        return TPU_TOPOLOGY_LABEL if self.kind is AcceleratorKind.TPU else None

    @property
    def multi_host(self) -> bool:
        return self.hosts_per_slice > 1


def _chips(topology: str) -> int:
    return math.prod(int(side) for side in topology.split("x"))


def _tpu_entry(family: TpuFamily, name: str, topology: str) -> DeviceType:
    chips = _chips(topology)
    single_chip = chips == 1
    # A one-chip shape is one one-chip VM; every other shape is built from four-chip VMs.
    chips_per_host = 1 if single_chip else 4
    machine_type = family.machine_type
    if single_chip and family.single_chip_machine_type is not None:
        machine_type = family.single_chip_machine_type
    return DeviceType(
        name=name,
        kind=AcceleratorKind.TPU,
        family=family.name,
        topology=topology,
        hosts_per_slice=chips // chips_per_host,
        chips_per_host=chips_per_host,
        gke_accelerator=family.gke_accelerator,
        machine_type=machine_type,
        resource_name=TPU_RESOURCE,
    )


def _size_topologies(family: TpuFamily) -> dict[int, str]:
    """Which topology each size name of the family means, by size in its naming unit.

    The default topology where the size has one, else the first in xpk's order (the one xpk
    resolves that size name to).
    """
    size_topology: dict[int, str] = {}
    for topology in family.topologies:
        cores = _chips(topology) * family.tensorcores_per_chip
        if cores not in size_topology or topology in family.default_topologies:
            size_topology[cores] = topology
    return size_topology


def _build_canonical() -> dict[str, DeviceType]:
    canonical: dict[str, DeviceType] = {}
    for family in TPU_FAMILIES:
        size_topology = _size_topologies(family)
        for cores in sorted(size_topology):
            entry = _tpu_entry(family, f"{family.name}-{cores}", size_topology[cores])
            canonical[entry.name] = entry
    for shape in GPU_SHAPES:
        canonical[shape.name] = DeviceType(
            name=shape.name,
            kind=AcceleratorKind.GPU,
            family=shape.family,
            topology=f"1x{shape.gpus_per_host}",
            hosts_per_slice=1,
            chips_per_host=shape.gpus_per_host,
            gke_accelerator=shape.gke_accelerator,
            machine_type=shape.machine_type,
            resource_name=GPU_RESOURCE,
        )
    return canonical


LOCAL_GPU_FAMILY = "local-gpu"
MAX_LOCAL_GPUS_PER_SLICE = 16
_LOCAL_GPU = re.compile(rf"^{LOCAL_GPU_FAMILY}-(?P<gpus>\d+)$")


def _local_gpu_entry(gpus: int) -> DeviceType:
    return DeviceType(
        name=f"{LOCAL_GPU_FAMILY}-{gpus}",
        kind=AcceleratorKind.GPU,
        family=LOCAL_GPU_FAMILY,
        topology=f"1x{gpus}",
        hosts_per_slice=1,
        chips_per_host=gpus,
        gke_accelerator="",
        machine_type="this machine",
        resource_name=GPU_RESOURCE,
        local_only=True,
    )


_LOCAL_GPU_TYPES: Mapping[str, DeviceType] = types.MappingProxyType(
    {entry.name: entry for entry in map(_local_gpu_entry, range(1, MAX_LOCAL_GPUS_PER_SLICE + 1))}
)
_CANONICAL = _build_canonical()
_DEVICE_TYPES: Mapping[str, DeviceType] = types.MappingProxyType(_CANONICAL)
_NAMES: tuple[str, ...] = tuple(_CANONICAL)
_FAMILIES: tuple[str, ...] = tuple(dict.fromkeys(entry.family for entry in _CANONICAL.values()))
_TPU_BY_NAME = {family.name: family for family in TPU_FAMILIES}
_accepted_cache: dict[str, DeviceType] | None = None


def _accepted() -> dict[str, DeviceType]:
    """Every accepted spelling by name, canonical names included.

    Built on first use rather than at import: the ~1,600 spelled-out topologies (mostly v4
    permutations) would otherwise cost every CLI start a few milliseconds for a rare case.
    """
    global _accepted_cache
    if _accepted_cache is None:
        accepted: dict[str, DeviceType] = {}
        for family in TPU_FAMILIES:
            for topology in family.topologies:
                # A spelled-out topology that a size name already means resolves to that
                # entry, so each shape has one name; other shapes keep the spelled-out name.
                alias = f"{family.name}-{topology}"
                entry = _CANONICAL.get(_size_name(family, topology))
                if entry is None or entry.topology != topology:
                    entry = _tpu_entry(family, alias, topology)
                accepted[alias] = entry
        accepted.update(_CANONICAL)
        accepted.update(_LOCAL_GPU_TYPES)
        _accepted_cache = accepted
    return _accepted_cache


def _size_name(family: TpuFamily, topology: str) -> str:
    return f"{family.name}-{_chips(topology) * family.tensorcores_per_chip}"


def device_types() -> Mapping[str, DeviceType]:
    """Every device type under its canonical name, read-only, in :func:`device_type_names` order."""
    return _DEVICE_TYPES


def device_type_names() -> tuple[str, ...]:
    """Every canonical name: TPU families (v4, v5litepod, v5p, v6e, tpu7x), then GPU families;
    within a family, by size. Spelled-out topology names are left out; see
    :func:`accepted_device_type_names`."""
    return _NAMES


def accepted_device_type_names() -> frozenset[str]:
    """Every name :func:`get_device_type` accepts, spelled-out topologies included."""
    return frozenset(_accepted())


def families() -> tuple[str, ...]:
    """Family names in catalog order."""
    return _FAMILIES


def get_device_type(name: str) -> DeviceType:
    """Look up a device type by xpk's name, ignoring case and surrounding blanks.

    Raises InvalidInputError, one line that names the nearest valid names, for anything else.
    """
    if len(name) > MAX_NAME_LENGTH:  # no device type is that long; its digits would not even parse
        name = name[:MAX_NAME_LENGTH] + "..."
    key = name.strip().lower()
    entry = _CANONICAL.get(key) or _LOCAL_GPU_TYPES.get(key) or _accepted().get(key)
    if entry is None:
        if _LOCAL_GPU.match(key):
            raise InvalidInputError(
                f"unknown device type {name.strip()!r}: {LOCAL_GPU_FAMILY}-K takes 1 to {MAX_LOCAL_GPUS_PER_SLICE} GPUs"
            )
        raise InvalidInputError(_unknown_message(name, key))
    return entry


MAX_NAME_LENGTH = 64
_SIZED = re.compile(r"^(?P<family>.+)-(?P<size>\d+)$")
_TOPOLOGY = re.compile(r"^(?P<family>.+)-(?P<topology>\d+(?:x\d+)+)$")


def _family_names(family: str) -> list[str]:
    return [n for n in _NAMES if _CANONICAL[n].family == family]


def _sizes_near(family: str, size: int) -> list[str]:
    """The family's name of that size if there is one, else the sizes on either side of it,
    nearest first."""
    sized = [(int(m.group("size")), n) for n in _family_names(family) if (m := _SIZED.match(n))]
    exact = [n for s, n in sized if s == size]
    if exact:
        return exact
    below = [(s, n) for s, n in sized if s < size][-1:]
    above = [(s, n) for s, n in sized if s > size][:1]
    near = sorted(below + above, key=lambda pair: abs(pair[0] - size))
    return [n for _, n in near]


def _topologies_near(family: str, topology: str) -> list[str]:
    """Accepted spelled-out names of the family with the same number of chips (its sides in
    ascending order first), else the shapes of the sizes on either side."""
    spelled = [n for n in _accepted() if n.startswith(f"{family}-") and "x" in n[len(family) :]]
    sides = sorted(int(side) for side in topology.split("x"))
    same_size = [n for n in spelled if _accepted()[n].chips_per_slice == _chips(topology)]
    ascending = f"{family}-{'x'.join(str(side) for side in sides)}"
    same_size.sort(key=lambda n: n != ascending)
    if same_size:
        return same_size[:3]
    # No shape of that size: offer the sizes on either side, spelled the way the user spelled.
    size = _chips(topology) * _TPU_BY_NAME[family].tensorcores_per_chip
    return [f"{family}-{_CANONICAL[n].topology}" for n in _sizes_near(family, size)]


def _known_family(spelled: str) -> str | None:
    """The family a name prefix means: itself, a well-known other name for it, or a near typo."""
    if spelled in _FAMILIES:
        return spelled
    if spelled in FAMILY_HINTS:
        return FAMILY_HINTS[spelled]
    near = difflib.get_close_matches(spelled, _FAMILIES, n=1, cutoff=0.8)
    return near[0] if near else None


def _suggestions(key: str) -> list[str]:
    sized = _SIZED.match(key)
    if sized:
        family = _known_family(sized.group("family"))
        if family is not None:
            return _sizes_near(family, int(sized.group("size")))
    shaped = _TOPOLOGY.match(key)
    if shaped:
        family = FAMILY_HINTS.get(shaped.group("family"), shaped.group("family"))
        if family in _TPU_BY_NAME:
            return _topologies_near(family, shaped.group("topology"))
    # A bare family ("v6e", "v5e") gets its smallest names.
    family = FAMILY_HINTS.get(key, key)
    if family in _FAMILIES:
        return _family_names(family)[:3]
    return difflib.get_close_matches(key, _NAMES, n=3, cutoff=0.6)


def _join(names: Iterable[str]) -> str:
    return ", ".join(names)


def _unknown_message(raw: str, key: str) -> str:
    shown = raw.strip() or raw
    suggestions = _suggestions(key)
    if suggestions:
        return f"unknown device type {shown!r}; did you mean {_join(suggestions)}?"
    return (
        f"unknown device type {shown!r}; names are <family>-<size>, "
        f"families: {_join(_FAMILIES)} (e.g. v6e-16, v5p-16, h100-80gb-8)"
    )
