"""The Flax NNX example (``examples/train_nnx.py``: an ``nnx.Module`` classifier, ``nnx.Optimizer``,
``nnx.MultiMetric``, an ``nnx.jit`` step, dropout from ``nnx.Rngs``, an evaluation pass every few
steps), run by 2 real JAX processes (jax.distributed, gloo on CPU), the test playing the
controller: a migration (SIGTERM, then the job created again), a non-elastic slice loss (a rank
killed; the survivor saves its replica and exits for a restart; the job resumes from it) and an
elastic 2 -> 1 -> 2. Each loss curve (and the training metrics' windows, which are NNX state
too) is compared step by step with an uninterrupted run of the same seed."""

from __future__ import annotations

import math
import re
import signal
from pathlib import Path

import pytest
from train_harness import Worker, Workers, free_port, publish_membership, wait_until, worker_env

pytest.importorskip("jax", reason="the JAX SDK needs hotswap[jax]")
pytest.importorskip("orbax.checkpoint", reason="the JAX SDK needs hotswap[jax]")
pytest.importorskip("flax.nnx", reason="the Flax NNX example needs flax (hotswap[jax])")

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "train_nnx.py"
STEPS = 40
ARGS = ["--steps", str(STEPS), "--batch-size", "32", "--log-every", "5", "--eval-every", "10", "--checkpoint-every", "10"]
TIMEOUT = 180.0  # per phase: JAX starts slowly on a busy 2-core machine
SLICES = ("slice-0", "slice-1")
SAVED = re.compile(r"^checkpoint saved step=(\d+) reason=termination ")
SURVIVOR_SAVED = re.compile(r"^checkpoint saved step=(\d+) reason=recovery .*by a survivor")
RESTORED = re.compile(r"^restored step=(\d+) source=(\w+)")
METRICS = ("loss", "train_accuracy", "train_loss")  # the step's loss and the metrics' windows
QUIET = ("Distributed system is not available", "did not leave generation")  # the expected path's noise


def start(workers: Workers, name: str, checkpoints: Path, *, sleep: float = 0.0, ranks: int = 2, **env: object) -> list[Worker]:
    port = free_port()
    args = [*ARGS, "--step-sleep", str(sleep)]
    return [
        workers.start(f"{name}-{rank}", EXAMPLE, args, worker_env(rank=rank, world_size=ranks, port=port, checkpoint_dir=checkpoints, **env))  # type: ignore[arg-type]
        for rank in range(ranks)
    ]


def finish(job: list[Worker]) -> None:
    for worker in job:
        assert worker.wait(TIMEOUT) == 0, worker.stderr()


def curve(worker: Worker) -> dict[int, dict[str, str]]:
    return {step: {k: v for k, v in fields.items() if k in METRICS} for step, fields in worker.steps().items()}


def restored(worker: Worker) -> tuple[int, str]:
    [found] = [(int(m.group(1)), m.group(2)) for line in worker.lines() if (m := RESTORED.match(line))]
    return found


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[int, dict[str, str]]:
    """The uninterrupted run of the same seed: its step lines, the same on both ranks."""
    directory = tmp_path_factory.mktemp("reference")
    with Workers(directory) as workers:
        job = start(workers, "reference", directory / "checkpoints")
        finish(job)
    steps = curve(job[0])
    assert sorted(steps) == list(range(1, STEPS + 1)) and curve(job[1]) == steps
    assert "train_accuracy" in steps[5] and "eval accuracy=" in "\n".join(job[0].lines())
    return steps


def test_a_migrated_nnx_job_resumes_at_the_exact_step_with_the_same_curve(tmp_path: Path, reference: dict[int, dict[str, str]]) -> None:
    """SIGTERM mid-run (delete), then the job created again: it resumes at the step it saved and
    every later step's loss and metrics window are bit for bit the uninterrupted run's (the model,
    the optimizer, the metrics' sums and the dropout stream were all restored into the objects)."""
    checkpoints = tmp_path / "checkpoints"
    with Workers(tmp_path) as workers:
        first = start(workers, "first", checkpoints, sleep=0.2)
        wait_until(lambda: all(w.last_step() >= 12 for w in first), TIMEOUT, "12 steps", first)
        first[1].signal(signal.SIGTERM)
        for worker in first:
            assert worker.wait(TIMEOUT) == 143, worker.stderr()
        [saved] = [int(m.group(1)) for line in first[0].lines() if (m := SAVED.match(line))]

        second = start(workers, "second", checkpoints)
        finish(second)
    for worker in second:
        assert restored(worker) == (saved, "migration")
        assert curve(worker) == {step: reference[step] for step in range(saved + 1, STEPS + 1)}
    assert curve(first[0]) == {step: reference[step] for step in range(1, saved + 1)}


def test_a_non_elastic_slice_loss_resumes_from_the_survivors_save_with_the_same_curve(tmp_path: Path, reference: dict[int, dict[str, str]]) -> None:
    """A rank killed (its slice lost) in a job without elastic slices: the survivor cannot take
    an orbax checkpoint without its group, so it writes the replica it holds as a survivor save
    and exits for a restart, saying so in one line and no more; the restarted job resumes from
    that step, not from the periodic checkpoint before it (0 steps lost), and recomputes exactly
    the uninterrupted steps."""
    checkpoints = tmp_path / "checkpoints"
    with Workers(tmp_path) as workers:
        first = start(workers, "first", checkpoints, sleep=0.2)
        committed = lambda: (checkpoints / "10").is_dir() and all(w.last_step() >= 14 for w in first)  # noqa: E731
        wait_until(committed, TIMEOUT, "step 10's checkpoint and 14 steps", first)
        first[1].signal(signal.SIGKILL)
        assert first[0].wait(TIMEOUT) == 42, first[0].stderr()
        survivor = first[0].stderr()
        assert not [line for line in survivor.splitlines() if any(noise in line for noise in QUIET)], survivor
        assert "Traceback" not in survivor, survivor
        [saved] = [int(m.group(1)) for line in first[0].lines() if (m := SURVIVOR_SAVED.match(line))]
        assert saved == first[0].last_step()  # the last step it completed: nothing it trained is lost

        second = start(workers, "second", checkpoints)
        finish(second)
    for worker in second:
        assert restored(worker) == (saved, "checkpoint")
        assert curve(worker) == {s: reference[s] for s in range(saved + 1, STEPS + 1)}
    assert not list((checkpoints / "survivors").iterdir())  # superseded by the group's next checkpoint


def test_an_elastic_nnx_job_shrinks_to_1_slice_and_grows_back_on_the_same_curve(tmp_path: Path, reference: dict[int, dict[str, str]]) -> None:
    """2 -> 1 -> 2 slices: the survivor goes on alone, its objects taken back from its handoff, and
    the returning process receives the state from it. Every step computes the same global batch,
    so the curve is the uninterrupted one: bit for bit before the loss; on 1 slice and after, to
    float32 rounding (one device sums the batch in another order than two devices and an
    all-reduce, so the last bits differ and the weights go on from there)."""
    membership = tmp_path / "membership.json"
    publish_membership(membership, 1, SLICES, free_port())
    checkpoints = tmp_path / "checkpoints"

    def process(workers: Workers, rank: int, name: str) -> Worker:
        env = worker_env(
            rank=rank, world_size=2, port=0, checkpoint_dir=checkpoints, slice_name=SLICES[rank], membership_file=membership,
        )
        return workers.start(name, EXAMPLE, [*ARGS, "--step-sleep", "0.3"], env)

    def slices(worker: Worker) -> dict[int, str]:
        return {step: fields["elastic_manager.good_slice_count"] for step, fields in worker.steps().items()}

    with Workers(tmp_path) as workers:
        survivor, lost = process(workers, 0, "slice0"), process(workers, 1, "slice1")
        wait_until(lambda: survivor.last_step() >= 8, TIMEOUT, "8 steps on 2 slices", [survivor, lost])
        lost.signal(signal.SIGKILL)
        publish_membership(membership, 2, SLICES[:1], free_port())
        wait_until(lambda: list(slices(survivor).values()).count("1") >= 4, TIMEOUT, "4 steps on 1 slice", [survivor])
        publish_membership(membership, 3, SLICES, free_port())
        joiner = process(workers, 1, "slice1-joiner")
        finish([survivor, joiner])

    counts = slices(survivor)
    shrunk = min(step for step, count in counts.items() if count == "1")
    grown = min(step for step, count in counts.items() if count == "2" and step > shrunk)
    assert restored(joiner)[1] == "peer" and restored(joiner)[0] < grown
    steps = curve(survivor)
    assert sorted(steps) == list(range(1, STEPS + 1))
    assert {s: steps[s] for s in range(1, shrunk)} == {s: reference[s] for s in range(1, shrunk)}
    for step in range(shrunk, STEPS + 1):
        for name, value in steps[step].items():
            assert math.isclose(float(value), float(reference[step][name]), rel_tol=1e-4, abs_tol=1e-6), (step, name)
    assert {s: f for s, f in curve(joiner).items() if s >= grown} == {s: steps[s] for s in range(grown, STEPS + 1)}
