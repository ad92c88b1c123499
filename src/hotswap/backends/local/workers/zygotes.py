"""The controller's side of a local cluster's zygote (``zygote.py``): start it (or adopt the one a
killed controller left), ask it for a worker or a spare by fork, stop it.

One zygote per cluster, importing the pool's preload list (its settings' ``warm_preload``): the
cluster's workers run one interpreter and one environment, and the zygote is started as a spare
is (no GPU visible, CUDA left uninitialised), so every slice's workers, GPU-backed or emulated,
can come from it; their CUDA_VISIBLE_DEVICES applies in the forked process before any CUDA
call. One process per cluster, not per slice: a fork is milliseconds, so a second zygote would
buy nothing but its memory.

When the zygote cannot serve (not started yet, still importing, dead, refusing to fork: see
``zygote.fork_problem``; or not answering within :data:`REPLY_TIMEOUT_S`), the caller starts
the process cold, as before; the reason is said once in the controller's log (each new reason
once). A shim forked for a request given up on never runs (``zygote.py``: it waits for ``go``).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from hotswap.backends.local.crash_points import crash_at
from hotswap.api.processes import start_ticks
from hotswap.backends.local.workers.supervisor import WorkerLaunch
from hotswap.store.paths import new_dirs_private, open_private, write_private

ZYGOTE = Path(__file__).with_name("zygote.py")
GO = b"go\n"  # zygote.GO: the forked shim may run
REPLY_TIMEOUT_S = 1.0  # then the worker starts cold (safe: a shim forked later never runs)
UNANSWERED_PAUSE_S = 10.0  # after a fork unanswered, start cold this long: one wait, not one per fork
STARTED = "started"  # every zygote started for the cluster and not known ended: "pid ticks" lines


class ZygoteUnusable(Exception):
    """The zygote cannot start this process now (the message says why)."""


class Zygote:
    def __init__(self, root: Path, modules: list[str], environment: dict[str, str]) -> None:
        """``modules``: what it imports; ``environment``: what it starts with (a spare's)."""
        self.dir = root / "zygote"
        self.modules = modules
        self.environment = environment
        self.process: subprocess.Popen[bytes] | None = None
        self.said: set[str] = set()  # reasons for a cold start already logged
        self.unanswered_at: float | None = None  # (monotonic) when a fork last went unanswered

    def start(self) -> None:
        """Start the zygote, or adopt the one that runs with these modules (a controller killed
        and restarted finds it beside the cluster)."""
        info = self.info()
        if info is not None and info.get("modules") == self.modules:
            try:  # what it really started with (a killed controller's environment)
                self.environment = json.loads((self.dir / "env.json").read_text())
            except (FileNotFoundError, ValueError):
                pass
            self._end_others(keep=int(info["pid"]))
            return
        self.stop()
        new_dirs_private(self.dir)
        write_private(self.dir / "env.json", json.dumps(self.environment))  # may hold secrets
        with os.fdopen(open_private(self.dir / "zygote.log"), "a") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-u", str(ZYGOTE), str(self.dir), *self.modules],
                cwd=self.dir, env=self.environment, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                start_new_session=True,
            )
        crash_at("zygote-spawned")  # (test-only: see crash_points.py)
        with os.fdopen(open_private(self.dir / STARTED), "a") as started:  # at once: a controller can die any time
            started.write(f"{self.process.pid} {start_ticks(self.process.pid)}\n")

    def info(self) -> dict | None:
        """The running zygote's ready record (None: not running, or still importing)."""
        if self.process is not None and self.process.poll() is not None:
            self.process = None  # it died (reaped)
        try:
            info = json.loads((self.dir / "ready").read_text())
        except (FileNotFoundError, ValueError):
            return None
        return info if isinstance(info, dict) and start_ticks(int(info.get("pid", 0))) is not None else None

    def importing(self) -> bool:
        """Whether the zygote this controller started is still importing (alive, not ready)."""
        if self.process is None or self.process.poll() is not None:
            return False
        return self.info() is None

    def stop(self) -> None:
        """Stop the zygote (it ends when its ready file is gone; SIGKILL makes that at once,
        also while it still imports, or is stopped: it has nothing to save, and the wait
        below must not hold the controller)."""
        info = self.info()
        (self.dir / "ready").unlink(missing_ok=True)
        pids = {int(info["pid"])} if info is not None else set()
        if self.process is not None:
            pids.add(self.process.pid)  # ours, perhaps still importing: waited for below
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.process is not None:
            self.process.wait()
            self.process = None
        self._end_others(keep=None)

    def _end_others(self, keep: int | None) -> None:
        """Kill every zygote a controller of this cluster started but ``keep``: one a killed
        controller left importing (no ready file names it) would live on beside the new one."""
        try:
            lines = (self.dir / STARTED).read_text().splitlines()
        except FileNotFoundError:
            return
        kept = []
        for line in lines:
            with contextlib.suppress(ValueError, ProcessLookupError):
                pid, ticks = map(int, line.split())
                if start_ticks(pid) != ticks:
                    continue  # ended (the pid may be another process's by now)
                if pid == keep:
                    kept.append(line)
                    continue
                os.kill(pid, signal.SIGKILL)
        write_private(self.dir / STARTED, "".join(f"{line}\n" for line in kept))

    def usable(self) -> bool:
        """Whether the zygote is ready to fork."""
        info = self.info()
        return info is not None and not info.get("problem")

    def fork(self, launch: WorkerLaunch, lock: int, what: dict[str, object]) -> tuple[int, int | None]:
        """A new shim for ``launch`` forked by the zygote, holding the start lock ``lock``; it
        runs ``what``: ``{"spare": dir}`` or ``{"assignment": {...}}``. Raises ZygoteUnusable."""
        info = self.info()
        if info is None:
            raise ZygoteUnusable("the zygote is not running (or still importing)")
        if info.get("problem"):
            raise ZygoteUnusable(f"the zygote cannot fork: {info['problem']}")
        if self.unanswered_at is not None and time.monotonic() - self.unanswered_at < UNANSWERED_PAUSE_S:
            raise ZygoteUnusable("the zygote did not answer a moment ago")
        request = {"dir": str(launch.dir), "log": str(launch.log), "env": launch.env, "cwd": launch.cwd, **what}
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as channel:
                channel.settimeout(REPLY_TIMEOUT_S)
                channel.connect(str(self.dir / "socket"))
                socket.send_fds(channel, [json.dumps(request).encode() + b"\n"], [lock])
                data = b""
                while not data.endswith(b"\n"):
                    more = channel.recv(1 << 16)
                    if not more:
                        break
                    data += more
                reply = json.loads(data)
                if "error" in reply:
                    raise ZygoteUnusable(f"the zygote refused: {reply['error']}")
                # The forked shim runs only once told so: given up on (the timeout above, or
                # this controller dies), it exits before it records or starts anything.
                channel.sendall(GO)
        except (OSError, ValueError) as error:
            self.unanswered_at = time.monotonic()
            raise ZygoteUnusable(f"the zygote did not answer: {error}") from error
        return int(reply["pid"]), reply.get("ticks")

    def say_once(self, reason: str) -> None:
        """Tell the controller's log why a process starts cold (each reason once)."""
        if reason not in self.said:
            self.said.add(reason)
            print(f"hotswap: starting workers cold (without the zygote): {reason}", file=sys.stderr, flush=True)
