"""Where hotswap keeps its state, and the owner-only permissions it keeps it with.

``$HOTSWAP_HOME`` overrides the base directory (tests and demos use their own); otherwise it is
the platform's user state directory (``~/.local/state/hotswap`` on Linux).

    <home>/clusters/<cluster>/state.db        the cluster's database (WAL)
    <home>/clusters/<cluster>/controller.*    lock, socket and log of its controller
    <home>/clusters/<cluster>/workloads/<workload>-<seq>/   logs, goodput events, membership
    <home>/checkpoints/<cluster>/<workload>/  checkpoints (outlive workloads and clusters)
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

HOME_VARIABLE = "HOTSWAP_HOME"
MAX_SOCKET_PATH = 100


def home() -> Path:
    configured = os.environ.get(HOME_VARIABLE)
    if configured:
        return Path(configured).expanduser().resolve()
    import platformdirs

    return Path(platformdirs.user_state_dir("hotswap"))


def new_dirs_private(path: Path) -> Path:
    """Create ``path`` and any missing parent readable by the owner only; leave existing ones
    as they are (a shared checkpoint directory a user names keeps its mode)."""
    missing = []
    current = path
    while not current.exists():
        missing.append(current)
        current = current.parent
    for directory in reversed(missing):
        directory.mkdir(mode=0o700, exist_ok=True)
    return path


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (created owner-only): others wait for it (a flock)."""
    descriptor = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        yield
    finally:
        os.close(descriptor)


def private_dir(path: Path) -> Path:
    """``path`` (created with its missing parents if needed) readable by the owner only."""
    new_dirs_private(path)
    os.chmod(path, 0o700)
    return path


@dataclasses.dataclass(frozen=True)
class ClusterPaths:
    name: str
    root: Path

    @classmethod
    def of(cls, cluster: str, base: Path | None = None) -> ClusterPaths:
        return cls(cluster, (base or home()) / "clusters" / cluster)

    @property
    def database(self) -> Path:
        return self.root / "state.db"

    @property
    def lock(self) -> Path:
        return self.root / "controller.lock"

    @property
    def socket(self) -> Path:
        """The controller's Unix socket. Socket paths are limited to 107 bytes, so a deep state
        directory gets a short one in a private runtime directory, named after the cluster's."""
        inside = self.root / "controller.sock"
        if len(os.fsencode(inside)) <= MAX_SOCKET_PATH:
            return inside
        digest = hashlib.sha256(os.fsencode(self.root)).hexdigest()[:20]
        return runtime_dir() / f"{digest}.sock"

    @property
    def controller_log(self) -> Path:
        return self.root / "controller.log"

    def controller_pid(self) -> int | None:
        """The pid written in the controller's lock file, if a live process holds it."""
        with contextlib.suppress(FileNotFoundError, ValueError):
            pid = int(self.lock.read_text().strip() or 0)
            if pid and os.path.exists(f"/proc/{pid}"):
                return pid
        return None

    def workload_dir(self, workload: str, seq: int) -> Path:
        return self.root / "workloads" / f"{workload}-{seq}"

    def checkpoint_dir(self, workload: str) -> Path:
        return self.root.parent.parent / "checkpoints" / self.name / workload


def runtime_dir() -> Path:
    """A short, private directory for sockets: ``$XDG_RUNTIME_DIR/hotswap`` or
    ``/tmp/hotswap-<uid>``, which must be ours and closed to others."""
    base = os.environ.get("XDG_RUNTIME_DIR")
    path = Path(base) / "hotswap" if base else Path(tempfile.gettempdir()) / f"hotswap-{os.getuid()}"
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    status = path.lstat()
    if stat.S_ISLNK(status.st_mode) or status.st_uid != os.getuid() or stat.S_IMODE(status.st_mode) & 0o077:
        raise PermissionError(f"{path} must be a directory of yours that nobody else can open")
    return path


def clusters_root(base: Path | None = None) -> Path:
    return (base or home()) / "clusters"
