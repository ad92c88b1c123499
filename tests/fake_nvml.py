"""A fake NVML layer for tests (``HOTSWAP_NVML_LAYER=fake_nvml:FakeNvml``), driven by a JSON file
the test rewrites while the CLI and the controller's health probe read it
(``FAKE_NVML_STATE``)::

    {"gpus": [{"index": 0, "uuid": "GPU-...", "name": "...", "memory_bytes": 0}, ...],
     "init_error": "..."            # nvmlInit fails with this message
     "fail": "..."                  # NVML fails mid-run (reads and event waits)
     "hang": true                   # NVML calls never return
     "xids": [["GPU-...", 79], ...] # critical XID events, in order (each delivered once)
     "readings": {"GPU-...": {"reachable": false, "problem": "...", "ecc_uncorrected": 3, ...}}}

:class:`FakeMachine` writes that file for a test.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from hotswap.backends.local.gpu.nvml import GpuInfo, NvmlError
from hotswap.core.gpu_health import GpuReading

STATE_VARIABLE = "FAKE_NVML_STATE"


def _state() -> dict[str, Any]:
    path = os.environ.get(STATE_VARIABLE)
    if not path:
        raise NvmlError("fake NVML: FAKE_NVML_STATE is not set")
    try:
        return json.loads(Path(path).read_text())
    except (FileNotFoundError, ValueError):
        return {}


class FakeNvml:
    def __init__(self) -> None:
        self.delivered = 0

    def _check(self) -> dict[str, Any]:
        state = _state()
        while state.get("hang"):
            time.sleep(0.2)
            state = _state()
        if state.get("fail"):
            raise NvmlError(f"fake NVML: {state['fail']}")
        return state

    def init(self) -> None:
        state = _state()
        if state.get("init_error"):
            raise NvmlError(f"NVML cannot start: {state['init_error']}")

    def shutdown(self) -> None:
        pass

    def gpus(self) -> list[GpuInfo]:
        return [GpuInfo.from_json(g) for g in self._check().get("gpus", [])]

    def watch_xids(self, uuids: list[str]) -> list[str]:
        self.delivered = len(self._check().get("xids", []))  # only events from now on
        return []

    def wait_xid(self, timeout_ms: int) -> tuple[str, int] | None:
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            xids = self._check().get("xids", [])
            if len(xids) > self.delivered:
                uuid, xid = xids[self.delivered]
                self.delivered += 1
                return str(uuid), int(xid)
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.05)

    def read(self, uuid: str) -> GpuReading:
        fields = self._check().get("readings", {}).get(uuid, {})
        return GpuReading(uuid, **fields)


class FakeMachine:
    """The fake NVML's state file, and the environment that makes hotswap use it."""

    def __init__(self, directory: Path, gpus: int, name: str = "Fake H100 80GB HBM3") -> None:
        self.path = directory / "fake-nvml.json"
        self.state: dict[str, Any] = {
            "gpus": [{"index": i, "uuid": f"GPU-fake-{i:04d}", "name": name, "memory_bytes": 80 << 30} for i in range(gpus)],
            "xids": [],
            "readings": {},
        }
        self.save()

    def uuid(self, index: int) -> str:
        return self.state["gpus"][index]["uuid"]

    def save(self) -> None:
        temporary = self.path.with_suffix(".tmp")
        temporary.write_text(json.dumps(self.state))
        os.replace(temporary, self.path)

    def update(self, **changes: Any) -> None:
        self.state.update(changes)
        self.save()

    def xid(self, index: int, xid: int) -> None:
        self.state["xids"].append([self.uuid(index), xid])
        self.save()

    def reading(self, index: int, **fields: Any) -> None:
        self.state["readings"][self.uuid(index)] = fields
        self.save()

    def environ(self) -> dict[str, str]:
        tests = str(Path(__file__).resolve().parent)
        path = os.pathsep.join(p for p in (tests, os.environ.get("PYTHONPATH", "")) if p)
        return {"HOTSWAP_NVML_LAYER": "fake_nvml:FakeNvml", STATE_VARIABLE: str(self.path), "PYTHONPATH": path}
