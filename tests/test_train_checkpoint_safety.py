"""Restoring a checkpoint never runs code, and the SDK refuses checkpoint directories that
someone else could write (issue 13, item 1).

A planted pickle (in every file a checkpoint has, and as a checkpoint of the previous release's
format) must not run; the ownership and mode checks must refuse with one line naming the path
and what is wrong; what the SDK creates is private."""

from __future__ import annotations

import json
import logging
import os
import pickle
import stat
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from hotswap.train.torch.checkpointer import Checkpointer  # noqa: E402
from hotswap.train.events import EventLog  # noqa: E402
from hotswap.train.torch.state import StateRegistry, build_tree, rng_state  # noqa: E402
from hotswap.train.files import CheckpointDirectoryRefused  # noqa: E402
from hotswap.train.torch.store import MARKER_FILE, CheckpointStore  # noqa: E402

OTHER_UID = 65534  # nobody


class Payload:
    """Unpickling this runs ``exec``: it writes ``sentinel``."""

    def __init__(self, sentinel: Path) -> None:
        self.sentinel = sentinel

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (exec, (f"open({str(self.sentinel)!r}, 'w').write('pwned')",))


def malicious_pickle(sentinel: Path) -> bytes:
    data = pickle.dumps({"format": 1, "progress": {"step": 99}, "objects": Payload(sentinel), "rng": []})
    pickle.loads(data)  # the payload is live: unpickling it runs code
    assert sentinel.read_text() == "pwned"
    sentinel.unlink()
    return data


def torch_file_with(sentinel: Path, path: Path) -> None:
    """A torch.save file whose unpickling (weights_only=False, as the previous release did) runs code."""
    torch.save({"format": 1, "objects": Payload(sentinel), "progress": {"step": 99}, "rng": []}, path)
    torch.load(path, weights_only=False)
    assert sentinel.exists()
    sentinel.unlink()


def saved_state(directory: Path, step: int = 1) -> tuple[Checkpointer, StateRegistry]:
    registry = StateRegistry()
    registry.register("weights", {"w": torch.arange(6.0)})
    saver = Checkpointer(CheckpointStore(directory), EventLog(None))
    saver.save(step, build_tree(registry, {"step": step, "elastic_down_events": 0}, [rng_state()]), "periodic")
    return saver, registry


def plant_step(directory: Path, step: int, files: dict[str, bytes], marker: dict | None = None) -> Path:  # type: ignore[type-arg]
    """A committed-looking checkpoint with a valid marker: checksums match what was planted."""
    path = directory / f"step-{step:010d}"
    path.mkdir()
    for name, data in files.items():
        (path / name).write_bytes(data)
    if marker is None:
        digests = {name: {"size": len(data), "crc32": zlib.crc32(data)} for name, data in files.items()}
        marker = {"format": 2, "step": step, "reason": "termination", "created": 0.0, "files": digests}
    (path / MARKER_FILE).write_text(json.dumps(marker))
    return path


@pytest.fixture
def sentinel(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "pwned"
    yield path
    assert not path.exists(), "the planted checkpoint ran code"


# No code execution ---------------------------------------------------------------------------


@pytest.mark.parametrize("planted_as", ["index.json", "tensors-0.bin"])
def test_a_planted_pickle_in_a_checkpoint_file_does_not_run(
    tmp_path: Path, sentinel: Path, planted_as: str, caplog: pytest.LogCaptureFixture
) -> None:
    checkpoints = tmp_path / "checkpoints"
    saver, _ = saved_state(checkpoints)
    good = (checkpoints / "step-0000000001" / "index.json").read_bytes()
    files = {"index.json": good, "tensors-0.bin": b""}
    files[planted_as] = malicious_pickle(sentinel)
    planted = plant_step(checkpoints, 2, files)
    with caplog.at_level(logging.WARNING, logger="hotswap.train"):
        tree, info = saver.restore_latest()
    assert info.step == 1 and torch.equal(tree["objects"]["weights"]["w"], torch.arange(6.0))
    assert str(planted) in caplog.text


def test_a_planted_checkpoint_in_the_previous_format_does_not_run(
    tmp_path: Path, sentinel: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The previous release restored ``state.pt`` with ``torch.load(weights_only=False)``."""
    checkpoints = tmp_path / "checkpoints"
    saver, _ = saved_state(checkpoints)
    source = tmp_path / "planted.pt"
    torch_file_with(sentinel, source)
    data = source.read_bytes()
    marker = {"format": 1, "step": 2, "reason": "termination", "created": 0.0, "size": len(data), "crc32": zlib.crc32(data)}
    planted = plant_step(checkpoints, 2, {"state.pt": data}, marker)
    with caplog.at_level(logging.WARNING, logger="hotswap.train"):
        _, info = saver.restore_latest()
    assert info.step == 1
    assert f"damaged checkpoint {planted}: it cannot be loaded" in caplog.text
    assert "earlier release" in caplog.text
    assert not planted.exists() and len(list((checkpoints / "damaged").iterdir())) == 1  # set aside


def test_a_checkpoint_of_the_previous_release_is_still_restored(tmp_path: Path) -> None:
    """Format 1: ``state.pt`` (torch.save of the tree, numpy RNG state included) and a marker
    with its size and CRC-32, as the previous release wrote them."""
    import numpy
    import random

    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(5, 3)).sum().backward()
    optimizer.step()
    registry = StateRegistry()
    registry.register("model", model)
    registry.register("optimizer", optimizer)
    registry.register("metrics", {"best": float("inf"), "seen": numpy.int64(7)})
    random.seed(3)
    tree = build_tree(registry, {"step": 5, "elastic_down_events": 0}, [rng_state()])
    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir(mode=0o700)
    path = checkpoints / "step-0000000005"
    path.mkdir()
    torch.save(tree, path / "state.pt")
    data = (path / "state.pt").read_bytes()
    marker = {"format": 1, "step": 5, "reason": "termination", "created": 0.0, "size": len(data), "crc32": zlib.crc32(data)}
    (path / MARKER_FILE).write_text(json.dumps(marker))

    store = CheckpointStore(checkpoints)
    store.set_reason(5, "periodic")  # a SIGTERM right after the resume relabels it: still format 1
    restored, info = Checkpointer(store, EventLog(None)).restore_latest()
    assert (info.step, info.reason, info.format) == (5, "periodic", 1)
    assert restored["objects"]["metrics"] == {"best": float("inf"), "seen": 7}
    for name, value in tree["objects"]["model"].items():
        assert torch.equal(restored["objects"]["model"][name], value)
    numpy_state = restored["rng"][0]["numpy"]
    assert numpy_state[0] == "MT19937" and numpy.array_equal(numpy_state[1], tree["rng"][0]["numpy"][1])


def test_a_data_file_that_is_a_link_is_not_followed(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    checkpoints = tmp_path / "checkpoints"
    saver, registry = saved_state(checkpoints, step=1)
    saver.save(2, build_tree(registry, {"step": 2, "elastic_down_events": 0}, []), "periodic")
    data = checkpoints / "step-0000000002" / "tensors-0.bin"
    elsewhere = tmp_path / "elsewhere.bin"
    data.rename(elsewhere)
    data.symlink_to(elsewhere)
    with caplog.at_level(logging.WARNING, logger="hotswap.train"):
        _, info = saver.restore_latest()
    assert info.step == 1
    assert "its file tensors-0.bin is not a regular file" in caplog.text


# Ownership and modes --------------------------------------------------------------------------


def test_what_the_sdk_creates_is_private(tmp_path: Path) -> None:
    checkpoints = tmp_path / "a" / "b" / "checkpoints"  # missing parents too
    saved_state(checkpoints)
    for directory in (tmp_path / "a", tmp_path / "a" / "b", checkpoints, checkpoints / "step-0000000001"):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700, directory
    files = list((checkpoints / "step-0000000001").iterdir())
    assert {p.name for p in files} == {"COMMIT", "index.json", "tensors-0.bin"}
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in files)


@pytest.mark.parametrize(
    ("mode", "who", "foreign_group"),
    [(0o777, "others", False), (0o1777, "others", False), (0o702, "others", False), (0o777, "group and others", True),
     (0o770, "group", True)],
)
def test_a_checkpoint_directory_writable_by_others_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: int, who: str, foreign_group: bool
) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(mode)
    if foreign_group:  # a group this process is not in
        gid = shared.stat().st_gid
        monkeypatch.setattr(os, "getegid", lambda: gid + 1)
        monkeypatch.setattr(os, "getgroups", lambda: [gid + 1])
    with pytest.raises(CheckpointDirectoryRefused) as refused:
        CheckpointStore(shared)
    message = str(refused.value)
    assert message == (
        f"refusing checkpoint directory {shared}: it is writable by {who} (mode {mode:04o}), who could "
        f"plant a checkpoint; make it private (chmod go-w {shared}) or use another directory"
    )
    assert "\n" not in message


@pytest.mark.parametrize("mode", [0o770, 0o2775])
def test_a_directory_writable_by_our_own_group_is_accepted(tmp_path: Path, mode: int) -> None:
    """A team's directory, or a Kubernetes volume with fsGroup (the kubelet makes it g+rw, setgid)."""
    checkpoints = tmp_path / "team"
    checkpoints.mkdir()
    checkpoints.chmod(mode)
    assert checkpoints.stat().st_gid in (os.getegid(), *os.getgroups())
    saver, _ = saved_state(checkpoints)
    assert saver.restore_latest()[1].step == 1


def owned_by_someone_else(path: Path, monkeypatch: pytest.MonkeyPatch) -> int:
    """Make ``path`` another user's: really (as root), or from this process's point of view."""
    if os.geteuid() == 0:
        os.chown(path, OTHER_UID, OTHER_UID)
        return 0
    me = os.geteuid()
    monkeypatch.setattr(os, "geteuid", lambda: me + 1)
    return me + 1


def test_a_checkpoint_directory_owned_by_someone_else_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    me = owned_by_someone_else(theirs, monkeypatch)
    owner = theirs.stat().st_uid
    with pytest.raises(CheckpointDirectoryRefused, match="^refusing checkpoint directory .*theirs: it is owned by uid "):
        CheckpointStore(theirs)
    with pytest.raises(CheckpointDirectoryRefused) as refused:
        CheckpointStore(theirs)
    assert str(refused.value) == (
        f"refusing checkpoint directory {theirs}: it is owned by uid {owner}, not by this user (uid {me}); "
        "use a directory of your own"
    )


def test_a_checkpoint_path_that_is_a_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "file"
    path.write_text("")
    with pytest.raises(CheckpointDirectoryRefused, match="it is not a directory"):
        CheckpointStore(path)


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can give a file to another user")
def test_a_checkpoint_holding_another_users_file_is_skipped(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    checkpoints = tmp_path / "checkpoints"
    saver, registry = saved_state(checkpoints, step=1)
    saver.save(2, build_tree(registry, {"step": 2, "elastic_down_events": 0}, []), "periodic")
    os.chown(checkpoints / "step-0000000002" / "index.json", OTHER_UID, OTHER_UID)
    with caplog.at_level(logging.WARNING, logger="hotswap.train"):
        _, info = saver.restore_latest()
    assert info.step == 1
    assert f"its file index.json is owned by uid {OTHER_UID}, not by this user (uid 0)" in caplog.text


def test_a_previously_saved_checkpoint_directory_with_the_old_modes_is_accepted(tmp_path: Path) -> None:
    """The previous release left 0755 directories: readable by others, writable only by us."""
    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir(mode=0o755)
    checkpoints.chmod(0o755)
    saver, _ = saved_state(checkpoints)
    assert saver.restore_latest()[1].step == 1


@pytest.mark.skipif(os.geteuid() != 0, reason="needs a directory owned by root")
def test_a_root_owned_directory_is_trusted_by_another_user(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A mount point owned by root (a volume's root): root can act as any user anyway."""
    checkpoints = tmp_path / "mount"
    saved_state(checkpoints)  # written by root, as the files on a volume made by root are
    monkeypatch.setattr(os, "geteuid", lambda: OTHER_UID)
    reader = Checkpointer(CheckpointStore(checkpoints), EventLog(None))
    assert reader.restore_latest()[1].step == 1
