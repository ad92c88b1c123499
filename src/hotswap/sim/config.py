"""Parameters of a simulated cluster, with where each default comes from, and their limits.

Every value a user can give is checked here once, with one line saying what is wrong and what
would be right; nothing is rounded silently (a node count that does not fill whole slices is
refused, not truncated).
"""

from __future__ import annotations

import dataclasses
import math

from hotswap.api.catalog import get_device_type
from hotswap.api.errors import InvalidInputError
from hotswap.core.policy import SchedulerConfig


@dataclasses.dataclass(frozen=True)
class FailureProfile:
    name: str
    failures_per_1000_node_days: float
    source: str


# Published node failure rates. Meta's figures are per node (8 A100 GPUs) and count failures
# that stop jobs; Llama 3's are the unexpected interruptions of one 2,048-node job.
PROFILES: dict[str, FailureProfile] = {
    p.name: p
    for p in (
        FailureProfile(
            "meta-rsc1",
            6.50,
            "Kokolis et al., Revisiting Reliability in Large-Scale ML Research Clusters, HPCA 2025:"
            " RSC-1 (16k A100 GPUs), 6.50 failures per 1000 node-days",
        ),
        FailureProfile(
            "meta-rsc2",
            2.34,
            "Kokolis et al., HPCA 2025: RSC-2 (8k A100 GPUs), 2.34 failures per 1000 node-days",
        ),
        FailureProfile(
            "llama3",
            round(419 / (2048 * 54) * 1000, 3),
            "Llama 3 Herd of Models (Meta, 2024), section 3.3.4: 419 unexpected interruptions in a"
            " 54-day snapshot of pre-training on 16,384 H100 GPUs (2,048 nodes)",
        ),
    )
}
DEFAULT_PROFILE = "meta-rsc1"
# GKE: repairing a TPU slice's node takes up to about 10 minutes (GKE hotswap documentation).
GKE_REPAIR_S = 600.0

POLICIES: dict[str, SchedulerConfig] = {
    "wait-for-repair": SchedulerConfig(hotswap=False, elastic=False),
    "hotswap": SchedulerConfig(hotswap=True, elastic=False),
    "hotswap+elastic": SchedulerConfig(hotswap=True, elastic=True),
}

# Limits of what the simulator is meant for; beyond them an input is a typo, not a study.
MAX_NODES = 262_144
MAX_DAYS = 366.0
MAX_FAILURES_PER_1000_NODE_DAYS = 1000.0  # one failure per node per day
MAX_REPAIR_S = 7 * 86400.0


def profile(name: str) -> FailureProfile:
    found = PROFILES.get(name)
    if found is None:
        raise InvalidInputError(f"unknown failure profile {name!r}; use one of {', '.join(PROFILES)}")
    return found


@dataclasses.dataclass(frozen=True)
class SimConfig:
    nodes: int = 4096
    days: float = 30.0
    seed: int = 0
    device_type: str = "v6e-16"
    failures_per_1000_node_days: float = PROFILES[DEFAULT_PROFILE].failures_per_1000_node_days
    repair_s: float = GKE_REPAIR_S
    # A restart: processes start, runtime initialises (startup), then state is read (restore).
    startup_s: float = 60.0
    restore_s: float = 30.0
    # Periodic checkpoints; with async saves the loop blocks only for the copy to host memory.
    checkpoint_interval_s: float = 1800.0
    checkpoint_block_s: float = 5.0
    # Time for workers to stop after SIGTERM (they save a checkpoint first).
    stop_s: float = 10.0
    # Whether a preempted job saves on SIGTERM (loses nothing). False: it loses the progress since
    # its last checkpoint (a job without a SIGTERM save, or one whose save outlasts its grace
    # period), which is when the choice of victims matters (``hotswap simulate --compare-victims``).
    preemption_saves: bool = True
    # Re-forming the process group after an elastic scale-down or scale-up.
    elastic_reconfigure_s: float = 20.0
    # An elastic job that loses a slice goes back to its last in-memory snapshot: the steps
    # since are lost. MaxText's elastic_train snapshots every 5 steps (snapshot_period=5) to
    # host memory; at the seconds per step of a large model that is about a minute.
    elastic_snapshot_s: float = 60.0
    # The workload mix: one long very-high job on main_fraction of the slices, which may run
    # down to main_min_fraction of its size when elastic, and streams of lower-priority fillers
    # (none when filler_oversubscription is 0).
    main_fraction: float = 0.75
    main_min_fraction: float = 0.9
    filler_oversubscription: float = 1.5
    filler_mean_hours: float = 12.0
    filler_think_s: float = 600.0
    policies: tuple[str, ...] = tuple(POLICIES)

    def __post_init__(self) -> None:
        device = get_device_type(self.device_type)
        hosts = device.hosts_per_slice
        if not 0 < self.nodes <= MAX_NODES:
            raise InvalidInputError(f"--nodes {self.nodes} is out of range: give 1 to {MAX_NODES:,} nodes")
        if self.nodes < hosts * 2:
            raise InvalidInputError(
                f"--nodes {self.nodes} is too small: {self.device_type} has {hosts} host(s) per slice and"
                " the simulation needs at least 2 slices"
            )
        if self.nodes % hosts:
            below = self.nodes - self.nodes % hosts
            raise InvalidInputError(
                f"--nodes {self.nodes} is not a whole number of {self.device_type} slices ({hosts} hosts"
                f" each): use {below} or {below + hosts}"
            )
        _check_range("--days", self.days, 0.0, MAX_DAYS, "days")
        _check_range(
            "--failure-rate", self.failures_per_1000_node_days, 0.0, MAX_FAILURES_PER_1000_NODE_DAYS,
            "failures per 1000 node-days", low_ok=True,
        )
        _check_range("--repair-minutes", self.repair_s / 60.0, 0.0, MAX_REPAIR_S / 60.0, "minutes", low_ok=True)
        _check_range("--checkpoint-minutes", self.checkpoint_interval_s / 60.0, 0.0, 1440.0, "minutes")
        _check_range(
            "--elastic-snapshot-minutes", self.elastic_snapshot_s / 60.0, 0.0, 1440.0, "minutes", low_ok=True
        )
        if self.checkpoint_block_s >= self.checkpoint_interval_s:
            raise InvalidInputError(
                f"--checkpoint-minutes {self.checkpoint_interval_s / 60.0:g} is shorter than the"
                f" {self.checkpoint_block_s:g} s each checkpoint blocks training:"
                f" give more than {self.checkpoint_block_s / 60.0:.3g}"
            )
        for name, value in (("startup", self.startup_s), ("restore", self.restore_s), ("stop", self.stop_s),
                            ("elastic reconfiguration", self.elastic_reconfigure_s),
                            ("checkpoint block", self.checkpoint_block_s), ("filler think", self.filler_think_s)):
            if not math.isfinite(value) or value < 0:
                raise InvalidInputError(f"{name} time must be a non-negative number of seconds, not {value}")
        if not 0 < self.main_fraction < 1:
            raise InvalidInputError("the main job's fraction of the cluster must lie between 0 and 1")
        if not 0 < self.main_min_fraction <= 1:
            raise InvalidInputError("the main job's elastic floor must lie in (0, 1] of its size")
        if self.filler_oversubscription < 0 or self.filler_mean_hours <= 0:
            raise InvalidInputError("filler oversubscription must be >= 0 and filler work > 0 hours")
        if not self.policies:
            raise InvalidInputError("give at least one policy")
        for name in self.policies:
            if name not in POLICIES:
                raise InvalidInputError(f"unknown policy {name!r}; use {', '.join(POLICIES)}")

    @property
    def hosts_per_slice(self) -> int:
        return get_device_type(self.device_type).hosts_per_slice

    @property
    def slices(self) -> int:
        return self.nodes // self.hosts_per_slice

    @property
    def duration_s(self) -> float:
        return self.days * 86400.0

    @property
    def main_slices(self) -> int:
        return max(1, int(self.slices * self.main_fraction))

    @property
    def main_nodes(self) -> int:
        return self.main_slices * self.hosts_per_slice

    @property
    def main_min_slices(self) -> int:
        return max(1, min(self.main_slices - 1, int(self.main_slices * self.main_min_fraction)))


def _check_range(flag: str, value: float, low: float, high: float, unit: str, low_ok: bool = False) -> None:
    """``value`` must be finite, above ``low`` (or equal when ``low_ok``) and at most ``high``."""
    below = value < low if low_ok else value <= low
    if not math.isfinite(value) or below or value > high:
        bound = f"{'from' if low_ok else 'more than'} {low:g} to {high:g}"
        raise InvalidInputError(f"{flag} {value:g} is out of range: give {bound} {unit}")
