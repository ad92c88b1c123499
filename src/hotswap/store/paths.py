"""Where hotswap keeps its state, and the owner-only permissions it keeps it with.

``$HOTSWAP_HOME`` overrides the base directory (tests and demos use their own); otherwise it is
the platform's user state directory (``~/.local/state/hotswap`` on Linux).

    <home>/clusters/<cluster>/state.db        the cluster's database (WAL)
    <home>/clusters/<cluster>/controller.*    pid file (``.lock``), socket and log of its controller
    <home>/clusters/<cluster>/workloads/<workload>-<seq>/   logs, goodput events, membership
    <home>/checkpoints/<cluster>/<workload>/  checkpoints (outlive workloads and clusters)

The state directory is trusted: it must belong to the user and be closed to others' writes
(:func:`home` refuses it otherwise). Directories hotswap creates are 0700, files 0600. The
controller's socket lives in the cluster's own directory; a path too long for a socket address
is reached through ``/proc/self/fd`` (no shared directory such as ``/tmp`` is ever used).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
import stat
from collections.abc import Iterator
from pathlib import Path

from hotswap.api.errors import HotswapError, StateError

HOME_VARIABLE = "HOTSWAP_HOME"
MAX_SOCKET_PATH = 100  # sun_path holds 108 bytes with its NUL


def home() -> Path:
    """The state directory, after checking that it is safe to use (see :func:`check_private`)."""
    configured = os.environ.get(HOME_VARIABLE)
    if configured:
        path = Path(configured).expanduser().resolve()
    else:
        import platformdirs

        path = Path(platformdirs.user_state_dir("hotswap"))
    check_private(path, "the state directory")
    return path


def check_private(
    path: Path, what: str, remedy: str = f"set ${HOME_VARIABLE} to a directory of yours", error: type[HotswapError] = StateError
) -> None:
    """Refuse a directory of another user, or one that others can write to: hotswap runs what
    its state says (worker commands, environments), and restores what checkpoints hold, so
    these must be the user's alone. A missing directory passes (it is created 0700)."""
    try:
        status = os.stat(path)
    except FileNotFoundError:
        return
    except OSError as problem:
        raise error(f"cannot open {what} {path}: {problem.strerror}; {remedy}") from None
    if not stat.S_ISDIR(status.st_mode):
        raise error(f"{what} {path} is not a directory; {remedy}")
    if status.st_uid != os.geteuid():
        raise error(f"{what} {path} belongs to {_user(status.st_uid)}, not to you: hotswap keeps it private; {remedy}")
    if stat.S_IMODE(status.st_mode) & 0o022:
        raise error(
            f"{what} {path} can be written by other users (mode {stat.S_IMODE(status.st_mode):o}):"
            f" run `chmod 700 {path}`"
        )


def _user(uid: int) -> str:
    import pwd

    try:
        return f"user {pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def new_dirs_private(path: Path) -> Path:
    """Create ``path`` and any missing parent readable by the owner only; leave existing ones
    as they are (``workload create`` has checked that a checkpoint directory is the user's)."""
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


def owner_only(root: Path) -> None:
    """Close ``root`` and everything under it to others: directories 0700, files 0600 (links
    are left alone: their targets are not ours to change)."""
    for directory, dirs, names in os.walk(root):
        os.chmod(directory, 0o700)
        for name in names:
            path = os.path.join(directory, name)
            if not os.path.islink(path):
                os.chmod(path, 0o600)


def write_private(path: Path, text: str) -> None:
    """Replace ``path`` atomically with ``text``, readable by the owner only."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(text)
    os.replace(temporary, path)


def open_private(path: Path, flags: int = os.O_WRONLY | os.O_CREAT | os.O_APPEND) -> int:
    """A descriptor of ``path``, created readable by the owner only."""
    return os.open(path, flags | os.O_CLOEXEC, 0o600)


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
    def pid_file(self) -> Path:
        """The running controller's pid. (Named ``.lock`` for the scripts that read it; the
        lock itself is held on the cluster's directory, see ``backends/local/controller/loop.py``.)"""
        return self.root / "controller.lock"

    @property
    def socket(self) -> Path:
        """Where the controller's Unix socket lives (see :meth:`socket_address`)."""
        return self.root / "controller.sock"

    @contextlib.contextmanager
    def socket_address(self) -> Iterator[str]:
        """An address to bind or connect the socket with, valid inside the ``with``. Socket
        addresses hold at most 107 bytes, so a deep state directory is reached through a
        descriptor of the cluster's directory (``/proc/self/fd/N/controller.sock``)."""
        if len(os.fsencode(self.socket)) <= MAX_SOCKET_PATH:
            yield str(self.socket)
            return
        descriptor = os.open(self.root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            yield f"/proc/self/fd/{descriptor}/{self.socket.name}"
        finally:
            os.close(descriptor)

    @property
    def controller_log(self) -> Path:
        return self.root / "controller.log"

    def controller_pid(self) -> int | None:
        """The pid written in the controller's pid file, if that process is alive."""
        with contextlib.suppress(OSError, ValueError):
            pid = int(self.pid_file.read_text().strip() or 0)
            if pid > 0 and os.path.exists(f"/proc/{pid}"):
                return pid
        return None

    def workload_dir(self, workload: str, seq: int) -> Path:
        return self.root / "workloads" / f"{workload}-{seq}"

    def checkpoint_dir(self, workload: str) -> Path:
        return self.root.parent.parent / "checkpoints" / self.name / workload


def clusters_root(base: Path | None = None) -> Path:
    return (base or home()) / "clusters"
