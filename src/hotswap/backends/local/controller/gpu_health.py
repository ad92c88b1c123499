"""GPU health of a GPU-backed local cluster, as its controller watches it.

The controller never calls NVML itself (a call can hang): it runs the probe
(:mod:`hotswap.backends.local.gpu.probe`) as a child process, reads its JSON lines from its
selector loop without blocking, and judges them with :mod:`hotswap.core.gpu_health`:

- a GPU that is lost, has new uncorrectable ECC errors, a pending page retirement or row
  remapping, or a critical hardware XID fails its node, with the reason (``fail``): the node's
  workers are killed at once and its work is hotswapped, as after ``node fail``;
- an application XID (13, 31, 43, 45, 68, 109) is recorded; the node stays healthy and the
  job's own failure policy applies to whatever its process does next;
- a probe that cannot start NVML, fails, exits or falls silent for :data:`SILENCE_S` is
  recorded and logged ("GPU health is not being checked"), and started again with backoff;
  scheduling goes on meanwhile.

A GPU is reported once; ``node uncordon`` (:meth:`GpuHealthMonitor.repaired`) watches it
afresh (a fault that persists fails the node again).
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable

from hotswap.backends.local.gpu.backing import Backing
from hotswap.backends.local.gpu.nvml import GpuInfo
from hotswap.core.gpu_health import GpuReading, XidClass, XidFilter, describe_xid, reading_problems

SILENCE_S = 10.0  # a probe quiet this long is hung in NVML: kill it, say so, start another
READING_INTERVAL_S = 2.0
BACKOFF_S = (2.0, 5.0, 15.0, 30.0, 60.0)  # between attempts to start NVML again

Record = Callable[[str, str, dict], None]  # (timeline kind, message, data)
Fail = Callable[[list[tuple[str, str]]], None]  # [(node, reason)]


class GpuHealthMonitor:
    def __init__(self, selector: selectors.BaseSelector, record: Record, fail: Fail, xids: XidFilter | None = None) -> None:
        self.selector = selector
        self.record = record
        self.fail = fail
        self.xids = xids or XidFilter.parse(
            os.environ.get("DP_DISABLE_HEALTHCHECKS", ""), os.environ.get("DP_ENABLE_HEALTHCHECKS", "")
        )
        self.gpus: dict[str, GpuInfo] = {}
        self.node_of: dict[str, str] = {}  # GPU UUID -> node
        self.process: subprocess.Popen[bytes] | None = None
        self.buffer = b""
        self.heard_at = 0.0
        self.restart_at: float | None = None
        self.attempts = 0  # failed starts in a row
        self.watching = False  # NVML answered since the probe started
        self.unavailable = False  # the last thing said was "not being checked"
        self.ecc_baseline: dict[str, int] = {}
        self.out: dict[str, str] = {}  # GPU UUID -> why it was taken out (reported once)

    # ------------------------------------------------------------------ lifecycle

    def watch(self, backing: Backing | None) -> None:
        """Watch this backing's GPUs (a resize changes them); nothing for an emulated cluster."""
        gpus = {g.uuid: g for g in backing.gpus()} if backing else {}
        self.node_of = {g.uuid: node for node, host_gpus in (backing.node_gpus() if backing else {}).items() for g in host_gpus}
        unchanged = set(gpus) == set(self.gpus)
        self.gpus = gpus
        if unchanged:
            return
        self._stop_probe()
        self.restart_at = None
        if gpus:
            self._start_probe()

    def close(self) -> None:
        self.gpus = {}
        self.restart_at = None
        self._stop_probe()

    def next_deadline(self, now: float) -> float | None:
        """Seconds until the monitor must act (a silence to judge, a restart due)."""
        due = []
        if self.process is not None:
            due.append(self.heard_at + SILENCE_S)
        if self.restart_at is not None:
            due.append(self.restart_at)
        return max(0.0, min(due) - now) if due else None

    def tick(self, now: float) -> None:
        if self.process is not None and now - self.heard_at > SILENCE_S:
            self._stop_probe()
            self._lost(f"NVML did not answer for {SILENCE_S:.0f}s")
        if self.restart_at is not None and now >= self.restart_at:
            self.restart_at = None
            self._start_probe()

    def repaired(self, nodes: Iterable[str]) -> None:
        """Nodes were repaired (``node uncordon``): judge their GPUs afresh."""
        repaired = set(nodes)
        for uuid, node in self.node_of.items():
            if node in repaired:
                self.out.pop(uuid, None)
                self.ecc_baseline.pop(uuid, None)

    # ------------------------------------------------------------------ the probe

    def _start_probe(self) -> None:
        command = [
            sys.executable, "-m", "hotswap.backends.local.gpu.probe", "--interval", str(READING_INTERVAL_S), *self.gpus,
        ]
        try:
            self.process = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=None, start_new_session=True
            )
        except OSError as error:
            self._lost(f"the NVML probe cannot start: {error}")
            return
        assert self.process.stdout is not None
        os.set_blocking(self.process.stdout.fileno(), False)
        self.selector.register(self.process.stdout, selectors.EVENT_READ, self._readable)
        self.buffer, self.heard_at, self.watching = b"", time.time(), False

    def _stop_probe(self) -> None:
        process, self.process = self.process, None
        if process is None:
            return
        assert process.stdout is not None
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(process.stdout)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.stdout.close()
        process.wait()

    def _readable(self, stream: object) -> None:
        process = self.process
        if process is None or process.stdout is None:
            return
        try:
            chunk = os.read(process.stdout.fileno(), 1 << 16)
        except BlockingIOError:
            return
        if not chunk:  # the probe exited
            self._stop_probe()
            if self.gpus:
                self._lost(f"the NVML probe exited (code {process.returncode})")
            return
        self.heard_at = time.time()
        *lines, self.buffer = (self.buffer + chunk).split(b"\n")
        for line in lines:
            with contextlib.suppress(ValueError):
                self._handle(json.loads(line))

    # ------------------------------------------------------------------ what it says

    def _handle(self, message: dict) -> None:
        kind = message.get("kind")
        if kind == "ready":
            self._ready(message.get("xid_unsupported") or [])
        elif kind == "reading":
            fields = {k: v for k, v in message.items() if k not in ("kind", "t")}
            self._reading(GpuReading(**fields))
        elif kind == "xid":
            self._xid(str(message["uuid"]), int(message["xid"]))
        elif kind == "error":
            self._stop_probe()
            self._lost(f"NVML failed: {message.get('message', '')}")

    def _ready(self, unsupported: list[str]) -> None:
        self.watching, self.attempts = True, 0
        names = ", ".join(self.gpus[u].label() for u in self.gpus)
        note = f" (no XID events from {', '.join(unsupported)})" if unsupported else ""
        again = " again" if self.unavailable else ""
        self.unavailable = False
        self._say("gpu-health", f"GPU health: NVML answers{again}; watching {names}{note}", {"gpus": list(self.gpus)})

    def _reading(self, reading: GpuReading) -> None:
        if reading.uuid not in self.gpus or reading.uuid in self.out:
            return
        if reading.ecc_uncorrected is not None:
            self.ecc_baseline.setdefault(reading.uuid, reading.ecc_uncorrected)
        problems = reading_problems(reading, self.ecc_baseline.get(reading.uuid))
        if problems:
            self._take_out(reading.uuid, "; ".join(problems))

    def _xid(self, uuid: str, xid: int) -> None:
        gpu = self.gpus.get(uuid)
        if gpu is None:
            return
        verdict = self.xids.classify(xid)
        where = f"{describe_xid(xid)} on {gpu.label()}, node {self.node_of.get(uuid, '?')}"
        data = {"gpu": uuid, "xid": xid, "class": verdict.value}
        if verdict is XidClass.HARDWARE:
            if uuid not in self.out:
                self._take_out(uuid, describe_xid(xid))
        elif verdict is XidClass.APPLICATION:
            self._say("gpu-xid", f"{where}: an application error; the node stays healthy", data)
        else:
            self._say("gpu-xid", f"{where}: ignored (DP_DISABLE_HEALTHCHECKS)", data)

    def _take_out(self, uuid: str, problem: str) -> None:
        gpu, node = self.gpus[uuid], self.node_of.get(uuid)
        self.out[uuid] = problem
        if node is not None:
            self.fail([(node, f"{gpu.label()}: {problem}")])

    def _lost(self, why: str) -> None:
        """NVML cannot be asked: say so (timeline and log), keep scheduling, try again later."""
        delay = BACKOFF_S[min(self.attempts, len(BACKOFF_S) - 1)]
        self.attempts += 1
        self.restart_at = time.time() + delay
        if not self.unavailable:
            self.unavailable = True
            self._say(
                "gpu-health",
                f"GPU health: {why}; GPU health is not being checked (scheduling goes on); trying again",
                {"error": why},
            )

    def _say(self, kind: str, message: str, data: dict) -> None:
        print(f"hotswap controller: {message}", file=sys.stderr, flush=True)
        self.record(kind, message, data)
