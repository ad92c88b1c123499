"""The drain + controller crash drill (issue 36, item 2): a node of an elastic workload drained
(or its slice preempted) while the controller is killed with -9 must cost the workload nothing:
the exits of its workers (143, a saved checkpoint) are the drain's or the preemption's doing.

The trainer follows the elastic protocol as the SDK does, in a few lines: it reads the
membership file at each step and leaves (saves, exits 143) once its slice is not in it; it saves
and exits 143 on SIGTERM too. A generation written before its round committed made a drained
worker leave for a drain that a killed controller never committed; its exit was then judged a
failure (with ``--max-restarts 0``: FAILED).

``HOTSWAP_DRAIN_CRASH_ROUNDS`` sets how many drains and preemptions the random drill makes
(default 3; the issue's 50: ``benchmarks/bench_infra_faults.py``).
"""

from __future__ import annotations

import os
import random
import shlex
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from local_helpers import query, wait_until, workloads
from test_controller_crash_drill import TRAINER, Drill

ROUNDS = int(os.environ.get("HOTSWAP_DRAIN_CRASH_ROUNDS", "3"))

# The crash drill's trainer, leaving as the SDK's elastic workers do when their slice is removed.
ELASTIC_TRAINER = TRAINER.replace(
    "while not stop:\n",
    textwrap.dedent(
        """
        import json
        def removed():
            try:
                with open(os.environ["HOTSWAP_MEMBERSHIP_FILE"]) as f:
                    return os.environ["HOTSWAP_SLICE"] not in json.load(f)["slices"]
            except (OSError, ValueError, KeyError):
                return False
        while not stop and not removed():
        """
    ).lstrip("\n"),
)


class ElasticDrill(Drill):
    def __init__(self, root: Path) -> None:
        super().__init__(root)
        script = root / "elastic_trainer.py"
        script.write_text(ELASTIC_TRAINER)
        self.elastic_command = shlex.join([sys.executable, str(script)])

    def create_elastic(self, slices: int) -> None:
        self.cli(
            "workload", "create", "--cluster", "c", "--workload", "e", "--command", self.elastic_command,
            "--num-slices", str(slices), "--min-slices", "1", "--termination-grace-period", "5",
        )

    def trains_on_every_slice(self) -> None:
        wait_until(
            lambda: all(
                "step" in log.read_text() for log in (self.root / "workloads" / "e-0" / "logs").glob("*.log")
            ) and len(list((self.root / "workloads" / "e-0" / "logs").glob("*.log"))) >= 1,
            timeout=60, what="e to train",
        )

    def check_elastic(self) -> None:
        record = workloads(self.home, "c")["e"]
        events = [r["message"] for r in query(self.home, "c", "SELECT message FROM events ORDER BY id")]
        assert record["phase"] != "FAILED" and record["restarts"] == 0, (record["status_message"], events[-8:])
        self.check()


@pytest.fixture
def drill(tmp_path: Path) -> Iterator[ElasticDrill]:
    drill = ElasticDrill(tmp_path)
    yield drill
    drill.close()


def test_the_trainer_leaves_when_its_slice_is_drained(drill: ElasticDrill) -> None:
    """(The drill's trainer does what the SDK does, or the drills below prove nothing.)"""
    drill.cluster(2)
    drill.create_elastic(2)
    drill.settle()
    drill.trains_on_every_slice()
    drained = workloads(drill.home, "c")["e"]["slices"][1]
    drill.cli("node", "drain", "--cluster", "c", "--node", f"{drained}-0")
    drill.settle()
    assert workloads(drill.home, "c")["e"]["slices"] == [workloads(drill.home, "c")["e"]["slices"][0]]
    drill.check_elastic()


@pytest.mark.parametrize("once", [True, False], ids=["next-controller-serves-it", "every-controller-dies"])
def test_a_drain_whose_round_died_before_its_commit_costs_nothing(drill: ElasticDrill, once: bool) -> None:
    """The controller is killed inside the drain's round, after it wrote the new generation and
    before its commit: once (the next controller serves the drain), or every time (the CLI gives
    up and withdraws it: nothing was drained). Either way no worker may act on that generation."""
    drill.cluster(3)
    drill.create_elastic(3)
    drill.settle()
    drill.trains_on_every_slice()
    drill.stop_controller()
    drained = workloads(drill.home, "c")["e"]["slices"][1]
    answer = drill.cli(
        "node", "drain", "--cluster", "c", "--node", f"{drained}-0", crash=f"staged@{drill.once}" if once else "staged",
        check=False,
    )
    assert drill.once.exists() or not once, "the controller never reached the point"
    assert (answer.returncode == 0) == once, answer.stderr
    time.sleep(2)  # a worker that acted on the uncommitted generation has left by now
    drill.settle()
    drill.check_elastic()
    assert len(workloads(drill.home, "c")["e"]["slices"]) == (2 if once else 3)


def test_drains_and_preemptions_with_controller_kills_at_random_moments(drill: ElasticDrill) -> None:
    """The issue's drill: a drain (or a higher-priority job preempting a slice) and a kill -9 of
    the controller 0.06-0.56 s later, round after round; then the node is repaired (or the job
    deleted) and the workload grows back. Never charged, never FAILED, no step lost."""
    seed = int(os.environ.get("HOTSWAP_CRASH_DRILL_SEED") or random.randrange(2**32))
    rng = random.Random(seed)
    drill.cluster(3)
    drill.create_elastic(3)
    drill.settle()
    drill.trains_on_every_slice()
    try:
        for done in range(ROUNDS):
            held = workloads(drill.home, "c")["e"]["slices"]
            if rng.random() < 0.5:
                node = f"{rng.choice(held)}-0"
                fault = ["node", "drain", "--cluster", "c", "--node", node]
                repair = ["node", "uncordon", "--cluster", "c", "--node", node]
            else:
                fault = ["workload", "create", "--cluster", "c", "--workload", f"h{done}", "--command", drill.command,
                         "--priority", "very-high", "--termination-grace-period", "2"]
                repair = ["workload", "delete", "--cluster", "c", "--workload", f"h{done}", "--force"]
            answer: list[subprocess.CompletedProcess[str]] = []
            worker = threading.Thread(target=lambda: answer.append(drill.cli(*fault, check=False)))
            worker.start()
            time.sleep(rng.uniform(0.06, 0.56))
            drill.kill_controllers()
            worker.join(timeout=180)
            assert answer and "Traceback" not in answer[0].stderr, answer
            drill.settle()
            drill.check_elastic()
            drill.cli(*repair, check=False)
            drill.settle()
            wait_until(lambda: len(workloads(drill.home, "c")["e"]["slices"]) == 3, timeout=60, what="e to grow back")
        drill.settle()
        drill.check_elastic()
    except AssertionError as failure:
        raise AssertionError(f"{failure} (HOTSWAP_CRASH_DRILL_SEED={seed})") from failure
