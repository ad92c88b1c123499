"""The GPT example (``examples/train_gpt.py``: DDP, gradient accumulation, an LR schedule by
iteration, a prefetched micro-batch, evaluation pauses, a seed per rank) on the local backend,
through what a cluster does to it: a migration (delete and re-create), a non-elastic slice
loss (hotswap onto the spare) and an elastic 2 -> 1 -> 2. Each is compared step by step with an
uninterrupted run of the same seed, from the workers' own logs (issue 33)."""

from __future__ import annotations

import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest
from example_helpers import Curves, combined, create, curves, slice_of, tail_mean, wait_for_end, wait_for_steps
from local_helpers import PYTHON, cleanup, hotswap, wait_until, workloads

from hotswap.demo.observe import read_trace

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]
STEPS = 80
ARGS = ["--max-iters", str(STEPS), "--eval-interval", "20", "--checkpoint-every", "10", "--step-sleep", "0.05"]
def command(*extra: str) -> str:
    return shlex.join([PYTHON, str(ROOT / "examples" / "train_gpt.py"), *ARGS, *extra])


@pytest.fixture(scope="module")
def module_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    home = tmp_path_factory.mktemp("gpt") / "state"
    yield home
    cleanup(home)


@pytest.fixture(scope="module")
def reference(module_home: Path) -> dict[bool, Curves]:
    """Uninterrupted runs of the same seed, with DDP and without (ht.average_gradients)."""
    hotswap(module_home, "cluster", "create", "--cluster", "ref", "--device-type", "v6e-4", "--num-slices", "2", check=True)
    found = {}
    for ddp in (True, False):
        name = "ddp" if ddp else "plain"
        create(module_home, "ref", name, command() if ddp else command("--no-ddp"))
        final = wait_for_end(module_home, "ref", name)
        assert final["phase"] == "SUCCESSFUL" and final["restarts"] == 0, final["status_message"]
        found[ddp] = curves(module_home, "ref", name)
    return found


def test_the_reference_runs_train_each_rank_on_its_own_batches(reference: dict[bool, Curves]) -> None:
    for runs in reference.values():
        rank0, rank1 = (runs[replica][1] for replica in (0, 1))
        assert sorted(rank0) == list(range(1, STEPS + 1))
        assert sum(rank0[s] != rank1[s] for s in rank0) > STEPS * 0.9  # a seed per rank: other batches


@pytest.mark.parametrize("ddp", [True, False], ids=["ddp", "average_gradients"])
def test_a_migrated_run_trains_exactly_the_uninterrupted_curve(
    module_home: Path, reference: dict[bool, Curves], ddp: bool
) -> None:
    """Without DDP this needs the ranks to start from one model (rank 0's): the first restore
    gives every rank rank 0's weights, so a run whose ranks kept their own initial weights departs
    from its uninterrupted self at the second resumed step."""
    cluster = f"mig{int(ddp)}"
    hotswap(module_home, "cluster", "create", "--cluster", cluster, "--device-type", "v6e-4", "--num-slices", "2", check=True)
    extra = () if ddp else ("--no-ddp",)
    create(module_home, cluster, "gpt", command(*extra))
    wait_for_steps(module_home, cluster, "gpt", 25)
    hotswap(module_home, "workload", "delete", "--cluster", cluster, "--workload", "gpt", "--force", check=True)
    wait_until(lambda: "gpt" not in workloads(module_home, cluster), timeout=120, what="the deletion")
    interrupted = curves(module_home, cluster, "gpt")  # the deleted run's logs, kept until the cluster goes
    create(module_home, cluster, "gpt", command(*extra))
    final = wait_for_end(module_home, cluster, "gpt")
    assert final["phase"] == "SUCCESSFUL", final["status_message"]
    resumed = curves(module_home, cluster, "gpt")
    for replica in (0, 1):
        first = interrupted[replica][1]
        second = resumed[replica][1]
        assert min(second) == max(first) + 1  # resumed at the step it stopped at: 0 steps lost
        assert {**first, **second} == reference[ddp][replica][1]


def test_a_slice_lost_under_the_default_policy_costs_no_step(module_home: Path, reference: dict[bool, Curves]) -> None:
    """Recreate, with DDP: the new attempt waits for the survivor's save and resumes at the
    step it held. The curve is the uninterrupted one up to there, and for the survivor one step
    further (its own random stream was saved with it); the lost rank's stream went with its
    node, so it resumes on a stream of its own, and from there the run is another run of the
    same model, compared by its level."""
    hotswap(module_home, "cluster", "create", "--cluster", "loss", "--device-type", "v6e-4", "--num-slices", "3", check=True)
    create(module_home, "loss", "gpt", command("--step-sleep", "0.1"))
    wait_for_steps(module_home, "loss", "gpt", 25)
    hotswap(module_home, "node", "fail", "--cluster", "loss", "--slice", slice_of(module_home, "loss", "gpt", 1), check=True)
    final = wait_for_end(module_home, "loss", "gpt")
    assert final["phase"] == "SUCCESSFUL" and final["attempt"] == 2, final["status_message"]
    trace = read_trace(module_home / "clusters" / "loss" / "workloads" / "gpt-0")
    survivor_last = max(s.step for s in trace.steps if s.attempt == 1 and s.replica == 0)
    (restore, *_) = [r for r in trace.restores if r.attempt == 2]
    assert restore.step == survivor_last  # the survivor's save: no step lost
    runs = curves(module_home, "loss", "gpt")
    survivor, replaced = combined(runs[0]), combined(runs[1])
    expected, expected_lost = reference[True][0][1], reference[True][1][1]
    resumed = restore.step + 1
    assert {s: survivor[s] for s in range(1, resumed + 1)} == {s: expected[s] for s in range(1, resumed + 1)}
    assert {s: replaced[s] for s in range(1, resumed)} == {s: expected_lost[s] for s in range(1, resumed)}
    assert replaced[resumed] != expected_lost[resumed]  # a stream of its own, not the survivor's
    assert replaced[resumed] != survivor[resumed]
    assert sorted(survivor) == list(range(1, STEPS + 1))
    assert abs(tail_mean(survivor, STEPS) - tail_mean(expected, STEPS)) < 0.15 * tail_mean(expected, STEPS)


def test_an_elastic_job_goes_from_2_to_1_to_2_slices_and_each_rank_keeps_its_own_data(
    module_home: Path, reference: dict[bool, Curves]
) -> None:
    """Elastic: no restart, no step lost. The curve is the uninterrupted one until the slice is
    lost; on one slice the single rank draws every micro-batch of a step from its own stream
    (the same global batch size, other samples), so from there it is another run of the same
    model, and it is compared by its level, not bit for bit. After the grow-back the joiner
    draws batches of its own, not the survivor's."""
    hotswap(module_home, "cluster", "create", "--cluster", "el", "--device-type", "v6e-4", "--num-slices", "2", check=True)
    create(module_home, "el", "gpt", command("--step-sleep", "0.1"), "--min-slices", "1")
    wait_for_steps(module_home, "el", "gpt", 20)
    lost = slice_of(module_home, "el", "gpt", 1)
    hotswap(module_home, "node", "fail", "--cluster", "el", "--slice", lost, check=True)
    directory = module_home / "clusters" / "el" / "workloads" / "gpt-0"
    wait_until(lambda: sum(s.slices == 1 for s in read_trace(directory).steps) >= 5, timeout=120, what="5 steps on 1 slice")
    hotswap(module_home, "node", "uncordon", "--cluster", "el", "--node", f"{lost}-0", check=True)
    final = wait_for_end(module_home, "el", "gpt")
    assert final["phase"] == "SUCCESSFUL" and final["attempt"] == 1, final["status_message"]  # never restarted
    trace = read_trace(directory)
    survivor = sorted(s.step for s in trace.steps if s.replica == 0)
    assert survivor == list(range(1, STEPS + 1))  # every step once: nothing lost, nothing repeated
    shrunk = min(s.step for s in trace.steps if s.slices == 1)
    grown = min(s.step for s in trace.steps if s.slices == 2 and s.step > shrunk)
    runs = curves(module_home, "el", "gpt")
    rank0, rank1 = combined(runs[0]), combined(runs[1])
    expected = reference[True][0][1]
    assert {s: rank0[s] for s in range(1, shrunk - 1)} == {s: expected[s] for s in range(1, shrunk - 1)}
    after = [s for s in range(grown, STEPS + 1) if s in rank1]
    assert len(after) >= 5 and sum(rank0[s] != rank1[s] for s in after) == len(after)  # the joiner's own stream
    assert abs(tail_mean(rank0, STEPS) - tail_mean(expected, STEPS)) < 0.15 * tail_mean(expected, STEPS)  # the same model trained as far
