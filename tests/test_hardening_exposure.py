"""Nothing is exposed beyond the user and the machine (issue 13): the state directory's files
are owner-only (a workload's launch record holds its environment, secrets included), no shared
directory such as /tmp is needed (another user could squat it), and rank 0's rendezvous store
listens on MASTER_ADDR only."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from local_helpers import cleanup, hotswap, live_workers, wait_until, workloads, write_sleeper


@pytest.fixture
def home(tmp_path: Path):
    state = tmp_path / "state"
    yield state
    cleanup(state)


def test_every_file_of_the_state_directory_is_owner_only(home: Path, tmp_path: Path) -> None:
    hotswap(home, "cluster", "create", "--cluster", "c", "--device-type", "v6e-4", "--num-slices", "2", check=True)
    sleeper = write_sleeper(tmp_path)
    hotswap(home, "workload", "create", "--cluster", "c", "--workload", "a", "--command", sleeper, "--env", "TOKEN=secret", check=True)
    hotswap(home, "workload", "create", "--cluster", "c", "--workload", "e", "--command", sleeper,
            "--num-slices", "1", "--min-slices", "1", check=True)  # elastic: a membership file too
    wait_until(lambda: all(workloads(home, "c")[w]["phase"] == "RUNNING" for w in "ae") and len(live_workers(home, "c")) == 2,
               what="running")
    wait_until(lambda: all((Path(w["dir"]) / "pid").exists() for w in live_workers(home, "c")), what="pid files")
    seen = 0
    for directory, _, files in os.walk(home):
        assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700, directory
        for name in files:
            mode = stat.S_IMODE(os.lstat(Path(directory) / name).st_mode)
            assert mode & 0o077 == 0, f"{directory}/{name} is {mode:o}"
            seen += 1
    assert seen > 10 and any(Path(d, "launch.json").exists() for d, _, _ in os.walk(home))


def test_a_deep_state_directory_needs_no_shared_socket_directory(tmp_path: Path) -> None:
    """A state path too long for a socket address once needed /tmp/hotswap-<uid>, and a
    directory of that name made by another user blocked every such cluster."""
    squatted = tmp_path / "tmp"
    (squatted / f"hotswap-{os.getuid()}").mkdir(parents=True)
    if os.geteuid() == 0:
        os.chown(squatted / f"hotswap-{os.getuid()}", 65534, 65534)
    else:
        (squatted / f"hotswap-{os.getuid()}").chmod(0o777)
    home = tmp_path / ("deep-" * 20) / "state"
    env = {"TMPDIR": str(squatted), "XDG_RUNTIME_DIR": ""}
    try:
        old = dict(os.environ)
        os.environ.update(env)
        hotswap(home, "cluster", "create", "--cluster", "c", "--device-type", "v6e-4", "--num-slices", "1", check=True)
        hotswap(home, "workload", "create", "--cluster", "c", "--workload", "a", "--command", write_sleeper(tmp_path), check=True)
        assert hotswap(home, "workload", "list", "--cluster", "c").returncode == 0
        assert len(os.fsencode(home / "clusters" / "c" / "controller.sock")) > 108
        assert (home / "clusters" / "c" / "controller.sock").is_socket()
        assert os.listdir(squatted / f"hotswap-{os.getuid()}") == []
    finally:
        os.environ.clear()
        os.environ.update(old)
        cleanup(home)


def _listening(port: int) -> list[str]:
    """Local addresses of TCP sockets listening on ``port`` (from /proc/net/tcp and tcp6)."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as lines:
            next(lines)
            for line in lines:
                local, state = line.split()[1], line.split()[3]
                address, hex_port = local.rsplit(":", 1)
                if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                    found.append(address)
    return found


FORM_A_GROUP = """
import sys
from hotswap.backends.local.workers.environment import free_port
from hotswap.api.worker import WorkerEnv
from hotswap.train.torch.distributed import ProcessGroup
from hotswap.train.rendezvous import GroupSpec

group = ProcessGroup("gloo", collective_timeout_s=10, rendezvous_timeout_s=30, env=WorkerEnv.from_environ({"CUDA_VISIBLE_DEVICES": ""}))
port = free_port()
group.form(GroupSpec(1, 0, 1, "127.0.0.1", port), interrupted=lambda: False)
print(port, flush=True)
sys.stdin.readline()
group.destroy()
"""


def test_rank_0s_store_listens_on_master_addr_only() -> None:
    pytest.importorskip("torch")
    process = subprocess.Popen([sys.executable, "-c", FORM_A_GROUP], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        port = int(process.stdout.readline())  # type: ignore[union-attr]
        assert _listening(port) == ["0100007F"]  # 127.0.0.1, not 0.0.0.0 or ::
    finally:
        process.communicate("\n", timeout=60)
