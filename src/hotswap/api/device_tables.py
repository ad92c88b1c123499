"""The facts behind the device catalog: xpk's TPU families and GPU VM shapes, as tables.

Our own restatement of xpk's system characteristics table
(``src/xpk/core/system_characteristics.py`` in AI-Hypercomputer/xpk) and of GKE's published TPU
topologies; :mod:`hotswap.api.catalog` builds the device types and their names from them.
"""

from __future__ import annotations

import dataclasses

__all__ = ["FAMILY_HINTS", "GPU_FAMILIES", "GPU_SHAPES", "TPU_FAMILIES", "GpuShape", "TpuFamily"]


@dataclasses.dataclass(frozen=True, slots=True)
class TpuFamily:
    """A TPU generation as xpk knows it."""

    name: str  # the name prefix, e.g. "v5p"
    tensorcores_per_chip: int  # 2 means the number in a size name counts cores, not chips
    gke_accelerator: str
    machine_type: str  # the four-chip VM every multi-chip shape is built from
    single_chip_machine_type: str | None  # the one-chip VM, for families offering a 1-chip shape
    topologies: tuple[str, ...]  # in xpk's order, which decides ties between same-size shapes
    default_topologies: frozenset[str]  # the shape a size name means when sizes tie


@dataclasses.dataclass(frozen=True, slots=True)
class GpuShape:
    """A GPU VM shape as xpk offers it."""

    name: str
    family: str
    gpus_per_host: int
    gke_accelerator: str
    machine_type: str


def _cube_topologies(max_cubes: int, *, nondecreasing: bool) -> tuple[str, ...]:
    """Topologies of the 3-D torus families (v4, v5p, tpu7x), as xpk enumerates them.

    Below one 4x4x4 cube there are four fixed sub-cube shapes; above it, any AxBxC of whole
    cubes (each side a multiple of 4, at most 256) up to the family's cube count.
    ``nondecreasing`` keeps only A <= B <= C (v5p, tpu7x); v4 accepts every permutation.
    """
    shapes = ["2x2x1", "2x2x2", "2x2x4", "2x4x4"]
    most = 64  # cubes along one side: 256 chips
    # Count in cubes and stop each loop once the budget is spent, so this stays cheap at import;
    # the order (A, then B, then C ascending) is xpk's, which matters for size-name ties.
    for a in range(1, most + 1):
        for b in range(a if nondecreasing else 1, most + 1):
            if a * b * (b if nondecreasing else 1) > max_cubes:
                break
            for c in range(b if nondecreasing else 1, min(most, max_cubes // (a * b)) + 1):
                shapes.append(f"{4 * a}x{4 * b}x{4 * c}")
    return tuple(shapes)


def _topos(text: str) -> tuple[str, ...]:
    return tuple(text.split())


# The sizes GKE publishes for v5p and tpu7x slices; a size name means this shape when several
# topologies have the same number of chips. Ironwood lists the same shapes as v5p plus 16x16x32
# and 16x24x24.
_V5P_DEFAULTS = _topos(
    """
    2x2x1 2x2x2 2x2x4 2x4x4 4x4x4 4x4x8 4x4x12 4x8x8 4x4x20 4x8x12 4x4x28 8x8x8 4x12x12
    4x8x20 4x4x44 8x8x12 4x4x52 4x8x28 4x12x20 8x8x16 4x4x68 8x12x12 4x4x76 8x8x20 4x12x28
    4x8x44 4x4x92 8x12x16 4x20x20 4x8x52 12x12x12 8x8x28 4x4x116 8x12x20 4x4x124 8x16x16
    4x12x44 4x8x68 4x20x28 12x12x16 4x4x148 4x8x76 4x12x52 8x16x20 4x4x164 8x12x28 4x4x172
    8x8x44 12x12x20 4x8x92 4x4x188 12x16x16 4x28x28 8x20x20 4x12x68 8x8x52 4x4x212 12x12x24
    4x20x44 8x16x28 4x12x76 4x8x116 4x4x236 12x16x20 4x4x244 4x8x124 12x12x28 16x16x16
    4x20x52 8x12x44 8x8x68 4x12x92 8x20x28 12x16x24 4x8x148 12x20x20 8x8x76 4x28x44 8x12x52
    16x16x20 12x12x36 4x8x164 12x16x28 4x20x68 4x8x172 4x12x116 8x16x44 12x20x24 4x28x52
    8x8x92 4x12x124 4x8x188 4x20x76 16x16x24 12x24x24 16x20x28
    """
)
_TPU7X_DEFAULTS = (*_V5P_DEFAULTS, "16x16x32", "16x24x24")
_V4_DEFAULTS = _topos("2x2x1 2x2x2 2x2x4 2x4x4 4x4x4 4x4x8 4x8x8 8x8x8 8x8x12 8x8x16 8x16x16")
# v5e and v6e are 2-D; xpk offers the same six multi-host shapes for both, and 2x2 (one VM)
# and 1x1 (one chip) for v6e only.
_PLANAR = _topos("2x4 4x4 4x8 8x8 8x16 16x16")

TPU_FAMILIES: tuple[TpuFamily, ...] = (
    TpuFamily(
        name="v4",
        tensorcores_per_chip=2,
        gke_accelerator="tpu-v4-podslice",
        machine_type="ct4p-hightpu-4t",
        single_chip_machine_type=None,
        topologies=_cube_topologies(64, nondecreasing=False),
        default_topologies=frozenset(_V4_DEFAULTS),
    ),
    TpuFamily(
        name="v5litepod",
        tensorcores_per_chip=1,
        gke_accelerator="tpu-v5-lite-podslice",
        machine_type="ct5lp-hightpu-4t",
        single_chip_machine_type=None,
        topologies=_PLANAR,
        default_topologies=frozenset(_PLANAR),
    ),
    TpuFamily(
        name="v5p",
        tensorcores_per_chip=2,
        gke_accelerator="tpu-v5p-slice",
        machine_type="ct5p-hightpu-4t",
        single_chip_machine_type=None,
        topologies=_cube_topologies(140, nondecreasing=True),
        default_topologies=frozenset(_V5P_DEFAULTS),
    ),
    TpuFamily(
        name="v6e",
        tensorcores_per_chip=1,
        gke_accelerator="tpu-v6e-slice",
        machine_type="ct6e-standard-4t",
        single_chip_machine_type="ct6e-standard-1t",
        topologies=("1x1", "2x2", *_PLANAR),
        default_topologies=frozenset(("1x1", "2x2", *_PLANAR)),
    ),
    TpuFamily(
        name="tpu7x",  # Ironwood
        tensorcores_per_chip=2,
        gke_accelerator="tpu7x",
        machine_type="tpu7x-standard-4t",
        single_chip_machine_type="tpu7x-standard-1t",
        topologies=("1x1x1", *_cube_topologies(144, nondecreasing=True)),
        default_topologies=frozenset(("1x1x1", *_TPU7X_DEFAULTS)),
    ),
)

# GPU VM shapes xpk offers: (name, family, GPUs per VM, GKE accelerator label, machine type).
GPU_SHAPES: tuple[GpuShape, ...] = tuple(
    GpuShape(*row)
    for row in (
        ("l4-1", "l4", 1, "nvidia-l4", "g2-standard-12"),
        ("l4-2", "l4", 2, "nvidia-l4", "g2-standard-24"),
        ("l4-4", "l4", 4, "nvidia-l4", "g2-standard-48"),
        ("l4-8", "l4", 8, "nvidia-l4", "g2-standard-96"),
        ("a100-40gb-1", "a100-40gb", 1, "nvidia-tesla-a100", "a2-highgpu-1g"),
        ("a100-40gb-2", "a100-40gb", 2, "nvidia-tesla-a100", "a2-highgpu-2g"),
        ("a100-40gb-4", "a100-40gb", 4, "nvidia-tesla-a100", "a2-highgpu-4g"),
        ("a100-40gb-8", "a100-40gb", 8, "nvidia-tesla-a100", "a2-highgpu-8g"),
        ("h100-80gb-8", "h100-80gb", 8, "nvidia-h100-80gb", "a3-highgpu-8g"),
        ("h100-mega-80gb-8", "h100-mega-80gb", 8, "nvidia-h100-mega-80gb", "a3-megagpu-8g"),
        ("h200-141gb-8", "h200-141gb", 8, "nvidia-h200-141gb", "a3-ultragpu-8g"),
        ("b200-8", "b200", 8, "nvidia-b200", "a4-highgpu-8g"),
        ("gb200-4", "gb200", 4, "nvidia-gb200", "a4x-highgpu-4g"),
        # Same GB200 VM without local SSD; a separate name because it is a separate machine type.
        ("gb200-4-nolssd", "gb200", 4, "nvidia-gb200", "a4x-highgpu-4g-nolssd"),
    )
)

GPU_FAMILIES: tuple[str, ...] = tuple(dict.fromkeys(shape.family for shape in GPU_SHAPES))

# Spellings people use for a family that xpk does not accept, mapped to xpk's prefix. Used only
# to make error messages point at the right name; lookups stay exact.
FAMILY_HINTS = {
    "v5e": "v5litepod",
    "v5lite": "v5litepod",
    "v5litepod": "v5litepod",
    "v6": "v6e",
    "trillium": "v6e",
    "v7": "tpu7x",
    "v7x": "tpu7x",
    "tpu7": "tpu7x",
    "ironwood": "tpu7x",
    "h100": "h100-80gb",
    "h200": "h200-141gb",
    "a100": "a100-40gb",
}
