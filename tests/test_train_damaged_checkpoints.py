"""Damaged and refused checkpoints (issue 24 item 3): a tampered commit marker is named in one
line and its checkpoint set aside (kept in ``damaged/``, never read again) so a later save of
the same step works; a job left with only damaged checkpoints does not silently start from
step 0 unless the user allows it; a refused checkpoint directory is one line, not a traceback.
Both refusals exit with ``CHECKPOINTS_UNUSABLE_EXIT_CODE``, which the failure policy fails on.
"""

from __future__ import annotations

import json
import logging
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from hotswap.api import worker as contract  # noqa: E402
from hotswap.api.spec import DEFAULT_RESTART_EXIT_CODES  # noqa: E402
from hotswap.train.events import EventLog  # noqa: E402
from hotswap.train.files import DAMAGED_DIR  # noqa: E402
from hotswap.train.torch.checkpointer import Checkpointer  # noqa: E402
from hotswap.train.torch.state import StateRegistry, build_tree, rng_state  # noqa: E402
from hotswap.train.torch.store import MARKER_FILE, CheckpointStore  # noqa: E402
from train_harness import TRAIN_EXAMPLE, Workers, free_port, worker_env  # noqa: E402

NOBODY = 65534


def tree_at(step: int, value: float) -> dict[str, Any]:
    registry = StateRegistry()
    registry.register("weights", {"w": torch.full((4,), value)})
    return build_tree(registry, {"step": step, "elastic_down_events": 0}, [rng_state()])


def edit_marker(change: Callable[[dict[str, Any]], None]) -> Callable[[Path, Path], None]:
    def tamper(checkpoint: Path, scratch: Path) -> None:
        marker = json.loads((checkpoint / MARKER_FILE).read_text())
        change(marker)
        (checkpoint / MARKER_FILE).write_text(json.dumps(marker))

    return tamper


def negative_size(marker: dict[str, Any]) -> None:
    marker["files"]["index.json"]["size"] = -5


def step_as_string(marker: dict[str, Any]) -> None:
    marker["step"] = str(marker["step"])


def traversal_name(marker: dict[str, Any]) -> None:
    marker["files"]["../../../etc/passwd"] = marker["files"].pop("index.json")


def symlinked_marker(checkpoint: Path, scratch: Path) -> None:
    """COMMIT replaced by a link to a valid marker elsewhere."""
    elsewhere = scratch / "elsewhere-COMMIT"
    elsewhere.write_bytes((checkpoint / MARKER_FILE).read_bytes())
    (checkpoint / MARKER_FILE).unlink()
    (checkpoint / MARKER_FILE).symlink_to(elsewhere)


TAMPERINGS = {
    "negative size": (edit_marker(negative_size), "the size or checksum of index.json is not a non-negative integer: -5"),
    "step as a string": (edit_marker(step_as_string), "its step is not a non-negative integer: '2'"),
    "traversal name": (edit_marker(traversal_name), "not a plain name in its directory: '../../../etc/passwd'"),
    "symlinked COMMIT": (symlinked_marker, "its commit marker COMMIT is a symbolic link"),
}


@pytest.mark.parametrize("case", list(TAMPERINGS))
def test_a_tampered_marker_is_named_set_aside_and_the_step_saved_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, case: str
) -> None:
    """The newest checkpoint's marker is tampered with: the restore takes the older one, says
    in one line which checkpoint and why, moves it into ``damaged/``; the final save of that
    step then works (it used to die with "exists but its commit marker is malformed")."""
    tamper, why = TAMPERINGS[case]
    checkpoints = tmp_path / "checkpoints"
    saver = Checkpointer(CheckpointStore(checkpoints), EventLog(None))
    saver.save(1, tree_at(1, 1.0), "periodic")
    damaged = saver.save(2, tree_at(2, 2.0), "periodic").path
    tamper(damaged, tmp_path)

    with caplog.at_level(logging.WARNING, logger="hotswap.train"):
        tree, info = saver.restore_latest()  # type: ignore[misc]
    assert info.step == 1 and torch.equal(tree["objects"]["weights"]["w"], torch.full((4,), 1.0))
    said = [record.getMessage() for record in caplog.records]
    assert len(said) == 1 and "\n" not in said[0], said
    assert said[0].startswith(f"hotswap: damaged checkpoint {damaged}: ") and why in said[0], said[0]
    assert "partial" not in said[0]
    [aside] = (checkpoints / DAMAGED_DIR).iterdir()
    assert not damaged.exists() and aside.name.startswith("step-0000000002-") and f"moved to {aside}" in said[0]

    saved = saver.save(2, tree_at(2, 3.0), "final")  # the run goes on to step 2 and saves it
    assert saved.step == 2 and saved.reason == "final"
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="hotswap.train"):
        tree, info = Checkpointer(CheckpointStore(checkpoints), EventLog(None)).restore_latest()  # type: ignore[misc]
    assert info.step == 2 and torch.equal(tree["objects"]["weights"]["w"], torch.full((4,), 3.0))
    assert not caplog.records  # what was set aside is never read again
    assert len(list((checkpoints / DAMAGED_DIR).iterdir())) == 1  # and kept for inspection


def test_a_save_over_a_damaged_checkpoint_of_its_step_sets_it_aside(tmp_path: Path) -> None:
    """A damaged checkpoint that no restore saw (it appeared later) does not stop the save."""
    checkpoints = tmp_path / "checkpoints"
    saver = Checkpointer(CheckpointStore(checkpoints), EventLog(None))
    damaged = saver.save(3, tree_at(3, 1.0), "periodic").path
    edit_marker(step_as_string)(damaged, tmp_path)
    assert saver.save(3, tree_at(3, 5.0), "final").step == 3
    tree, info = saver.restore_latest()  # type: ignore[misc]
    assert info.step == 3 and torch.equal(tree["objects"]["weights"]["w"], torch.full((4,), 5.0))
    assert [p.name[:15] for p in (checkpoints / DAMAGED_DIR).iterdir()] == ["step-0000000003"]


# Worker processes: what the user sees ----------------------------------------------------------

TRAIN = ["--steps", "4", "--checkpoint-every", "2"]


def train(workers: Workers, name: str, checkpoints: Path, **extra: object) -> tuple[int, str, list[str]]:
    env = worker_env(rank=0, world_size=1, port=free_port(), checkpoint_dir=checkpoints)
    env.update(extra)
    worker = workers.start(name, TRAIN_EXAMPLE, TRAIN, env)
    code = worker.wait(120)
    return code, worker.errors.read_text(), worker.lines()


def test_only_damaged_checkpoints_do_not_silently_start_from_step_0(tmp_path: Path) -> None:
    """Every checkpoint of the job is damaged: the worker exits with the documented code (a
    workload error, not restarted) and one line naming where they went, instead of training
    from step 0 with exit 0. HOTSWAP_ALLOW_FRESH_START=1 lets it start over."""
    checkpoints = tmp_path / "checkpoints"
    with Workers(tmp_path) as workers:
        code, errors, _ = train(workers, "first", checkpoints)
        assert code == 0, errors
        steps = sorted(path for path in checkpoints.iterdir() if path.name.startswith("step-"))
        assert [path.name for path in steps] == ["step-0000000002", "step-0000000004"]
        for path in steps:
            edit_marker(negative_size)(path, tmp_path)

        code, errors, lines = train(workers, "second", checkpoints)
        assert code == contract.CHECKPOINTS_UNUSABLE_EXIT_CODE == 65, errors
        assert code not in DEFAULT_RESTART_EXIT_CODES
        assert "Traceback" not in errors and not any(line.startswith("step=") for line in lines), errors
        said = errors.strip().splitlines()
        assert said[-1] == (
            f"hotswap: no usable checkpoint: 2 damaged one(s) were set aside in {checkpoints / DAMAGED_DIR} "
            f"(newest: {sorted(p.name for p in (checkpoints / DAMAGED_DIR).iterdir())[-1]}); refusing to start "
            "again from step 0 and lose their steps: repair or restore a checkpoint, or set "
            "HOTSWAP_ALLOW_FRESH_START=1 (workload create --env HOTSWAP_ALLOW_FRESH_START=1) to start over"
        ), errors
        for path in steps:  # one line each: which checkpoint, why, where it went
            [line] = [line for line in said if line.startswith(f"hotswap: damaged checkpoint {path}: ")]
            assert "is not a non-negative integer: -5" in line and f"moved to {checkpoints / DAMAGED_DIR}" in line
        assert len(said) == 3, errors

        code, errors, _ = train(workers, "restarted", checkpoints)  # a restart is refused the same way
        assert code == 65 and errors.strip().splitlines() == [said[-1]], errors

        code, errors, lines = train(workers, "allowed", checkpoints, **{contract.HOTSWAP_ALLOW_FRESH_START: "1"})
        assert code == 0, errors
        assert [line.split()[0] for line in lines if line.startswith("step=")] == [f"step={n}" for n in range(1, 5)]
        assert (checkpoints / "step-0000000004").is_dir()  # its final save works over the damaged step
        assert len(list((checkpoints / DAMAGED_DIR).iterdir())) == 2


def refuse_others(path: Path) -> str:
    path.chmod(0o777)
    return f"it is writable by others (mode 0777), who could plant a checkpoint; make it private (chmod go-w {path})"


def refuse_foreign_group(path: Path) -> str:
    os.chown(path, -1, NOBODY)
    path.chmod(0o770)
    return f"it is writable by group (mode 0770), who could plant a checkpoint; make it private (chmod go-w {path})"


def refuse_another_owner(path: Path) -> str:
    os.chown(path, NOBODY, NOBODY)
    path.chmod(0o755)
    return f"it is owned by uid {NOBODY}, not by this user (uid 0); use a directory of your own"


REFUSALS = {"0777": refuse_others, "foreign group": refuse_foreign_group, "another owner": refuse_another_owner}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_a_refused_checkpoint_directory_is_one_line_and_a_workload_error(tmp_path: Path, case: str) -> None:
    if case != "0777" and (os.geteuid() != 0 or NOBODY in os.getgroups()):
        pytest.skip("only root can give a directory to another user or group")
    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir()
    why = REFUSALS[case](checkpoints)
    mode = stat.S_IMODE(checkpoints.stat().st_mode)
    with Workers(tmp_path) as workers:
        code, errors, lines = train(workers, "refused", checkpoints)
    assert code == contract.CHECKPOINTS_UNUSABLE_EXIT_CODE, errors
    line = f"hotswap: refusing checkpoint directory {checkpoints}: {why}"
    assert errors.strip().splitlines() == [line + (" or use another directory" if "chmod" in why else "")], errors
    assert not lines and list(checkpoints.iterdir()) == [] and stat.S_IMODE(checkpoints.stat().st_mode) == mode
