"""``hotswap demo shrink`` with tiny workers (no framework: fast on 2 cores): a high-priority
job that needs a slice shrinks the elastic low-priority job instead of evicting it, and the low
job grows back when the slice is free.

What a user relies on, read from the workers' own records (the drill's archive), not only from
the drill's verdict: low is never evicted, restarted or failed; its rank 0 does every step
exactly once (0 steps lost, none skipped); it trains on N, N-1, then N slices; no two live
workers of a job ever share a replica index. And the drill fails when low is evicted instead.
(The same drill with PyTorch workers: tests/test_demo.py::test_shrink_drill.)
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from local_helpers import cleanup

from hotswap.demo.drills import DemoOptions
from hotswap.demo.observe import log_lines, read_trace, slice_count_changes
from hotswap.demo.shrink import ShrinkDrill, rank0_steps, step_faults

# The worker contract as the drill reads it, without a framework: a step event (with the
# slices it trained on) and a seed-001 step line per step; elastic membership read at each step,
# a joiner's readiness mark left at its start (survivors switch once the joiners' marks are
# there, as the SDK's train/formation.py does); a joiner of a grow-back (HOTSWAP_START_CAUSE=
# elastic) takes rank 0's step (a peer copy). A replica of the job's first start does not, even
# when rank 0 has stepped already (it often has, on a loaded host): nothing was lost to restore.
TINY_WORKER = textwrap.dedent(
    """
    import argparse, json, os, signal, sys, time
    from pathlib import Path

    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10**6)
    parser.add_argument("--step-sleep", type=float, default=0.05)
    args, _ = parser.parse_known_args()
    env = os.environ
    replica, host = int(env["JOB_INDEX"]), int(env["JOB_COMPLETION_INDEX"])
    events = open(env["HOTSWAP_EVENTS_FILE"], "a")
    shared = Path(env["HOTSWAP_CHECKPOINT_DIR"]) / "rank0-step"
    membership_file = env.get("HOTSWAP_MEMBERSHIP_FILE")
    step = downs = 0

    def emit(kind, **fields):
        events.write(json.dumps({"t": time.time(), "kind": kind, **fields}) + "\\n")
        events.flush()

    def on_term(*_):
        emit("stop", step=step, reason="terminated", exit_code=143)
        sys.exit(143)

    signal.signal(signal.SIGTERM, on_term)

    def membership():
        try:
            return json.loads(Path(membership_file).read_text()) if membership_file else None
        except (OSError, ValueError):
            return None

    def marks(m, slices):
        return [Path(m["joined_dir"], f"{m['generation']}-{s}-{h}-0") for s in slices for h in range(m["hosts_per_slice"])]

    emit("start", attempt=int(env["HOTSWAP_ATTEMPT"]), rank=int(env["RANK"]), world_size=int(env["WORLD_SIZE"]))
    current = membership()
    if env.get("HOTSWAP_START_CAUSE") == "elastic" and shared.exists():  # a grow-back's joiner, as the SDK
        step = int(shared.read_text() or 0)
        emit("checkpoint_restore", step=step, source="peer", duration_s=0.0)
        print(f"restored step={step} source=peer", flush=True)
    if current and current.get("joined_dir"):
        for mark in marks(current, [env["HOTSWAP_SLICE"]]):
            mark.touch()
    while step < args.steps:
        time.sleep(args.step_sleep)
        latest = membership()
        if latest and current and latest["generation"] > current["generation"]:
            joiners = [s for s in latest["slices"] if s not in current["slices"]]
            if not latest.get("joined_dir") or all(p.exists() for p in marks(latest, joiners)):
                downs += len(latest["slices"]) < len(current["slices"])
                current = latest
        step += 1
        slices = len(current["slices"]) if current else int(env["MEGASCALE_NUM_SLICES"])
        if replica == 0 and host == 0:
            shared.with_suffix(".partial").write_text(str(step))
            os.replace(shared.with_suffix(".partial"), shared)
        emit("step", step=step, duration_s=args.step_sleep, slices=slices)
        print(f"step={step} elastic_manager.good_slice_count={slices} elastic_manager.elastic_down_event_count={downs}", flush=True)
    emit("stop", step=step, reason="complete", exit_code=0)
    """
)


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    state = tmp_path / "state"
    monkeypatch.setenv("HOTSWAP_HOME", str(state))
    monkeypatch.chdir(tmp_path)
    yield state
    cleanup(state)


def tiny_drill(tmp_path: Path, cls: type[ShrinkDrill] = ShrinkDrill, timeout_s: float = 60.0) -> ShrinkDrill:
    worker = tmp_path / "tiny_worker.py"
    worker.write_text(TINY_WORKER)
    return cls(DemoOptions(step_sleep=0.05, backing="emulated", timeout_s=timeout_s), live=False, worker=worker)


def test_low_shrinks_for_high_trains_on_and_grows_back_losing_no_step(home: Path, tmp_path: Path) -> None:
    summary = tiny_drill(tmp_path).run()
    failed = [c for c in summary["checks"] if not c["passed"]]
    assert summary["passed"] and not failed, failed
    assert summary["scenario"] == "shrink"
    assert summary["preempted"] == [] and summary["shrunk"] == ["low"]
    assert summary["steps_lost"] == 0 and summary["low_steps_skipped"] == 0
    assert summary["low_slices"] == [3, 2, 3]
    assert summary["mttr_s"] > 0 and summary["high_first_step"] == 1
    assert summary["samples"] >= 10
    assert any(c["name"].startswith("every live worker of a job had its own replica index") and c["passed"] for c in summary["checks"])
    # The workers' own records, as archived: low's rank 0 did steps 1..last once each, in one
    # attempt, and logged 3 -> 2 -> 3 slices; the joiner took its state from a peer.
    archive = Path(summary["archive"])
    low = read_trace(next(archive.glob("low-*")))
    steps = [s.step for s in rank0_steps(low)]
    assert steps == list(range(1, steps[-1] + 1))
    assert {s.attempt for s in low.steps} == {1}
    assert [(old, new) for _, old, new in slice_count_changes(log_lines(next(archive.glob("low-*")) / "logs" / "slice-0-host-0.log"))] == [
        (3, 2), (2, 3),
    ]
    assert [s.slices for s in rank0_steps(low) if s.step in (1, summary["low_down_at_step"], summary["low_up_at_step"])] == [3, 2, 3]
    # One restore: the returning replica's, from a peer, after high freed its slice.
    assert [(r.source, r.replica) for r in low.restores] == [("peer", 2)]
    high = read_trace(next(archive.glob("high-*")))
    assert [s.step for s in rank0_steps(high)] == list(range(1, ShrinkDrill.high_steps + 1))
    # The drill removed its cluster.
    assert not list((home / "clusters").glob("*/state.db"))


class _RigidLow(ShrinkDrill):
    """The same drill, but low is not elastic: high evicts it (what every peer does)."""

    def submit_job(self, name: str, mark: bool = True, **flags):  # type: ignore[no-untyped-def]
        flags.pop("min_slices", None)
        return super().submit_job(name, mark, **flags)


def test_the_drill_fails_when_low_is_evicted_instead_of_shrunk(home: Path, tmp_path: Path) -> None:
    summary = tiny_drill(tmp_path, _RigidLow, timeout_s=10.0).run()
    assert not summary["passed"]
    failed = {c["name"]: c["detail"] for c in summary["checks"] if not c["passed"]}
    assert failed == {"drill completed": "timed out waiting for low to train on 2 slices"}, failed


def test_step_faults_names_every_repeated_and_skipped_step() -> None:
    assert step_faults(list(range(1, 11))) == {"repeated": [], "skipped": []}
    # A restart from the checkpoint of step 5 after step 8: steps 6-8 done twice (lost work).
    assert step_faults([1, 2, 3, 4, 5, 6, 7, 8, 6, 7, 8, 9]) == {"repeated": [6, 7, 8], "skipped": []}
    assert step_faults([1, 2, 5, 6]) == {"repeated": [], "skipped": [3, 4]}
    assert step_faults([]) == {"repeated": [], "skipped": []}
