"""kill -9 during checkpoint writes, many times: run by tests/test_train_kill9.py.

``python train_harness_kill9.py DIR TRIALS SEED`` imports torch once, then for each trial forks
a writer that saves checkpoints of a known state back to back (synchronous saves in even
trials, asynchronous ones in odd trials), SIGKILLs it after a random delay, and restores the
newest complete checkpoint in this process. Prints one JSON summary line.

Forking keeps a trial at a few tens of milliseconds instead of a fresh interpreter's import of
torch; the parent has no thread left when it forks (torch runs single-threaded here, and a
restore's reader threads end with it).

The writers save each checkpoint as three data files written by three threads at once, so kills
land between the files of one checkpoint too.
"""

from __future__ import annotations

import io
import json
import logging
import os
import random
import signal
import sys
import time
from pathlib import Path

import torch

from hotswap.train.torch import tensorfiles
from hotswap.train.torch.checkpointer import Checkpointer
from hotswap.train.events import EventLog
from hotswap.train.torch.store import CheckpointStore

ELEMENTS = 1 << 20  # 4 MiB of float32 per tensor, two tensors: writes take a few ms
WRITER_THREADS = 3
tensorfiles.MIN_FILE_BYTES = 1 << 20  # 8 MiB of state: one file per writer thread


def state_of(step: int) -> dict[str, object]:
    """A state whose every byte is determined by its step."""
    return {
        "format": 1,
        "progress": {"step": step, "elastic_down_events": 0},
        "objects": {
            "weights": {
                "a": torch.full((ELEMENTS,), float(step)),
                "b": torch.arange(ELEMENTS, dtype=torch.float32) * step,
            },
            "metrics": {"step": step},
        },
        "rng": [],
    }


def intact(tree: dict, step: int) -> bool:  # type: ignore[type-arg]
    objects = tree["objects"]
    return (
        tree["progress"]["step"] == step
        and objects["metrics"]["step"] == step
        and torch.equal(objects["weights"]["a"], torch.full((ELEMENTS,), float(step)))
        and torch.equal(objects["weights"]["b"], torch.arange(ELEMENTS, dtype=torch.float32) * step)
    )


def write_forever(directory: Path, first_step: int, asynchronous: bool) -> None:
    checkpointer = Checkpointer(CheckpointStore(directory, keep=3), EventLog(None), threads=WRITER_THREADS)
    step = first_step
    while True:
        step += 1
        if asynchronous:
            checkpointer.save_async(step, state_of(step), "periodic")
        else:
            checkpointer.save(step, state_of(step), "periodic")


def main() -> None:
    directory, trials, seed = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    torch.set_num_threads(1)
    chooser = random.Random(seed)
    warnings = io.StringIO()
    handler = logging.StreamHandler(warnings)
    logging.getLogger("hotswap.train").addHandler(handler)
    logging.getLogger("hotswap.train").propagate = False
    summary = {
        "trials": 0,
        "restored": 0,
        "corrupt": 0,
        "not_newest": 0,
        "interrupted_writes": 0,
        "reported_partial": 0,
    }
    restored_step = 0
    for trial in range(trials):
        pid = os.fork()
        if pid == 0:  # the writer: never returns
            try:
                sys.stderr = open(os.devnull, "w")
                write_forever(directory, restored_step, asynchronous=trial % 2 == 1)
            finally:
                os._exit(1)
        # Kill only once this writer has committed a checkpoint, so every trial has something
        # to restore however slow the machine is; then at a random point of the next writes.
        deadline = time.monotonic() + 30
        while (CheckpointStore(directory, keep=3).latest_step() or 0) <= restored_step and time.monotonic() < deadline:
            time.sleep(0.005)
        time.sleep(chooser.uniform(0.0, 0.08))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        summary["trials"] += 1
        store = CheckpointStore(directory, keep=3)
        partial = store.partial()
        newest_committed = store.latest_step()
        found = Checkpointer(store, EventLog(None)).restore_latest()
        if partial and any(str(path) in warnings.getvalue() for path in partial):
            summary["reported_partial"] += 1
        summary["interrupted_writes"] += bool(partial)
        if found is None:
            continue
        tree, info = found
        summary["restored"] += 1
        summary["corrupt"] += not intact(tree, info.step)
        summary["not_newest"] += info.step != newest_committed
        restored_step = info.step
        for path in partial:  # the next writer starts clean (the store deletes them after a while)
            for child in path.iterdir():
                child.unlink()
            path.rmdir()
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
