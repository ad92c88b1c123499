"""Faults of the machine are errors, not crashes (issue 13): a full disk, a read-only state
directory, a corrupt or locked database, another user's state directory. Each is one line on
stderr that says what happened and what to do, with exit code 6; nothing changes; reads keep
working where the data can be read."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
from pathlib import Path

import pytest
from hardening_helpers import TRACEBACK, cli, controllers, digest, home, hotswap_command, unprivileged  # noqa: F401
from local_helpers import alive, cleanup, hotswap, live_workers, wait_until, workloads, write_sleeper

from hotswap.store import db


def cluster_with_a_workload(home: Path, sleeper: str, name: str = "c") -> None:
    hotswap(home, "cluster", "create", "--cluster", name, "--device-type", "v6e-4", "--num-slices", "2", check=True)
    hotswap(home, "workload", "create", "--cluster", name, "--workload", "a", "--command", sleeper, check=True)
    wait_until(lambda: workloads(home, name)["a"]["phase"] == "RUNNING" and live_workers(home, name, "a"), what="running")


def one_line(result: subprocess.CompletedProcess[str], *words: str) -> None:
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 6 and len(lines) == 1 and TRACEBACK not in result.stderr, result.stderr
    assert lines[0].startswith("error: ") and all(word in lines[0] for word in words), lines[0]


def as_user(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, HOTSWAP_HOME=str(home))
    return subprocess.run(unprivileged(hotswap_command(*args)), capture_output=True, text=True, env=env, timeout=120)


READS = [
    ("workload", "list", "--cluster", "c"),
    ("workload", "list", "--cluster", "c", "-o", "json"),
    ("workload", "describe", "--cluster", "c", "--workload", "a"),
    ("workload", "logs", "--cluster", "c", "--workload", "a"),
    ("cluster", "list"),
    ("cluster", "describe", "--cluster", "c"),
    ("node", "list", "--cluster", "c"),
]


@pytest.mark.parametrize("controller_running", [True, False])
def test_reads_work_on_a_read_only_state_directory_and_writes_say_why_not(
    home: Path, tmp_path: Path, controller_running: bool
) -> None:
    cluster_with_a_workload(home, write_sleeper(tmp_path))
    if not controller_running:  # its last connection gone, the write-ahead log is folded in and removed
        for pid in controllers(home / "clusters" / "c"):
            os.kill(pid, signal.SIGTERM)
            wait_until(lambda: not alive(pid), what="controller stopped")
    before = digest(home / "clusters" / "c" / "state.db")
    for directory, _, files in os.walk(home):
        for name in files:
            if not (Path(directory) / name).is_socket():
                os.chmod(Path(directory) / name, 0o400)
        os.chmod(directory, 0o500)
    for args in READS:
        result = as_user(home, *args)
        assert result.returncode == 0 and TRACEBACK not in result.stderr, (args, result.stderr)
    listing = json.loads(as_user(home, "workload", "list", "--cluster", "c", "-o", "json").stdout)
    assert [w["name"] for w in listing] == ["a"]
    one_line(as_user(home, "workload", "create", "--cluster", "c", "--workload", "b", "--command", "true"), "read-only", "reads")
    one_line(as_user(home, "node", "cordon", "--cluster", "c", "--slice", "c-np-1"), "read-only")
    assert digest(home / "clusters" / "c" / "state.db") == before


def test_a_cluster_directory_without_permissions_is_one_line(home: Path, tmp_path: Path) -> None:
    cluster_with_a_workload(home, write_sleeper(tmp_path))
    (home / "clusters" / "c").chmod(0)
    for args in (("workload", "list", "--cluster", "c"), ("workload", "delete", "--cluster", "c", "--workload", "a")):
        one_line(as_user(home, *args), "Permission denied")
    listing = as_user(home, "cluster", "list", "-o", "json")  # the other clusters stay visible
    assert listing.returncode == 0 and "unreadable (permission)" in listing.stdout, listing.stderr


def test_another_users_state_directory_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """It once gave a 40-line PermissionError (and root would have written into it)."""
    if os.geteuid() == 0:
        foreign = tmp_path / "theirs"
        foreign.mkdir(mode=0o700)
        os.chown(foreign, 65534, 65534)
    else:
        foreign = Path("/")  # owned by root
    monkeypatch.setenv("HOTSWAP_HOME", str(foreign))
    before = sorted(os.listdir(foreign))
    for args in (("cluster", "create", "--cluster", "c", "--device-type", "v6e-4", "--num-slices", "1"),
                 ("cluster", "list"), ("workload", "list", "--cluster", "c")):
        result = cli(*args)
        assert result.one_line_error and result.code == 6 and "not to you" in result.err and "HOTSWAP_HOME" in result.err, result
    assert sorted(os.listdir(foreign)) == before


def test_a_state_directory_others_can_write_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    monkeypatch.setenv("HOTSWAP_HOME", str(shared))
    result = cli("cluster", "create", "--cluster", "c", "--device-type", "v6e-4", "--num-slices", "1")
    assert result.one_line_error and result.code == 6 and f"chmod 700 {shared}" in result.err, result
    assert os.listdir(shared) == []


def test_a_corrupt_database_is_one_line_and_the_cluster_can_still_be_deleted(home: Path, tmp_path: Path) -> None:
    sleeper = write_sleeper(tmp_path)
    cluster_with_a_workload(home, sleeper)
    hotswap(home, "cluster", "create", "--cluster", "ok", "--device-type", "v6e-4", "--num-slices", "1", check=True)
    worker = live_workers(home, "c", "a")[0]["pid"]
    root = home / "clusters" / "c"
    for pid in controllers(root):
        os.kill(pid, signal.SIGKILL)
    for suffix in ("-wal", "-shm"):
        (root / f"state.db{suffix}").unlink(missing_ok=True)
    (root / "state.db").write_bytes(b"this is not a database" * 400)
    for args in (("workload", "list", "--cluster", "c"), ("workload", "create", "--cluster", "c", "--workload", "b", "--command", "true")):
        one_line(hotswap(home, *args), "is corrupt", "cluster delete")
    listing = {c["name"]: c for c in json.loads(hotswap(home, "cluster", "list", "-o", "json", check=True).stdout)}
    assert listing["ok"]["backend"] == "local" and "unreadable" in listing["c"]["device_type"]
    assert alive(worker)  # a bad database stops nobody's work by itself
    deleted = hotswap(home, "cluster", "delete", "--cluster", "c", "--force")
    assert deleted.returncode == 0, deleted.stderr
    assert not root.exists() and not alive(worker)
    assert [c["name"] for c in json.loads(hotswap(home, "cluster", "list", "-o", "json", check=True).stdout)] == ["ok"]


@pytest.mark.parametrize("content", ["empty", "foreign"])
def test_a_database_without_hotswap_tables_is_one_line_and_spares_the_other_clusters(home: Path, content: str) -> None:
    """A zero-length state.db (a crash while the cluster was created, an empty file copied in)
    or an SQLite file of something else: one line for that cluster's commands, and
    ``cluster list`` lists the others with that one marked unreadable."""
    for name in ("c", "ok"):
        hotswap(home, "cluster", "create", "--cluster", name, "--device-type", "v6e-4", "--num-slices", "1", check=True)
    root = home / "clusters" / "c"
    for pid in controllers(root):
        os.kill(pid, signal.SIGKILL)
    for suffix in ("-wal", "-shm"):
        (root / f"state.db{suffix}").unlink(missing_ok=True)
    (root / "state.db").write_bytes(b"")
    if content == "foreign":
        other = sqlite3.connect(root / "state.db")
        other.execute("CREATE TABLE notes (text TEXT)")
        other.commit()
        other.close()
    before = digest(root / "state.db")
    word = "is empty" if content == "empty" else "holds no hotswap tables"
    for args in (
        ("workload", "list", "--cluster", "c"),
        ("workload", "create", "--cluster", "c", "--workload", "b", "--command", "true"),
        ("node", "fail", "--cluster", "c", "--node", "c-np-0-0"),
        ("cluster", "describe", "--cluster", "c"),
    ):
        result = hotswap(home, *args)
        one_line(result, word, "cluster delete --cluster c")
        assert result.returncode == 6
    assert digest(root / "state.db") == before  # nothing was changed, not even a header written
    table = hotswap(home, "cluster", "list")
    assert table.returncode == 0 and not table.stderr, table.stderr
    listing = {c["name"]: c for c in json.loads(hotswap(home, "cluster", "list", "-o", "json", check=True).stdout)}
    assert listing["ok"]["backend"] == "local" and "unreadable" in listing["c"]["device_type"]
    deleted = hotswap(home, "cluster", "delete", "--cluster", "c", "--force")
    assert deleted.returncode == 0, deleted.stderr
    assert [c["name"] for c in json.loads(hotswap(home, "cluster", "list", "-o", "json", check=True).stdout)] == ["ok"]


def test_another_clusters_database_copied_in_is_one_line(home: Path, tmp_path: Path) -> None:
    """Issue 36, item 8: another cluster's state.db copied over this one's was served as this
    cluster (its workloads listed, its workers' pids signalled). The database records its
    cluster's identity, as does the file beside it: a copy is named in one line, changes nothing."""
    hotswap(home, "cluster", "create", "--cluster", "c", "--device-type", "v6e-4", "--num-slices", "1", check=True)
    hotswap(home, "cluster", "create", "--cluster", "other", "--device-type", "v6e-4", "--num-slices", "1", check=True)
    hotswap(home, "workload", "create", "--cluster", "other", "--workload", "theirs", "--command", write_sleeper(tmp_path), check=True)
    root = home / "clusters" / "c"
    for pid in controllers(root):
        os.kill(pid, signal.SIGKILL)
    for suffix in ("-wal", "-shm"):
        (root / f"state.db{suffix}").unlink(missing_ok=True)
    (root / "state.db").unlink()
    source = sqlite3.connect(home / "clusters" / "other" / "state.db")
    copy = sqlite3.connect(root / "state.db")
    source.backup(copy)  # a consistent copy, as a backup tool makes it
    copy.close()
    source.close()
    before = digest(root / "state.db")
    for args in (("workload", "list", "--cluster", "c"), ("cluster", "describe", "--cluster", "c")):
        one_line(hotswap(home, *args), "another cluster's (cluster other)", "cluster delete --cluster c")
    assert digest(root / "state.db") == before
    listing = {c["name"]: c for c in json.loads(hotswap(home, "cluster", "list", "-o", "json", check=True).stdout)}
    assert "unreadable" in listing["c"]["device_type"] and listing["other"]["backend"] == "local"
    assert hotswap(home, "cluster", "delete", "--cluster", "c", "--force").returncode == 0
    assert "theirs" in hotswap(home, "workload", "list", "--cluster", "other", check=True).stdout  # theirs untouched


def test_a_locked_database_is_one_line_and_reads_still_work(home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cluster_with_a_workload(home, write_sleeper(tmp_path))
    monkeypatch.setattr(db, "BUSY_TIMEOUT_MS", 300)
    holder = sqlite3.connect(home / "clusters" / "c" / "state.db", isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")  # e.g. a sqlite3 shell left in a transaction
    try:
        before = digest(home / "clusters" / "c" / "state.db")
        result = cli("workload", "create", "--cluster", "c", "--workload", "b", "--command", "true")
        assert result.one_line_error and result.code == 6 and "locked by another process" in result.err, result
        assert cli("workload", "list", "--cluster", "c").code == 0
        assert digest(home / "clusters" / "c" / "state.db") == before
    finally:
        holder.execute("ROLLBACK")
        holder.close()


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("mount") is None, reason="needs root to mount a small filesystem")
def test_a_full_disk_is_one_line_changes_nothing_and_reads_work(tmp_path: Path) -> None:
    mount_point = tmp_path / "small"
    mount_point.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m,mode=700", "tmpfs", str(mount_point)]).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    home = mount_point / "state"
    try:
        cluster_with_a_workload(home, write_sleeper(tmp_path))
        database = home / "clusters" / "c" / "state.db"
        with sqlite3.connect(database) as connection:  # every later write must grow the log
            connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        with open(mount_point / "filler", "wb") as filler:
            try:
                while True:
                    filler.write(b"\0" * 65536)
                    filler.flush()
            except OSError:
                pass
        before = digest(database)
        one_line(hotswap(home, "workload", "create", "--cluster", "c", "--workload", "b", "--command", "true"),
                 "is full", "free some space")
        assert hotswap(home, "workload", "list", "--cluster", "c").returncode == 0
        assert digest(database) == before
        (mount_point / "filler").unlink()
        assert hotswap(home, "workload", "create", "--cluster", "c", "--workload", "b", "--command", "true").returncode == 0
    finally:
        cleanup(home)
        subprocess.run(["umount", "-l", str(mount_point)])
