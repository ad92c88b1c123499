"""The JAX job's state on the move: the :class:`~hotswap.train.protocols.ReplicaState` of
:mod:`hotswap.train.jax`.

When a group forms, every process ends up holding the same step: a survivor of the previous
generation takes its own shards back from its handoff, a joining slice receives a survivor
slice's shards (host by host, through the new group's collectives), and when no process holds
state every process reads the newest orbax checkpoint, resharded onto the new mesh. Which rank
is the source is the neutral :func:`~hotswap.train.progress.plan_peer_copy`.
"""

from __future__ import annotations

import logging
import pickle
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jax

from hotswap.api.worker_output import restore_source
from hotswap.train import runs
from hotswap.train.events import EventLog, announce_restore
from hotswap.train.files import FinalSaveFailed, fresh_start_refusal
from hotswap.train.jax.handoff import Handoff, MembershipChange
from hotswap.train.jax.objects import ObjectRegistry
from hotswap.train.jax.runtime import JaxGroup
from hotswap.train.jax.trees import (
    HostSnapshot,
    agree_with_first_holders,
    any_deleted,
    broadcast_bytes,
    broadcast_shards,
    leaf_names,
    leaves_with_paths,
    local_shards,
    place_local_data,
    plain,
    rebuild,
)
from hotswap.train.jax.survivors import Survivors
from hotswap.train.progress import Progress, plan_peer_copy
from hotswap.train.rendezvous import first_line
from hotswap.train.save_leases import SaveLeases

if TYPE_CHECKING:
    from hotswap.train.jax.checkpoints import OrbaxCheckpoints

log = logging.getLogger("hotswap.train")

WRITE_WAIT_S = 10.0  # how long leaving waits for a save in flight


class JaxStateSync:
    """Size: JAX's one ReplicaState. Which state every process ends up with (its own handoff, a
    peer slice's shards, a survivor save, orbax, process 0's at a fresh start) is decided in one
    place, where the sources are weighed against each other; the formats and the transfers live
    in trees, checkpoints, survivors and handoff."""

    def __init__(
        self,
        group: JaxGroup,
        progress: Progress,
        events: EventLog,
        *,
        hosts_per_slice: int,
        async_checkpoints: bool,
        snapshot_every: int | None,
        handoff: Handoff | None,
        cause: str | None = None,
        allow_fresh_start: bool = False,
        attempt: int = 1,
        grace_period_s: float = 30.0,
        sync_initial_state: bool = True,
    ) -> None:
        self.cause = cause  # why this worker generation started (HOTSWAP_START_CAUSE)
        self.grace_period_s = grace_period_s  # the longest a restore waits for the attempt before's saves
        self.sync_initial_state = sync_initial_state  # a fresh start takes process 0's state
        self.leases: SaveLeases | None = None  # this process's save lease; the earlier attempts' are waited for
        self.survivors = Survivors(group, events, attempt)
        self.allow_fresh_start = allow_fresh_start  # HOTSWAP_ALLOW_FRESH_START
        self.group = group
        self.progress = progress
        self.events = events
        self.hosts_per_slice = max(1, hosts_per_slice)
        self.async_checkpoints = async_checkpoints
        self.snapshot_every = snapshot_every
        self.objects = ObjectRegistry()
        self.template: Any = None
        self.current: Any = None  # the live state: what the last step assigned
        # The last state known to be computed (the step's arrays come asynchronously and may
        # turn out to be the failed computation), with its counters and objects.
        self.committed: tuple[Any, dict[str, int], dict[str, Any]] | None = None
        self.checkpoints: OrbaxCheckpoints | None = None
        self.snapshot: HostSnapshot | None = None
        self.force_snapshot = False  # take one at the next boundary whatever the period
        self._objects_now: dict[str, Any] = {}  # the objects' states at the last boundary
        self._handoff = handoff

    # What the run registers and updates --------------------------------------------------------

    def register(self, state: Any, objects: dict[str, object]) -> None:
        for name, obj in objects.items():
            self.objects.register(name, obj)
        self.template = self.current = state

    def at_boundary(self) -> None:
        """Between steps: remember the objects' states that go with the live arrays, and take
        the host snapshot when one is due."""
        self._objects_now = self.objects.state()
        every, step = self.snapshot_every, self.progress.step
        due = self.force_snapshot or bool(every and step and step % every == 0)
        self.force_snapshot = False
        if due and (self.snapshot is None or self.snapshot.counters["step"] != step):
            self.snapshot = HostSnapshot(
                self._counters(), local_shards(self.current), self._leaves(), self._objects_now
            )

    def commit(self) -> None:
        """After the ranks agreed at a boundary (their collectives ran after the step's): the
        live state, if it is computed and not a failure, is the one to fall back on."""
        state = self.current
        if state is None or any_deleted(state) or not all(leaf.is_ready() for leaf in _arrays(state)):
            return
        try:
            jax.block_until_ready(state)  # ready already: this only surfaces a failure
        except Exception:
            return
        self.committed = (state, self._counters(), self._objects_now)

    def handoff(self, change: MembershipChange, attempts: int, live: bool = True) -> Handoff:
        """What this process hands its next program: the live state if its arrays are intact
        (not with ``live=False``: another thread is computing with them), else the last state
        known to be computed, else the last host snapshot, else nothing (the next generation
        then restores from a peer or the newest checkpoint)."""
        if self._handoff is not None:  # restarting again before the state was taken back
            held = self._handoff
            return Handoff(change, held.counters, held.shards, held.leaves, held.objects, attempts)
        found = self._held(live)
        if found is None:
            return Handoff(change, None, None, None, None, attempts)
        return Handoff(change, found.counters, found.shards, found.leaves, found.objects, attempts)

    def _held(self, live: bool) -> HostSnapshot | None:
        """This process's shards of the newest state it can vouch for, on the host: the live
        state (unless ``live`` is false), else the last one known to be computed, else the last
        host snapshot."""
        candidates = [self.committed] if self.committed else []
        if live:
            candidates.insert(0, (self.current, self._counters(), self._objects_now))
        if not self.progress.has_state:
            return None
        for state, counters, objects in candidates:
            if state is None or any_deleted(state):
                continue
            try:  # a step's result is computed asynchronously: it may be the failed computation
                shards = local_shards(state)
            except Exception as error:
                log.warning("hotswap: the state of step %d cannot be read (%s)", counters["step"], first_line(error))
                continue
            return HostSnapshot(counters, shards, self._leaves(), objects)
        return self.snapshot

    def attach(self, checkpoints: OrbaxCheckpoints) -> None:
        """Save into ``checkpoints`` (its directory prepared), holding this process's save lease
        there from now on (see :mod:`hotswap.train.save_leases`)."""
        self.checkpoints = checkpoints
        self.leases = SaveLeases(checkpoints.directory, self.survivors.attempt)
        self.leases.hold()

    # ReplicaState -----------------------------------------------------------------------------

    def receive(self, handoff: Handoff) -> None:
        """The handoff a successor run ahead received at its first step (see successor)."""
        self._handoff = handoff

    def synchronise(self, interrupted: Callable[[], bool]) -> None:
        """Every rank at the same step: the most advanced holder's (itself, after a handoff;
        a survivor slice's, for a joining slice), else the newest checkpoint."""
        if self.template is None:
            raise RuntimeError("register the state (run.register(state, ...)) before the first step")
        started = time.monotonic()
        self._take_handoff()
        if self.group.world_size == 1:
            if not self.progress.has_state:
                self._restore_from_disk(started)
            return
        # The counters and objects a source would send, pickled: every rank offers their size
        # with its step, so that they travel with the shards (one collective, not three).
        extra = pickle.dumps((self._counters(), self._objects_now)) if self.progress.has_state else b""
        offers = self.group.all_gather_ints([int(self.progress.has_state), self.progress.step, len(extra)])
        copy = plan_peer_copy([(bool(has), step) for has, step, _ in offers])
        if copy is None:
            self._restore_from_disk(started)
            return
        if not copy.receivers:
            return
        rank, hosts = self.group.rank, self.hosts_per_slice
        source_slice, extra_size = copy.source // hosts, offers[copy.source][2]
        received, attached = None, b""
        for host in range(hosts):
            sender = source_slice * hosts + host
            carries = extra_size if sender == copy.source else 0  # the source's host sends them along
            data, attachment = broadcast_shards(
                self.template, self.current if rank == sender else None, rank == sender,
                extra if rank == sender and carries else b"", carries,
            )
            attached = attachment or attached
            if rank % hosts == host:
                received = data
        if rank in copy.receivers:
            assert received is not None
            counters, objects = pickle.loads(attached)
            self.current = place_local_data(self.template, received)
            self.objects.load(objects)
            self._objects_now = self.objects.state()
            self._adopt(counters, on_disk=False)
            self._announce_restore("peer", started)

    def can_start_save(self) -> bool:
        return self.checkpoints is not None and not self.checkpoints.busy

    def save_periodic(self) -> None:
        self._save("periodic", wait=not self.async_checkpoints)

    def save_last(self, reason: str) -> bool:
        """Every rank writes its shards (unless that step is on disk already); rank 0 reports."""
        if self.checkpoints is None:
            return False
        self.checkpoints.wait()
        if self.checkpoints.latest_step() != self.progress.step:
            try:
                failure = self._save(reason, wait=True)
            except Exception as error:  # orbax's (tensorstore's) storage errors are not OSErrors
                if reason != "final":
                    raise
                failure = first_line(error)
            if failure and reason == "final":
                raise FinalSaveFailed(f"hotswap: the final checkpoint of step {self.progress.step} could not be saved: {failure}")
        return self.group.rank == 0

    def save_own(self, reason: str) -> None:
        """Without the group (a peer is gone, the job is not elastic): an orbax save needs every
        process, so this process writes the shards it holds as its part of a survivor save
        (:mod:`.survivor_saves`); the survivors' parts together are the replica the restart
        resumes from. A save still in flight never completes (it ends at a barrier of the group).
        One line says what the next run starts from when there is nothing to write."""
        if not self.progress.has_state or self.checkpoints is None:
            return
        newest = self.checkpoints.complete_step()
        if self.checkpoints.busy:
            self.checkpoints.abandon()
        held = self._held(live=True)
        if held is not None and (newest is None or held.counters["step"] > newest):
            if self.survivors.write(self.checkpoints, held, self.template, reason):
                return
        if newest is not None and newest >= self.progress.step:
            return
        log.warning(
            "hotswap: no %s save of step %d without the group: the next run starts from %s", reason, self.progress.step,
            "the beginning" if newest is None else f"the newest complete checkpoint (step {newest})",
        )

    def wait_for_writes(self) -> None:
        """Finish the writes in flight: this process's last (it is ending)."""
        try:
            if self.group.peers_lost:  # a save in flight ends at a barrier of the group: it cannot finish
                return
            if self.checkpoints is not None and not self.checkpoints.wait(WRITE_WAIT_S):
                log.warning("hotswap: a checkpoint save did not finish in %gs: its peers are gone", WRITE_WAIT_S)
        finally:
            if self.leases is not None:
                self.leases.release()

    # Inside ---------------------------------------------------------------------------------

    def _save(self, reason: str, wait: bool) -> str | None:
        """Save (``wait``: to the end); why it failed (said in a warning), or None."""
        assert self.checkpoints is not None
        try:
            self.checkpoints.save(
                self.progress.step, self.current, self._objects_now, self._counters(), reason, wait=wait
            )
        except OSError as error:
            log.warning("hotswap: %s checkpoint of step %d failed: %s", reason, self.progress.step, error)
            return str(error)
        return None

    def _take_handoff(self) -> None:
        handoff, self._handoff = self._handoff, None
        if handoff is None or handoff.counters is None or handoff.shards is None:
            return
        state = rebuild(self.template, handoff.shards) if handoff.leaves == self._leaves() else None
        if state is None:
            log.warning(
                "hotswap: the state held before the restart does not fit the registered state on this "
                "mesh (sharded across slices, or a different tree): taking it from a peer or a checkpoint"
            )
            return
        self.current = state
        self.objects.load(handoff.objects or {})
        self._objects_now = self.objects.state()
        self._adopt(handoff.counters, on_disk=False)

    def _restore_from_disk(self, started: float) -> None:
        waited_s = 0.0
        if self.leases is not None:  # the survivors of the attempt before may still be saving
            waited_s = self.leases.wait_for_earlier(self.grace_period_s)
        restored = None
        if self.checkpoints is not None:
            restored = self.survivors.restore(self.checkpoints, self.template, self._leaves())
            restored = restored or self.checkpoints.restore_latest(self.template)
        if restored is None and self.checkpoints is not None:
            # Every process sees the same directories, so every one refuses alike.
            roots = [Path(p) for p in (self.checkpoints.directory, self.checkpoints.fallback) if p]
            refusal = fresh_start_refusal(roots, self.allow_fresh_start)
            if refusal is not None:
                raise refusal
        self.progress.has_state = True
        if self.checkpoints is not None and self.group.rank == 0:
            runs.mark_running(Path(self.checkpoints.directory))  # no earlier run's migration is pending now
        if restored is None:
            self._agree_on_initial_state()
            return
        self.current = restored.state
        self.objects.load(restored.objects)
        self._objects_now = self.objects.state()
        self._adopt(restored.counters, on_disk=True)
        if restored.resumed and self.cause in (None, "start"):  # another run's state: this run resumes it
            self.cause = "resume"
        self._announce_restore(restore_source(restored.reason, self.cause), started, waited_s)

    def _agree_on_initial_state(self) -> None:
        """A fresh start: every process takes process 0's registered state (each may have
        initialised its own from a seed of its own; JAX takes a replicated array's copies to be
        equal and never checks), as DDP does with the parameters at its construction: each
        shard from the first process holding it, and process 0's registered objects."""
        if self.group.world_size == 1 or not self.sync_initial_state or self.current is None:
            return
        self.current = agree_with_first_holders(self.current)
        mine = pickle.dumps(self.objects.state()) if self.group.rank == 0 else b""
        size = self.group.all_gather_ints([len(mine)])[0][0]
        objects = pickle.loads(broadcast_bytes(mine, size, self.group.rank == 0))
        if self.group.rank != 0:
            self.objects.load(objects)
        self._objects_now = self.objects.state()

    def _adopt(self, counters: dict[str, int], on_disk: bool) -> None:
        if on_disk:
            self.progress.load(counters)
            return
        self.progress.step = int(counters["step"])
        self.progress.elastic_down_events = int(counters["elastic_down_events"])
        self.progress.last_checkpoint_step = int(counters.get("last_checkpoint_step", 0))
        self.progress.has_state = True

    def _counters(self) -> dict[str, int]:
        return {**self.progress.counters(), "last_checkpoint_step": self.progress.last_checkpoint_step}

    def _leaves(self) -> list[str]:
        return leaf_names(self.template)

    def _announce_restore(self, source: str, started: float, waited_s: float = 0.0) -> None:
        announce_restore(self.events, self.progress.step, source, self.cause, started, waited_s)


def _arrays(tree: Any) -> list[jax.Array]:
    return [plain(leaf) for _, leaf in leaves_with_paths(tree) if isinstance(leaf, jax.Array)]
