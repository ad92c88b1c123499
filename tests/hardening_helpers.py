"""Helpers of the hardening tests: the CLI run in-process through its real entry point, a
digest of a cluster's whole database (to prove a refusal changed nothing), the controller's
processes, and running a command as a user without root's power over file permissions."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import json
import os
import shutil
import sqlite3
import sys
from pathlib import Path

import pytest

from hotswap.api.errors import EXIT_CODES
from hotswap.cli.app import run

TRACEBACK = "Traceback (most recent call last)"


@dataclasses.dataclass
class Result:
    code: int
    out: str
    err: str

    @property
    def one_line_error(self) -> bool:
        """Exactly one line on stderr, ``error: ...``, and nothing else anywhere."""
        lines = self.err.strip().splitlines()
        return self.code != 0 and len(lines) == 1 and lines[0].startswith("error: ") and TRACEBACK not in self.err


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A private state directory (HOTSWAP_HOME) for one test; every cluster in it is deleted
    and every process of it ended afterwards, even if the test made it read-only."""
    from local_helpers import cleanup

    state = tmp_path / "state"
    monkeypatch.setenv("HOTSWAP_HOME", str(state))
    yield state
    for directory, _, _ in os.walk(state):
        os.chmod(directory, 0o700)
    cleanup(state)


@contextlib.contextmanager
def state_home(home: Path):
    """HOTSWAP_HOME set to ``home`` for a module's shared cluster; afterwards every cluster in
    it is deleted and the variable restored."""
    from local_helpers import cleanup

    saved = os.environ.get("HOTSWAP_HOME")
    os.environ["HOTSWAP_HOME"] = str(home)
    try:
        yield home
    finally:
        cleanup(home)
        if saved is None:
            os.environ.pop("HOTSWAP_HOME", None)
        else:
            os.environ["HOTSWAP_HOME"] = saved


def cli(*args: str) -> Result:
    """``hotswap ARGS`` in this process (HOTSWAP_HOME comes from the environment)."""
    out, err = io.TextIOWrapper(io.BytesIO(), encoding="utf-8"), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = run(list(args))
    out.flush()
    assert code in EXIT_CODES, f"exit code {code} is not documented: {err.getvalue()}"
    return Result(code, out.buffer.getvalue().decode(errors="replace"), err.getvalue())  # type: ignore[attr-defined]


def digest(database: Path, tables: tuple[str, ...] | None = None) -> str:
    """A digest of every row of ``tables`` (default: all of them)."""
    connection = sqlite3.connect(f"file:{database}?mode=ro", uri=True, timeout=30)
    try:
        names = tables or tuple(
            r[0] for r in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
        )
        hasher = hashlib.sha256()
        for name in names:
            for row in connection.execute(f"SELECT * FROM {name} ORDER BY rowid"):
                hasher.update(repr(tuple(row)).encode())
        return hasher.hexdigest()
    finally:
        connection.close()


STATE_TABLES = ("meta", "slices", "nodes", "workloads", "workers")  # not the request log or timeline


def controllers(root: Path) -> list[int]:
    """Pids of the controller processes of the cluster at ``root``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"hotswap.backends.local.controller.entry" in command and os.fsencode(root) in command:
            found.append(int(entry.name))
    return found


def independent_controllers(root: Path) -> list[int]:
    """:func:`controllers` less those whose parent is one of them: a controller starting a
    process (a worker's shim, cold) shows its command line in the child until the exec, and that
    child is the start, not a second controller. A pid gone meanwhile is left out."""
    found = controllers(root)
    parents = {}
    for pid in found:
        try:
            parents[pid] = int((Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
    return [pid for pid, parent in parents.items() if parent not in found]


def worker_shims(root: Path) -> list[dict[str, str]]:
    """The environment of every live worker shim of the cluster at ``root``, read from /proc,
    with its ``pid`` and its worker directory ``dir`` (its command line: python -S shim.py
    <dir> ...); zombies left out."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes()
            if b"shim.py" not in command or os.fsencode(root) not in command:
                continue
            state, parent = (entry / "stat").read_text().rsplit(")", 1)[1].split()[:2]
            if state == "Z":
                continue
            pairs = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        env = dict(p.decode(errors="replace").split("=", 1) for p in pairs if b"=" in p)
        found.append({**env, "pid": entry.name, "ppid": parent, "dir": command.split(b"\0")[3].decode()})
    # A shim starts its command with posix_spawn: for an instant the child, not yet exec'd, has
    # the shim's command line and environment. It is that shim's command, not a second shim.
    shims = {(shim["pid"], shim["dir"]) for shim in found}
    found = [shim for shim in found if (shim["ppid"], shim["dir"]) not in shims]
    return found + forked_shims(root)


def forked_shims(root: Path) -> list[dict[str, str]]:
    """The worker shims forked by the cluster's zygote (backends/local/workers/zygote.py): their command
    line and /proc environment are the zygote's (a fork's), so they are found by the pid files
    of the workers' directories, and their worker's environment read from its saved launch."""
    zygote = root / "zygote" / "ready"
    if not zygote.exists():
        return []
    zygote_pid = str(json.loads(zygote.read_text())["pid"])
    spares = {}  # a spare's directory -> the worker directory it was handed (the pointer)
    for pointer in root.glob("workloads/*/**/spare"):
        spares[pointer.read_text().strip()] = pointer.parent
    found = []
    for pid_file in [*root.glob("workloads/*/**/pid"), *root.glob("spares/*/pid")]:
        try:
            pid = pid_file.read_text().split()[0]
            stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if stat[0] == "Z" or stat[1] != zygote_pid:
            continue
        worker_dir = spares.get(str(pid_file.parent), pid_file.parent)
        launch = worker_dir / "launch.json"
        if launch.exists():  # (an unassigned spare serves no worker)
            found.append({**json.loads(launch.read_text())["env"], "pid": pid, "dir": str(pid_file.parent)})
    return found


def unprivileged(command: list[str]) -> list[str]:
    """``command`` as its user without the power to ignore file permissions: root runs it
    with CAP_DAC_OVERRIDE and friends dropped (setpriv); others run it as it is."""
    if os.geteuid() != 0:
        return command
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root without setpriv: cannot drop the power to ignore permissions")
    return [setpriv, "--bounding-set=-dac_override,-dac_read_search,-fowner", *command]


def hotswap_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "hotswap", *args]


def cluster_processes(root: Path) -> set[int]:
    """Every live process of the cluster at ``root``: those whose command line names it (the
    controller, shims, spares, the zygote), their descendants, and the members of the sessions
    they lead (a worker's command, reparented to a subreaper or to init)."""
    table: dict[int, tuple[int, int, bytes]] = {}  # pid -> (parent, session, command line)
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            command = (entry / "cmdline").read_bytes()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z":
            table[int(entry.name)] = (int(fields[1]), int(fields[4]), command)
    found = {pid for pid, (_, _, command) in table.items() if os.fsencode(root) in command and pid != os.getpid()}
    while True:
        more = {pid for pid, (parent, session, _) in table.items() if parent in found or session in found} - found
        if not more:
            return found
        found |= more


def freeze_and_kill(root: Path) -> int:
    """What a power loss, a reboot or the OOM killer does to a cluster: every process of it stops
    at once (SIGSTOP, until no new one appears: a fork in flight is frozen too), then all are
    killed with SIGKILL, none able to record anything. Returns how many were killed."""
    import signal

    frozen: set[int] = set()
    while True:
        new = cluster_processes(root) - frozen
        if not new:
            break
        for pid in new:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        frozen |= new
    for pid in frozen:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return len(frozen)
