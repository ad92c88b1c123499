"""Run backends/local/workers/warm.py as the pool does: a spare that preloads modules, then is handed
one assignment through its FIFO."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from hotswap.backends.local.workers.spares import WARM


def run_spare(directory: Path, preload: list[str], worker_env: dict[str, str], script: str, timeout: float = 120.0) -> tuple[Path, str]:
    """Start a spare in ``directory`` (no GPU visible, as the pool starts it), wait until it is
    ready, hand it ``script`` to run with ``worker_env``; returns the spare's directory and the
    worker's log once it has exited."""
    directory.mkdir(parents=True, exist_ok=True)
    os.mkfifo(directory / "assignment", 0o600)
    (directory / "job.py").write_text(script)
    spare_env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTORCH_NVML_BASED_CUDA_CHECK": "1"}
    process = subprocess.Popen([sys.executable, "-u", str(WARM), str(directory), *preload], env=spare_env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + timeout
    while not (directory / "ready").exists():
        assert process.poll() is None, f"the spare died: {process.stderr.read() if process.stderr else ''}"
        assert time.monotonic() < deadline, "the spare did not get ready"
        time.sleep(0.05)
    log = directory / "worker.log"
    assignment = {"argv": [sys.executable, str(directory / "job.py")], "env": worker_env, "cwd": str(directory), "log": str(log)}
    with open(directory / "assignment", "w") as channel:
        channel.write(json.dumps(assignment) + "\n")
    process.wait(timeout=timeout)
    return directory, log.read_text()


def start_zygote(directory: Path, preload: list[str], timeout: float = 120.0) -> tuple[subprocess.Popen, dict]:
    """Start backends/local/workers/zygote.py as the controller does (no GPU visible, CUDA unchecked);
    returns the process and its ready record once it is ready."""
    from hotswap.backends.local.workers.zygotes import ZYGOTE

    directory.mkdir(parents=True, exist_ok=True)
    spare_env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTORCH_NVML_BASED_CUDA_CHECK": "1"}
    process = subprocess.Popen([sys.executable, "-u", str(ZYGOTE), str(directory), *preload], env=spare_env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + timeout
    while not (directory / "ready").exists():
        assert process.poll() is None, f"the zygote died: {process.stderr.read() if process.stderr else ''}"
        assert time.monotonic() < deadline, "the zygote did not get ready"
        time.sleep(0.05)
    return process, json.loads((directory / "ready").read_text())


def fork_worker(zygote_dir: Path, worker_dir: Path, worker_env: dict[str, str], script: str, timeout: float = 60.0) -> tuple[int, str]:
    """Ask the zygote for a worker running ``script`` with ``worker_env`` (as zygotes.Zygote.fork
    does, the start lock passed); returns its exit code (the shim's record) and its log."""
    import dataclasses
    import fcntl

    from hotswap.backends.local.workers.supervisor import WorkerLaunch
    from hotswap.backends.local.tables import SPARE
    from hotswap.backends.local.workers.zygotes import Zygote

    worker_dir.mkdir(parents=True, exist_ok=True)
    (worker_dir / "job.py").write_text(script)
    log = worker_dir / "worker.log"
    launch = WorkerLaunch(dataclasses.replace(SPARE), worker_dir, log, "", str(worker_dir), worker_env)
    lock = os.open(worker_dir / "lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(lock, fcntl.LOCK_EX)
    try:
        zygote = Zygote(zygote_dir.parent, [], {})
        zygote.dir = zygote_dir
        assignment = {"argv": [sys.executable, str(worker_dir / "job.py")], "env": worker_env, "cwd": str(worker_dir), "log": str(log)}
        zygote.fork(launch, lock, {"assignment": assignment})
    finally:
        os.close(lock)
    deadline = time.monotonic() + timeout
    while not (worker_dir / "exit").exists():
        assert time.monotonic() < deadline, "the forked worker did not end"
        time.sleep(0.05)
    return int((worker_dir / "exit").read_text()), log.read_text()
