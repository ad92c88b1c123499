"""GPU health: which NVML observations take a GPU out of service. Pure.

XIDs are classified as NVIDIA's Kubernetes device plugin classifies them (``internal/rm/
health.go``): only critical XID events count; 13, 31, 43, 45, 68 and 109 are application
errors, after which the GPU is fine and the job's own failure policy applies (its process
usually dies of it); every other critical XID takes the GPU out. The plugin's two variables
work the same way here: ``DP_DISABLE_HEALTHCHECKS`` (``all``/``xids``, or XIDs to ignore as
well) and ``DP_ENABLE_HEALTHCHECKS`` (XIDs to count even so).

Beyond XIDs a GPU is unhealthy when its volatile uncorrectable ECC count rises above what it
was when watching began (or last repaired), when a page retirement or a row remapping is
pending (the GPU needs a reset) or failed, and when NVML reports it lost or cannot read it.
"""

from __future__ import annotations

import dataclasses
import enum

APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})

# What the common XIDs mean (NVIDIA's XID catalogue), for messages; others show their number.
XID_NAMES = {
    13: "graphics engine exception",
    31: "GPU memory page fault",
    43: "GPU stopped processing",
    45: "preemptive cleanup, due to previous errors",
    48: "double-bit ECC error",
    61: "internal micro-controller breakpoint",
    62: "internal micro-controller halt",
    63: "ECC page retirement or row remapping recording event",
    64: "ECC page retirement or row remapper recording failure",
    68: "video processor exception",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    109: "context switch timeout",
    119: "GSP RPC timeout",
    120: "GSP error",
}


class XidClass(enum.Enum):
    APPLICATION = "application"  # the job's error: its failure policy applies, the GPU stays
    HARDWARE = "hardware"  # the GPU is out: its node fails, its work is hotswapped
    IGNORED = "ignored"  # health checks for it are turned off


def describe_xid(xid: int) -> str:
    name = XID_NAMES.get(xid)
    return f"XID {xid} ({name})" if name else f"XID {xid}"


@dataclasses.dataclass(frozen=True, slots=True)
class XidFilter:
    """The device plugin's switches: XIDs whose health checks are off, or all of them, and
    XIDs turned back on."""

    disabled: frozenset[int] = frozenset()
    all_disabled: bool = False
    enabled: frozenset[int] = frozenset()

    @classmethod
    def parse(cls, disable: str = "", enable: str = "") -> XidFilter:
        """From the values of ``DP_DISABLE_HEALTHCHECKS`` and ``DP_ENABLE_HEALTHCHECKS``
        (malformed entries are ignored, as the plugin ignores them)."""
        disabled_all, disabled = _xids(disable)
        _, enabled = _xids(enable)
        return cls(disabled, disabled_all, enabled)

    def classify(self, xid: int) -> XidClass:
        if xid in self.enabled:  # turned on explicitly: it takes the GPU out, application XIDs too
            return XidClass.HARDWARE
        if self.all_disabled or xid in self.disabled:
            return XidClass.IGNORED
        return XidClass.APPLICATION if xid in APPLICATION_XIDS else XidClass.HARDWARE


def _xids(text: str) -> tuple[bool, frozenset[int]]:
    found: set[int] = set()
    for item in text.lower().split(","):
        item = item.strip()
        if item in ("all", "xids"):
            return True, frozenset()
        if item.isdigit():
            found.add(int(item))
    return False, frozenset(found)


@dataclasses.dataclass(frozen=True, slots=True)
class GpuReading:
    """One look at one GPU through NVML (counts None where the GPU does not report them)."""

    uuid: str
    reachable: bool = True
    problem: str = ""  # why it is not reachable (NVML's words)
    ecc_uncorrected: int | None = None  # volatile uncorrectable ECC errors since the driver loaded
    retirement_pending: bool = False  # retired pages waiting for a reset (before Ampere)
    remap_pending: bool = False  # remapped rows waiting for a reset (Ampere and later)
    remap_failed: bool = False


def reading_problems(reading: GpuReading, ecc_baseline: int | None) -> list[str]:
    """Why this reading takes the GPU out of service (empty: healthy)."""
    if not reading.reachable:
        return [f"lost or unreachable ({reading.problem or 'NVML cannot read it'})"]
    problems = []
    if reading.ecc_uncorrected is not None and ecc_baseline is not None and reading.ecc_uncorrected > ecc_baseline:
        problems.append(
            f"{reading.ecc_uncorrected - ecc_baseline} new uncorrectable ECC error(s)"
            f" ({reading.ecc_uncorrected} since the driver loaded)"
        )
    if reading.retirement_pending:
        problems.append("a page retirement is pending (the GPU needs a reset)")
    if reading.remap_pending:
        problems.append("a row remapping is pending (the GPU needs a reset)")
    if reading.remap_failed:
        problems.append("a row remapping failed")
    return problems
