"""Plays the controller for hotswap.train tests: starts real worker processes with the worker
environment of the contract, publishes elastic memberships, sends signals, reads logs.

Every worker runs in its own session (process group); :class:`Workers` kills whatever is left
when the test ends, pass or fail.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from hotswap.api import worker as contract
from hotswap.api.membership import Membership
from hotswap.api.worker_output import parse_fields

ROOT = Path(__file__).resolve().parents[1]
TRAIN_EXAMPLE = ROOT / "examples" / "train.py"
MIGRATOR_EXAMPLE = ROOT / "examples" / "migrator_train.py"
LOCALHOST = "127.0.0.1"
# Variables of the contract (and torch.distributed's) that must not leak in from the test runner.
_CONTRACT_VARS = {value for name, value in vars(contract).items() if name.isupper() and isinstance(value, str)}


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((LOCALHOST, 0))
        return int(probe.getsockname()[1])


def clean_environ() -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key not in _CONTRACT_VARS}
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONFAULTHANDLER"] = "1"  # a crashing worker leaves its stack in its stderr
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


@dataclasses.dataclass
class Worker:
    name: str
    process: subprocess.Popen[bytes]
    log: Path
    errors: Path

    def lines(self) -> list[str]:
        try:
            return self.log.read_text().splitlines()
        except FileNotFoundError:
            return []

    def steps(self) -> dict[int, dict[str, str]]:
        """Fields of each step line, by step number (the last line of a step wins)."""
        found = {}
        for line in self.lines():
            fields = parse_fields(line)
            if line.startswith("step=") and "elastic_manager.good_slice_count" in fields:
                found[int(fields["step"])] = fields
        return found

    def losses(self) -> dict[int, str]:
        return {step: fields["loss"] for step, fields in self.steps().items()}

    def last_step(self) -> int:
        steps = self.steps()
        return max(steps) if steps else 0

    def signal(self, signum: int) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signum)

    def wait(self, timeout: float) -> int:
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{self.name} did not exit within {timeout}s; stderr:\n{self.stderr()}") from None

    def stderr(self) -> str:
        try:
            return self.errors.read_text()[-4000:]
        except FileNotFoundError:
            return ""


class Workers:
    """The processes of one test, all killed (whole process groups) on exit."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.started: list[Worker] = []

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc: object) -> None:
        for worker in self.started:
            if worker.process.poll() is None:
                try:
                    os.killpg(worker.process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            worker.process.wait()

    def start(self, name: str, script: Path, args: list[str], env: dict[str, object]) -> Worker:
        log = self.directory / f"{name}.log"
        errors = self.directory / f"{name}.err"
        environ = clean_environ()
        environ.update({key: str(value) for key, value in env.items()})
        with open(log, "ab") as stdout, open(errors, "ab") as stderr:
            process = subprocess.Popen(
                [sys.executable, str(script), *args],
                stdout=stdout,
                stderr=stderr,
                env=environ,
                cwd=self.directory,
                start_new_session=True,
            )
        worker = Worker(name, process, log, errors)
        self.started.append(worker)
        return worker


def worker_env(
    *,
    rank: int,
    world_size: int,
    port: int,
    checkpoint_dir: Path,
    events_file: Path | None = None,
    slice_name: str | None = None,
    num_slices: int | None = None,
    membership_file: Path | None = None,
    grace_s: float = contract.DEFAULT_GRACE_PERIOD_S,
) -> dict[str, object]:
    """The contract's variables for host 0 of slice ``rank`` of a one-host-per-slice workload."""
    env: dict[str, object] = {
        contract.HOTSWAP_WORKLOAD: "test",
        contract.RANK: contract.global_rank(rank, 0, hosts_per_slice=1),
        contract.WORLD_SIZE: world_size,
        contract.MASTER_ADDR: LOCALHOST,
        contract.MASTER_PORT: port,
        contract.MEGASCALE_NUM_SLICES: num_slices or world_size,
        contract.MEGASCALE_SLICE_ID: rank,
        contract.JOB_INDEX: rank,
        contract.JOB_COMPLETION_INDEX: 0,
        contract.HOTSWAP_HOSTS_PER_SLICE: 1,
        contract.HOTSWAP_CHECKPOINT_DIR: checkpoint_dir,
        contract.HOTSWAP_TERMINATION_GRACE_S: grace_s,
        # An emulated slice, as the local backend starts it: gloo on the CPU even where the
        # test machine has a GPU (unset, the SDK would take one; set and empty, never).
        contract.CUDA_VISIBLE_DEVICES: "",
    }
    if events_file is not None:
        env[contract.HOTSWAP_EVENTS_FILE] = events_file
    if slice_name is not None:
        env[contract.HOTSWAP_SLICE] = slice_name
    if membership_file is not None:
        env[contract.HOTSWAP_MEMBERSHIP_FILE] = membership_file
    return env


def publish_membership(path: Path, generation: int, slices: tuple[str, ...], port: int) -> Membership:
    """Replace the membership file atomically, as the controller does."""
    membership = Membership(generation, slices, 1, LOCALHOST, port)
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(membership.to_json())
    os.replace(temporary, path)
    return membership


def wait_until(condition: Callable[[], bool], timeout: float, what: str, workers: Sequence[Worker] = ()) -> None:
    """Poll ``condition`` until true; fail with the workers' stderr after ``timeout``, or at
    once when one of ``workers`` exits."""
    deadline = time.monotonic() + timeout
    while not condition():
        exited = [w for w in workers if w.process.poll() is not None]
        if exited or time.monotonic() > deadline:
            details = "\n".join(
                f"--- {w.name} (exit {w.process.poll()}):\n{w.stderr()}\n{chr(10).join(w.lines()[-5:])}"
                for w in workers
            )
            problem = f"{exited[0].name} exited" if exited else f"timed out after {timeout}s"
            raise AssertionError(f"{problem} waiting for {what}\n{details}")
        time.sleep(0.05)


def read_events(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
