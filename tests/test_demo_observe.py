"""The demo's resume check reads the workers' own records: a restart must restore exactly the
newest checkpoint the workers saved before it, not just some step above 0."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hotswap.demo.observe import read_trace, resumed_from_last_checkpoint


def _events(directory: Path, name: str, *records: dict[str, Any]) -> None:
    (directory / "events").mkdir(parents=True, exist_ok=True)
    with (directory / "events" / f"{name}.jsonl").open("a") as handle:
        for record in records:
            handle.write(json.dumps(record) + "\n")


def _first_attempt(directory: Path) -> None:
    """Attempt 1 on two hosts: periodic saves at 50 and 100, steps to 120, killed there."""
    for host in (0, 1):
        _events(directory, f"1-{host}-0", *({"t": 100.0 + s, "kind": "step", "step": s} for s in range(1, 121)))
        _events(directory, f"1-{host}-0", {"t": 150.5, "kind": "checkpoint_save", "step": 50, "reason": "periodic"},
                {"t": 200.5, "kind": "checkpoint_save", "step": 100, "reason": "periodic"})


def test_a_restart_that_restores_an_older_checkpoint_fails_the_check(tmp_path: Path) -> None:
    _first_attempt(tmp_path)
    _events(tmp_path, "2-0-0", {"t": 300.0, "kind": "checkpoint_restore", "step": 50, "source": "checkpoint"},
            {"t": 301.0, "kind": "step", "step": 51})
    passed, detail = resumed_from_last_checkpoint(read_trace(tmp_path), attempt=1)
    assert not passed  # step 50 > 0, yet 50 steps more were lost than needed
    assert "restored step 50" in detail and "step 100 (periodic)" in detail and "last step done: 120" in detail


def test_a_restart_that_restores_the_newest_checkpoint_passes(tmp_path: Path) -> None:
    _first_attempt(tmp_path)
    _events(tmp_path, "1-0-0", {"t": 221.0, "kind": "checkpoint_save", "step": 120, "reason": "termination"})
    _events(tmp_path, "2-0-0", {"t": 300.0, "kind": "checkpoint_restore", "step": 120, "source": "checkpoint"})
    _events(tmp_path, "3-0-0", {"t": 400.0, "kind": "checkpoint_restore", "step": 100, "source": "checkpoint"})
    trace = read_trace(tmp_path)
    assert resumed_from_last_checkpoint(trace, attempt=1)[0]  # the termination save counts: it came first
    assert not resumed_from_last_checkpoint(trace, attempt=2)[0]  # attempt 3 went back to 100


def test_a_restore_with_no_save_behind_it_fails(tmp_path: Path) -> None:
    _events(tmp_path, "1-0-0", {"t": 101.0, "kind": "step", "step": 1})
    _events(tmp_path, "2-0-0", {"t": 300.0, "kind": "checkpoint_restore", "step": 7, "source": "checkpoint"})
    assert not resumed_from_last_checkpoint(read_trace(tmp_path), attempt=1)[0]
    assert not resumed_from_last_checkpoint(read_trace(tmp_path / "nothing"), attempt=1)[0]  # no restore at all


def test_the_returning_replicas_restore_is_its_own_not_the_first_after_the_repair(tmp_path: Path) -> None:
    """After a repair, the survivors (replicas 0 and 2) restart into the grown group too: the
    check of where the returning replica (1) got its state must read replica 1's restore."""
    _events(tmp_path, "1-0-0-1", {"t": 500.2, "kind": "checkpoint_restore", "step": 51, "source": "checkpoint"})
    _events(tmp_path, "1-2-0-3", {"t": 500.3, "kind": "checkpoint_restore", "step": 51, "source": "checkpoint"})
    _events(tmp_path, "1-1-0-4", {"t": 500.4, "kind": "checkpoint_restore", "step": 90, "source": "peer"})
    trace = read_trace(tmp_path)
    joined = trace.restore_after(500.0, replica=1)
    assert joined is not None and (joined.replica, joined.source, joined.step) == (1, "peer", 90)
    assert trace.restore_after(500.0, replica=0).source == "checkpoint"  # type: ignore[union-attr]
    assert trace.restore_after(500.5, replica=1) is None
