"""kill -9 in the middle of checkpoint writes, many times over: a restore never yields a torn or
mixed checkpoint, always the newest committed one, and the leftovers of killed writes are
reported by name."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from train_harness import clean_environ

pytest.importorskip("torch")

HARNESS = Path(__file__).with_name("train_harness_kill9.py")
TRIALS = 40


def test_kill_9_during_checkpoint_writes_never_gives_a_corrupt_restore(tmp_path: Path) -> None:
    harness = subprocess.Popen(
        [sys.executable, str(HARNESS), str(tmp_path), str(TRIALS), "4"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=clean_environ(),
        start_new_session=True,
    )
    try:
        stdout, stderr = harness.communicate(timeout=120)
    finally:
        if harness.poll() is None:
            os.killpg(harness.pid, signal.SIGKILL)  # the harness and the writer it forked
            harness.wait()
    assert harness.returncode == 0, stderr
    summary = json.loads(stdout.splitlines()[-1])
    assert summary["trials"] == TRIALS
    assert summary["corrupt"] == 0
    assert summary["not_newest"] == 0
    assert summary["restored"] == TRIALS  # each kill comes after a commit of that trial
    # The writers save back to back, so most kills land mid-write; each such leftover is named.
    assert summary["interrupted_writes"] >= TRIALS // 4
    assert summary["reported_partial"] == summary["interrupted_writes"]
