"""A small data-parallel JAX job that survives preemption, migration and slice loss.

Standalone: ``python examples/train_jax.py --steps 200``. As a hotswap workload, one process per
host of every slice (elastic down to 2 of 3 slices)::

    hotswap workload create --cluster demo --workload mlp --num-slices 3 --min-slices 2 \\
        --command "python examples/train_jax.py --steps 3000 --step-sleep 0.05"

An MLP (plain JAX, optax's SGD with momentum) learns y = sin(x . w) from a synthetic dataset
that every process generates from the same seed. The parameters are replicated over the mesh's
``slice`` axis and each global batch is split over all devices, so XLA averages the gradients
across every host of every slice, and every surviving slice holds a whole replica.
"""

from __future__ import annotations

import argparse
import sys
import time

try:
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import hotswap.train.jax as hj
except ImportError as error:  # one line, not a traceback
    sys.exit(f"examples/train_jax.py: {error}; pip install 'hotswap[jax]'")


def synthetic_dataset(samples: int, features: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((samples, features), dtype=np.float32)
    w = rng.standard_normal((features, 1), dtype=np.float32)
    y = np.sin(x @ w) + 0.05 * rng.standard_normal((samples, 1), dtype=np.float32)
    return x, y.astype(np.float32)


def init_params(features: int, hidden: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed + 1)
    return {
        "w1": (rng.standard_normal((features, hidden)) / np.sqrt(features)).astype(np.float32),
        "b1": np.zeros(hidden, np.float32),
        "w2": (rng.standard_normal((hidden, 1)) / np.sqrt(hidden)).astype(np.float32),
        "b2": np.zeros(1, np.float32),
    }


def predict(params: dict[str, jax.Array], x: jax.Array) -> jax.Array:
    hidden = jax.nn.relu(x @ params["w1"] + params["b1"])
    return hidden @ params["w2"] + params["b2"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--batch-size", type=int, default=32, help="per process")
    parser.add_argument("--lr", type=float, default=0.05, help="at full size; scaled by active slices")
    parser.add_argument("--checkpoint-every", type=int, default=50)
    parser.add_argument("--checkpoint-dir", default=None, help="default: $HOTSWAP_CHECKPOINT_DIR (none: no checkpoints)")
    parser.add_argument("--step-sleep", type=float, default=0.0, help="seconds per step, to slow down drills")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    run = hj.init(checkpoint_dir=args.checkpoint_dir, checkpoint_every=args.checkpoint_every)
    mesh = run.mesh()
    replicated = NamedSharding(mesh, P())
    split = NamedSharding(mesh, P(("slice", "device")))  # the global batch over every device

    x, y = synthetic_dataset(samples=8192, features=16, seed=args.seed)
    # The learning rate is an argument of the step, so a change of size needs no new optimizer.
    optimizer = optax.inject_hyperparams(optax.sgd)(learning_rate=args.lr, momentum=0.9)
    params = jax.device_put(init_params(16, 64, args.seed), replicated)
    state = {"params": params, "opt": jax.jit(optimizer.init, out_shardings=replicated)(params)}
    batches = hj.ResumableBatches(len(x), args.batch_size, seed=args.seed)
    run.register(state, batches=batches)

    @jax.jit
    def train_step(state, xb, yb, lr):
        def loss_fn(params):
            return jnp.mean((predict(params, xb) - yb) ** 2)

        loss, grads = jax.value_and_grad(loss_fn)(state["params"])
        opt = state["opt"]
        opt.hyperparams["learning_rate"] = lr
        updates, opt = optimizer.update(grads, opt, state["params"])
        return {"params": optax.apply_updates(state["params"], updates), "opt": opt}, loss

    for _ in run.steps(args.steps):
        with run.elastic_step():
            index = batches.take(run.rank, run.world_size)
            xb = jax.make_array_from_process_local_data(split, x[index])
            yb = jax.make_array_from_process_local_data(split, y[index])
            lr = hj.scale_by_slices(args.lr, run.slices, run.total_slices)
            run.state, loss = train_step(run.state, xb, yb, jnp.float32(lr))
            run.report(loss=float(loss))
            time.sleep(args.step_sleep)


if __name__ == "__main__":
    main()
