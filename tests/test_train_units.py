"""hotswap.train pieces that need no PyTorch: the checkpoint directory, the data position, the
scaling rule, the membership watcher, the events log, and importing the package (and its
framework-neutral modules) without torch."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hotswap.api.membership import Membership
from hotswap.api.worker_output import EVENT_KINDS
from hotswap.train import ResumableBatches, scale_by_slices
from hotswap.train.events import EventLog
from hotswap.train.membership import MembershipWatcher
from hotswap.train.files import write_file_durably
from hotswap.train.torch.store import MARKER_FILE, STALE_PARTIAL_S, CheckpointStore, file_crc32

DATA_FILE = "data.bin"

# The checkpoint directory ------------------------------------------------------------------------


def write(store: CheckpointStore, step: int, payload: bytes | None = None, reason: str = "periodic"):  # type: ignore[no-untyped-def]
    data = payload or f"state of step {step}".encode()
    return store.write(step, reason, lambda directory: {DATA_FILE: write_file_durably(directory / DATA_FILE, data)})


def test_a_write_commits_data_and_marker_and_can_be_found(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    info = write(store, 7, b"x" * 1000)
    assert info.path == tmp_path / "step-0000000007"
    assert sorted(p.name for p in info.path.iterdir()) == [MARKER_FILE, DATA_FILE]
    marker = json.loads((info.path / MARKER_FILE).read_text())
    assert marker["step"] == 7 and marker["files"][DATA_FILE]["size"] == 1000 and marker["reason"] == "periodic"
    assert marker["files"][DATA_FILE]["crc32"] == file_crc32(info.path / DATA_FILE)
    assert store.latest_complete() == info
    assert not store.partial()


def test_only_the_newest_k_checkpoints_are_kept(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, keep=3)
    for step in range(1, 6):
        write(store, step)
    store.settle()
    assert [info.step for info in store.committed()] == [5, 4, 3]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["signal", "step-0000000003", "step-0000000004", "step-0000000005", "workload"]


def test_a_killed_write_leaves_a_partial_directory_that_is_skipped_and_reported(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = CheckpointStore(tmp_path)
    write(store, 1)

    def dies_mid_write(directory: Path) -> dict:  # type: ignore[type-arg]
        (directory / DATA_FILE).write_bytes(b"half a checkpoint")
        raise KeyboardInterrupt  # stands for the process dying here

    with pytest.raises(KeyboardInterrupt):
        store.write(2, "periodic", dies_mid_write)
    [partial] = store.partial()
    assert partial.name.startswith("step-0000000002.partial-")
    with caplog.at_level(logging.WARNING, logger="hotswap.train"):
        assert store.latest_complete().step == 1
    assert f"skipping partial checkpoint {partial}" in caplog.text
    assert "never committed" in caplog.text


def test_a_checkpoint_without_marker_or_with_damaged_data_is_skipped_for_an_older_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = CheckpointStore(tmp_path, keep=5)
    write(store, 1)
    flipped = write(store, 2, b"a" * 100)
    truncated = write(store, 3, b"b" * 100)
    unmarked = write(store, 4)
    data = bytearray((flipped.path / DATA_FILE).read_bytes())
    data[50] ^= 0xFF
    (flipped.path / DATA_FILE).write_bytes(bytes(data))
    (truncated.path / DATA_FILE).write_bytes(b"b" * 60)
    (unmarked.path / MARKER_FILE).unlink()
    with caplog.at_level(logging.WARNING, logger="hotswap.train"):
        assert store.latest_complete().step == 1
    assert f"{unmarked.path}: it has no commit marker" in caplog.text
    assert f"{truncated.path}: its file {DATA_FILE} has 60 bytes, the marker says 100" in caplog.text
    assert f"{flipped.path}: its file {DATA_FILE} does not match the checksum" in caplog.text


def test_the_reason_of_a_committed_checkpoint_can_be_changed_atomically(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    before = write(store, 3)
    after = store.set_reason(3, "termination")
    assert after.reason == "termination" and store.latest_complete().reason == "termination"
    assert after.files == before.files
    assert sorted(p.name for p in after.path.iterdir()) == [MARKER_FILE, DATA_FILE]
    with pytest.raises(FileNotFoundError):
        store.set_reason(4, "termination")


def test_a_second_writer_of_the_same_step_keeps_the_first_commit(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    first = write(store, 5, b"first")
    second = write(store, 5, b"second")
    assert second.files == first.files
    assert (first.path / DATA_FILE).read_bytes() == b"first"
    assert not store.partial()


def test_a_deletion_cut_short_leaves_nothing_that_looks_like_a_checkpoint(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, keep=1)
    write(store, 1)
    store.settle()  # the commit's own prune, in the background, would otherwise take the leftover early
    leftover = tmp_path / "step-0000000000.deleting-cccc"  # a prune killed mid-rmtree
    leftover.mkdir()
    (leftover / MARKER_FILE).write_text("{}")
    assert [info.step for info in store.committed()] == [1] and store.latest_complete().step == 1
    write(store, 2)
    store.settle()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["signal", "step-0000000002", "workload"]


def test_stale_partial_directories_are_deleted_recent_ones_kept(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    stale = tmp_path / "step-0000000001.partial-host-1-aaaa"
    recent = tmp_path / "step-0000000002.partial-host-2-bbbb"
    for path in (stale, recent):
        path.mkdir()
    old = time.time() - STALE_PARTIAL_S - 10
    os.utime(stale, (old, old))
    write(store, 3)
    store.settle()
    assert not stale.exists() and recent.exists()


def test_store_arguments_are_checked(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="keep must be at least 1"):
        CheckpointStore(tmp_path, keep=0)
    with pytest.raises(ValueError, match="reason must be one of"):
        write(CheckpointStore(tmp_path), 1, reason="whim")


# The data position ---------------------------------------------------------------------------


def replicas(count: int, **options: int) -> list[ResumableBatches]:
    """One data position per rank, as each process of a job holds its own."""
    return [ResumableBatches(**options) for _ in range(count)]


def one_step(ranks: list[ResumableBatches]) -> list[int]:
    return [index for rank, batches in enumerate(ranks) for index in batches.take(rank, len(ranks))]


def test_ranks_take_disjoint_parts_of_each_epoch_in_a_seeded_order() -> None:
    ranks = replicas(3, dataset_size=12, batch_size=2, seed=5)
    epoch = one_step(ranks) + one_step(ranks)
    assert sorted(epoch) == list(range(12))
    assert epoch != list(range(12))  # shuffled
    assert one_step(ranks) != epoch[:6]  # the next epoch has another order
    again = replicas(3, dataset_size=12, batch_size=2, seed=5)
    assert one_step(again) + one_step(again) == epoch


def test_a_restored_position_continues_the_same_sequence() -> None:
    original = ResumableBatches(dataset_size=50, batch_size=4, seed=1)
    for _ in range(9):
        original.take(1, 2)
    state = json.loads(json.dumps(original.state_dict()))
    resumed = ResumableBatches(dataset_size=50, batch_size=4, seed=1)
    resumed.load_state_dict(state)
    assert [resumed.take(1, 2) for _ in range(10)] == [original.take(1, 2) for _ in range(10)]


def test_after_a_world_size_change_the_epoch_continues_with_unseen_samples() -> None:
    ranks = replicas(3, dataset_size=30, batch_size=2, seed=0)
    seen = one_step(ranks)  # 6 samples on 3 ranks, then a slice is lost
    seen += one_step(ranks[:2]) + one_step(ranks[:2])  # 8 more on 2 ranks
    assert len(seen) == len(set(seen)) == 14
    assert {batches.epoch for batches in ranks[:2]} == {0}


def test_data_position_errors_are_one_line() -> None:
    with pytest.raises(ValueError, match="does not fit a dataset of 10 samples"):
        ResumableBatches(10, 4).take(0, 3)
    batches = ResumableBatches(10, 2)
    with pytest.raises(ValueError, match="is for 11 samples, this dataset has 10"):
        batches.load_state_dict({"epoch": 0, "offset": 0, "dataset_size": 11, "seed": 0})
    with pytest.raises(ValueError, match="rank 3 is outside a world of 3"):
        batches.take(3, 3)


# The scaling rule ----------------------------------------------------------------------------


def test_scale_by_slices_follows_the_linear_scaling_rule() -> None:
    assert scale_by_slices(0.3, 2, 3) == pytest.approx(0.2)
    assert scale_by_slices(0.3, 3, 3) == 0.3
    assert scale_by_slices(96, 2, 3) == 64
    assert scale_by_slices(10, 1, 3) == 3  # rounded down
    assert scale_by_slices(1, 1, 4) == 1  # never zero
    with pytest.raises(ValueError, match="between 1 and 3"):
        scale_by_slices(0.1, 4, 3)
    with pytest.raises(ValueError, match="total slices must be at least 1"):
        scale_by_slices(0.1, 1, 0)
    with pytest.raises(TypeError, match="not str"):
        scale_by_slices("0.1", 1, 2)  # type: ignore[type-var]


# Membership and events -----------------------------------------------------------------------


def publish(path: Path, generation: int, slices: tuple[str, ...]) -> None:
    temporary = path.with_suffix(".tmp")
    temporary.write_text(Membership(generation, slices, 1, "127.0.0.1", 1000 + generation).to_json())
    os.replace(temporary, path)


def test_the_watcher_reads_each_published_generation(tmp_path: Path) -> None:
    path = tmp_path / "membership.json"
    watcher = MembershipWatcher(str(path))
    assert watcher.poll() is None
    publish(path, 1, ("a", "b", "c"))
    assert watcher.poll().slices == ("a", "b", "c")
    publish(path, 2, ("a", "b"))
    assert watcher.poll().generation == 2
    path.write_text("{not json")  # a torn write by a careless controller: keep the last good one
    assert watcher.poll().generation == 2


def test_waiting_for_a_membership_ends_on_match_timeout_or_interruption(tmp_path: Path) -> None:
    path = tmp_path / "membership.json"
    publish(path, 3, ("a",))
    watcher = MembershipWatcher(str(path))
    assert watcher.wait_for(lambda m: m.generation >= 3, 5.0, lambda: False).generation == 3
    assert watcher.wait_for(lambda m: m.generation > 3, 0.1, lambda: False) is None
    assert watcher.wait_for(lambda m: m.generation > 3, 60.0, lambda: True) is None


def test_events_are_contract_records_one_per_line(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    log = EventLog(str(path))
    log.record("start", attempt=1, rank=0, world_size=1)
    log.record("step", t=12.5, step=1, duration_s=0.1, slices=1)
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["kind"] for r in records] == ["start", "step"]
    assert records[1]["t"] == 12.5 and all(r["kind"] in EVENT_KINDS for r in records)
    with pytest.raises(ValueError, match="unknown goodput event kind"):
        log.record("nap")
    EventLog(None).record("start")  # outside hotswap: nothing to write, no error


# The package without torch -------------------------------------------------------------------

_NO_TORCH = """
import sys

class NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "numpy"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NoTorch())
"""

_WITHOUT_TORCH = _NO_TORCH + """
import hotswap.train as ht
print(ht.scale_by_slices(0.6, 1, 3), ht.ResumableBatches(4, 2).take())
try:
    ht.init
except ImportError as error:
    print(error)
print(sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "numpy")))
"""


def test_the_package_imports_without_torch_and_says_what_to_install() -> None:
    result = subprocess.run([sys.executable, "-c", _WITHOUT_TORCH], capture_output=True, text=True, check=True)
    lines = result.stdout.splitlines()
    scaled, batch = lines[0].split(" ", 1)
    assert float(scaled) == pytest.approx(0.2) and batch == "[0, 3]"
    assert lines[1] == (
        "hotswap.train.init needs PyTorch: pip install 'hotswap[torch]' "
        "(where the CPU build is on disk, pip install torch==2.13.0 first)"
    )
    assert lines[2] == "[]"


# What a second framework's SDK reuses: group formation, step boundaries, termination, progress,
# membership, events and log lines.
_NEUTRAL_MODULES = (
    "boundary", "events", "formation", "front", "lifecycle", "membership", "progress", "rendezvous", "termination",
)


def test_the_framework_neutral_modules_import_without_torch() -> None:
    imports = "".join(f"import hotswap.train.{name}\n" for name in _NEUTRAL_MODULES)
    probe = _NO_TORCH + imports + "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'numpy')))\n"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
