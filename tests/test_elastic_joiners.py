"""Grow-back without stalling the survivors: a generation that adds slices counts for the
survivors only once its joiners are ready to form it (their marks), so survivors keep training
while the joiners start (the demo's grow-back stall). A joiner is ready when its script wants
the state, not when it calls ``init``: building the model (torch's first optimizer imports for
~1 s) happens before the survivors pause."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from test_train_neutral import Group, elastic_worker

from hotswap.api.membership import Membership
from hotswap.train import formation as formation_module
from hotswap.train.formation import GroupFormation


def publish(path: Path, generation: int, slices: tuple[str, ...], joined: Path) -> Membership:
    membership = Membership(generation, slices, 1, "127.0.0.1", 1000 + generation, 1, str(joined))
    temporary = path.with_suffix(".tmp")
    temporary.write_text(membership.to_json())
    os.replace(temporary, path)
    return membership


def survivor_of_two(tmp_path: Path) -> tuple[GroupFormation, Path, Path]:
    """Slice a's worker in generation 1 (slices a, b): (its formation, the membership, the marks)."""
    joined = tmp_path / "joined"
    joined.mkdir()
    membership = tmp_path / "membership.json"
    publish(membership, 1, ("a", "b"), joined)
    survivor = elastic_worker(tmp_path, Group(), "a")
    survivor.join_first()
    assert survivor.generation == 1
    return survivor, membership, joined


def test_survivors_move_only_when_every_joiner_is_ready(tmp_path: Path) -> None:
    survivor, membership, joined = survivor_of_two(tmp_path)
    grown = publish(membership, 2, ("a", "b", "c"), joined)
    assert grown.joiners(Membership(1, ("a", "b"), 1, "127.0.0.1", 1001)) == ("c",)
    assert survivor.newest_generation() == 1 and not survivor.interrupted()  # c is still starting: train on
    joiner = elastic_worker(tmp_path, Group(), "c")
    joiner.join_first()  # a fresh joiner marks itself ready, then forms generation 2
    assert (joined / "2-c-0-0").exists() and joiner.generation == 2
    assert survivor.newest_generation() == 2 and survivor.interrupted()
    shrunk = publish(membership, 3, ("a",), joined)  # a loss needs no marks
    assert shrunk.joined_marks(grown) == [] and survivor.newest_generation() == 3


def test_a_deferred_joiner_is_ready_only_when_its_script_wants_the_state(tmp_path: Path) -> None:
    survivor, membership, joined = survivor_of_two(tmp_path)
    publish(membership, 2, ("a", "b", "c"), joined)
    group = Group()
    joiner = elastic_worker(tmp_path, group, "c")
    joiner.join_first(defer=True)  # what hotswap.train's init does
    assert (group.rank, group.world_size) == (2, 3) and group.attempts == []  # its place is known, nothing formed
    assert not (joined / "2-c-0-0").exists() and survivor.newest_generation() == 1  # its script builds: train on
    joiner.complete_join()  # the script's first step (or restore())
    assert (joined / "2-c-0-0").exists() and joiner.generation == 2 and len(group.attempts) == 1
    assert survivor.newest_generation() == 2
    joiner.complete_join()  # once only
    assert len(group.attempts) == 1


def test_a_pytorch_worker_marks_itself_ready_at_its_first_step_not_at_init(tmp_path: Path) -> None:
    """A real worker process (torch, gloo): after ``init`` it knows its rank and size but has
    neither marked itself ready nor formed; ``restore()`` (or its first step) does both."""
    pytest.importorskip("torch")
    from train_harness import LOCALHOST, Workers, free_port, worker_env

    joined = tmp_path / "joined"
    joined.mkdir()
    membership = tmp_path / "membership.json"
    membership.write_text(Membership(1, ("a",), 1, LOCALHOST, free_port(), 1, str(joined)).to_json())
    script = tmp_path / "joiner.py"
    script.write_text(
        "import os, sys\n"
        "import hotswap.train as ht\n"
        "mark = sys.argv[1]\n"
        "run = ht.init()\n"
        "print('init', run.rank, run.world_size, os.path.exists(mark), flush=True)\n"
        "run.restore()\n"
        "print('restored', run.rank, run.world_size, os.path.exists(mark), flush=True)\n"
    )
    env = worker_env(rank=0, world_size=1, port=0, checkpoint_dir=tmp_path / "checkpoints", slice_name="a",
                     membership_file=membership)
    with Workers(tmp_path) as workers:
        worker = workers.start("joiner", script, [str(joined / "1-a-0-0")], env)
        assert worker.wait(120) == 0, worker.stderr()
    assert worker.lines()[-2:] == ["init 0 1 False", "restored 0 1 True"], worker.stderr()


def test_survivors_move_anyway_after_the_timeout_or_without_marks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    membership = tmp_path / "membership.json"
    publish(membership, 1, ("a",), tmp_path / "joined")
    survivor = elastic_worker(tmp_path, Group(), "a")
    survivor.join_first()
    publish(membership, 2, ("a", "b"), tmp_path / "joined")
    assert survivor.newest_generation() == 1
    monkeypatch.setattr(formation_module, "JOINERS_READY_TIMEOUT_S", 0.0)
    assert survivor.newest_generation() == 2  # a joiner that never comes does not hold them forever
    without = Membership(3, ("a", "b", "c"), 1, "127.0.0.1", 1003)  # Kubernetes: no marks, move at once
    assert Membership.from_json(without.to_json()).joined_marks(Membership(2, ("a", "b"), 1, "127.0.0.1", 1002)) == []


class JaxLikeGroup(Group):
    """The fake group, plus what a JAX survivor does ahead of a generation (no service here)."""

    used = False  # it has not formed a group yet

    def prepare_service(self, master_addr: str, port: int, processes: int) -> None:
        pass

    def prepared_service(self) -> tuple[int, int] | None:
        return None


class Successors:
    """A survivor's next program (see hotswap.train.jax.successor), as the formation sees it."""

    def __init__(self) -> None:
        self.marks: list[str | None] = []
        self.generation: int | None = None  # the generation it runs ahead for
        self.alive = True

    @property
    def started(self) -> bool:
        return bool(self.marks)

    @property
    def ready(self) -> bool:
        return self.started and self.alive

    def start(self, ready_mark: str | None, ahead: object = None) -> None:
        self.marks.append(ready_mark)
        self.generation = getattr(ahead, "generation", None)


def jax_survivor(tmp_path: Path, slices: tuple[str, ...]) -> tuple[object, Successors, Path, Path]:
    """Slice ``slices[0]``'s JAX worker in generation 1 of ``slices``, with a fake next
    program: (its formation, its successor, the membership file, the readiness marks)."""
    pytest.importorskip("jax")
    from test_train_neutral import State, ending

    from hotswap.api.worker import WorkerEnv
    from hotswap.train.events import EventLog
    from hotswap.train.jax.formation import RestartingFormation
    from hotswap.train.progress import Progress

    joined = tmp_path / "joined"
    joined.mkdir()
    membership = tmp_path / "membership.json"
    publish(membership, 1, slices, joined)
    group = JaxLikeGroup()
    env = WorkerEnv(slice_name=slices[0], num_slices=3, membership_file=str(membership))
    state, progress = State(), Progress()
    survivor = RestartingFormation(
        env, group, ending(tmp_path, group, state, progress), state, progress, EventLog(None),  # type: ignore[arg-type]
        membership_timeout_s=5.0, handoff=None, restart=lambda handoff: None,  # type: ignore[arg-type,return-value]
    )
    successor = Successors()
    survivor._successor = successor  # type: ignore[assignment]
    survivor.join_first()
    return survivor, successor, membership, joined


def test_jax_survivors_move_only_when_their_next_programs_have_imported_too(tmp_path: Path) -> None:
    """A JAX survivor moves to a new generation by handing its state to its next program,
    started ahead: survivors that moved once the joiner was ready, while one's next program
    still imported, made the whole new group wait for it (0.6 s of a grow-back stall)."""
    survivor, successor, membership, joined = jax_survivor(tmp_path, ("a", "b"))
    publish(membership, 2, ("a", "b", "c"), joined)
    (joined / "2-c-0-0").touch()  # the joiner is ready
    assert survivor.newest_generation() == 1  # type: ignore[attr-defined]
    # Its next program runs ahead for generation 2, and marks itself once it wants the state.
    assert successor.marks == [str(joined / "2-a-0-0")] and successor.generation == 2
    (joined / "2-a-0-0").touch()
    assert survivor.newest_generation() == 1  # type: ignore[attr-defined]  # b's next program still imports
    (joined / "2-b-0-0").touch()
    assert survivor.newest_generation() == 2  # type: ignore[attr-defined]


def test_a_jax_generation_that_adds_no_slice_is_taken_at_once(tmp_path: Path) -> None:
    """A slice taken away (preempted: its worker is being stopped) must not wait for the
    survivors' next programs: the stopping worker's vote would stop the whole group meanwhile."""
    survivor, successor, membership, joined = jax_survivor(tmp_path, ("a", "b", "c"))
    publish(membership, 2, ("a", "b"), joined)
    assert survivor.newest_generation() == 2  # type: ignore[attr-defined]
    assert successor.generation == 2 and not (joined / "2-a-0-0").exists()  # started, not ready yet


def test_a_jax_survivor_whose_next_program_died_holds_nobody_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hotswap.train.jax import formation as jax_formation

    survivor, successor, membership, joined = jax_survivor(tmp_path, ("a", "b"))
    publish(membership, 2, ("a", "b", "c"), joined)
    (joined / "2-c-0-0").touch()  # the joiner is ready
    assert survivor.newest_generation() == 1  # type: ignore[attr-defined]
    successor.alive = False  # it will restart plainly: it marks itself for it
    survivor.newest_generation()  # type: ignore[attr-defined]
    assert (joined / "2-a-0-0").exists()
    monkeypatch.setattr(jax_formation, "SUCCESSORS_READY_TIMEOUT_S", 0.0)
    assert survivor.newest_generation() == 2  # type: ignore[attr-defined]  # b's never came: move anyway
