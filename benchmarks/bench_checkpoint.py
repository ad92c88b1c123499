"""Checkpoint save and restore of a training state: hotswap.train against PyTorch DCP, in one run.

The state is a real one: an MLP of 2048-wide layers and its Adam state (parameters and two
moments), ``--state-gb`` in all, on ``--device``. On one directory (``--dir``, default the
system's temporary directory), each of these is measured ``--repeat`` times after a warm-up,
next to what it is compared with (in an order that rotates every repetition):

* ``raw_write``: the state's bytes written to one file by one thread in 64 MB calls, then fsync
  of the file and its directory (from host memory: GPU state is copied to a host buffer first,
  untimed). What the disk does with the simplest code;
* ``hotswap_sync_save``: ``Checkpointer.save`` (the SIGTERM path: data, checksums, marker,
  atomic rename, every fsync);
* ``hotswap_async_block``: what ``Checkpointer.save_async`` blocks the training loop, as a run
  calls it (parameters and optimizer state are copied in the background until the next optimizer
  step); ``hotswap_async_copy`` is the whole host copy, the most a loop can wait if its next
  optimizer step comes at once;
* ``dcp_save`` / ``dcp_async_block``: ``torch.distributed.checkpoint.save`` and what
  ``async_save`` blocks, both with DCP's defaults (what a user gets);
* ``torch_save``: ``torch.save`` of the same state to one file, then fsync;
* ``hotswap_restore`` / ``dcp_restore``: load the newest checkpoint back into the model and
  optimizer on the device (``restore_latest`` + load; ``dcp.load`` in place + load), with the
  checkpoint's files evicted from the page cache first, as on the machine a job resumes on.

Each measurement starts with ``sync`` (no one's dirty data waiting for the disk). A shared
virtual machine's disk varies by up to 5x between minutes, so the output has every time, the
best and the median of each, and the ratios to DCP computed within each repetition (both runs
saw the same disk), with their best and median::

    python benchmarks/bench_checkpoint.py --device cpu --state-gb 1 --repeat 5 [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp

from hotswap.train.torch.checkpointer import Checkpointer
from hotswap.train.events import EventLog
from hotswap.train.torch.state import StateRegistry, build_tree, rng_state
from hotswap.train.torch.store import CheckpointStore

WIDTH = 2048
RAW_CHUNK = 64 << 20
# name of a ratio -> (numerator, denominator, target: the ratio must be at most this)
RATIOS = {
    "hotswap_sync_save/dcp_save": ("hotswap_sync_save", "dcp_save", 0.8),
    "hotswap_restore/dcp_restore": ("hotswap_restore", "dcp_restore", 1.0),
    "hotswap_async_block/hotswap_sync_save": ("hotswap_async_block", "hotswap_sync_save", 0.01),
    "dcp_async_block/hotswap_sync_save": ("dcp_async_block", "hotswap_sync_save", None),
    "hotswap_sync_save/raw_write": ("hotswap_sync_save", "raw_write", None),
    "torch_save/dcp_save": ("torch_save", "dcp_save", None),
}


def training_state(state_bytes: float, device: torch.device) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """An MLP and its Adam state, about ``state_bytes`` together (each parameter is stored
    three times: value and two moments)."""
    layer_bytes = 3 * (WIDTH * WIDTH + WIDTH) * 4
    model = torch.nn.Sequential(*(torch.nn.Linear(WIDTH, WIDTH) for _ in range(max(1, round(state_bytes / layer_bytes)))))
    model.to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for parameter in model.parameters():
        parameter.grad = torch.full_like(parameter, 1e-3)
    optimizer.step()  # creates the moments
    return model, optimizer


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def fsync_directory(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def evict(directory: Path) -> None:
    """Drop ``directory``'s files from the page cache (they are clean after ``sync``)."""
    os.sync()
    for path in directory.rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


class Bench:
    """The measurements, on one state and one directory."""

    def __init__(
        self,
        directory: Path,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        device: torch.device,
        threads: int | None = None,
    ) -> None:
        self.directory = directory
        self.model, self.optimizer, self.device = model, optimizer, device
        self.registry = StateRegistry()
        self.registry.register("model", model)
        self.registry.register("optimizer", optimizer)
        self.checkpointer = Checkpointer(CheckpointStore(directory / "hotswap", keep=1), EventLog(None), threads)
        tensors = self.dcp_state_dict_tensors()
        self.state_bytes = sum(t.numel() * t.element_size() for t in tensors)
        # The raw write's source on GPU: a host copy of the state, made once.
        self.host = None if device.type == "cpu" else [t.to("cpu") for t in tensors]
        self.step = 0
        self.dcp_count = 0
        self.extra: dict[str, list[float]] = {"hotswap_async_copy": []}

    def dcp_state_dict(self) -> dict[str, Any]:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}

    def dcp_state_dict_tensors(self) -> list[torch.Tensor]:
        state = self.dcp_state_dict()
        moments = [v for per in state["optimizer"]["state"].values() for v in per.values() if torch.is_tensor(v)]
        return [*state["model"].values(), *moments]

    def tree(self) -> dict[str, Any]:
        self.step += 1
        return build_tree(self.registry, {"step": self.step, "elastic_down_events": 0}, [rng_state()])

    def groups(self) -> list[dict[str, Callable[[], float]]]:
        """Measurements compared with each other run next to each other (the disk of a shared
        machine changes within seconds); restores come after the saves they read."""
        return [
            {
                "hotswap_sync_save": self.hotswap_sync_save,
                "dcp_save": self.dcp_save,
                "raw_write": self.raw_write,
                "torch_save": self.torch_save,
            },
            {"hotswap_async_block": self.hotswap_async_block, "dcp_async_block": self.dcp_async_block},
            {"hotswap_restore": self.hotswap_restore, "dcp_restore": self.dcp_restore},
        ]

    def raw_write(self) -> float:
        path = self.directory / "raw.bin"
        started = time.perf_counter()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            for tensor in self.host or self.dcp_state_dict_tensors():
                view = memoryview(tensor.detach().reshape(-1).view(torch.uint8).numpy())
                for start in range(0, len(view), RAW_CHUNK):
                    chunk = view[start : start + RAW_CHUNK]
                    while chunk:
                        chunk = chunk[os.write(fd, chunk) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        fsync_directory(self.directory)
        elapsed = time.perf_counter() - started
        path.unlink()
        return elapsed

    def hotswap_sync_save(self) -> float:
        tree = self.tree()
        synchronize(self.device)
        started = time.perf_counter()
        self.checkpointer.save(self.step, tree, "termination")
        elapsed = time.perf_counter() - started
        self.checkpointer.store.settle()  # the old checkpoint's deletion must not slow what follows
        return elapsed

    def hotswap_async_block(self) -> float:
        tree = self.tree()
        synchronize(self.device)
        deferrable = self.registry.changed_only_by_optimizers()
        started = time.perf_counter()
        blocked = self.checkpointer.save_async(self.step, tree, "periodic", deferrable)
        self.checkpointer.wait_for_copy()
        self.extra["hotswap_async_copy"].append(time.perf_counter() - started)
        self.checkpointer.wait()
        self.checkpointer.store.settle()
        return blocked

    def _dcp_directory(self) -> Path:
        shutil.rmtree(self.directory / f"dcp-{self.dcp_count}", ignore_errors=True)
        self.dcp_count += 1
        return self.directory / f"dcp-{self.dcp_count}"

    def dcp_save(self) -> float:
        target = self._dcp_directory()
        state = self.dcp_state_dict()
        synchronize(self.device)
        started = time.perf_counter()
        dcp.save(state, checkpoint_id=target)
        return time.perf_counter() - started

    def dcp_async_block(self) -> float:
        target = self._dcp_directory()
        state = self.dcp_state_dict()
        synchronize(self.device)
        started = time.perf_counter()
        future = dcp.async_save(state, checkpoint_id=target)
        blocked = time.perf_counter() - started
        future.result()
        return blocked

    def torch_save(self) -> float:
        path = self.directory / "torch.pt"
        state = self.dcp_state_dict()
        synchronize(self.device)
        started = time.perf_counter()
        with open(path, "wb") as handle:
            torch.save(state, handle)
            handle.flush()
            os.fsync(handle.fileno())
        elapsed = time.perf_counter() - started
        path.unlink()
        return elapsed

    def hotswap_restore(self) -> float:
        evict(self.directory / "hotswap")
        started = time.perf_counter()
        found = self.checkpointer.restore_latest()
        assert found is not None, "no hotswap checkpoint to restore"
        self.registry.load(found[0]["objects"])
        synchronize(self.device)
        return time.perf_counter() - started

    def dcp_restore(self) -> float:
        source = self.directory / f"dcp-{self.dcp_count}"
        evict(source)
        state = self.dcp_state_dict()
        started = time.perf_counter()
        dcp.load(state, checkpoint_id=source)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        synchronize(self.device)
        return time.perf_counter() - started


def summary(values: list[float]) -> dict[str, Any]:
    return {"best": round(min(values), 4), "median": round(statistics.median(values), 4), "all": [round(v, 4) for v in values]}


def measure(bench: Bench, repeat: int) -> dict[str, Any]:
    groups = bench.groups()
    for group in groups:  # warm-up: first writes of a process, allocations, DCP's planning caches
        for run in group.values():
            os.sync()
            run()
    bench.extra["hotswap_async_copy"].clear()
    seconds: dict[str, list[float]] = {name: [] for group in groups for name in group}
    for round_index in range(repeat):
        for group in groups:
            names = list(group)
            shift = round_index % len(names)  # each one first in turn
            for name in names[shift:] + names[:shift]:
                os.sync()
                seconds[name].append(group[name]())
    seconds.update(bench.extra)
    ratios = {}
    for label, (numerator, denominator, target) in RATIOS.items():
        per_repetition = [a / b for a, b in zip(seconds[numerator], seconds[denominator], strict=True)]
        ratios[label] = {**summary(per_repetition), "target_at_most": target}
        if target is not None:
            ratios[label]["met_by_median"] = statistics.median(per_repetition) <= target
    return {
        "state_bytes": bench.state_bytes,
        "seconds": {name: summary(values) for name, values in seconds.items()},
        "GBps_by_median": {
            name: round(bench.state_bytes / statistics.median(values) / 1e9, 3)
            for name, values in seconds.items()
            if "block" not in name
        },
        "ratios": ratios,
    }


def machine(device: torch.device, directory: Path) -> dict[str, Any]:
    described = {
        "host": platform.node(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "memory_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9, 1),
        "torch": torch.__version__,
        "directory": str(directory),
    }
    if device.type == "cuda":
        described["gpu"] = torch.cuda.get_device_name(device)
    return described


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--state-gb", type=float, default=1.0, help="model + optimizer state in GB (default 1)")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--dir", default=None, help="where to write (default: the temporary directory)")
    parser.add_argument("--io-threads", type=int, default=None, help="hotswap's I/O threads (default: one per CPU, at most 8)")
    parser.add_argument("--json", action="store_true", help="print only the result, as one JSON line (for scripts)")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: CUDA is not available here")
    warnings.filterwarnings("ignore", module="torch.distributed.checkpoint")  # single-process notices
    device = torch.device(args.device)
    directory = Path(tempfile.mkdtemp(prefix="hotswap-bench-", dir=args.dir))
    try:
        model, optimizer = training_state(args.state_gb * 1e9, device)
        bench = Bench(directory, model, optimizer, device, args.io_threads)
        result = {"device": args.device, "repeat": args.repeat, "machine": machine(device, directory.parent)}
        result["machine"]["io_threads"] = bench.checkpointer.threads
        result.update(measure(bench, args.repeat))
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    if args.json:
        print(json.dumps(result))
        return
    for label, ratio in result["ratios"].items():
        print(f"{label}: median {ratio['median']} (target at most {ratio['target_at_most']})")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
