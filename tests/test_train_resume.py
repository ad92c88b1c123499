"""SIGTERM mid-training, then a restart with the same checkpoint directory (what deleting and
re-creating a workload does): 0 steps lost, and the same losses as an uninterrupted run.
Real worker processes, PyTorch with gloo on CPU."""

from __future__ import annotations

import itertools
import json
import re
import signal
from pathlib import Path

import pytest
from train_harness import (
    MIGRATOR_EXAMPLE,
    TRAIN_EXAMPLE,
    Worker,
    Workers,
    free_port,
    read_events,
    wait_until,
    worker_env,
)

pytest.importorskip("torch")

STEPS = 60
TRAIN_ARGS = ["--steps", str(STEPS), "--checkpoint-every", "10", "--collective-timeout", "20"]
SAVED = re.compile(r"^checkpoint saved step=(\d+) reason=termination ")


def run_job(
    workers: Workers, name: str, script: Path, args: list[str], ranks: int, checkpoint_dir: Path
) -> list[Worker]:
    port = free_port()
    return [
        workers.start(
            f"{name}-rank{rank}",
            script,
            args,
            worker_env(
                rank=rank,
                world_size=ranks,
                port=port,
                checkpoint_dir=checkpoint_dir,
                events_file=workers.directory / f"{name}-rank{rank}.events",
            ),
        )
        for rank in range(ranks)
    ]


def finish(job: list[Worker], code: int, timeout: float = 60.0) -> None:
    for worker in job:
        assert worker.wait(timeout) == code, worker.stderr()


def saved_step(worker: Worker) -> int:
    [step] = [int(m.group(1)) for line in worker.lines() if (m := SAVED.match(line))]
    return step


def interrupt_and_resume(
    directory: Path, script: Path, args: list[str], slow: list[str], ranks: int, signalled: list[int]
) -> dict:  # type: ignore[type-arg]
    """An uninterrupted reference run; a run SIGTERMed (on the ``signalled`` ranks) after step
    15, past its first periodic checkpoint; the restart. Returns the workers of each."""
    with Workers(directory) as workers:
        reference = run_job(workers, "reference", script, args, ranks, directory / "reference-checkpoints")
        first = run_job(workers, "first", script, args + slow, ranks, directory / "checkpoints")
        wait_until(lambda: all(w.last_step() >= 15 for w in first), 60, "15 steps", first)
        for rank in signalled:
            first[rank].signal(signal.SIGTERM)
        finish(first, 143)
        finish(reference, 0)
        second = run_job(workers, "second", script, args, ranks, directory / "checkpoints")
        finish(second, 0)
    return {"reference": reference, "first": first, "second": second}


@pytest.fixture(scope="module")
def single_rank(tmp_path_factory: pytest.TempPathFactory) -> dict:  # type: ignore[type-arg]
    return interrupt_and_resume(
        tmp_path_factory.mktemp("single"), TRAIN_EXAMPLE, TRAIN_ARGS, ["--step-sleep", "0.03"], 1, [0]
    )


def assert_zero_steps_lost_and_same_losses(job: dict, rank: int) -> int:  # type: ignore[type-arg]
    first, second, reference = job["first"][rank], job["second"][rank], job["reference"][rank]
    stopped = first.last_step()
    assert 15 <= stopped < STEPS
    assert second.lines()[0] == f"restored step={stopped} source=migration"
    before, after = first.losses(), second.losses()
    assert sorted(before) == list(range(1, stopped + 1))
    assert sorted(after) == list(range(stopped + 1, STEPS + 1))
    assert {**before, **after} == reference.losses()  # exactly: the same floats, step by step
    return stopped


def test_sigterm_saves_at_the_step_boundary_and_a_restart_loses_no_step(single_rank: dict) -> None:  # type: ignore[type-arg]
    stopped = assert_zero_steps_lost_and_same_losses(single_rank, 0)
    assert saved_step(single_rank["first"][0]) == stopped


def test_sigterm_on_one_rank_stops_every_rank_at_the_same_boundary(tmp_path: Path) -> None:
    job = interrupt_and_resume(tmp_path, TRAIN_EXAMPLE, TRAIN_ARGS, ["--step-sleep", "0.03"], 2, signalled=[1])
    stopped = assert_zero_steps_lost_and_same_losses(job, 0)
    assert assert_zero_steps_lost_and_same_losses(job, 1) == stopped
    assert saved_step(job["first"][0]) == stopped  # rank 0 wrote it
    assert not any(SAVED.match(line) for line in job["first"][1].lines())


def test_goodput_events_record_start_steps_saves_restore_and_stop(single_rank: dict) -> None:  # type: ignore[type-arg]
    first = read_events(single_rank["first"][0].log.with_suffix(".events"))
    second = read_events(single_rank["second"][0].log.with_suffix(".events"))
    stopped = single_rank["first"][0].last_step()

    assert first[0]["kind"] == "start" and first[0]["attempt"] == 1 and first[0]["world_size"] == 1
    assert [e["step"] for e in first if e["kind"] == "step"] == list(range(1, stopped + 1))
    assert all(e["duration_s"] > 0 and e["slices"] == 1 for e in first if e["kind"] == "step")
    saves = [e for e in first if e["kind"] == "checkpoint_save"]
    assert [e["reason"] for e in saves][:1] == ["periodic"] and saves[0]["step"] == 10
    assert saves[0]["blocking_s"] <= saves[0]["total_s"] and saves[0]["bytes"] > 0
    assert first[-1] == {**first[-1], "kind": "stop", "step": stopped, "reason": "terminated", "exit_code": 143}
    assert any(e["reason"] == "termination" and e["step"] == stopped for e in saves) or saves[-1]["step"] == stopped

    assert [e["kind"] for e in second[:2]] == ["start", "checkpoint_restore"]
    assert second[1]["step"] == stopped and second[1]["source"] == "migration" and second[1]["duration_s"] >= 0
    assert [e["step"] for e in second if e["kind"] == "step"] == list(range(stopped + 1, STEPS + 1))
    assert [e for e in second if e["kind"] == "checkpoint_save"][-1]["reason"] == "final"
    assert second[-1] == {**second[-1], "kind": "stop", "step": STEPS, "reason": "complete", "exit_code": 0}
    assert all(a["t"] <= b["t"] for a, b in itertools.pairwise(second))


def test_a_seed_004_script_resumes_through_the_migrator(tmp_path: Path) -> None:
    """Two ranks under DistributedDataParallel (the script's own process group), SIGTERM to
    both as a pod deletion does. The migrator's step boundary is the end of optimizer.step(),
    so the script's code after it (here, printing the step line) does not run for the step
    that is saved: that one line is missing, no training step is."""
    args = ["--epochs", "2"]
    job = interrupt_and_resume(tmp_path, MIGRATOR_EXAMPLE, args, ["--step-sleep", "0.03"], 2, signalled=[0, 1])
    steps = job["reference"][0].last_step()
    assert steps == 56  # 2 epochs of 3584 samples in global batches of 2 x 64
    saved = saved_step(job["first"][0])
    for rank in range(2):
        first, second, reference = job["first"][rank], job["second"][rank], job["reference"][rank].losses()
        assert sorted(first.losses()) == list(range(1, saved))
        assert second.lines()[0] == f"restored step={saved} source=migration"
        assert second.lines()[1].startswith("load migration ckpt from epoch")
        assert sorted(second.losses()) == list(range(saved + 1, steps + 1))
        assert {**first.losses(), **second.losses()} == {s: loss for s, loss in reference.items() if s != saved}


def test_a_lost_peer_in_a_job_that_is_not_elastic_costs_no_step(tmp_path: Path) -> None:
    """SIGKILL one of two ranks: the survivor cannot re-form the group, so it checkpoints the
    last complete step and exits 42 (restart); the restarted job resumes right there."""
    with Workers(tmp_path) as workers:
        first = run_job(workers, "first", TRAIN_EXAMPLE, [*TRAIN_ARGS, "--step-sleep", "0.03"], 2, tmp_path / "ckpt")
        wait_until(lambda: all(w.last_step() >= 15 for w in first), 60, "15 steps", first)
        first[1].signal(signal.SIGKILL)
        assert first[0].wait(60) == 42, first[0].stderr()
        assert "a peer was lost and the workload is not elastic" in first[0].stderr()
        second = run_job(workers, "second", TRAIN_EXAMPLE, TRAIN_ARGS, 2, tmp_path / "ckpt")
        finish(second, 0)
    survived = first[0].last_step()
    for worker in second:
        assert worker.lines()[0] == f"restored step={survived} source=checkpoint"
        assert sorted(worker.losses()) == list(range(survived + 1, STEPS + 1))
    recovery = [e for e in read_events(first[0].log.with_suffix(".events")) if e["kind"] == "checkpoint_save"]
    assert (recovery[-1]["reason"], recovery[-1]["step"]) == ("recovery", survived)


def test_a_restart_s_phases_are_read_from_the_workers_own_records(single_rank: dict, tmp_path: Path) -> None:  # type: ignore[type-arg]
    """The demo and bench_mttr report a restart's phases (spawn, import, group formed, state
    restored, first step) from what the workers recorded: the SDK puts when the process began in
    its start event and when its group formed and its state was restored in its first step's."""
    from hotswap.demo.observe import read_trace, restart_phases

    first = read_events(single_rank["first"][0].log.with_suffix(".events"))
    second = read_events(single_rank["second"][0].log.with_suffix(".events"))
    start, step = second[0], next(e for e in second if e["kind"] == "step")
    assert start["kind"] == "start" and float(start["process_t"]) < float(start["t"])  # the process began before its run
    assert float(start["t"]) <= float(step["formed_t"]) <= float(step["restored_t"]) <= float(step["t"])
    assert all("restored_t" not in e for e in second if e["kind"] == "step" and e is not step)  # the first step only

    # The layout the local backend gives the events files: events/<attempt>-<replica>-<host>.jsonl
    (tmp_path / "events").mkdir()
    for attempt, events in ((1, first), (2, second)):
        (tmp_path / "events" / f"{attempt}-0-0.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    stopped = float(first[-1]["t"])
    t_fail = stopped - 0.01  # the failure came just before the old worker stopped
    phases = restart_phases(read_trace(tmp_path), t_fail, after_attempt=1, decision_t=t_fail + 0.005)
    assert list(phases) == ["decision_s", "stop_s", "spawn_s", "import_s", "formed_s", "restored_s", "first_step_s"]
    assert phases["decision_s"] == 0.005 and phases["stop_s"] == round(stopped - t_fail, 3)
    assert phases["spawn_s"] == round(float(start["process_t"]) - t_fail, 3)
    assert phases["import_s"] == round(float(start["t"]) - t_fail, 3)
    assert phases["restored_s"] == round(float(step["restored_t"]) - t_fail, 3)
    assert phases["first_step_s"] == round(float(step["t"]) - t_fail, 3)
    ordered = [phases[k] for k in ("stop_s", "spawn_s", "import_s", "formed_s", "restored_s", "first_step_s")]
    assert ordered == sorted(ordered)  # type: ignore[type-var]
