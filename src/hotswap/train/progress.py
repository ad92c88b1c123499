"""Where the job stands: the counters that every part of a run reads and a checkpoint holds, and,
when a group (re)forms, which rank's state the others take. Framework-neutral."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence


@dataclasses.dataclass
class Progress:
    step: int = 0  # steps done
    elastic_down_events: int = 0
    last_checkpoint_step: int = 0
    has_state: bool = False  # holds the job's training state (restored, received, or started fresh)

    def counters(self) -> dict[str, int]:
        """What a checkpoint keeps of the progress."""
        return {"step": self.step, "elastic_down_events": self.elastic_down_events}

    def load(self, counters: Mapping[str, int]) -> None:
        """Continue from restored counters: the state of that step is now held, and on disk."""
        self.step = int(counters["step"])
        self.elastic_down_events = int(counters["elastic_down_events"])
        self.last_checkpoint_step = self.step
        self.has_state = True


@dataclasses.dataclass(frozen=True)
class PeerCopy:
    """Every rank takes the state of ``source``; ``receivers`` load it, the others hold it already."""

    source: int
    receivers: frozenset[int]


def plan_peer_copy(offers: Sequence[tuple[bool, int]]) -> PeerCopy | None:
    """From what each rank offers, by rank (whether it holds state, and its steps done): copy
    from the most advanced holder, the lowest rank among equals. None when no rank holds state:
    the state then comes from the newest checkpoint."""
    holders = [rank for rank, (has_state, _) in enumerate(offers) if has_state]
    if not holders:
        return None
    best = max(offers[rank][1] for rank in holders)
    source = min(rank for rank in holders if offers[rank][1] == best)
    behind = frozenset(rank for rank, (has_state, step) in enumerate(offers) if not (has_state and step == best))
    return PeerCopy(source, behind)
