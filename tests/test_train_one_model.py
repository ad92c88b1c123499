"""Every rank trains one model on its own data, as real trainers without DDP are written
(``tests/per_rank_trainer.py``: a seed per rank, ``ht.average_gradients``, gradient accumulation
from the world size): at a fresh start every rank takes rank 0's model unless the script opts
out; each rank keeps a random stream of its own, a joiner included; and a world-size change is
announced to the script before the first step at the new size (issue 33)."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from train_harness import Worker, Workers, free_port, publish_membership, wait_until, worker_env

pytest.importorskip("torch")

TRAINER = Path(__file__).resolve().parent / "per_rank_trainer.py"
TIMEOUT = 180.0  # per phase: generous for a loaded 2-core host; a deadlock still fails the test
SLICES = ("slice-0", "slice-1")


def step_fields(worker: Worker, key: str) -> dict[int, str]:
    return {step: fields[key] for step, fields in worker.steps().items()}


def size_changes(worker: Worker) -> list[tuple[int, int]]:
    """(world size, steps done) of each ``world_size_changed`` line."""
    found = []
    for line in worker.lines():
        if line.startswith("world_size_changed "):
            fields = dict(word.split("=", 1) for word in line.split()[1:])
            found.append((int(fields["world_size"]), int(fields["step"])))
    return found


@pytest.mark.parametrize("sync", [True, False], ids=["rank 0's model", "opted out"])
def test_a_fresh_start_gives_every_rank_rank_0s_model_unless_the_script_opts_out(tmp_path: Path, sync: bool) -> None:
    port = free_port()
    args = ["--steps", "3", *(() if sync else ("--no-sync",))]
    with Workers(tmp_path) as workers:
        ranks = [
            workers.start(
                f"rank{rank}", TRAINER, args, worker_env(rank=rank, world_size=2, port=port, checkpoint_dir=tmp_path / "ckpt")
            )
            for rank in (0, 1)
        ]
        for worker in ranks:
            assert worker.wait(TIMEOUT) == 0, worker.stderr()
    weights = [step_fields(worker, "weights") for worker in ranks]
    draws = [step_fields(worker, "draw") for worker in ranks]
    assert sorted(weights[0]) == sorted(weights[1]) == [1, 2, 3]
    if sync:  # one model from the first step on (the gradients are averaged: it stays one)
        assert weights[0] == weights[1]
    else:  # each rank's own initial weights, as the script asked
        assert all(weights[0][step] != weights[1][step] for step in (1, 2, 3))
    # Only the state is rank 0's: every rank still draws from its own seed's stream.
    assert all(draws[0][step] != draws[1][step] for step in (1, 2, 3))
    assert not any(size_changes(worker) for worker in ranks)  # a job that is not elastic never changes size


def test_an_elastic_2_1_2_announces_each_size_and_the_joiner_draws_its_own_stream(tmp_path: Path) -> None:
    membership = tmp_path / "membership.json"
    publish_membership(membership, 1, SLICES, free_port())

    def start(workers: Workers, index: int, name: str) -> Worker:
        env = worker_env(
            rank=index,
            world_size=2,
            port=0,  # the membership's port is used
            checkpoint_dir=tmp_path / "ckpt",
            slice_name=SLICES[index],
            membership_file=membership,
        )
        return workers.start(name, TRAINER, ["--steps", "100000", "--step-sleep", "0.05"], env)

    def steps_on(worker: Worker, slices: int) -> list[int]:
        counts = step_fields(worker, "elastic_manager.good_slice_count")
        return sorted(step for step, count in counts.items() if int(count) == slices)

    with Workers(tmp_path) as workers:
        survivor, lost = start(workers, 0, "rank0"), start(workers, 1, "rank1")
        wait_until(lambda: len(steps_on(survivor, 2)) >= 5, TIMEOUT, "5 steps on 2 slices", [survivor, lost])
        lost.signal(signal.SIGKILL)
        publish_membership(membership, 2, SLICES[:1], free_port())
        wait_until(lambda: len(steps_on(survivor, 1)) >= 5, TIMEOUT, "5 steps on 1 slice", [survivor])
        publish_membership(membership, 3, SLICES, free_port())
        joiner = start(workers, 1, "rank1-joiner")
        wait_until(lambda: len(joiner.steps()) >= 8, TIMEOUT, "8 steps of the joiner", [survivor, joiner])
        for worker in (survivor, joiner):
            worker.signal(signal.SIGTERM)
        for worker in (survivor, joiner):
            assert worker.wait(TIMEOUT) == 143, worker.stderr()

    # The survivor heard of each change once, before the first step at the new size, and its
    # accumulation followed: the global batch stayed 4 micro-batches.
    alone, back = steps_on(survivor, 1), [step for step in steps_on(survivor, 2) if step > max(steps_on(survivor, 1))]
    assert size_changes(survivor) == [(1, alone[0] - 1), (2, back[0] - 1)]
    accumulation = step_fields(survivor, "accumulation")
    assert {accumulation[step] for step in alone} == {"4"}
    assert {accumulation[step] for step in steps_on(survivor, 2)} == {"2"}
    # The joiner learnt its size at start-up: nothing changed for it.
    assert size_changes(joiner) == [] and set(step_fields(joiner, "accumulation").values()) == {"2"}

    # One model throughout: rank 0's from the fresh start, the survivor's after the join.
    weights = [step_fields(worker, "weights") for worker in (survivor, lost, joiner)]
    before = sorted(set(weights[0]) & set(weights[1]))
    after = sorted(set(weights[0]) & set(weights[2]))
    assert before and after and min(after) == back[0]
    assert all(weights[0][step] == weights[1][step] for step in before)
    assert all(weights[0][step] == weights[2][step] for step in after)
    # Its own random stream on every rank: before the loss, and for the joiner after it (a copy
    # of the survivor's stream would draw the same numbers at every step).
    draws = [step_fields(worker, "draw") for worker in (survivor, lost, joiner)]
    assert all(draws[0][step] != draws[1][step] for step in before)
    assert all(draws[0][step] != draws[2][step] for step in after)
