"""A checkpoint is resumed only by the workload that wrote it (issue 36, item 6), end to end
through the CLI on the local backend with real PyTorch workers: two workloads share one
``--checkpoint-dir`` root; the one deleted mid-run left a migration checkpoint there, which the
other does not take (it starts fresh and says why in one line) unless ``--resume-from`` names
it, and which its own workload, created again, still resumes after the other's newer runs."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from local_helpers import home, hotswap, live_workers, wait_until  # noqa: F401 (home: a fixture)
from train_harness import TRAIN_EXAMPLE

from hotswap.api.runs import RUN_OWNER_FILE, RUN_SIGNAL_FILE
from hotswap.api.worker_output import parse_fields

pytest.importorskip("torch")

SLOW = f"{sys.executable} {TRAIN_EXAMPLE} --steps 100000 --checkpoint-every 5 --step-sleep 0.05"


def _create(home: Path, name: str, root: Path, *flags: str) -> str:
    result = hotswap(home, "workload", "create", "--cluster", "c", "--workload", name, "--command", SLOW,
                     "--checkpoint-dir", str(root), *flags, check=True, timeout=300)
    [line] = result.stderr.splitlines()
    assert line.startswith(f"workload {name} created: "), result.stderr
    return line


def _describe(home: Path, name: str) -> dict:
    return json.loads(hotswap(home, "workload", "describe", "--cluster", "c", "--workload", name, "-o", "json", check=True).stdout)


def _logs(home: Path, name: str) -> list[str]:
    return hotswap(home, "workload", "logs", "--cluster", "c", "--workload", name).stdout.splitlines()


def _started(home: Path, name: str) -> dict[str, str] | None:
    """Once it trains: its ``restored`` line's fields (None: it started fresh)."""
    wait_until(lambda: any(line.startswith(("step=", "restored ")) for line in _logs(home, name)), timeout=180, what=f"{name} to start")
    restored = [line for line in _logs(home, name) if line.startswith("restored ")]
    return parse_fields(restored[0]) if restored else None


def _delete(home: Path, name: str) -> None:
    hotswap(home, "workload", "delete", "--cluster", "c", "--workload", name, check=True)
    wait_until(lambda: not live_workers(home, "c", name), timeout=90, what=f"{name}'s workers to save and exit")


def test_another_workload_sharing_the_root_starts_fresh_unless_it_names_the_run(home: Path, tmp_path: Path) -> None:
    root = tmp_path / "shared-checkpoints"
    hotswap(home, "cluster", "create", "--cluster", "c", "--device-type", "v4-8", "--num-slices", "2", check=True)
    _create(home, "a", root)
    first = _describe(home, "a")
    wait_until(lambda: sum(line.startswith("step=") for line in _logs(home, "a")) >= 3, timeout=180, what="a few steps of a")
    _delete(home, "a")
    run_dir = Path(first["checkpoint_dir"])
    assert (run_dir / RUN_SIGNAL_FILE).read_text() == "resume\n"  # a migration checkpoint waits

    line = _create(home, "b", root)
    assert line.endswith(
        f"starts fresh: run {first['run_id']} is workload a's and is never resumed automatically (--resume-from {first['run_id']} resumes it)"
    ), line
    assert (run_dir / RUN_OWNER_FILE).read_text() == "a\n"  # what says whose it is
    assert _describe(home, "b")["resumed_from"] is None
    assert _started(home, "b") is None  # step 0, nothing of a's
    assert (Path(_describe(home, "b")["checkpoint_dir"]) / RUN_OWNER_FILE).read_text() == "b\n"
    _delete(home, "b")  # b's run is the newest under the root now, and says resume too

    # Its own workload still resumes it, past b's newer run...
    assert f"resumes from the migration checkpoint of run {first['run_id']}" in _create(home, "a", root)
    assert (_started(home, "a") or {}).get("source") == "migration"
    again = _describe(home, "a")["run_id"]
    _delete(home, "a")
    # ...and b takes another's state only when the user names it.
    assert _create(home, "b", root, "--resume-from", again).endswith(f"resumes from run {again} ({root / again})")
    assert (_started(home, "b") or {}).get("cause") == "resume"
