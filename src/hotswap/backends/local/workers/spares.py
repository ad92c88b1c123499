"""A pool of warm spare workers for a local cluster (its settings' ``warm_workers``).

A spare is a worker process started ahead of need (see ``warm.py``): it has imported PyTorch
and ``hotswap.train`` and waits on a FIFO. When the controller must start a worker whose command
is ``python <script.py> ...`` with this very interpreter, it hands the worker's assignment to a
ready spare instead of starting a cold process: a hotswap restart then costs a process-group
rendezvous and a restore, not a PyTorch import.

Spares are rows of the worker table with state ``warm`` (no workload). Handing one over turns
the worker row into a pointer at the spare's process (its pid and its directory, where the
shim records the exit code) and marks the spare row ``assigned``.
"""

from __future__ import annotations

import dataclasses
import fcntl
import importlib.machinery
import importlib.util
import json
import os
import shlex
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from hotswap.api.worker import CUDA_VISIBLE_DEVICES
from hotswap.backends.local.settings import DEFAULT_PRELOAD
from hotswap.backends.local.workers.supervisor import Supervisor, WorkerLaunch
from hotswap.store.paths import new_dirs_private, write_private
from hotswap.backends.local.tables import SPARE, LocalStore, WorkerRow

WARM = Path(__file__).with_name("warm.py")
SPARE_POINTER = "spare"  # in a worker's directory: the spare that runs it
REFILL_AFTER_HAND_OVER_S = 5.0  # let a failover's workers have the CPU before new spares import torch
REFILL_AFTER_DEATH_S = 1.0
PYTHON_NAMES = ("python", "python3", f"python3.{sys.version_info.minor}")
# Variables that shape a Python process before its first line runs: a spare started under other
# values would not be the process the worker asked for, so it is not used. (PYTHONPATH and the
# thread counts are applied by the spare at hand-over instead.)
IMPORT_TIME_VARIABLES = (
    "PYTHONHOME", "PYTHONHASHSEED", "PYTHONOPTIMIZE", "PYTHONNOUSERSITE", "PYTHONSAFEPATH",
    "LD_PRELOAD", "LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES",
)


DEVICE_VISIBILITY_VARIABLES = (CUDA_VISIBLE_DEVICES, "HIP_VISIBLE_DEVICES")
CUDA_UNTOUCHED = "cuda-untouched"  # warm.py's marker: CUDA is not initialised in the spare


class SpareGone(Exception):
    """The spare is no longer waiting for an assignment (it died)."""


def preload_modules(requested: tuple[str, ...] = DEFAULT_PRELOAD) -> list[str]:
    """The requested modules that this interpreter can import (a spare must never die on one).

    Found without importing anything: ``importlib.util.find_spec("torch.distributed")`` would
    import ``torch`` into the controller (200 MB, and seconds of a busy host's CPU during which
    the cluster goes unanswered). Only the spares and the zygote import the list."""
    return [name for name in requested if _findable(name)]


def _findable(name: str) -> bool:
    """Whether module ``name`` can be found, its parent packages looked up on their paths, never
    imported (a module already imported counts as found)."""
    if name in sys.modules:
        return True
    top, *rest = name.split(".")
    try:
        spec = importlib.util.find_spec(top)  # a top-level name: the finders only, no import
        for depth in range(1, len(rest) + 1):
            locations = spec.submodule_search_locations if spec is not None else None
            if not locations:
                return False
            spec = importlib.machinery.PathFinder.find_spec(".".join([top, *rest[:depth]]), list(locations))
    except (ImportError, ValueError):
        return False
    return spec is not None


def starts_like(started_with: dict[str, str], env: dict[str, str], cuda_untouched: bool) -> bool:
    """Whether a process started with ``started_with`` is the Python process ``env`` would
    start (with CUDA untouched in it, the GPUs it sees are chosen at hand-over)."""
    compared = [n for n in IMPORT_TIME_VARIABLES if not (cuda_untouched and n in DEVICE_VISIBILITY_VARIABLES)]
    return all(started_with.get(name) == env.get(name) for name in compared)


def spare_environment() -> dict[str, str]:
    """What a spare (and the zygote) starts with: no GPU visible and CUDA left uninitialised
    (NVML answers is_available()), so that it serves emulated slices' workers and GPU-backed
    ones too: their CUDA_VISIBLE_DEVICES applies at hand-over, before any CUDA call."""
    return {**os.environ, CUDA_VISIBLE_DEVICES: "", "PYTORCH_NVML_BASED_CUDA_CHECK": "1"}


class SparePool:
    def __init__(
        self, store: LocalStore, supervisor: Supervisor, root: Path, size: int, preload: tuple[str, ...] = DEFAULT_PRELOAD
    ) -> None:
        self.store = store
        self.supervisor = supervisor
        self.root = root
        self.size = size
        self.preload = preload
        self.failures = 0  # spares that died unassigned in a row; a broken pool stops refilling
        self.refill_at: float | None = None  # when to start the spares the pool lacks
        self.closed = False  # the cluster is going away: no new spares

    def rows(self) -> list[WorkerRow]:
        return self.store.worker_rows.select(("warm",))

    def wanted(self) -> int:
        if self.size <= 0 or self.failures >= 3:
            return 0
        return max(0, self.size - len(self.rows()))

    def resize(self, size: int, preload: tuple[str, ...] | None) -> list[WorkerRow]:
        """A new size (and preload list) for the pool; returns the spares beyond it, to stop."""
        self.size = size
        if preload is not None:
            self.preload = preload
        self.failures = 0
        self.refill_after(0.0)
        return self.rows()[size:]

    def close(self) -> list[WorkerRow]:
        """No more spares (the cluster is being deleted); returns the spares, to stop."""
        self.closed = True
        self.refill_at = None
        return self.rows()

    def died(self) -> None:
        """A spare ended before it was used (while the cluster lives, that counts as a failure)."""
        if not self.closed:
            self.failures += 1
            self.refill_after(REFILL_AFTER_DEATH_S)

    def refill_after(self, delay_s: float) -> None:
        self.refill_at = time.time() + delay_s

    def refill_due(self) -> bool:
        """Whether it is time to start the spares the pool lacks (once per :attr:`refill_at`)."""
        if self.closed or self.refill_at is None or self.refill_at > time.time():
            return False
        self.refill_at = None
        return True

    def new_spare(self, now: float) -> tuple[WorkerRow, WorkerLaunch]:
        """A row (committed) and the launch of a new spare; the caller spawns and watches it."""
        with self.store.transaction():
            spare_id = self.store.worker_rows.add(SPARE, dir="", state="warm", started_at=now)
            directory = self.root / "spares" / str(spare_id)
            self.store.worker_rows.update(spare_id, dir=str(directory))
        new_dirs_private(directory)
        fifo = directory / "assignment"
        if not fifo.exists():
            os.mkfifo(fifo, 0o600)
        command = shlex.join([sys.executable, "-u", str(WARM), str(directory), *preload_modules(self.preload)])
        environment = spare_environment()
        write_private(directory / "env.json", json.dumps(environment))  # may hold secrets
        launch = WorkerLaunch(SPARE, directory, directory / "spare.log", command, str(directory), environment)
        return self.store.worker_rows.get(spare_id), launch

    def argv_for(self, launch: WorkerLaunch) -> list[str] | None:
        """The worker's argv if a spare can run it: ``python <script.py> ...`` with our Python,
        one process per host."""
        if launch.local:
            return None
        try:
            words = shlex.split(launch.command)
        except ValueError:
            return None
        if len(words) < 2 or os.path.basename(words[0]) not in PYTHON_NAMES and words[0] != sys.executable:
            return None
        if not words[1].endswith(".py") or any(c in launch.command for c in "|&;<>()$`"):
            return None
        interpreter = shutil.which(words[0], path=launch.env.get("PATH")) if os.sep not in words[0] else words[0]
        # The same environment (virtualenv), not merely the same binary: compare directories.
        if interpreter is None or os.path.realpath(Path(interpreter).parent) != os.path.realpath(Path(sys.executable).parent):
            return None
        script = Path(launch.cwd) / words[1]
        if not script.is_file():
            return None
        return [words[0], str(script), *words[2:]]

    def take(self, env: dict[str, str]) -> WorkerRow | None:
        """A spare that has finished importing, waits, and was started as ``env`` would start
        a Python process, if any."""
        for row in self.rows():
            if not (Path(row.dir) / "ready").exists() or not self.supervisor.alive(row):
                continue
            try:
                started_with = json.loads((Path(row.dir) / "env.json").read_text())
            except (FileNotFoundError, json.JSONDecodeError):
                continue
            if starts_like(started_with, env, (Path(row.dir) / CUDA_UNTOUCHED).exists()):
                return row
        return None

    def hand_over(self, spare: WorkerRow, worker: WorkerRow, launch: WorkerLaunch, argv: list[str]) -> WorkerRow:
        """Give ``worker``'s assignment to ``spare``; the worker row now points at its process.

        Order matters for a controller killed half-way: the worker's directory first names the
        spare (so a restarted controller adopts the spare's process instead of starting a
        second one), then the spare gets the assignment, then the rows are committed.
        """
        write_private(Path(launch.dir) / SPARE_POINTER, spare.dir)
        message = json.dumps({"argv": argv, "env": launch.env, "cwd": launch.cwd, "log": str(launch.log)}) + "\n"
        try:
            channel = os.open(Path(spare.dir) / "assignment", os.O_WRONLY | os.O_NONBLOCK)
        except OSError as error:  # ENXIO: nobody reads the FIFO any more
            (Path(launch.dir) / SPARE_POINTER).unlink(missing_ok=True)
            raise SpareGone(spare.dir) from error
        try:
            flags = fcntl.fcntl(channel, fcntl.F_GETFL)
            fcntl.fcntl(channel, fcntl.F_SETFL, flags & ~os.O_NONBLOCK)
            os.write(channel, message.encode())
        finally:
            os.close(channel)
        with self.store.transaction():
            self.store.worker_rows.update(spare.id, state="assigned")
            self.store.worker_rows.update(
                worker.id, pid=spare.pid, start_ticks=spare.start_ticks, dir=spare.dir, state="running"
            )
        self.supervisor.adopt(spare.id, worker.id)
        self.failures = 0
        self.refill_after(REFILL_AFTER_HAND_OVER_S)
        return dataclasses.replace(worker, pid=spare.pid, start_ticks=spare.start_ticks, dir=spare.dir, state="running")

    def adopt_after_crash(self, worker: WorkerRow) -> WorkerRow:
        """A worker handed to a spare by a controller that died before committing it: point the
        row at the spare's process and retire the spare's own row."""
        pointer = Path(worker.dir) / SPARE_POINTER
        try:
            spare_dir = pointer.read_text().strip()
        except FileNotFoundError:
            return worker
        with self.store.transaction():
            for spare in self.store.worker_rows.select(("warm",)):
                if spare.dir == spare_dir:
                    self.store.worker_rows.update(spare.id, state="assigned")
            self.store.worker_rows.update(worker.id, dir=spare_dir)
        return self.store.worker_rows.get(worker.id)
