"""Run backends/local/warm.py as the pool does: a spare that preloads modules, then is handed
one assignment through its FIFO."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from hotswap.backends.local.spares import WARM


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
