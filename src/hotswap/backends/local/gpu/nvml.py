"""This machine's NVIDIA GPUs through NVML, behind a small interface (:class:`NvmlLayer`).

The real layer wraps ``pynvml`` (``pip install 'hotswap[gpu]'``, package ``nvidia-ml-py``),
imported only when a GPU is asked about: the CLI, the controller of an emulated cluster and CI
never load it. ``HOTSWAP_NVML_LAYER=module:factory`` puts another layer in its place, in the CLI
and in the controller's health probe alike (the tests' fake NVML; a site's own health source).

Whole GPUs only, by NVML index (the order of ``nvidia-smi`` and of the PCI bus; workers get
``CUDA_DEVICE_ORDER=PCI_BUS_ID`` so that CUDA counts the same way).
"""

from __future__ import annotations

import dataclasses
import importlib
import os
from typing import Any, Protocol

from hotswap.core.gpu_health import GpuReading

LAYER_VARIABLE = "HOTSWAP_NVML_LAYER"
_INSTALL_HINT = "pip install 'hotswap[gpu]' on a machine with an NVIDIA driver"


class NvmlError(Exception):
    """NVML failed: not installed, no driver, or an error of the library itself."""


@dataclasses.dataclass(frozen=True, slots=True)
class GpuInfo:
    index: int  # NVML's (nvidia-smi's)
    uuid: str
    name: str
    memory_bytes: int = 0

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> GpuInfo:
        return cls(int(data["index"]), str(data["uuid"]), str(data.get("name", "")), int(data.get("memory_bytes", 0)))

    def label(self) -> str:
        return f"GPU {self.index} ({self.uuid})"


class NvmlLayer(Protocol):
    """What hotswap asks NVML. Methods raise :class:`NvmlError` when the library fails."""

    def init(self) -> None: ...

    def shutdown(self) -> None: ...

    def gpus(self) -> list[GpuInfo]:
        """Every GPU of the machine, by index."""
        ...

    def watch_xids(self, uuids: list[str]) -> list[str]:
        """Ask for the critical XID events of these GPUs; returns those that cannot report them."""
        ...

    def wait_xid(self, timeout_ms: int) -> tuple[str, int] | None:
        """The next critical XID event (GPU UUID, XID), or None when none came in time."""
        ...

    def read(self, uuid: str) -> GpuReading:
        """One look at the GPU's health (a lost GPU is a reading; NvmlError means the library
        itself failed, which says nothing about the GPU)."""
        ...


def load_layer() -> NvmlLayer:
    """The NVML layer of this process: ``HOTSWAP_NVML_LAYER``'s, else pynvml's."""
    spec = os.environ.get(LAYER_VARIABLE)
    if not spec:
        return PynvmlLayer()
    module, _, factory = spec.partition(":")
    try:
        return getattr(importlib.import_module(module), factory or "layer")()
    except (ImportError, AttributeError) as error:
        raise NvmlError(f"{LAYER_VARIABLE}={spec}: {error}") from None


def discover() -> list[GpuInfo]:
    """This machine's GPUs; :class:`NvmlError` with one line when NVML cannot say."""
    layer = load_layer()
    layer.init()
    try:
        return layer.gpus()
    finally:
        layer.shutdown()


class PynvmlLayer:
    """NVML through ``pynvml`` (nvidia-ml-py)."""

    def __init__(self) -> None:
        self._nvml: Any = None
        self._events: Any = None
        self._handles: dict[str, Any] = {}

    def _call(self, function: str, *args: Any) -> Any:
        try:
            return getattr(self._nvml, function)(*args)
        except self._nvml.NVMLError as error:
            raise NvmlError(f"NVML {function}: {error}") from None

    def init(self) -> None:
        try:
            import pynvml
        except ImportError:
            raise NvmlError(f"NVML is not installed ({_INSTALL_HINT})") from None
        self._nvml = pynvml
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as error:
            raise NvmlError(f"NVML cannot start: {error} ({_INSTALL_HINT})") from None

    def shutdown(self) -> None:
        if self._nvml is None:
            return
        if self._events is not None:
            try:
                self._nvml.nvmlEventSetFree(self._events)
            except self._nvml.NVMLError:
                pass
            self._events = None
        try:
            self._nvml.nvmlShutdown()
        except self._nvml.NVMLError:
            pass

    def gpus(self) -> list[GpuInfo]:
        found = []
        for index in range(self._call("nvmlDeviceGetCount")):
            handle = self._call("nvmlDeviceGetHandleByIndex", index)
            memory = self._call("nvmlDeviceGetMemoryInfo", handle)
            found.append(
                GpuInfo(index, self._call("nvmlDeviceGetUUID", handle), self._call("nvmlDeviceGetName", handle), int(memory.total))
            )
        return found

    def _handle(self, uuid: str) -> Any:
        if uuid not in self._handles:
            self._handles[uuid] = self._nvml.nvmlDeviceGetHandleByUUID(uuid)
        return self._handles[uuid]

    def watch_xids(self, uuids: list[str]) -> list[str]:
        nvml = self._nvml
        self._events = self._call("nvmlEventSetCreate")
        unsupported = []
        for uuid in uuids:
            try:
                handle = self._handle(uuid)
                if not nvml.nvmlDeviceGetSupportedEventTypes(handle) & nvml.nvmlEventTypeXidCriticalError:
                    unsupported.append(uuid)
                    continue
                nvml.nvmlDeviceRegisterEvents(handle, nvml.nvmlEventTypeXidCriticalError, self._events)
            except nvml.NVMLError:
                unsupported.append(uuid)
        return unsupported

    def wait_xid(self, timeout_ms: int) -> tuple[str, int] | None:
        nvml = self._nvml
        try:
            data = nvml.nvmlEventSetWait_v2(self._events, timeout_ms)
        except nvml.NVMLError as error:
            if getattr(error, "value", None) == nvml.NVML_ERROR_TIMEOUT:
                return None
            raise NvmlError(f"NVML nvmlEventSetWait: {error}") from None
        if data.eventType != nvml.nvmlEventTypeXidCriticalError:
            return None
        return self._call("nvmlDeviceGetUUID", data.device), int(data.eventData)

    def read(self, uuid: str) -> GpuReading:
        nvml = self._nvml
        try:
            handle = self._handle(uuid)
            nvml.nvmlDeviceGetUUID(handle)  # a lost GPU fails here (NVML_ERROR_GPU_IS_LOST)
            ecc = _optional(nvml, lambda: nvml.nvmlDeviceGetTotalEccErrors(
                handle, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC
            ))
            retirement = _optional(nvml, lambda: nvml.nvmlDeviceGetRetiredPagesPendingStatus(handle))
            remapped = _optional(nvml, lambda: nvml.nvmlDeviceGetRemappedRows(handle))
        except nvml.NVMLError as error:
            self._handles.pop(uuid, None)
            if getattr(error, "value", None) in (nvml.NVML_ERROR_GPU_IS_LOST, nvml.NVML_ERROR_NOT_FOUND):
                return GpuReading(uuid, reachable=False, problem=str(error))
            raise NvmlError(f"NVML cannot read {uuid}: {error}") from None  # the library, not the GPU
        return GpuReading(
            uuid,
            ecc_uncorrected=None if ecc is None else int(ecc),
            retirement_pending=bool(retirement),
            remap_pending=bool(remapped and remapped[2]),
            remap_failed=bool(remapped and remapped[3]),
        )


def _optional(nvml: Any, read: Any) -> Any:
    """A counter the GPU may not have (ECC off, no row remapping before Ampere): None then."""
    try:
        return read()
    except nvml.NVMLError as error:
        if getattr(error, "value", None) == nvml.NVML_ERROR_GPU_IS_LOST:
            raise
        return None
