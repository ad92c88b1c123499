"""A JAX worker for hotswap.train.jax's process tests (started by them, like a user's script).

Its state has one array sharded across the mesh's slices (``w``, ``--rows`` x 4, so restoring it
onto another number of slices really reshards it; ``--shard none`` replicates it) and one replicated (``big``, ``--mib``
MiB, to make saves take a while). Each step adds 1 to every element, so the state after step
``n`` is known exactly: the step line's ``checksum`` lets a test check a restore at any size.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import hotswap.train.jax as hj


def initial_w(rows: int) -> np.ndarray:
    return np.arange(rows * 4, dtype=np.float32).reshape(rows, 4)


def expected_checksum(rows: int, step: int) -> float:
    """``sum(w)`` after ``step`` steps."""
    return float(initial_w(rows).sum() + rows * 4 * step)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--rows", type=int, default=12)
    parser.add_argument("--shard", choices=("slice", "none"), default="slice", help="w across slices, or replicated")
    parser.add_argument("--mib", type=float, default=0.0)
    parser.add_argument("--checkpoint-every", type=int, default=20)
    parser.add_argument("--step-sleep", type=float, default=0.02)
    args = parser.parse_args()

    run = hj.init(checkpoint_every=args.checkpoint_every)
    mesh = run.mesh()
    sharded = NamedSharding(mesh, P("slice", None) if args.shard == "slice" else P())
    replicated = NamedSharding(mesh, P())
    w = jax.make_array_from_callback((args.rows, 4), sharded, lambda index: initial_w(args.rows)[index])
    big = jax.jit(lambda: jnp.zeros(max(1, int(args.mib * 2**20 / 4)), jnp.float32), out_shardings=replicated)()
    run.register({"w": w, "big": big})

    @jax.jit
    def step(state):
        return jax.tree.map(lambda x: x + 1, state)

    for _ in run.steps(args.steps):
        with run.elastic_step():
            run.state = step(run.state)
            run.report(checksum=float(jnp.sum(run.state["w"])), big=float(run.state["big"][0]) if args.mib else 0.0)
            time.sleep(args.step_sleep)


if __name__ == "__main__":
    main()
