"""Forming this worker's process group and keeping it formed.

The first group comes from the worker environment, from the elastic membership file, or from
the training script itself. In an elastic workload a new group is formed at each membership
generation the controller publishes, or when a collective fails because a peer is gone: the
group is destroyed, the worker waits for the next generation that forms (leaving if its slice
is no longer a member), and the state is synchronised so that joiners get it from survivors.
A workload that is not elastic cannot re-form in place: it saves and asks for a restart.

Framework-neutral: the group, the state and the termination it drives are passed in.
"""

from __future__ import annotations

import logging
import os
import time
from typing import TYPE_CHECKING

from hotswap.api.membership import Membership
from hotswap.api.worker import CHECKPOINTED_EXIT_CODE, RESTART_EXIT_CODE, WorkerEnv
from hotswap.api.worker_output import EVENT_ELASTIC
from hotswap.train.events import EventLog, say
from hotswap.train.membership import MembershipWatcher
from hotswap.train.progress import Progress
from hotswap.train.rendezvous import GroupSpec, RendezvousFailed, first_line
from hotswap.train.termination import Termination

if TYPE_CHECKING:
    from hotswap.train.protocols import Group, ReplicaState

log = logging.getLogger("hotswap.train")

# The longest survivors keep training on the previous generation while the joiners of a new one
# start; after that they move anyway (and the rendezvous waits, as without marks).
JOINERS_READY_TIMEOUT_S = 120.0


class GroupFormation:
    """This worker's membership: the generation its group was formed for, and moving on."""

    def __init__(
        self,
        env: WorkerEnv,
        group: Group,
        termination: Termination,
        state: ReplicaState,
        progress: Progress,
        events: EventLog,
        *,
        membership_timeout_s: float,
    ) -> None:
        if env.membership_file and not env.slice_name:
            raise ValueError(
                "HOTSWAP_MEMBERSHIP_FILE is set but HOTSWAP_SLICE is not: an elastic worker must know its slice"
            )
        self.env = env
        self.group = group
        self.termination = termination
        self.state = state
        self.progress = progress
        self.events = events
        self.membership_timeout_s = membership_timeout_s
        self.membership: Membership | None = None  # the generation the group was formed for
        self._watcher = MembershipWatcher(env.membership_file) if env.membership_file else None
        self._pending_since: dict[int, float] = {}  # generation -> when first seen waiting for joiners
        self._deferred: Membership | None = None  # a first generation joined only at complete_join()
        self._lost_at_timeout: bool | None = None  # how recover() learned of the last lost peer
        self._since: float | None = None  # when the change under way began (see recover)

    @property
    def elastic(self) -> bool:
        return self._watcher is not None

    @property
    def slices(self) -> int:
        """Active slices: the current membership's, or the workload's when it is not elastic."""
        return len(self.membership.slices) if self.membership else self.env.num_slices

    @property
    def generation(self) -> int:
        return self.membership.generation if self.membership else 0

    def newest_generation(self) -> int:
        """The newest generation published so far that this worker's group should move to (the
        current one when not elastic). A generation that adds slices counts only once their
        workers are ready to form it (their marks, see ``Membership.joined_dir``), or after
        :data:`JOINERS_READY_TIMEOUT_S`: survivors train on meanwhile instead of waiting in the
        rendezvous while the joiners start."""
        latest = self._watcher.poll() if self._watcher else None
        if latest is None:
            return self.generation
        current = self.membership
        if current is None or latest.generation <= current.generation or all(map(os.path.exists, latest.joined_marks(current))):
            return latest.generation
        seen = self._pending_since.setdefault(latest.generation, time.monotonic())
        return latest.generation if time.monotonic() - seen >= JOINERS_READY_TIMEOUT_S else current.generation

    def interrupted(self) -> bool:
        """Whether a wait for the other members should give up: SIGTERM, or a newer generation."""
        return self.termination.requested or self.newest_generation() > self.generation

    # Forming -------------------------------------------------------------------------------

    def join_first(self, defer: bool = False) -> None:
        """Join the first group. ``defer`` (elastic only): take this worker's rank and the size
        from the membership now, but tell the survivors it is ready and form the group only at
        :meth:`complete_join`, when the script has built its model and wants the state: the
        survivors then train on while the script starts (torch's first optimizer alone imports
        for ~1 s) instead of waiting for it in the state's synchronisation."""
        if self._watcher is not None and defer:
            membership = self._await_membership(after_generation=-1, fresh=True)
            rank = membership.rank_of(self.env.slice_name, self.env.host_index, self.env.local_rank)
            assert rank is not None  # _await_membership accepts only a generation with this worker
            self.group.expect(
                GroupSpec(membership.generation, rank, membership.world_size, membership.master_addr, membership.master_port)
            )
            self._deferred = membership
        elif self._watcher is not None:
            self._form_elastic_group(after_generation=-1, fresh=True)
        elif not self.group.adopt_existing() and self.env.world_size > 1:
            spec = GroupSpec(0, self.env.rank, self.env.world_size, self.env.master_addr, self.env.master_port)
            try:
                self.group.form(spec, interrupted=lambda: self.termination.requested)
            except RendezvousFailed as error:
                if self.termination.requested:
                    self.termination.exit(CHECKPOINTED_EXIT_CODE, "terminated")
                self.termination.exit(
                    RESTART_EXIT_CODE, "rendezvous_failed", f"hotswap: cannot form the process group: {error}"
                )

    def complete_join(self) -> None:
        """Finish a deferred first join (see :meth:`join_first`); nothing otherwise."""
        membership, self._deferred = self._deferred, None
        if membership is None:
            return
        rank = membership.rank_of(self.env.slice_name, self.env.host_index, self.env.local_rank)
        assert rank is not None
        _mark_joined(membership, self.env.slice_name, self.env.host_index, self.env.local_rank)
        if not self._form(membership, rank):  # a newer generation came meanwhile: join that one
            self._form_elastic_group(after_generation=membership.generation, fresh=True)

    def _form_elastic_group(self, after_generation: int, fresh: bool) -> None:
        """Join the first generation newer than ``after_generation`` that forms. A fresh process
        waits for one that includes its slice; a survivor leaves if the newest one does not."""
        while True:
            membership = self._await_membership(after_generation, fresh)
            rank = membership.rank_of(self.env.slice_name, self.env.host_index, self.env.local_rank)
            if rank is None:
                say(f"leaving: slice {self.env.slice_name} is not in membership generation {membership.generation}")
                self.termination.exit(CHECKPOINTED_EXIT_CODE, "removed")
            if fresh:
                _mark_joined(membership, self.env.slice_name, self.env.host_index, self.env.local_rank)
            if self._form(membership, rank):
                return
            after_generation = membership.generation

    def _await_membership(self, after_generation: int, fresh: bool) -> Membership:
        assert self._watcher is not None
        slice_name, host, local_rank = self.env.slice_name, self.env.host_index, self.env.local_rank

        def acceptable(membership: Membership) -> bool:
            newer = membership.generation > after_generation
            return newer and (not fresh or membership.rank_of(slice_name, host, local_rank) is not None)

        membership = self._watcher.wait_for(acceptable, self.membership_timeout_s, lambda: self.termination.requested)
        if membership is None:
            if self.termination.requested:
                self.termination.stop_without_group()
            self.termination.exit(
                RESTART_EXIT_CODE,
                "no_membership",
                f"hotswap: no membership generation after {after_generation} with slice "
                f"{slice_name!r} within {self.membership_timeout_s:g}s",
            )
        return membership

    def _form(self, membership: Membership, rank: int) -> bool:
        """Form the group of ``membership``; False when it did not form (a member missing, or a
        newer generation published meanwhile)."""
        spec = GroupSpec(
            membership.generation, rank, membership.world_size, membership.master_addr, membership.master_port
        )
        try:
            self.group.form(
                spec,
                interrupted=lambda: self.termination.requested or self.newest_generation() > membership.generation,
            )
        except RendezvousFailed as error:
            if self.termination.requested:
                self.termination.stop_without_group()
            log.warning("hotswap: generation %d did not form: %s", membership.generation, error)
            return False
        self.membership = membership
        return True

    # Re-forming ----------------------------------------------------------------------------

    def reconfigure(self, generation: int, since: float | None = None) -> None:
        """Move to ``generation``, which the ranks agreed the controller has published (at the
        boundary that began at ``since``, ``time.monotonic()``: see :meth:`recover`)."""
        assert self._watcher is not None
        self._since = since
        # Another rank may have seen the new file first: read until this rank sees it too.
        self._watcher.wait_for(lambda m: m.generation >= generation, self.membership_timeout_s, lambda: False)
        self._change_membership(failed=False)

    def recover(self, timed_out: bool = False, since: float | None = None) -> None:
        """A collective failed: a peer is gone (``timed_out``: noticed only at the timeout).

        ``since`` (``time.monotonic()``) is when the work that failed began: the step, or the
        boundary whose collective failed. The elastic event's ``duration_s`` counts from there,
        not from this call: a survivor that waited in the failed collective until its timeout
        lost that time too (goodput counts it as elastic, not as a step).

        Call it after the handler of the collective's error, never inside: while an error is
        handled its traceback keeps the failed collective's frames, and with them the group,
        alive, and gloo closes a group's connections only when the group is freed. A survivor
        still waiting on this rank in that collective would wait for its timeout instead of
        seeing this rank leave (losing rank 0's slice of 3 cost 10 s this way)."""
        if self.elastic:
            self._lost_at_timeout, self._since = timed_out, since
            self._change_membership(failed=True)
            return
        # Not elastic: the group cannot be re-formed in place. Every survivor holds the same
        # replica at the last complete step and saves it (the store keeps the first of
        # identical saves), so the restart the controller makes loses nothing even when the
        # lost peer was rank 0.
        self.group.destroy()
        if self.termination.requested:
            self.termination.stop_without_group()
        self.state.save_own("recovery")
        self.termination.exit(
            RESTART_EXIT_CODE, "peer_lost", "hotswap: a peer was lost and the workload is not elastic"
        )

    def _change_membership(self, failed: bool) -> None:
        """Move to the next generation: after a failed collective, or because the controller
        published one. Survivors keep their state; joiners receive it from a survivor.

        A framework whose process group cannot be re-formed in place overrides this (JAX:
        :class:`hotswap.train.jax.formation.RestartingFormation` restarts the process)."""
        started = self._change_began()
        previous = self.membership
        assert previous is not None
        after = previous.generation
        while True:
            self.group.destroy()
            self._form_elastic_group(after_generation=after, fresh=False)
            try:
                self.state.synchronise(self.interrupted)
                break
            except Exception as error:
                if not self.group.is_peer_failure(error):
                    raise
                log.warning(
                    "hotswap: generation %d lost a member while forming: %s", self.generation, first_line(error)
                )
                after = self.generation
        self._announce_change(len(previous.slices), started, failed)

    def _change_began(self) -> float:
        """When the change under way began as this worker saw it (the failed step or
        collective, or the boundary that agreed on a new generation); now when not told."""
        since, self._since = self._since, None
        return min(since, time.monotonic()) if since is not None else time.monotonic()

    def _announce_change(self, previous_slices: int, started: float, failed: bool) -> None:
        """The membership change that began at ``started`` (``time.monotonic()``) is done: the
        elastic event's ``duration_s`` is the time from then until the group trains again."""
        if self.slices < previous_slices:
            self.progress.elastic_down_events += 1
        elapsed = time.monotonic() - started
        how: dict[str, object] = {"cause": "peer_failure" if failed else "membership"}
        if failed and self._lost_at_timeout is not None:
            how["timed_out"] = self._lost_at_timeout
        self.events.record(
            EVENT_ELASTIC, generation=self.generation, slices=self.slices, duration_s=round(elapsed, 6), **how
        )
        say(
            f"elastic generation={self.generation} slices={self.slices} world_size={self.group.world_size} "
            f"rank={self.group.rank} cause={'peer_failure' if failed else 'membership'} seconds={elapsed:.3f}"
        )


def _mark_joined(membership: Membership, slice_name: str, host: int, local_rank: int) -> None:
    """Tell the survivors this worker is ready to form ``membership`` (when it has marks)."""
    mark = membership.joined_mark(slice_name, host, local_rank)
    if mark is not None:
        mark_ready(mark)


def mark_ready(mark: str) -> None:
    """Create the readiness mark ``mark`` (see ``Membership.joined_dir``)."""
    try:
        os.close(os.open(mark, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600))  # owner-only
    except FileExistsError:
        pass
    except OSError as error:  # the survivors move after their timeout instead
        log.warning("hotswap: cannot mark this worker ready at %s: %s", mark, error)
