"""How fast hotswap.train checkpoints a ~1 GB training state, beside the disk and torch.save.

The state is a real one: an MLP of 2048-wide layers and its Adam state (parameters, two
moments), about 1 GB in all, registered and built as the SDK does. Measured in one run, on one
directory (``--dir``, default the system's temporary directory), each repeated ``--repeat``
times in rotation after a warm-up; the best time of each is reported (on a shared virtual
machine, interference from other tenants and host page faults only ever add time, by up to
several-fold, so the best time is the stable estimate of what the code and the disk can do):

* ``disk_write_MBps``: the same bytes written raw to a file in large chunks, then fsync of
  the file and its directory (the discipline of a checkpoint commit);
* ``sync_save_MBps`` / ``sync_save_s``: ``Checkpointer.save`` (data, checksum, marker, atomic
  rename, fsyncs); target >= 80% of the raw disk speed;
* ``async_block_s``: the time ``Checkpointer.save_async`` blocks the training loop, as a run
  calls it (parameters and optimizer state are copied to reused host buffers in the background
  while the next step computes; the rest is copied at once); target <= 5% of ``sync_save_s``.
  The human-readable output also gives the whole host copy: what the loop would wait at worst,
  were its next optimizer step to come at once;
* ``restore_MBps``: ``restore_latest`` (checksum verified) plus loading into model and
  optimizer; the file is in the page cache, as it is after a recent save;
* ``torch_save_MBps``: plain ``torch.save`` of the same state, then fsync.

    python benchmarks/bench_checkpoint.py --json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import torch

from hotswap.train.checkpointer import Checkpointer
from hotswap.train.events import EventLog
from hotswap.train.state import StateRegistry, build_tree, rng_state
from hotswap.train.store import CheckpointStore, _fsync_directory

WIDTH = 2048
MB = 1e6


def training_state(target_bytes: int) -> tuple[StateRegistry, torch.nn.Module]:
    """An MLP and its Adam state, about ``target_bytes`` together (each parameter is stored
    three times: value and two moments)."""
    layer_bytes = 3 * (WIDTH * WIDTH + WIDTH) * 4
    layers = max(1, round(target_bytes / layer_bytes))
    model = torch.nn.Sequential(*(torch.nn.Linear(WIDTH, WIDTH) for _ in range(layers)))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for parameter in model.parameters():
        parameter.grad = torch.full_like(parameter, 1e-3)
    optimizer.step()  # creates the moments
    registry = StateRegistry()
    registry.register("model", model)
    registry.register("optimizer", optimizer)
    return registry, model


def tree_of(registry: StateRegistry, step: int) -> dict:  # type: ignore[type-arg]
    return build_tree(registry, {"step": step, "elastic_down_events": 0}, [rng_state()])


def state_bytes(registry: StateRegistry) -> int:
    from hotswap.train.snapshot import split_tensors

    _, tensors = split_tensors(tree_of(registry, 0))
    return sum(t.numel() * t.element_size() for t in tensors)


def raw_write(directory: Path, payload: memoryview) -> float:
    """Seconds to write ``payload`` to a new file, fsync it and its directory."""
    path = directory / "raw.bin"
    chunk = 64 << 20
    started = time.perf_counter()
    with open(path, "wb", buffering=0) as handle:
        for offset in range(0, len(payload), chunk):
            handle.write(payload[offset : offset + chunk])
        os.fsync(handle.fileno())
    _fsync_directory(directory)
    elapsed = time.perf_counter() - started
    path.unlink()
    return elapsed


def plain_torch_save(directory: Path, tree: dict) -> float:  # type: ignore[type-arg]
    path = directory / "plain.pt"
    started = time.perf_counter()
    with open(path, "wb") as handle:
        torch.save(tree, handle)
        handle.flush()
        os.fsync(handle.fileno())
    elapsed = time.perf_counter() - started
    path.unlink()
    return elapsed


def measure(directory: Path, size: int, repeat: int) -> dict[str, float]:
    registry, model = training_state(size)
    nbytes = state_bytes(registry)
    payload = memoryview(torch.cat([p.detach().reshape(-1) for p in model.parameters()] * 3).numpy()).cast("B")
    checkpointer = Checkpointer(CheckpointStore(directory / "checkpoints", keep=1), EventLog(None))
    step = 0

    def timed_raw() -> float:
        return raw_write(directory, payload[:nbytes])

    def timed_sync() -> float:
        nonlocal step
        step += 1
        started = time.perf_counter()
        checkpointer.save(step, tree_of(registry, step), "periodic")
        elapsed = time.perf_counter() - started
        checkpointer.store.settle()  # the old checkpoint's deletion must not slow what follows
        return elapsed

    def timed_plain() -> float:
        return plain_torch_save(directory, tree_of(registry, step))

    def timed_restore() -> float:
        started = time.perf_counter()
        tree, _ = checkpointer.restore_latest()
        registry.load(tree["objects"])
        return time.perf_counter() - started

    # Warm-up: the first large write of a process is often much slower (block allocation,
    # the virtual disk's cache); it is not what a checkpoint sees in steady state.
    timed_raw()
    timed_sync()
    # Each round starts with another measurement, so none always follows the same one.
    measurements = {"raw": timed_raw, "sync": timed_sync, "plain": timed_plain, "restore": timed_restore}
    seconds: dict[str, list[float]] = {name: [] for name in measurements}
    names = list(measurements)
    for round_index in range(repeat):
        for name in names[round_index % len(names) :] + names[: round_index % len(names)]:
            os.sync()  # start each measurement with no dirty data of anyone's waiting for the disk
            seconds[name].append(measurements[name]())
    raw, sync, plain, restore = (seconds[name] for name in names)

    # Async: the first save allocates the host buffers; a training loop pays that once.
    step += 1
    deferrable = registry.changed_only_by_optimizers()
    checkpointer.save_async(step, tree_of(registry, step), "periodic", deferrable)
    checkpointer.wait()
    checkpointer.store.settle()
    blocking, copying = [], []
    for _ in range(repeat):
        step += 1
        started = time.perf_counter()
        blocking.append(checkpointer.save_async(step, tree_of(registry, step), "periodic", deferrable))
        checkpointer.wait_for_copy()
        copying.append(time.perf_counter() - started)
        checkpointer.wait()
        checkpointer.store.settle()

    def rate(seconds: list[float]) -> float:
        return round(nbytes / min(seconds) / MB, 1)

    return {
        "state_bytes": nbytes,
        "disk_write_MBps": rate(raw),
        "sync_save_MBps": rate(sync),
        "sync_save_s": round(min(sync), 4),
        "async_block_s": round(min(blocking), 4),
        "restore_MBps": rate(restore),
        "torch_save_MBps": rate(plain),
        "host_copy_s": round(min(copying), 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", type=float, default=1000.0, help="state size in MB (default 1000)")
    parser.add_argument("--dir", default=None, help="where to write (default: the temporary directory)")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", action="store_true", help="print only the JSON result")
    args = parser.parse_args()
    directory = Path(tempfile.mkdtemp(prefix="hotswap-bench-", dir=args.dir))
    try:
        result = measure(directory, int(args.size * MB), args.repeat)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    copy = result.pop("host_copy_s")
    if args.json:
        print(json.dumps(result))
        return
    print(f"state: {result['state_bytes'] / MB:.0f} MB in {directory.parent}")
    print(f"raw disk write + fsync   {result['disk_write_MBps']:8.1f} MB/s")
    ratio = result["sync_save_MBps"] / result["disk_write_MBps"]
    print(f"sync save                {result['sync_save_MBps']:8.1f} MB/s  ({ratio:.0%} of the disk; target >= 80%)")
    share = result["async_block_s"] / result["sync_save_s"]
    print(f"async save blocks        {result['async_block_s']:8.4f} s     ({share:.1%} of a sync save; target <= 5%)")
    print(f"  whole host copy        {copy:8.4f} s     ({copy / result['sync_save_s']:.1%} of a sync save)")
    print(f"restore                  {result['restore_MBps']:8.1f} MB/s")
    print(f"plain torch.save + fsync {result['torch_save_MBps']:8.1f} MB/s")


if __name__ == "__main__":
    main()
