"""The real NVML layer (hotswap.backends.local.gpu.nvml.PynvmlLayer) against a stand-in ``pynvml``
module: how NVML's answers and errors become GPUs, readings, XID events and one-line errors
(the real library runs in tests/test_gpu_real.py, on a GPU)."""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest

from hotswap.backends.local.gpu.nvml import GpuInfo, NvmlError, PynvmlLayer
from hotswap.backends.local.gpu.probe import main as probe_main

TIMEOUT, LOST, NOT_FOUND, UNINITIALIZED, NOT_SUPPORTED = 10, 15, 6, 1, 3
XID_EVENT = 8


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


def stand_in(gpus: int = 2, **behaviour: Any) -> types.ModuleType:
    """A pynvml with ``gpus`` GPUs; ``behaviour`` makes calls fail or answer otherwise."""
    module = types.ModuleType("pynvml")
    module.NVMLError = NVMLError
    module.NVML_ERROR_TIMEOUT, module.NVML_ERROR_GPU_IS_LOST, module.NVML_ERROR_NOT_FOUND = TIMEOUT, LOST, NOT_FOUND
    module.nvmlEventTypeXidCriticalError = XID_EVENT
    module.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, module.NVML_VOLATILE_ECC = 1, 0
    events = list(behaviour.get("events", []))

    def fails(name: str) -> None:
        if name in behaviour:
            raise NVMLError(behaviour[name])

    def init() -> None:
        fails("init")

    module.nvmlInit = init
    module.nvmlShutdown = lambda: None
    module.nvmlDeviceGetCount = lambda: gpus
    module.nvmlDeviceGetHandleByIndex = lambda i: f"handle-{i}"
    module.nvmlDeviceGetHandleByUUID = lambda uuid: f"handle-{uuid.rsplit('-', 1)[1]}"

    def uuid_of(handle: str) -> str:
        fails("uuid")
        return f"GPU-{handle.rsplit('-', 1)[1]}"

    module.nvmlDeviceGetUUID = uuid_of
    module.nvmlDeviceGetName = lambda handle: "NVIDIA H100 80GB HBM3"
    module.nvmlDeviceGetMemoryInfo = lambda handle: types.SimpleNamespace(total=80 << 30)
    module.nvmlEventSetCreate = lambda: "events"
    module.nvmlEventSetFree = lambda events: None
    module.nvmlDeviceGetSupportedEventTypes = lambda handle: behaviour.get("supported", XID_EVENT)
    module.nvmlDeviceRegisterEvents = lambda handle, kinds, events: None

    def wait(events_set: str, timeout_ms: int) -> Any:
        fails("wait")
        if not events:
            raise NVMLError(TIMEOUT)
        device, xid = events.pop(0)
        return types.SimpleNamespace(device=device, eventType=XID_EVENT, eventData=xid)

    module.nvmlEventSetWait_v2 = wait

    def ecc(handle: str, kind: int, counter: int) -> int:
        fails("ecc")
        return behaviour.get("ecc_count", 0)

    module.nvmlDeviceGetTotalEccErrors = ecc
    module.nvmlDeviceGetRetiredPagesPendingStatus = lambda handle: behaviour.get("retirement", 0)

    def remapped(handle: str) -> tuple[int, int, int, int]:
        fails("remap")
        return (0, 0, behaviour.get("remap_pending", 0), 0)

    module.nvmlDeviceGetRemappedRows = remapped
    return module


def layer(monkeypatch: pytest.MonkeyPatch, **behaviour: Any) -> PynvmlLayer:
    monkeypatch.setitem(sys.modules, "pynvml", stand_in(**behaviour))
    nvml = PynvmlLayer()
    nvml.init()
    return nvml


def test_gpus_are_listed_by_index_with_uuid_name_and_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    assert layer(monkeypatch).gpus() == [GpuInfo(i, f"GPU-{i}", "NVIDIA H100 80GB HBM3", 80 << 30) for i in range(2)]


@pytest.mark.parametrize(
    ("behaviour", "reachable", "ecc", "pending"),
    [
        ({"ecc_count": 3}, True, 3, False),
        ({"ecc": NOT_SUPPORTED, "remap": NOT_SUPPORTED}, True, None, False),  # ECC off, no row remapping
        ({"remap_pending": 1}, True, 0, True),
        ({"uuid": LOST}, False, None, False),  # the GPU fell off the bus
        ({"uuid": NOT_FOUND}, False, None, False),
    ],
)
def test_health_readings(monkeypatch: pytest.MonkeyPatch, behaviour: dict, reachable: bool, ecc: int | None, pending: bool) -> None:
    reading = layer(monkeypatch, **behaviour).read("GPU-1")
    assert (reading.reachable, reading.ecc_uncorrected, reading.remap_pending) == (reachable, ecc, pending)
    assert reachable or "NVML error" in reading.problem


def test_a_library_failure_is_not_a_lost_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(NvmlError, match="the library|cannot read GPU-1"):
        layer(monkeypatch, uuid=UNINITIALIZED).read("GPU-1")


def test_xid_events_and_timeouts(monkeypatch: pytest.MonkeyPatch) -> None:
    nvml = layer(monkeypatch, events=[("handle-1", 79)])
    assert nvml.watch_xids(["GPU-0", "GPU-1"]) == []
    assert nvml.wait_xid(10) == ("GPU-1", 79)
    assert nvml.wait_xid(10) is None  # NVML_ERROR_TIMEOUT: nothing happened
    assert layer(monkeypatch, supported=0).watch_xids(["GPU-0"]) == ["GPU-0"]
    with pytest.raises(NvmlError, match="nvmlEventSetWait"):
        layer(monkeypatch, wait=UNINITIALIZED).wait_xid(10)


def test_missing_nvml_is_one_line(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", stand_in(init=9))
    with pytest.raises(NvmlError, match=r"NVML cannot start: NVML error 9 \(pip install 'hotswap\[gpu\]'"):
        PynvmlLayer().init()
    monkeypatch.setitem(sys.modules, "pynvml", None)  # not installed
    with pytest.raises(NvmlError, match="NVML is not installed"):
        PynvmlLayer().init()
    monkeypatch.delenv("HOTSWAP_NVML_LAYER", raising=False)
    assert probe_main(["--once"]) == 3
    assert capsys.readouterr().err.strip() == "hotswap: NVML is not installed (pip install 'hotswap[gpu]' on a machine with an NVIDIA driver)"
