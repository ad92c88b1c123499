"""Parameters of a simulated cluster, with where each default comes from."""

from __future__ import annotations

import dataclasses

from hotswap.api.catalog import get_device_type
from hotswap.api.errors import InvalidInputError
from hotswap.core.policy import SchedulerConfig

# Meta, "Revisiting Reliability in Large-Scale Machine Learning Research Clusters" (2024):
# 6.5 failures per 1000 node-days across their RSC-1/RSC-2 clusters.
META_2024_FAILURES_PER_1000_NODE_DAYS = 6.5
# GKE: repairing a TPU slice's node takes up to about 10 minutes (GKE hotswap documentation).
GKE_REPAIR_S = 600.0

POLICIES: dict[str, SchedulerConfig] = {
    "wait-for-repair": SchedulerConfig(hotswap=False, elastic=False),
    "hotswap": SchedulerConfig(hotswap=True, elastic=False),
    "hotswap+elastic": SchedulerConfig(hotswap=True, elastic=True),
}


@dataclasses.dataclass(frozen=True)
class SimConfig:
    nodes: int = 4096
    days: float = 30.0
    seed: int = 0
    device_type: str = "v6e-16"
    failures_per_1000_node_days: float = META_2024_FAILURES_PER_1000_NODE_DAYS
    repair_s: float = GKE_REPAIR_S
    # A restart: processes start, runtime initialises (startup), then state is read (restore).
    startup_s: float = 60.0
    restore_s: float = 30.0
    # Periodic checkpoints; with async saves the loop blocks only for the copy to host memory.
    checkpoint_interval_s: float = 1800.0
    checkpoint_block_s: float = 5.0
    # Time for workers to stop after SIGTERM (they save a checkpoint first).
    stop_s: float = 10.0
    # Re-forming the process group after an elastic scale-down or scale-up.
    elastic_reconfigure_s: float = 20.0
    # The workload mix: one long very-high job on main_fraction of the slices, which may run
    # down to main_min_fraction of its size when elastic, and streams of lower-priority fillers.
    main_fraction: float = 0.75
    main_min_fraction: float = 0.9
    filler_oversubscription: float = 1.5
    filler_mean_hours: float = 12.0
    filler_think_s: float = 600.0
    policies: tuple[str, ...] = tuple(POLICIES)

    def __post_init__(self) -> None:
        device = get_device_type(self.device_type)
        if self.nodes < device.hosts_per_slice * 2:
            raise InvalidInputError(
                f"--nodes {self.nodes} is too small: {self.device_type} has {device.hosts_per_slice}"
                " host(s) per slice and the simulation needs at least 2 slices"
            )
        if self.days <= 0:
            raise InvalidInputError("--days must be positive")
        if self.repair_s < 0 or self.failures_per_1000_node_days < 0:
            raise InvalidInputError("repair time and failure rate must not be negative")
        if not 0 < self.main_fraction < 1:
            raise InvalidInputError("the main job's fraction of the cluster must lie between 0 and 1")
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
    def main_min_slices(self) -> int:
        return max(1, min(self.main_slices - 1, int(self.main_slices * self.main_min_fraction)))
