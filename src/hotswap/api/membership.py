"""The membership file of an elastic workload: which slices are active, generation by generation.

The controller replaces the file atomically (write to a temporary name, rename) whenever the set
of active slices changes; workers read it at step boundaries (a ``stat`` per step; a read only
when it changed) and re-form their group. Its path is the worker's
:data:`~hotswap.api.worker.HOTSWAP_MEMBERSHIP_FILE`.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any

from hotswap.api.worker import global_rank, replica_index, world_size


@dataclasses.dataclass(frozen=True)
class Membership:
    """The active slices of an elastic workload, generation ``generation``.

    Rank of process ``l`` of host ``h`` of slice ``s``: the RANK formula with the replica index
    ``slices.index(s)``. Each generation has its own rendezvous port, so a new process group
    never meets a stale one.
    """

    generation: int
    slices: tuple[str, ...]
    hosts_per_slice: int
    master_addr: str
    master_port: int
    local_world_size: int = 1  # processes per host (one per GPU of a GPU-backed slice)
    # Where a joining worker leaves a mark once it is ready to form the group (started, imported,
    # waiting): survivors keep training on the previous generation until every joiner's mark is
    # there, so they pause only for the re-formation itself, not for the joiners' start-up.
    # None (Kubernetes: the membership volume is read-only): survivors move at once.
    joined_dir: str | None = None

    @property
    def world_size(self) -> int:
        return world_size(len(self.slices), self.hosts_per_slice, self.local_world_size)

    def rank_of(self, slice_name: str, host: int, local_rank: int = 0) -> int | None:
        """The rank of a worker in this generation, or None when its slice is not a member."""
        if slice_name not in self.slices:
            return None
        replica = replica_index(self.slices, slice_name)
        return global_rank(replica, host, self.hosts_per_slice, local_rank, self.local_world_size)

    def to_json(self) -> str:
        data = dataclasses.asdict(self)
        data["slices"] = list(self.slices)
        data["world_size"] = self.world_size
        return json.dumps(data, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Membership:
        data: dict[str, Any] = json.loads(text)
        return cls(
            generation=int(data["generation"]),
            slices=tuple(data["slices"]),
            hosts_per_slice=int(data["hosts_per_slice"]),
            master_addr=str(data["master_addr"]),
            master_port=int(data["master_port"]),
            local_world_size=int(data.get("local_world_size", 1)),
            joined_dir=str(data["joined_dir"]) if data.get("joined_dir") else None,
        )

    def joiners(self, previous: Membership) -> tuple[str, ...]:
        """The slices of this generation that were not members of ``previous``."""
        return tuple(s for s in self.slices if s not in previous.slices)

    def joined_mark(self, slice_name: str, host: int, local_rank: int) -> str | None:
        """The file a joiner creates when ready to form this generation (None: no marks)."""
        if not self.joined_dir:
            return None
        return f"{self.joined_dir.rstrip('/')}/{self.generation}-{slice_name}-{host}-{local_rank}"

    def joined_marks(self, previous: Membership) -> list[str]:
        """The marks every worker joining since ``previous`` leaves when ready (none without marks)."""
        return self.marks_of(self.joiners(previous))

    def marks_of(self, slices: Sequence[str]) -> list[str]:
        """The readiness marks of every worker of ``slices`` in this generation (none without marks)."""
        marks = [
            self.joined_mark(slice_name, host, local_rank)
            for slice_name in slices
            for host in range(self.hosts_per_slice)
            for local_rank in range(self.local_world_size)
        ]
        return [mark for mark in marks if mark is not None]
