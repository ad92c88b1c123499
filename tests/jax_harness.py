"""A JAX worker for hotswap.train.jax's process tests (started by them, like a user's script).

Its state has one array sharded across the mesh's slices (``w``, ``--rows`` x 4, so restoring it
onto another number of slices really reshards it; ``--shard none`` replicates it) and one replicated (``big``, ``--mib``
MiB, to make saves take a while), and with ``--key`` a typed PRNG key (``jax.random.key(0)``,
split at every step). Each step adds 1 to every element, so the state after step ``n`` is
known exactly: the step line's ``checksum`` lets a test check a restore at any size, its
``key`` the key's words (:func:`expected_key`).
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


def expected_key(step: int) -> int:
    """The key's words after ``step`` steps, as the step line's ``key`` prints them."""
    key = jax.random.key(0)
    for _ in range(step):
        key = jax.random.split(key)[0]
    return key_words(key)


def key_words(key: jax.Array) -> int:
    high, low = (int(word) for word in np.asarray(jax.random.key_data(key)))
    return high << 32 | low


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--rows", type=int, default=12)
    parser.add_argument("--shard", choices=("slice", "none"), default="slice", help="w across slices, or replicated")
    parser.add_argument("--mib", type=float, default=0.0)
    parser.add_argument("--checkpoint-every", type=int, default=20)
    parser.add_argument("--step-sleep", type=float, default=0.02)
    parser.add_argument("--key", action="store_true", help="a typed PRNG key in the state, split at every step")
    parser.add_argument("--seed-per-process", action="store_true", help="w initialised apart on each process (its own seed)")
    parser.add_argument("--no-sync-initial-state", action="store_true")
    args = parser.parse_args()

    run = hj.init(checkpoint_every=args.checkpoint_every, sync_initial_state=not args.no_sync_initial_state)
    own = 1000.0 * jax.process_index() if args.seed_per_process else 0.0
    mesh = run.mesh()
    sharded = NamedSharding(mesh, P("slice", None) if args.shard == "slice" else P())
    replicated = NamedSharding(mesh, P())
    w = jax.make_array_from_callback((args.rows, 4), sharded, lambda index: initial_w(args.rows)[index] + own)
    big = jax.jit(lambda: jnp.zeros(max(1, int(args.mib * 2**20 / 4)), jnp.float32), out_shardings=replicated)()
    state = {"w": w, "big": big}
    if args.key:
        state["key"] = jax.jit(lambda: jax.random.key(0), out_shardings=replicated)()
    run.register(state)

    @jax.jit
    def step(state):
        moved = {name: value + 1 for name, value in state.items() if name != "key"}
        return {**moved, "key": jax.random.split(state["key"])[0]} if "key" in state else moved

    for _ in run.steps(args.steps):
        with run.elastic_step():
            run.state = step(run.state)
            key = {"key": key_words(run.state["key"])} if args.key else {}
            run.report(checksum=float(jnp.sum(run.state["w"])), big=float(run.state["big"][0]) if args.mib else 0.0, **key)
            time.sleep(args.step_sleep)


if __name__ == "__main__":
    main()
