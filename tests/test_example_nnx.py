"""The Flax NNX example (``examples/train_nnx.py``: an ``nnx.Module`` CNN, ``nnx.Optimizer``,
``nnx.MultiMetric``, dropout keys in ``nnx.Rngs``, an ``nnx.jit`` step) in 2 JAX processes on
the local backend, through a migration, a non-elastic slice loss and an elastic 2 -> 1 -> 2,
each compared step by step with an uninterrupted run of the same seed (issue 33)."""

from __future__ import annotations

import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest
from example_helpers import Curves, combined, create, curves, slice_of, tail_mean, wait_for_end, wait_for_steps
from local_helpers import PYTHON, cleanup, hotswap, wait_until, workloads

from hotswap.demo.observe import read_trace

pytest.importorskip("flax")
pytest.importorskip("orbax.checkpoint")

ROOT = Path(__file__).resolve().parents[1]
STEPS = 40
ARGS = ["--steps", str(STEPS), "--eval-every", "10", "--checkpoint-every", "5", "--step-sleep", "0.1"]


def command(*extra: str) -> str:
    return shlex.join([PYTHON, str(ROOT / "examples" / "train_nnx.py"), *ARGS, *extra])


@pytest.fixture(scope="module")
def module_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    home = tmp_path_factory.mktemp("nnx") / "state"
    yield home
    cleanup(home)


@pytest.fixture(scope="module")
def reference(module_home: Path) -> Curves:
    hotswap(module_home, "cluster", "create", "--cluster", "ref", "--device-type", "v6e-4", "--num-slices", "2", check=True)
    create(module_home, "ref", "cnn", command())
    final = wait_for_end(module_home, "ref", "cnn")
    assert final["phase"] == "SUCCESSFUL" and final["attempt"] == 1, final["status_message"]
    found = curves(module_home, "ref", "cnn")
    assert sorted(found[0][1]) == list(range(1, STEPS + 1))
    return found


def test_a_migrated_nnx_run_trains_exactly_the_uninterrupted_curve(module_home: Path, reference: Curves) -> None:
    hotswap(module_home, "cluster", "create", "--cluster", "mig", "--device-type", "v6e-4", "--num-slices", "2", check=True)
    create(module_home, "mig", "cnn", command())
    wait_for_steps(module_home, "mig", "cnn", 12)
    hotswap(module_home, "workload", "delete", "--cluster", "mig", "--workload", "cnn", "--force", check=True)
    wait_until(lambda: "cnn" not in workloads(module_home, "mig"), timeout=120, what="the deletion")
    first = curves(module_home, "mig", "cnn")[0][1]
    create(module_home, "mig", "cnn", command())
    final = wait_for_end(module_home, "mig", "cnn")
    assert final["phase"] == "SUCCESSFUL", final["status_message"]
    second = curves(module_home, "mig", "cnn")[0][1]
    assert min(second) == max(first) + 1  # resumed where it stopped: 0 steps lost
    assert {**first, **second} == reference[0][1]  # parameters, optimizer, metrics and dropout keys


def test_an_nnx_job_that_loses_a_slice_resumes_on_the_spare_with_the_same_curve(module_home: Path, reference: Curves) -> None:
    """The loss is the global batch's (one jitted step over both processes' shards), and every
    random number is the model's own dropout key, which is state: the curve stays exact.
    The JAX survivor cannot save alone (orbax's save needs every process), so the restart
    resumes from the newest periodic checkpoint: up to ``--checkpoint-every`` steps are
    trained again (PyTorch's survivors save: 0 there; see the README)."""
    hotswap(module_home, "cluster", "create", "--cluster", "loss", "--device-type", "v6e-4", "--num-slices", "3", check=True)
    create(module_home, "loss", "cnn", command())
    wait_for_steps(module_home, "loss", "cnn", 12)
    hotswap(module_home, "node", "fail", "--cluster", "loss", "--slice", slice_of(module_home, "loss", "cnn", 1), check=True)
    final = wait_for_end(module_home, "loss", "cnn")
    assert final["phase"] == "SUCCESSFUL" and final["attempt"] == 2, final["status_message"]
    trace = read_trace(module_home / "clusters" / "loss" / "workloads" / "cnn-0")
    survivor_last = max(s.step for s in trace.steps if s.attempt == 1 and s.replica == 0)
    restores = {r.step for r in trace.restores if r.attempt == 2}
    assert len(restores) == 1 and survivor_last - 5 <= restores.pop() <= survivor_last
    assert combined(curves(module_home, "loss", "cnn")[0]) == reference[0][1]


def test_an_elastic_nnx_job_goes_from_2_to_1_to_2_slices(module_home: Path, reference: Curves) -> None:
    """No restart and no step lost; exact until the slice is lost. On one slice each step
    trains on half the global batch (the batch per process is fixed), so from there it is
    another run of the same model, compared by its level."""
    hotswap(module_home, "cluster", "create", "--cluster", "el", "--device-type", "v6e-4", "--num-slices", "2", check=True)
    create(module_home, "el", "cnn", command("--step-sleep", "0.2"), "--min-slices", "1")
    wait_for_steps(module_home, "el", "cnn", 8)
    lost = slice_of(module_home, "el", "cnn", 1)
    hotswap(module_home, "node", "fail", "--cluster", "el", "--slice", lost, check=True)
    directory = module_home / "clusters" / "el" / "workloads" / "cnn-0"
    wait_until(lambda: sum(s.slices == 1 for s in read_trace(directory).steps) >= 3, timeout=180, what="3 steps on 1 slice")
    hotswap(module_home, "node", "uncordon", "--cluster", "el", "--node", f"{lost}-0", check=True)
    final = wait_for_end(module_home, "el", "cnn")
    assert final["phase"] == "SUCCESSFUL" and final["restarts"] == 0, final["status_message"]
    trace = read_trace(directory)
    assert sorted({s.step for s in trace.steps if s.replica == 0}) == list(range(1, STEPS + 1))
    assert any(s.slices == 2 for s in trace.steps if s.step > min(s.step for s in trace.steps if s.slices == 1))
    shrunk = min(s.step for s in trace.steps if s.slices == 1)
    curve, expected = combined(curves(module_home, "el", "cnn")[0]), reference[0][1]
    assert {s: curve[s] for s in range(1, shrunk - 1)} == {s: expected[s] for s in range(1, shrunk - 1)}
    assert tail_mean(curve, STEPS, 5) < 3 * tail_mean(expected, STEPS, 5) + 0.1  # it trained on
