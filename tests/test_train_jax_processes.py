"""hotswap.train.jax with real processes (jax.distributed, gloo collectives on CPU), played by
the test as the controller: a job saved on 3 slices resumes on 2 with its arrays resharded and
on 3 again; kill -9 during orbax saves never restores wrongly; an elastic job whose peer hangs
is moved on by the watchdog from its host snapshot, and a returning slice gets the state from a
survivor, a typed PRNG key with it. Each check is on exact values: a step adds 1 to every
element of the state and splits its key."""

from __future__ import annotations

import random
import re
import signal
import time
from pathlib import Path

import pytest
from train_harness import Worker, Workers, free_port, publish_membership, wait_until, worker_env

pytest.importorskip("jax", reason="the JAX SDK needs hotswap[jax]")
pytest.importorskip("orbax.checkpoint", reason="the JAX SDK needs hotswap[jax]")

HARNESS = Path(__file__).with_name("jax_harness.py")
ROWS = 12  # divides over 2 and 3 slices
TIMEOUT = 120.0  # per phase: JAX starts slowly on a busy 2-core machine
SAVED = re.compile(r"^checkpoint saved step=(\d+) reason=termination ")
RESTORED = re.compile(r"^restored step=(\d+) source=(\w+)$")


def expected_checksum(step: int, rows: int = ROWS) -> float:
    return float(sum(range(rows * 4)) + rows * 4 * step)


def start_job(workers: Workers, name: str, ranks: int, checkpoints: Path, args: list[str]) -> list[Worker]:
    port = free_port()
    return [
        workers.start(f"{name}-{rank}", HARNESS, args, worker_env(rank=rank, world_size=ranks, port=port, checkpoint_dir=checkpoints))
        for rank in range(ranks)
    ]


def restored(worker: Worker) -> tuple[int, str] | None:
    found = [(int(m.group(1)), m.group(2)) for line in worker.lines() if (m := RESTORED.match(line))]
    return found[-1] if found else None


def stop(job: list[Worker], rank: int) -> int:
    """SIGTERM one rank: every rank agrees, saves and exits 143; the step saved."""
    job[rank].signal(signal.SIGTERM)
    for worker in job:
        assert worker.wait(TIMEOUT) == 143, worker.stderr()
    [step] = [int(m.group(1)) for line in job[0].lines() if (m := SAVED.match(line))]
    return step


def test_saved_on_3_slices_resumes_resharded_on_2_and_on_3_again(tmp_path: Path) -> None:
    checkpoints = tmp_path / "checkpoints"
    args = ["--rows", str(ROWS), "--checkpoint-every", "1000"]
    with Workers(tmp_path) as workers:
        three = start_job(workers, "three", 3, checkpoints, args)
        wait_until(lambda: all(w.last_step() >= 5 for w in three), TIMEOUT, "5 steps on 3 slices", three)
        saved = stop(three, 1)

        for name, ranks in (("two", 2), ("three-again", 3)):
            job = start_job(workers, name, ranks, checkpoints, args)
            wait_until(lambda: all(w.last_step() > saved + 2 for w in job), TIMEOUT, f"steps on {ranks} slices", job)
            for worker in job:
                assert restored(worker) == (saved, "migration")
                first = worker.steps()[saved + 1]
                assert float(first["checksum"]) == expected_checksum(saved + 1), (name, first)
                assert first["elastic_manager.good_slice_count"] == str(ranks)
            saved = stop(job, 0)


def test_kill_9_during_orbax_saves_never_restores_wrongly(tmp_path: Path) -> None:
    import jax.numpy as jnp

    from hotswap.train.events import EventLog
    from hotswap.train.jax.checkpoints import OrbaxCheckpoints

    checkpoints = tmp_path / "checkpoints"
    mib = 24.0  # each save takes a while: a kill at a random moment most often lands in one
    args = ["--rows", str(ROWS), "--mib", str(mib), "--checkpoint-every", "1", "--step-sleep", "0"]
    template = {"w": jnp.zeros((ROWS, 4)), "big": jnp.zeros(int(mib * 2**20 / 4))}
    chance = random.Random(14)
    previous = cut_short = 0
    with Workers(tmp_path) as workers:
        for trial in range(4):
            [writer] = start_job(workers, f"writer{trial}", 1, checkpoints, args)
            wait_until(
                lambda: writer.last_step() >= previous + 3 and newest_committed(checkpoints) > previous,
                TIMEOUT, "steps and a committed save", [writer],
            )
            if trial % 2:
                workers_sleep(chance.uniform(0.0, 0.4))
            else:  # the moment a save is under way
                wait_until(lambda: bool(unfinished(checkpoints)), TIMEOUT, "a save under way", [writer])
            writer.signal(signal.SIGKILL)
            writer.wait(TIMEOUT)
            last_reported = writer.last_step()
            cut_short += bool(unfinished(checkpoints))

            found = OrbaxCheckpoints(str(checkpoints), 3, EventLog(None), record_events=False).restore_latest(template)
            assert found is not None
            assert previous <= found.step <= last_reported
            assert float(jnp.sum(found.state["w"])) == expected_checksum(found.step)
            assert bool((found.state["big"] == found.step).all())
            assert found.counters["step"] == found.step
            previous = found.step
    assert cut_short >= 1  # at least one kill left a save unfinished, and it was never restored


def newest_committed(directory: Path) -> int:
    """orbax renames a step's directory to its number once every process has written it."""
    steps = [int(p.name) for p in directory.glob("*") if p.name.isdigit()] if directory.exists() else []
    return max(steps, default=0)


def unfinished(directory: Path) -> list[Path]:
    """Steps being written (orbax's temporary directories)."""
    return [p for p in directory.glob("*") if "tmp" in p.name] if directory.exists() else []


def workers_sleep(seconds: float) -> None:
    time.sleep(seconds)


SLICES = ("slice-0", "slice-1", "slice-2")


def test_a_hung_peer_is_left_behind_from_the_snapshot_and_a_returning_slice_gets_the_state(tmp_path: Path) -> None:
    """With a typed PRNG key in the state (a dropout key): the survivors carry it across their
    restarts and the returning slice receives it, bit for bit (before, taking the snapshot of
    such a state failed)."""
    from jax_harness import expected_key

    membership = tmp_path / "membership.json"
    publish_membership(membership, 1, SLICES, free_port())
    args = ["--rows", "6", "--shard", "none", "--checkpoint-every", "1000", "--step-sleep", "0.05", "--key"]

    def start(workers: Workers, index: int, name: str) -> Worker:
        env = worker_env(
            rank=index, world_size=3, port=0, checkpoint_dir=tmp_path / "checkpoints",
            slice_name=SLICES[index], membership_file=membership, grace_s=10.0,  # the watchdog waits 5 s
        )
        return workers.start(name, HARNESS, args, env)

    def on(worker: Worker, slices: int) -> dict[int, float]:
        return {
            step: float(fields["checksum"])
            for step, fields in worker.steps().items()
            if fields["elastic_manager.good_slice_count"] == str(slices)
        }

    with Workers(tmp_path) as workers:
        first = [start(workers, index, f"slice{index}") for index in range(3)]
        wait_until(lambda: all(len(on(w, 3)) >= 12 for w in first), TIMEOUT, "12 steps on 3 slices", first)

        # A peer hangs (its sockets stay open: collectives wait, they do not fail) and the
        # controller publishes the survivors: the watchdog moves them on from their snapshot.
        first[1].signal(signal.SIGSTOP)
        publish_membership(membership, 2, (SLICES[0], SLICES[2]), free_port())
        survivors = [first[0], first[2]]
        wait_until(lambda: all(len(on(w, 2)) >= 5 for w in survivors), TIMEOUT, "5 steps on 2 slices", survivors)
        first[1].signal(signal.SIGKILL)
        for worker in survivors:
            assert all(total == expected_checksum(step, 6) for step, total in on(worker, 2).items())
            assert "stuck in a step: restarting into it" in worker.stderr()

        publish_membership(membership, 3, SLICES, free_port())
        joiner = start(workers, 1, "slice1-joiner")
        everyone = [*survivors, joiner]
        wait_until(lambda: all(len(on(w, 3)) >= 5 for w in [joiner]), TIMEOUT, "steps on 3 slices again", everyone)
        assert restored(joiner) is not None and restored(joiner)[1] == "peer"  # type: ignore[index]
        resumed = min(on(joiner, 3))
        for worker in everyone:
            assert on(worker, 3)[resumed] == expected_checksum(resumed, 6)
        for worker in everyone:  # the same random stream throughout, on every slice
            wrong = {step: f["key"] for step, f in worker.steps().items() if int(f["key"]) != expected_key(step)}
            assert not wrong, (worker.name, wrong)


PATHWAYS_HARNESS = Path(__file__).with_name("jax_pathways_harness.py")


def test_a_pathwaysutils_style_loop_saves_on_sigterm_and_resumes_its_snapshot(tmp_path: Path) -> None:
    env = worker_env(rank=0, world_size=1, port=free_port(), checkpoint_dir=tmp_path / "checkpoints")
    with Workers(tmp_path) as workers:
        first = workers.start("first", PATHWAYS_HARNESS, [], env)
        wait_until(lambda: first.last_step() >= 8, TIMEOUT, "8 steps", [first])
        saved = stop([first], 0)
        assert "resumed step=0 seen=0" in first.lines()

        second = workers.start("second", PATHWAYS_HARNESS, [], env)
        wait_until(lambda: second.last_step() > saved, TIMEOUT, "a step after the restore", [second])
        assert f"resumed step={saved} seen={saved}" in second.lines()
        assert restored(second) == (saved, "migration")
        assert float(second.steps()[saved + 1]["w"]) == saved + 1


def test_only_damaged_checkpoints_or_a_refused_directory_stop_the_job_in_one_line(tmp_path: Path) -> None:
    """Issue 24 item 3, JAX: with every step damaged the job exits 65 (a workload error) with
    one line instead of starting again from step 0; HOTSWAP_ALLOW_FRESH_START=1 lets it. A
    checkpoint directory others can write to: one line, exit 65, no traceback."""
    from hotswap.api import worker as contract

    checkpoints = tmp_path / "checkpoints"
    args = ["--steps", "4", "--checkpoint-every", "2", "--step-sleep", "0"]
    with Workers(tmp_path) as workers:
        [first] = start_job(workers, "first", 1, checkpoints, args)
        assert first.wait(TIMEOUT) == 0, first.stderr()
        steps = sorted(p.name for p in checkpoints.iterdir() if p.name.isdigit())
        assert steps == ["2", "4"]
        for step in steps:
            (checkpoints / step / "state" / "_METADATA").write_text("garbage")

        [second] = start_job(workers, "second", 1, checkpoints, args)
        assert second.wait(TIMEOUT) == contract.CHECKPOINTS_UNUSABLE_EXIT_CODE, second.stderr()
        # (JAX's logging prefixes the warnings with "WARNING:hotswap.train:")
        errors = [line for line in second.stderr().splitlines() if "hotswap: " in line or "Traceback" in line]
        assert len(errors) == 3 and errors[-1].startswith("hotswap: no usable checkpoint: 2 damaged one(s) were set aside"), errors
        assert all("hotswap: damaged checkpoint " in line and "moved to" in line for line in errors[:2]), errors
        assert not any(line.startswith("step=") for line in second.lines())

        port = free_port()
        env = worker_env(rank=0, world_size=1, port=port, checkpoint_dir=checkpoints)
        allowed = workers.start("allowed", HARNESS, args, {**env, contract.HOTSWAP_ALLOW_FRESH_START: "1"})
        assert allowed.wait(TIMEOUT) == 0, allowed.stderr()
        assert sorted(allowed.steps()) == [1, 2, 3, 4] and (checkpoints / "4").is_dir()

        shared = tmp_path / "shared"
        shared.mkdir()
        shared.chmod(0o777)
        [refused] = start_job(workers, "refused", 1, shared, args)
        assert refused.wait(TIMEOUT) == contract.CHECKPOINTS_UNUSABLE_EXIT_CODE, refused.stderr()
        assert [line for line in refused.stderr().splitlines() if "hotswap" in line or "Traceback" in line] == [
            f"hotswap: refusing checkpoint directory {shared}: it is writable by others (mode 0777), who could plant "
            f"a checkpoint; make it private (chmod go-w {shared}) or use another directory"
        ], refused.stderr()
