"""A JAX job's survivor saves as its state sync uses them: this process's part written without
the group (and said, recorded, and signalled like any save), and, at a restore, the one save
every process takes (process 0's finding, since each reads the directory at its own moment), or
none when any process cannot read it. The files are :mod:`.survivor_saves`'."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hotswap.api.worker_output import EVENT_CHECKPOINT_SAVE
from hotswap.train import runs
from hotswap.train.events import EventLog, say
from hotswap.train.jax.runtime import JaxGroup
from hotswap.train.jax.survivor_saves import SurvivorSave, SurvivorSaves, SurvivorSaveUnreadable
from hotswap.train.jax.trees import HostSnapshot
from hotswap.train.rendezvous import first_line

if TYPE_CHECKING:
    from hotswap.train.jax.checkpoints import OrbaxCheckpoints, Restored

log = logging.getLogger("hotswap.train")


class Survivors:
    def __init__(self, group: JaxGroup, events: EventLog, attempt: int) -> None:
        self.group = group
        self.events = events
        self.attempt = attempt  # the workload's attempt (HOTSWAP_ATTEMPT): names this process's parts

    def write(self, checkpoints: OrbaxCheckpoints, held: HostSnapshot, template: Any, reason: str) -> bool:
        """This process's part of the survivor save of the state it holds; False if it failed
        (said in one line: the restart then takes the newest orbax checkpoint)."""
        step, started = held.counters["step"], time.monotonic()
        try:
            size = SurvivorSaves(checkpoints.directory).write(
                attempt=self.attempt, rank=self.group.rank, template=template, counters=held.counters,
                shards=held.shards, leaves=held.leaves, objects=held.objects, reason=reason,
            )
        except (OSError, TypeError) as error:
            log.warning("hotswap: the %s save of step %d failed: %s", reason, step, error)
            return False
        seconds = time.monotonic() - started
        runs.mark_saved(Path(checkpoints.directory), reason)
        self.events.record(
            EVENT_CHECKPOINT_SAVE, step=step, blocking_s=round(seconds, 6), total_s=round(seconds, 6), bytes=size,
            reason=reason,
        )
        say(f"checkpoint saved step={step} reason={reason} seconds={seconds:.3f} by a survivor (its part, without the group)")
        return True

    def restore(self, checkpoints: OrbaxCheckpoints, template: Any, leaf_names: list[str]) -> Restored | None:
        """The survivors' save of the attempt before, when it is complete and newer than the
        newest orbax checkpoint; None (on every process alike) otherwise."""
        found, from_source = self._agreed(checkpoints)
        if found is None:
            return None
        from hotswap.train.jax.checkpoints import Restored  # loaded with orbax, by now

        saves = SurvivorSaves(found.directory)
        try:
            read, problem = saves.read(found, template, leaf_names), ""
        except (OSError, ValueError, SurvivorSaveUnreadable) as error:
            read, problem = None, first_line(error)
        if self.group.world_size > 1 and not all(ok for [ok] in self.group.all_gather_ints([int(read is not None)])):
            read = None
        if read is None:
            if problem:
                log.warning("hotswap: the survivors' save of step %d cannot be read: %s", found.step, problem)
                if self.group.rank == 0:
                    saves.set_aside(found, f"it cannot be read ({problem})")
            return None
        return Restored(found.step, read.state, read.objects, read.counters, read.reason, resumed=from_source)

    def _agreed(self, checkpoints: OrbaxCheckpoints) -> tuple[SurvivorSave | None, bool]:
        """Process 0's newest survivor save, on every process (True: in the resume source)."""
        found, from_source = _newest(checkpoints)
        if self.group.world_size == 1:
            return found, from_source
        mine = [int(found is not None), found.step if found else 0, found.attempt if found else 0, int(from_source)]
        [has, step, attempt, source] = self.group.all_gather_ints(mine)[0]
        directory = checkpoints.fallback if source else checkpoints.directory
        return (SurvivorSave(Path(directory or ""), step, attempt) if has else None), bool(source)


def _newest(checkpoints: OrbaxCheckpoints) -> tuple[SurvivorSave | None, bool]:
    """This run's newest complete survivor save newer than its newest orbax checkpoint; while
    this run has neither, its resume source's (True: from there)."""
    newest = checkpoints.complete_step()
    own = SurvivorSaves(checkpoints.directory).newest_complete(newer_than=newest)
    source = checkpoints.fallback
    if own is not None or newest is not None or not source or not Path(source).is_dir():
        return own, False
    found = SurvivorSaves(source).newest_complete(newer_than=checkpoints.complete_step(source))
    return found, found is not None
