"""A training script written against pathwaysutils.elastic's API (``Manager``, ``elastic_retry``,
``get_resharded_snapshot``, ``maybe_snapshot``, ``ScaleUpSignalError``), run on hotswap's JAX SDK
by ``test_train_jax_processes.py``. Each step adds 1 to ``w``; the controller dict counts steps."""

from __future__ import annotations

import argparse
import time

import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from hotswap.train.jax.elastic import Manager, ScaleUpSignalError


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100_000)
    args = parser.parse_args()
    manager = Manager(snapshot_period=5)

    @jax.jit
    def add_one(arrays):
        return jax.tree.map(lambda x: x + 1, arrays)

    @manager.elastic_retry(minimum_slice_count=1, poll_interval=0.1, timeout=60)
    def train() -> None:
        mesh = manager.mesh
        initial = {"w": jax.device_put(np.zeros(4, np.float32), NamedSharding(mesh, P()))}
        step, arrays, controller = manager.get_resharded_snapshot(mesh, initial, {"seen": 0})
        print(f"resumed step={step} seen={controller['seen']}", flush=True)
        while step < args.steps:
            arrays = add_one(arrays)
            step += 1
            controller["seen"] = step
            print(
                f"step={step} elastic_manager.good_slice_count={manager.good_slice_count} "
                f"elastic_manager.elastic_down_event_count={manager.elastic_down_event_count} w={float(arrays['w'][0])}",
                flush=True,
            )
            manager.maybe_snapshot(step, arrays, controller)
            if manager.available_inactive_slices:
                raise ScaleUpSignalError()
            time.sleep(0.02)

    train()


if __name__ == "__main__":
    main()
