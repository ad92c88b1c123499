"""Group formation for JAX: :class:`~hotswap.train.formation.GroupFormation`, except that a
process cannot re-form its group in place. Moving to a new generation is done by restarting the
process into it (:func:`~hotswap.train.jax.handoff.restart`):

1. the survivor waits, in its old program, for the generation that follows its own (leaving if
   its slice is not in it), exactly as the neutral formation does;
2. it leaves the old group, rank 0 last (it releases the coordination service, see
   :mod:`hotswap.train.jax.coordinator`; the one that will be rank 0 of the new generation
   started that generation's service while it still trained);
3. it hands its state to its next program and ``exec``s (into a keeper of its pid, if its next
   program was started ahead: :mod:`hotswap.train.jax.successor`; where readiness marks exist,
   that program has joined the new generation and run the script up to the state meanwhile,
   and the survivors moved only once every such program and every joiner was ready);
4. the next program joins the new generation, takes its state back (joining slices receive it
   from a survivor), and announces the change with the time it took from step 1.

The controller does nothing JAX-specific: it publishes generations and starts joiners, as for
PyTorch.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import NoReturn

from hotswap.api.membership import Membership
from hotswap.api.worker import CHECKPOINTED_EXIT_CODE, RESTART_EXIT_CODE, WorkerEnv
from hotswap.train.events import EventLog, say
from hotswap.train.formation import GroupFormation, mark_ready
from hotswap.train.jax.handoff import Handoff, MembershipChange
from hotswap.train.jax.runtime import JaxGroup
from hotswap.train.jax.successor import Ahead, Successor
from hotswap.train.jax.sync import JaxStateSync
from hotswap.train.progress import Progress
from hotswap.train.termination import Termination

# The longest survivors wait for their next programs to be ready (imports, and where run ahead
# the new group and the script up to its state: seconds on a busy machine) once the joiners are
# ready; then they move anyway.
SUCCESSORS_READY_TIMEOUT_S = 30.0


class RestartingFormation(GroupFormation):
    def __init__(
        self,
        env: WorkerEnv,
        group: JaxGroup,
        termination: Termination,
        state: JaxStateSync,
        progress: Progress,
        events: EventLog,
        *,
        membership_timeout_s: float,
        handoff: Handoff | None,
        restart: Callable[[Handoff], NoReturn],
    ) -> None:
        super().__init__(env, group, termination, state, progress, events, membership_timeout_s=membership_timeout_s)
        self.jax_group = group
        self.jax_state = state
        self.change = handoff.change if handoff else None  # the move this program finishes
        self.attempts = handoff.attempts if handoff else 0  # elastic retries so far
        self._restart = restart
        self._moving = threading.Lock()  # held by whichever thread moves the process on
        self._successor = Successor()
        self._successors_pending_since: dict[int, float] = {}  # generation -> first seen waiting for them

    def recover(self, timed_out: bool = False, since: float | None = None) -> None:
        if not self.elastic:  # the group is left for a restart: nothing waits on the lost peers
            self.jax_group.peers_lost = True
        super().recover(timed_out, since)

    def join_first(self) -> None:
        if self.change is not None and self.elastic:
            self._form_elastic_group(after_generation=self.change.after_generation, fresh=False)
        else:
            super().join_first()

    def newest_membership(self) -> Membership | None:
        """The newest generation published so far (None when not elastic)."""
        return self._watcher.poll() if self._watcher else None

    def newest_generation(self) -> int:
        """As for every framework, but a generation that adds slices is taken only once the
        survivors' next programs are ready too (their marks, see :meth:`_successors_ready`).
        One that adds none is taken at once: it may be removing a slice whose worker is being
        stopped, and its stop vote would otherwise stop the whole group."""
        latest = self.newest_membership()
        self._prepare(latest)
        newest = super().newest_generation()
        current = self.membership
        if latest is None or current is None or newest != latest.generation or newest <= current.generation:
            return newest
        if not latest.joiners(current):
            return newest
        return newest if self._successors_ready(latest, current) else current.generation

    def _prepare(self, latest: Membership | None) -> None:
        """While this process trains on: if it will be rank 0 of a published generation, start
        that generation's coordination service now, so that the group forms without waiting
        for it (the survivors train on until the joiners are ready anyway); start and import
        its next program (:mod:`.successor`)."""
        current = self.membership
        if latest is None or current is None or latest.generation <= current.generation or latest.world_size == 1:
            return
        rank = latest.rank_of(self.env.slice_name, self.env.host_index)
        if rank == 0:
            self.jax_group.prepare_service(latest.master_addr, latest.master_port, latest.world_size)
        if rank is None:
            return
        mark = latest.joined_mark(self.env.slice_name, self.env.host_index, self.env.local_rank)
        on_main_thread = threading.current_thread() is threading.main_thread()
        if self._successor.generation not in (None, latest.generation) and on_main_thread:
            self._successor.stop()  # it runs ahead for a generation that will not form
        if not self._successor.started and on_main_thread:
            # The next program, imported (and, with marks, run up to the state) while this one
            # trains on; without marks nobody would wait for it to get that far.
            ahead = Ahead(current.generation, latest.generation, self.attempts + 1, self.jax_group.prepared_service())
            self._successor.start(mark, ahead if mark is not None else None)
        elif self._successor.started and not self._successor.ready and mark is not None:
            mark_ready(mark)  # it died: this survivor restarts plainly, and holds nobody back

    def _successors_ready(self, latest: Membership, current: Membership) -> bool:
        """Whether the next program of every survivor is ready for its state (its mark exists;
        without marks, or after :data:`SUCCESSORS_READY_TIMEOUT_S`, the survivors move anyway):
        a survivor whose successor still imports would make the whole new group wait for it."""
        staying = [slice_name for slice_name in latest.slices if slice_name in current.slices]
        if all(map(os.path.exists, latest.marks_of(staying))):
            return True
        seen = self._successors_pending_since.setdefault(latest.generation, time.monotonic())
        return time.monotonic() - seen >= SUCCESSORS_READY_TIMEOUT_S

    def receive(self, handoff: Handoff) -> None:
        """A successor run ahead has its survivor's handoff: the move it finishes."""
        self.change, self.attempts = handoff.change, handoff.attempts

    def finish_change(self) -> None:
        """Once the state is synchronised: the move the previous program began is done."""
        change, self.change = self.change, None
        if change is not None and change.previous_slices is not None:
            self._lost_at_timeout = change.timed_out  # as the previous program saw the loss
            self._announce_change(change.previous_slices, change.started, change.failed)

    def _form(self, membership: Membership, rank: int) -> bool:
        if self.jax_group.used:  # a generation that did not form: only a new process can try the next
            self._claim()
            self.restart_into(membership.generation - 1, failed=True)
        return super()._form(membership, rank)

    def _change_membership(self, failed: bool) -> None:
        """Restart into the generation after this one (see the module)."""
        started = self._change_began()
        previous = self.membership
        assert previous is not None
        self._claim()
        newest = self._await_membership(previous.generation, fresh=False)
        if not failed:
            # A healthy group can finish the save in flight, but only before it leaves: the
            # save ends at a barrier of the group's processes (it failed after 10 s otherwise).
            self.jax_state.wait_for_writes()
        self.jax_group.leave(_staying(previous, newest))
        if newest.rank_of(self.env.slice_name, self.env.host_index) is None:
            say(f"leaving: slice {self.env.slice_name} is not in membership generation {newest.generation}")
            self.termination.exit(CHECKPOINTED_EXIT_CODE, "removed")
        change = MembershipChange(
            previous.generation, len(previous.slices), started, failed, self._lost_at_timeout if failed else None
        )
        self._hand_over(self.jax_state.handoff(change, self.attempts + 1))

    def restart_into(
        self, after_generation: int, *, failed: bool, live: bool = True, since: float | None = None
    ) -> NoReturn:
        """Restart this process to join the first generation after ``after_generation`` (a move
        that began at ``since``, ``time.monotonic()``; now when not told)."""
        if self.change is not None:  # still finishing the previous move: it goes on
            change = dataclasses.replace(self.change, after_generation=after_generation)
        else:
            slices = len(self.membership.slices) if self.membership else None
            change = MembershipChange(after_generation, slices, time.monotonic() if since is None else since, failed)
        self._hand_over(self.jax_state.handoff(change, self.attempts + 1, live=live))

    def _hand_over(self, handoff: Handoff) -> NoReturn:
        """Restart, handing the next program the state and a coordination service started ahead;
        into the successor started ahead if there is one (from the main thread: the successor
        dies with the thread that started it)."""
        handoff = dataclasses.replace(handoff, service=self.jax_group.prepared_service())
        newest = self.newest_membership()
        current = self._successor.generation in (None, newest.generation if newest else None)
        if self._successor.ready and current and threading.current_thread() is threading.main_thread():
            self._successor.take_over(handoff)
        self._successor.stop()
        self._restart(handoff)

    def abandon(self, newest: Membership, forming: int | None, since: float | None = None) -> None:
        """The watchdog's way out of a call that does not return (see :mod:`.watchdog`); the
        step stuck since ``since`` counts in the move's time."""
        if not self._moving.acquire(blocking=False):
            return  # the main thread is moving on already
        try:
            if forming is not None:  # no group formed: its service (if this is rank 0) serves nobody
                self.jax_group.stop_service()
                self.restart_into(forming, failed=False)
            previous = self.membership
            assert previous is not None
            self.jax_group.leave(_staying(previous, newest))
            self.restart_into(previous.generation, failed=True, live=False, since=since)
        except BaseException as error:  # the main thread waits for this one: never leave it hanging
            print(f"hotswap: cannot restart into generation {newest.generation}: {error}", file=sys.stderr, flush=True)
            os._exit(RESTART_EXIT_CODE)

    def _claim(self) -> None:
        """Only one thread moves the process on; if the watchdog does, this one waits for it."""
        if not self._moving.acquire(blocking=False):
            threading.Event().wait()


def _staying(previous: Membership, newest: Membership) -> set[int]:
    """The ranks of ``previous`` whose slices are members of ``newest``."""
    return {
        rank for rank in range(previous.world_size)
        if previous.slices[rank // previous.hosts_per_slice] in newest.slices
    }
