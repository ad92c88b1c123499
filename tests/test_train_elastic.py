"""Elastic slices with real processes: 3 slices -> a worker is SIGKILLed and the controller
publishes 2 -> the slice returns and a fresh worker joins. Survivors never restart, the loss
goes on, the joiner gets its state from a peer, and seed 001's awk script reads both
transitions from the rank-0 log."""

from __future__ import annotations

import itertools
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from train_harness import (
    TRAIN_EXAMPLE,
    clean_environ,
    Worker,
    Workers,
    free_port,
    publish_membership,
    read_events,
    wait_until,
    worker_env,
)

pytest.importorskip("torch")

SLICES = ("slice-0", "slice-1", "slice-2")
ARGS = ["--steps", "100000", "--step-sleep", "0.05", "--checkpoint-every", "20", "--collective-timeout", "20"]
TIMEOUT = 60.0  # per phase; a deadlock fails the test instead of hanging it

# The verification step of seed 001 (Pathways elastic training), verbatim.
# Seed 001's verification script, unchanged, as the demo ships it.
SEED_001_AWK = Path(__file__).resolve().parents[1] / "src" / "hotswap" / "demo" / "seed001_slice_changes.awk"


def slice_counts(worker: Worker) -> dict[int, int]:
    return {step: int(fields["elastic_manager.good_slice_count"]) for step, fields in worker.steps().items()}


def steps_on(worker: Worker, slices: int) -> list[int]:
    return sorted(step for step, count in slice_counts(worker).items() if count == slices)


def start_worker(workers: Workers, directory: Path, index: int, name: str) -> Worker:
    env = worker_env(
        rank=index,
        world_size=len(SLICES),
        port=0,  # the membership's port is used, never MASTER_PORT
        checkpoint_dir=directory / "checkpoints",
        events_file=directory / f"{name}.events",
        slice_name=SLICES[index],
        membership_file=directory / "membership.json",
    )
    return workers.start(name, TRAIN_EXAMPLE, ARGS, env)


def test_elastic_3_to_2_to_3_slices_without_restart_or_deadlock(tmp_path: Path) -> None:
    membership = tmp_path / "membership.json"
    publish_membership(membership, 1, SLICES, free_port())

    with Workers(tmp_path) as workers:
        first = [start_worker(workers, tmp_path, index, f"slice{index}") for index in range(3)]
        wait_until(lambda: all(len(steps_on(w, 3)) >= 10 for w in first), TIMEOUT, "10 steps on 3 slices", first)

        # A slice fails: its worker dies at once, the controller publishes the survivors.
        first[2].signal(signal.SIGKILL)
        publish_membership(membership, 2, SLICES[:2], free_port())
        survivors = first[:2]
        wait_until(
            lambda: all(len(steps_on(w, 2)) >= 10 for w in survivors), TIMEOUT, "10 steps on 2 slices", survivors
        )

        # The slice returns: the controller publishes 3 slices and starts a fresh worker there.
        publish_membership(membership, 3, SLICES, free_port())
        joiner = start_worker(workers, tmp_path, 2, "slice2-joiner")
        everyone = [*survivors, joiner]
        wait_until(
            lambda: all(len(steps_on(w, 3)) >= 20 for w in everyone), TIMEOUT, "10 more steps on 3 slices", everyone
        )

        for worker in everyone:
            worker.signal(signal.SIGTERM)
        for worker in everyone:
            assert worker.wait(TIMEOUT) == 143, worker.stderr()

    rank0 = survivors[0]
    # Survivors never restarted: one process, one run of increasing steps across both changes.
    for worker in survivors:
        counts = slice_counts(worker)
        steps = sorted(counts)
        assert steps == list(range(1, steps[-1] + 1))
        runs = [counts[s] for s in steps]
        changes = [(a, b) for a, b in itertools.pairwise(runs) if a != b]
        assert changes == [(3, 2), (2, 3)]
        assert not any(line.startswith("restored ") for line in worker.lines())  # kept their state
        assert all(float(fields["loss"]) < 10 for fields in worker.steps().values())
    assert steps_on(survivors[0], 2) == steps_on(survivors[1], 2)

    # The joiner received the survivors' state (no disk) and went on from there.
    joined = [line for line in joiner.lines() if line.startswith("restored ")]
    assert len(joined) == 1 and joined[0].endswith(" source=peer")
    joined_at = int(joined[0].split()[1].removeprefix("step="))
    assert min(joiner.steps()) == joined_at + 1
    assert max(steps_on(rank0, 2)) == joined_at  # it joined where the survivors were

    # The elastic_down_event_count counts the loss of the slice, on every rank.
    assert {fields["elastic_manager.elastic_down_event_count"] for fields in joiner.steps().values()} == {"1"}

    # Goodput: both reconfigurations are recorded, and the joiner's restore came from a peer.
    elastic = [e for e in read_events(rank0.log.with_suffix(".events")) if e["kind"] == "elastic"]
    assert [(e["generation"], e["slices"]) for e in elastic] == [(2, 2), (3, 3)]
    restores = [e for e in read_events(joiner.log.with_suffix(".events")) if e["kind"] == "checkpoint_restore"]
    assert [(e["source"], e["step"]) for e in restores] == [("peer", joined_at)]

    awk = subprocess.run(["awk", "-f", str(SEED_001_AWK), str(rank0.log)], capture_output=True, text=True, check=True)
    down, up = min(steps_on(rank0, 2)), joined_at + 1
    assert awk.stdout.splitlines() == [
        f"Step: {down}, Old Slice Count: 3, New Slice Count: 2",
        f"Step: {up}, Old Slice Count: 2, New Slice Count: 3",
    ]


def test_a_drained_slice_leaves_and_the_others_go_on(tmp_path: Path) -> None:
    """What the controller does to shrink an elastic job whose workers are alive (drain,
    preemption of one slice): publish the smaller membership, then SIGTERM the leaving workers.
    They leave at the next step boundary; the rest neither stop nor restart."""
    membership = tmp_path / "membership.json"
    publish_membership(membership, 1, SLICES[:2], free_port())
    with Workers(tmp_path) as workers:
        staying, leaving = (start_worker(workers, tmp_path, index, f"slice{index}") for index in range(2))
        wait_until(lambda: len(steps_on(staying, 2)) >= 10, TIMEOUT, "10 steps on 2 slices", [staying, leaving])
        publish_membership(membership, 2, SLICES[:1], free_port())
        leaving.signal(signal.SIGTERM)
        assert leaving.wait(TIMEOUT) == 143, leaving.stderr()
        wait_until(lambda: len(steps_on(staying, 1)) >= 10, TIMEOUT, "10 steps on 1 slice", [staying])
        staying.signal(signal.SIGTERM)
        assert staying.wait(TIMEOUT) == 143, staying.stderr()
    assert f"leaving: slice {SLICES[1]} is not in membership generation 2" in leaving.lines()
    steps = sorted(slice_counts(staying))
    assert steps == list(range(1, steps[-1] + 1))
    assert min(steps_on(staying, 1)) == max(steps_on(staying, 2)) + 1
    stops = [e for e in read_events(leaving.log.with_suffix(".events")) if e["kind"] == "stop"]
    assert [(e["reason"], e["exit_code"]) for e in stops] == [("removed", 143)]


# Rank 0 dies at step KILL_AT, between two steps (after every rank finished that step's
# collectives: a file each), and the survivors go on only once it is gone and the controller
# has published their generation. The collective they then meet in is the step boundary's vote.
RANK_0_DIES = """
import os, signal, sys, time
from pathlib import Path
import torch
import hotswap.train as ht

here, kill_at = Path(sys.argv[1]), int(sys.argv[2])
run = ht.init(collective_timeout_s=float(sys.argv[3]))
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
run.register(model=model, optimizer=optimizer)
for step in run.steps(100000):
    with run.elastic_step():
        optimizer.zero_grad()
        model(torch.ones(8, 4)).sum().backward()
        ht.average_gradients(model)
        optimizer.step()
        run.report()
        if step == kill_at:
            (here / f"done-{run.rank}").touch()
            if run.rank == 0:
                while not ((here / "done-1").exists() and (here / "done-2").exists()):
                    time.sleep(0.01)
                os.kill(os.getpid(), signal.SIGKILL)  # the node is gone
            while not (here / "go").exists():
                time.sleep(0.01)
        time.sleep(0.02)
"""


def test_losing_rank_0s_slice_the_survivors_go_on_without_waiting_for_a_timeout(tmp_path: Path) -> None:
    """With rank 0 gone, gloo fails slice 2's vote at once while slice 1's waits on slice 2: slice
    1 learns only when slice 2's old connections close. Slice 2 used to re-form while the failed
    vote (and with it the old group) was still alive, so slice 1 waited for its collective
    timeout (10 s in ``hotswap demo elastic --fail-slice 0``). Both must see the loss as it
    happens: their elastic records say the lost peer was not noticed at a timeout."""
    membership = tmp_path / "membership.json"
    publish_membership(membership, 1, SLICES, free_port())
    script = tmp_path / "rank0_dies.py"
    script.write_text(RANK_0_DIES)
    kill_at, timeout = 5, "10"
    with Workers(tmp_path) as workers:
        first = []
        for index in range(3):
            env = worker_env(
                rank=index, world_size=3, port=0, checkpoint_dir=tmp_path / "checkpoints",
                events_file=tmp_path / f"slice{index}.events", slice_name=SLICES[index], membership_file=membership,
            )
            first.append(workers.start(f"slice{index}", script, [str(tmp_path), str(kill_at), timeout], env))
        assert first[0].wait(TIMEOUT) == -signal.SIGKILL, first[0].stderr()
        publish_membership(membership, 2, SLICES[1:], free_port())  # the controller's part
        (tmp_path / "go").touch()
        survivors = first[1:]
        wait_until(lambda: all(len(steps_on(w, 2)) >= 5 for w in survivors), TIMEOUT, "5 steps on 2 slices", survivors)
        for worker in survivors:
            worker.signal(signal.SIGTERM)
        for worker in survivors:
            assert worker.wait(TIMEOUT) == 143, worker.stderr()

    for worker in survivors:
        elastic = [e for e in read_events(worker.log.with_suffix(".events")) if e["kind"] == "elastic"]
        assert [(e["generation"], e["slices"], e["cause"], e["timed_out"]) for e in elastic] == [
            (2, 2, "peer_failure", False)
        ], worker.stderr()
        # No step lost, none done twice: steps 1..5 on 3 slices, then 6.. on 2.
        assert steps_on(worker, 3) == list(range(1, kill_at + 1))
        assert min(steps_on(worker, 2)) == kill_at + 1
        assert "still referenced" not in worker.stderr()  # the old group was freed as it was left


LEAVE_A_GROUP = """
import logging, sys
import torch.distributed as dist
from hotswap.api.worker import WorkerEnv
from hotswap.backends.local.workers.environment import free_port
from hotswap.train.rendezvous import GroupSpec
from hotswap.train.torch.distributed import ProcessGroup

logging.basicConfig(format="%(message)s")
group = ProcessGroup("gloo", 10, 30, WorkerEnv.from_environ({"CUDA_VISIBLE_DEVICES": ""}))
for generation, hold in ((1, False), (2, True)):
    group.form(GroupSpec(generation, 0, 1, "127.0.0.1", free_port()), interrupted=lambda: False)
    held = dist.group.WORLD if hold else None  # what DDP, or a script's own variable, keeps
    print(f"leaving generation {generation}", file=sys.stderr, flush=True)
    group.destroy()
"""


def test_a_group_the_script_still_holds_after_leaving_is_reported() -> None:
    """Gloo closes a left group's connections only once nothing refers to it; until then its
    peers notice only at their collective timeout. The SDK says so when the script holds it."""
    result = subprocess.run(
        [sys.executable, "-c", LEAVE_A_GROUP], capture_output=True, text=True, timeout=120,
        env={**clean_environ(), "GLOO_SOCKET_IFNAME": "lo"},
    )
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith(("leaving", "hotswap:"))]
    assert lines[0] == "leaving generation 1" and lines[1] == "leaving generation 2", result.stderr
    assert len(lines) == 3 and lines[2].startswith("hotswap: the process group left behind is still referenced")
