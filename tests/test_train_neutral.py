"""hotswap.train's framework-neutral pieces, in process and without PyTorch: the step-boundary
decision, the plan of a peer state copy, and group formation, boundaries and termination
driven through stand-ins for a framework's collectives and state (as a second framework's
would drive them)."""

from __future__ import annotations

import json
import os
import time
import types
import weakref
from collections.abc import Callable
from pathlib import Path

import pytest

from hotswap.api.membership import Membership
from hotswap.api.worker import CHECKPOINTED_EXIT_CODE, RESTART_EXIT_CODE, WorkerEnv
from hotswap.train import termination
from hotswap.train.boundary import Action, StepBoundary, Vote, decide, periodic_checkpoint_due
from hotswap.train.events import EventLog
from hotswap.train.formation import GroupFormation
from hotswap.train.lifecycle import RunLifecycle
from hotswap.train.progress import PeerCopy, Progress, plan_peer_copy
from hotswap.train.rendezvous import GroupSpec, RendezvousFailed
from hotswap.train.termination import Termination, TerminationRequest

# Pure decisions ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("elastic", "agreed", "generation", "action"),
    [
        (True, Vote(stop=True, generation=3, save=True), 2, Action.REFORM),  # a new group votes again
        (True, Vote(stop=True, generation=2, save=True), 2, Action.STOP),  # a stop saves anyway
        (True, Vote(stop=False, generation=2, save=True), 2, Action.SAVE),
        (True, Vote(stop=False, generation=2, save=False), 2, Action.CONTINUE),
        (True, Vote(stop=False, generation=1, save=False), 2, Action.CONTINUE),  # an older file changes nothing
        (False, Vote(stop=False, generation=5, save=False), 0, Action.CONTINUE),  # only elastic jobs re-form
        (False, Vote(stop=True, generation=0, save=False), 0, Action.STOP),
    ],
)
def test_every_rank_takes_one_action_at_a_boundary(
    elastic: bool, agreed: Vote, generation: int, action: Action
) -> None:
    assert decide(agreed, generation, elastic) is action


def test_votes_travel_as_integers_agreed_by_maximum() -> None:
    vote = Vote(stop=True, generation=7, save=False)
    assert vote.as_ints() == [1, 7, 0]
    assert Vote.from_ints(vote.as_ints()) == vote


@pytest.mark.parametrize(
    ("step", "total", "last", "every", "due"),
    [
        (100, 1000, 0, 100, True),
        (99, 1000, 0, 100, False),
        (250, 1000, 100, 100, True),  # a save put off while the previous one was writing
        (1000, 1000, 900, 100, False),  # the final checkpoint follows instead
        (500, 1000, 0, None, False),
        (200, 1000, 151, 50, True),  # resumed at 151: the saves fall on 200, 250, ... (issue 33)
        (201, 1000, 200, 50, False),  # not 201, 50 steps after a restore at 151
        (199, 1000, 151, 50, False),
        (251, 1000, 200, 50, True),  # 250 was put off (a save in flight): the next boundary
        (300, 1000, 251, 50, True),  # and back on the multiples
    ],
)
def test_periodic_checkpoints_are_due_on_multiples_of_every_before_the_last(
    step: int, total: int, last: int, every: int | None, due: bool
) -> None:
    assert periodic_checkpoint_due(step, total, last, every) is due


@pytest.mark.parametrize(
    ("offers", "plan"),
    [
        ([(False, 0), (False, 0)], None),  # nobody holds state: read the newest checkpoint
        ([(True, 5), (True, 5)], PeerCopy(0, frozenset())),  # already the same everywhere
        ([(True, 5), (False, 0), (True, 5)], PeerCopy(0, frozenset({1}))),  # a joiner
        ([(True, 3), (True, 5), (True, 5)], PeerCopy(1, frozenset({0}))),  # the most advanced, lowest rank
        ([(False, 9), (True, 2)], PeerCopy(1, frozenset({0}))),  # a step without state counts for nothing
    ],
)
def test_ranks_take_the_state_of_the_most_advanced_holder(offers: list[tuple[bool, int]], plan: PeerCopy) -> None:
    assert plan_peer_copy(offers) == plan


# Stand-ins for a framework's collectives and state ----------------------------------------------


class PeerLost(Exception):
    pass


class Group:
    """Forms what it is asked to (``form`` may refuse), and agrees with scripted peers' votes."""

    def __init__(
        self,
        rank: int = 0,
        world_size: int = 1,
        form: Callable[[GroupSpec], None] = lambda spec: None,
        peer_votes: list[list[int] | Exception] | None = None,
    ) -> None:
        self.spec: GroupSpec | None = GroupSpec(0, rank, world_size, "", 0)
        self.attempts: list[GroupSpec] = []
        self.destroyed = 0
        self._form = form
        self.peer_votes = peer_votes or []

    @property
    def rank(self) -> int:
        return self.spec.rank if self.spec else 0

    @property
    def world_size(self) -> int:
        return self.spec.world_size if self.spec else 1

    @staticmethod
    def is_peer_failure(error: BaseException) -> bool:
        return isinstance(error, (PeerLost, RendezvousFailed))

    def adopt_existing(self) -> bool:
        return False

    def expect(self, spec: GroupSpec) -> None:
        self.spec = spec

    def form(self, spec: GroupSpec, interrupted: Callable[[], bool]) -> None:
        self.attempts.append(spec)
        self._form(spec)
        self.spec = spec

    def destroy(self, before_teardown: bool = False) -> None:
        self.destroyed += 1
        self.spec = None

    def agree_max(self, values: list[int]) -> list[int]:
        peers = self.peer_votes.pop(0)
        if isinstance(peers, Exception):
            raise peers
        return [max(mine, theirs) for mine, theirs in zip(values, peers)]


class State:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def synchronise(self, interrupted: Callable[[], bool]) -> None:
        self.calls.append("synchronise")

    def can_start_save(self) -> bool:
        return True

    def save_periodic(self) -> None:
        self.calls.append("periodic")

    def save_last(self, reason: str) -> bool:
        self.calls.append(reason)
        return True

    def save_own(self, reason: str) -> None:
        self.calls.append(f"own {reason}")

    def wait_for_writes(self) -> None:
        pass


@pytest.fixture
def leaving(monkeypatch: pytest.MonkeyPatch) -> list[tuple[object, ...]]:
    """Exit handlers a worker registers to end at once: kept from ending pytest."""
    registered: list[tuple[object, ...]] = []
    monkeypatch.setattr(termination, "atexit", types.SimpleNamespace(register=lambda *args: registered.append(args)))
    return registered


def ending(tmp_path: Path, group: Group, state: State, progress: Progress, sigterm: bool = False) -> Termination:
    request = TerminationRequest(grace_period_s=30.0)
    if sigterm:
        request.requested_at = time.monotonic()
    return Termination(request, group, state, progress, EventLog(str(tmp_path / "events.jsonl")))


def stop_event(tmp_path: Path) -> dict[str, object]:
    records = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    [stop] = [record for record in records if record["kind"] == "stop"]
    return {key: stop[key] for key in ("step", "reason", "exit_code")}


def publish(path: Path, generation: int, slices: tuple[str, ...]) -> None:
    temporary = path.with_suffix(".tmp")
    temporary.write_text(Membership(generation, slices, 1, "127.0.0.1", 1000 + generation).to_json())
    os.replace(temporary, path)


# Group formation ---------------------------------------------------------------------------------


def worker(
    tmp_path: Path, env: WorkerEnv, group: Group, state: State, progress: Progress, sigterm: bool = False
) -> GroupFormation:
    stop = ending(tmp_path, group, state, progress, sigterm)
    return GroupFormation(env, group, stop, state, progress, EventLog(None), membership_timeout_s=5.0)


def elastic_worker(tmp_path: Path, group: Group, slice_name: str) -> GroupFormation:
    env = WorkerEnv(slice_name=slice_name, num_slices=3, membership_file=str(tmp_path / "membership.json"))
    return worker(tmp_path, env, group, State(), Progress())


def test_an_elastic_worker_joins_the_first_generation_that_forms_at_its_rank(tmp_path: Path) -> None:
    publish(tmp_path / "membership.json", 1, ("a", "b"))

    def form(spec: GroupSpec) -> None:
        if spec.generation == 1:
            publish(tmp_path / "membership.json", 2, ("c", "b", "a"))  # the controller moved on meanwhile
            raise RendezvousFailed("slice a never came")

    group = Group(form=form)
    formation = elastic_worker(tmp_path, group, "b")
    formation.join_first()
    assert [spec.generation for spec in group.attempts] == [1, 2]
    assert group.spec == GroupSpec(2, 1, 3, "127.0.0.1", 1002)
    assert (formation.generation, formation.slices, formation.elastic) == (2, 3, True)


def test_a_survivor_whose_slice_was_removed_leaves_with_the_checkpointed_code(
    tmp_path: Path, leaving: list[tuple[object, ...]], capsys: pytest.CaptureFixture[str]
) -> None:
    publish(tmp_path / "membership.json", 1, ("a", "b"))
    group = Group()
    formation = elastic_worker(tmp_path, group, "b")
    formation.join_first()
    publish(tmp_path / "membership.json", 2, ("a",))
    with pytest.raises(SystemExit) as exited:
        formation.reconfigure(2)
    assert exited.value.code == CHECKPOINTED_EXIT_CODE
    assert "leaving: slice b is not in membership generation 2" in capsys.readouterr().out
    assert stop_event(tmp_path) == {"step": 0, "reason": "removed", "exit_code": CHECKPOINTED_EXIT_CODE}
    assert group.destroyed and leaving


@pytest.mark.parametrize(
    ("sigterm", "save", "code", "reason"),
    [
        (False, "own recovery", RESTART_EXIT_CODE, "peer_lost"),
        (True, "own termination", CHECKPOINTED_EXIT_CODE, "terminated"),
    ],
)
def test_without_elasticity_a_lost_peer_saves_the_replica_and_exits(
    tmp_path: Path, leaving: list[tuple[object, ...]], sigterm: bool, save: str, code: int, reason: str
) -> None:
    group, state, progress = Group(), State(), Progress(step=7, has_state=True)
    env = WorkerEnv(rank=1, world_size=2)
    formation = worker(tmp_path, env, group, state, progress, sigterm)
    formation.join_first()
    assert group.spec == GroupSpec(0, 1, 2, env.master_addr, env.master_port)
    with pytest.raises(SystemExit) as exited:
        formation.recover()
    assert exited.value.code == code and state.calls == [save]
    assert stop_event(tmp_path) == {"step": 7, "reason": reason, "exit_code": code}


# Step boundaries ---------------------------------------------------------------------------------


class Formation:
    """A group already formed at generation 1, told of newer ones."""

    def __init__(self, published: int = 1) -> None:
        self.elastic, self.generation, self.published = True, 1, published
        self.calls: list[str] = []

    def newest_generation(self) -> int:
        return self.published

    def reconfigure(self, generation: int, since: float | None = None) -> None:
        self.calls.append(f"reconfigure {generation}")
        self.generation = generation

    def recover(self, timed_out: bool = False, since: float | None = None) -> None:
        self.calls.append("recover after a timeout" if timed_out else "recover")


def boundary(tmp_path: Path, group: Group, formation: Formation, progress: Progress) -> StepBoundary:
    state = State()
    stop = ending(tmp_path, group, state, progress)
    return StepBoundary(group, formation, stop, state, progress, checkpoint_every=10)


def test_a_new_generation_re_forms_the_group_which_then_agrees_again(tmp_path: Path) -> None:
    formation = Formation(published=2)
    group = Group(rank=1, world_size=2, peer_votes=[[0, 2, 0], [0, 2, 0]])
    boundary(tmp_path, group, formation, Progress(step=3)).cross(total=100)
    assert formation.calls == ["reconfigure 2"] and not group.peer_votes


def test_a_peer_lost_while_agreeing_is_recovered_and_the_boundary_crossed(tmp_path: Path) -> None:
    formation = Formation()
    group = Group(rank=0, world_size=2, peer_votes=[PeerLost("gloo: connection closed by peer"), [0, 1, 0]])
    boundary(tmp_path, group, formation, Progress(step=3)).cross(total=100)
    assert formation.calls == ["recover"]


class Collective:
    """What a failed torch collective leaves in the frames its error's traceback keeps: the
    group, whose connections gloo closes only when it is freed."""


class FailingOnce(Group):
    """Its first vote fails as gloo fails it; the next one agrees (the re-formed group)."""

    def __init__(self, error: str) -> None:
        super().__init__(rank=1, world_size=3)
        self.error, self.held = error, []

    def agree_max(self, values: list[int]) -> list[int]:
        if self.held:
            return values
        collective = Collective()
        self.held.append(weakref.ref(collective))
        raise PeerLost(self.error)


class Recovering(Formation):
    def __init__(self, group: FailingOnce) -> None:
        super().__init__()
        self.group = group

    def recover(self, timed_out: bool = False, since: float | None = None) -> None:
        super().recover(timed_out)
        self.calls.append("collective still held" if self.group.held[0]() is not None else "collective released")


@pytest.mark.parametrize(
    ("error", "recovery"),
    [
        ("[gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:7555", "recover"),
        ("[gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 10000ms for recv operation", "recover after a timeout"),
    ],
)
def test_a_peer_lost_while_agreeing_is_recovered_once_the_failed_collective_is_released(
    tmp_path: Path, error: str, recovery: str
) -> None:
    """A survivor that re-forms while the failed collective still holds the old group keeps its
    connections open: another survivor waiting on it in that collective then waits for its
    timeout (losing rank 0's slice of 3 cost 10 s this way). Recovery begins once it is freed,
    and says whether the loss was noticed at a timeout (a hang) or as the peer went."""
    group = FailingOnce(error)
    formation = Recovering(group)
    boundary(tmp_path, group, formation, Progress(step=41)).cross(total=100)
    assert formation.calls == [recovery, "collective released"]


class SlowCollective(Group):
    """Its first vote waits ``delay_s`` (a collective waiting on a peer), then fails as a lost
    peer fails it, or returns the peers' votes; the re-formed group's votes agree at once."""

    def __init__(self, delay_s: float, outcome: list[int] | Exception) -> None:
        super().__init__(rank=1, world_size=2)
        self.delay_s, self.outcome = delay_s, outcome

    def agree_max(self, values: list[int]) -> list[int]:
        outcome, self.outcome = self.outcome, None
        if outcome is None:
            return values
        time.sleep(self.delay_s)
        if isinstance(outcome, Exception):
            raise outcome
        return [max(mine, theirs) for mine, theirs in zip(values, outcome)]


@pytest.mark.parametrize(
    ("outcome", "cause"),
    [
        (PeerLost("[gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 400ms for recv operation"), "peer_failure"),
        ([0, 2, 0], "membership"),
    ],
)
def test_the_elastic_events_duration_counts_from_the_failed_collective_not_from_the_recovery(
    tmp_path: Path, outcome: list[int] | Exception, cause: str
) -> None:
    """A survivor that waited in a failed collective until its timeout lost that time too: the
    elastic event's ``duration_s`` (goodput's elastic badput) counts from when the boundary's
    collective began, not from when recovery started after the timeout. (Before, the 0.4 s
    the collective waited were counted nowhere.)"""
    delay_s = 0.4
    publish(tmp_path / "membership.json", 1, ("a", "b"))
    group, state, progress = SlowCollective(delay_s, outcome), State(), Progress(step=5, has_state=True)
    env = WorkerEnv(slice_name="b", num_slices=2, membership_file=str(tmp_path / "membership.json"))
    events = EventLog(str(tmp_path / "events.jsonl"))
    formation = GroupFormation(env, group, ending(tmp_path, group, state, progress), state, progress, events, membership_timeout_s=5.0)
    formation.join_first()
    publish(tmp_path / "membership.json", 2, ("b",) if cause == "peer_failure" else ("a", "b"))
    crossing = time.monotonic()
    StepBoundary(group, formation, ending(tmp_path, group, state, progress), state, progress, checkpoint_every=None).cross(100)
    crossed_s = time.monotonic() - crossing
    events.close()

    [elastic] = [e for line in (tmp_path / "events.jsonl").read_text().splitlines() if (e := json.loads(line))["kind"] == "elastic"]
    assert elastic["cause"] == cause and elastic["generation"] == 2
    assert delay_s <= elastic["duration_s"] <= crossed_s


class Loop(RunLifecycle):
    """The neutral step loop on a fake group (what the PyTorch and JAX runs build on)."""

    def __init__(self, env: WorkerEnv, group: Group, state: State, progress: Progress, events: EventLog) -> None:
        self.env, self.group, self.progress, self.events = env, group, progress, events
        formation = lambda stop: GroupFormation(env, group, stop, state, progress, events, membership_timeout_s=5.0)  # noqa: E731
        self._assemble(TerminationRequest(grace_period_s=30.0), state, formation, checkpoint_every=None)


def test_the_elastic_events_duration_counts_from_the_start_of_the_step_that_failed(tmp_path: Path) -> None:
    """A step whose collective waited on a lost peer until it failed: the elastic event's
    ``duration_s`` counts from the start of that abandoned step (it is counted as no step)."""
    delay_s = 0.4
    publish(tmp_path / "membership.json", 1, ("a", "b"))
    env = WorkerEnv(slice_name="b", num_slices=2, membership_file=str(tmp_path / "membership.json"))
    events = EventLog(str(tmp_path / "events.jsonl"))
    group, progress = SlowCollective(0.0, None), Progress(step=5, has_state=True)  # type: ignore[arg-type]
    loop = Loop(env, group, State(), progress, events)
    loop.formation.join_first()
    tries = []
    for _ in loop._steps(6):
        with loop.elastic_step():
            tries.append(time.monotonic())
            if len(tries) == 1:  # the all-reduce waits on the lost peer, then fails
                publish(tmp_path / "membership.json", 2, ("b",))
                time.sleep(delay_s)
                raise PeerLost("[gloo/transport/tcp/pair.cc:553] Connection closed by peer")
    events.close()

    records = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    [elastic] = [e for e in records if e["kind"] == "elastic"]
    assert [e["step"] for e in records if e["kind"] == "step"] == [6] and len(tries) == 2
    assert delay_s <= elastic["duration_s"] <= tries[1] - tries[0]


def elastic_loop(tmp_path: Path) -> Loop:
    """Rank 1 of an elastic group of slices a and b, 5 steps done."""
    publish(tmp_path / "membership.json", 1, ("a", "b"))
    env = WorkerEnv(slice_name="b", num_slices=2, membership_file=str(tmp_path / "membership.json"))
    group, progress = SlowCollective(0.0, None), Progress(step=5, has_state=True)  # type: ignore[arg-type]
    loop = Loop(env, group, State(), progress, EventLog(str(tmp_path / "events.jsonl")))
    loop.formation.join_first()
    return loop


def test_a_world_size_change_is_announced_once_before_the_first_step_at_the_new_size(tmp_path: Path) -> None:
    """Slice a is lost during step 6: the step is abandoned, and the script's callback hears of
    the new size before step 6 runs again on one rank (so its gradient accumulation is right)."""
    loop = elastic_loop(tmp_path)
    heard: list[tuple[int, int]] = []
    loop.on_world_size_change(lambda size: heard.append((size, loop.step)))
    ran: list[tuple[int, int, list[tuple[int, int]]]] = []
    for step in loop._steps(8):
        with loop.elastic_step():
            ran.append((step, loop.world_size, list(heard)))
            if len(ran) == 1:
                publish(tmp_path / "membership.json", 2, ("b",))
                raise PeerLost("[gloo/transport/tcp/pair.cc:553] Connection closed by peer")
    assert heard == [(1, 5)]
    assert ran == [(6, 2, []), (6, 1, [(1, 5)]), (7, 1, [(1, 5)]), (8, 1, [(1, 5)])]


def test_a_loop_that_counts_its_own_steps_hears_of_a_world_size_change_at_the_boundary(tmp_path: Path) -> None:
    loop = elastic_loop(tmp_path)
    sizes: list[int] = []
    loop.on_world_size_change(sizes.append)
    loop._step_done()
    assert sizes == []  # the size the script learnt at registration has not changed
    publish(tmp_path / "membership.json", 2, ("b",))  # slice a leaves between steps
    loop._step_done()
    loop._step_done()
    assert sizes == [1] and loop.world_size == 1 and loop.step == 8


def test_rank_0_calls_periodic_saves_and_every_rank_takes_part(tmp_path: Path) -> None:
    alone = boundary(tmp_path, Group(), Formation(), Progress(step=10))
    alone.cross(total=100)
    assert alone.state.calls == ["periodic"] and alone.progress.last_checkpoint_step == 10
    alone.cross(total=100)  # the same step again: saved already
    assert alone.state.calls == ["periodic"]
    follower = boundary(tmp_path, Group(rank=1, world_size=2, peer_votes=[[0, 1, 1]]), Formation(), Progress(step=10))
    follower.cross(total=100)
    assert follower.state.calls == ["periodic"] and follower.progress.last_checkpoint_step == 10


def test_a_sigterm_seen_by_any_rank_saves_and_exits_with_the_checkpointed_code(
    tmp_path: Path, leaving: list[tuple[object, ...]], capsys: pytest.CaptureFixture[str]
) -> None:
    group = Group(rank=0, world_size=2, peer_votes=[[1, 1, 0]])
    with pytest.raises(SystemExit) as exited:
        boundary(tmp_path, group, Formation(), Progress(step=42)).cross(total=100)
    assert exited.value.code == CHECKPOINTED_EXIT_CODE
    assert capsys.readouterr().out.startswith("checkpoint saved step=42 reason=termination seconds=")
    assert stop_event(tmp_path) == {"step": 42, "reason": "terminated", "exit_code": CHECKPOINTED_EXIT_CODE}
    assert group.destroyed == 1 and leaving == [(termination._leave_now, CHECKPOINTED_EXIT_CODE)]
