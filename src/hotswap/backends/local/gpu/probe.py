"""The GPU health probe: a child process of a GPU-backed cluster's controller that asks NVML
about the cluster's GPUs and prints what it sees as JSON lines.

    python -m hotswap.backends.local.gpu.probe [--interval S] UUID...
    python -m hotswap.backends.local.gpu.probe --once      # every GPU of the machine, one document

NVML calls can hang (a GPU falling off the bus, a wedged driver): in a process of its own they
never block the controller, which reads these lines without waiting, kills a probe that falls
silent, and starts another. Lines (each ``{"kind": ..., "t": ...}``):

- ``ready``: watching; ``gpus`` and the ones that cannot report XID events (``xid_unsupported``);
- ``reading``: one GPU's :class:`~hotswap.core.gpu_health.GpuReading`, every ``--interval``;
- ``xid``: a critical XID event (``uuid``, ``xid``), as it comes;
- ``beat``: at least every second, so that silence means a hang;
- ``error``: NVML failed (``message``); the probe exits 3.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from typing import Any

from hotswap.backends.local.gpu.nvml import NvmlError, load_layer

NVML_FAILED_EXIT_CODE = 3
WAIT_MS = 500


def emit(kind: str, **fields: Any) -> None:
    print(json.dumps({"kind": kind, "t": time.time(), **fields}), flush=True)


def once() -> dict[str, Any]:
    """Every GPU of the machine with one health reading each (``--once``)."""
    layer = load_layer()
    layer.init()
    try:
        gpus = layer.gpus()
        return {
            "gpus": [{**g.to_json(), "reading": dataclasses.asdict(layer.read(g.uuid))} for g in gpus],
            "time": time.time(),
        }
    finally:
        layer.shutdown()


def watch(uuids: list[str], interval_s: float) -> int:
    layer = load_layer()
    try:
        layer.init()
        unsupported = layer.watch_xids(uuids)
    except NvmlError as error:
        emit("error", message=str(error))
        return NVML_FAILED_EXIT_CODE
    emit("ready", gpus=uuids, xid_unsupported=unsupported)
    events = len(unsupported) < len(uuids)
    next_reading = 0.0
    try:
        while True:
            if time.monotonic() >= next_reading:
                for uuid in uuids:
                    emit("reading", **dataclasses.asdict(layer.read(uuid)))
                next_reading = time.monotonic() + interval_s
            if events:
                found = layer.wait_xid(WAIT_MS)
                if found is not None:
                    emit("xid", uuid=found[0], xid=found[1])
            else:
                time.sleep(WAIT_MS / 1000)
            emit("beat")
    except NvmlError as error:
        emit("error", message=str(error))
        return NVML_FAILED_EXIT_CODE
    finally:
        layer.shutdown()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="hotswap's GPU health probe (NVML)")
    parser.add_argument("--interval", type=float, default=2.0, help="seconds between health readings")
    parser.add_argument("--once", action="store_true", help="print every GPU's health once, as one JSON document")
    parser.add_argument("uuids", nargs="*")
    args = parser.parse_args(argv)
    try:
        if args.once:
            print(json.dumps(once(), indent=2))
            return 0
        return watch(args.uuids, args.interval)
    except NvmlError as error:
        print(f"hotswap: {error}", file=sys.stderr)
        return NVML_FAILED_EXIT_CODE
    except BrokenPipeError:  # the controller is gone
        return 0


if __name__ == "__main__":
    sys.exit(main())
