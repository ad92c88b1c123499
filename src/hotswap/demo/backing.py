"""Which slices a drill runs on: this machine's GPUs when enough are free, else emulated ones.

``auto`` (the default) backs each of a drill's slices by one free GPU (``local-gpu-1``) when
the machine has at least as many free GPUs as the drill has slices, and emulates them
(``v6e-4``: one CPU process per slice) otherwise; ``gpu`` insists on GPUs, ``emulated`` never
uses them. Without NVML there are no GPUs to count: emulated.
"""

from __future__ import annotations

from hotswap.api.errors import InvalidInputError
from hotswap.backends.local.gpu.claims import held_by_clusters
from hotswap.backends.local.gpu.nvml import NvmlError, discover

EMULATED_DEVICE = "v6e-4"  # one host per slice: one training process per slice on a laptop
GPU_DEVICE = "local-gpu-1"  # one GPU per slice: one training process per GPU
BACKINGS = ("auto", "gpu", "emulated")


def free_gpus() -> tuple[int, str]:
    """How many of this machine's GPUs no local cluster holds, and why none when that is so."""
    try:
        machine = discover()
    except NvmlError as error:
        return 0, str(error)
    held = held_by_clusters("")
    free = [g for g in machine if g.uuid not in held]
    return len(free), "" if free else f"{len(machine)} GPU(s), all held by other clusters" if machine else "no GPU"


def choose_backing(backing: str, slices: int) -> tuple[str, str | None]:
    """The device type of a drill cluster of ``slices`` slices, and its ``--gpus`` (None:
    emulated)."""
    if backing not in BACKINGS:
        raise InvalidInputError(f"--backing {backing}: use {', '.join(BACKINGS)}")
    if backing == "emulated":
        return EMULATED_DEVICE, None
    free, why = free_gpus()
    if free >= slices:
        return GPU_DEVICE, str(slices)
    if backing == "gpu":
        raise InvalidInputError(f"--backing gpu: the drill needs {slices} free GPU(s); {free} here ({why or 'too few'})")
    return EMULATED_DEVICE, None
