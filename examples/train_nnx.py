"""A Flax NNX image classifier, written as the Flax NNX tutorials write one, made to survive
with hotswap.

An ``nnx.Module`` CNN, an ``nnx.Optimizer`` (optax AdamW), ``nnx.MultiMetric`` for accuracy
and loss, and an ``nnx.jit`` train step that updates all three in place. NNX objects are
mutable, the SDK's state is a pytree: each step starts from the run's state
(``nnx.update``) and hands back what the step made of it (``nnx.state``); the metrics and
the dropout keys (``nnx.Rngs``) are state too, so a restart resumes them. What hotswap needs
is marked ``# hotswap:``.

Standalone: ``python examples/train_nnx.py --steps 100``. As a workload, one process per
slice (elastic down to 1 of 2 slices)::

    hotswap workload create --cluster demo --workload cnn --num-slices 2 --min-slices 1 \\
        --command "python examples/train_nnx.py --steps 2000"

The images are synthetic (8x8 blobs whose position is the class), so no download is needed.
"""

from __future__ import annotations

import argparse
import sys
import time
from functools import partial

try:
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax
    from flax import nnx
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import hotswap.train.jax as hj
except ImportError as error:  # one line, not a traceback
    sys.exit(f"examples/train_nnx.py: {error}; pip install 'hotswap[jax]'")

CLASSES = 4


class CNN(nnx.Module):
    def __init__(self, *, rngs: nnx.Rngs) -> None:
        self.conv1 = nnx.Conv(1, 8, kernel_size=(3, 3), rngs=rngs)
        self.conv2 = nnx.Conv(8, 16, kernel_size=(3, 3), rngs=rngs)
        self.dropout = nnx.Dropout(rate=0.1, rngs=rngs)
        self.linear = nnx.Linear(16 * 2 * 2, CLASSES, rngs=rngs)
        self.pool = partial(nnx.avg_pool, window_shape=(2, 2), strides=(2, 2))

    def __call__(self, x: jax.Array) -> jax.Array:
        x = self.pool(nnx.relu(self.conv1(x)))
        x = self.pool(nnx.relu(self.conv2(x)))
        return self.linear(self.dropout(x.reshape(x.shape[0], -1)))


def synthetic_images(samples: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """8x8 images with a bright 3x3 blob in the quadrant that is the label, and noise."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, CLASSES, samples)
    images = 0.3 * rng.standard_normal((samples, 8, 8, 1)).astype(np.float32)
    for i, label in enumerate(labels):
        row, column = 4 * (label // 2) + rng.integers(0, 2), 4 * (label % 2) + rng.integers(0, 2)
        images[i, row : row + 3, column : column + 3, 0] += 1.0
    return images, labels.astype(np.int32)


def loss_fn(model: CNN, images: jax.Array, labels: jax.Array) -> tuple[jax.Array, jax.Array]:
    logits = model(images)
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean(), logits


@nnx.jit
def train_step(model: CNN, optimizer: nnx.Optimizer, metrics: nnx.MultiMetric, images: jax.Array, labels: jax.Array) -> jax.Array:
    (loss, logits), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model, images, labels)
    metrics.update(loss=loss, logits=logits, labels=labels)
    optimizer.update(model, grads)
    return loss


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=16, help="per process")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--eval-every", type=int, default=20, help="report and reset the metrics every N steps")
    parser.add_argument("--checkpoint-every", type=int, default=20)
    parser.add_argument("--step-sleep", type=float, default=0.0, help="seconds per step, to slow down drills")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    run = hj.init(checkpoint_every=args.checkpoint_every)  # hotswap: first (jax.distributed, the mesh)
    mesh = run.mesh()
    split = NamedSharding(mesh, P(("slice", "device")))  # the global batch over every device

    images, labels = synthetic_images(4096, args.seed)
    model = CNN(rngs=nnx.Rngs(params=args.seed, dropout=args.seed + 1))
    optimizer = nnx.Optimizer(model, optax.adamw(args.lr), wrt=nnx.Param)
    metrics = nnx.MultiMetric(accuracy=nnx.metrics.Accuracy(), loss=nnx.metrics.Average("loss"))
    batches = hj.ResumableBatches(len(images), args.batch_size, seed=args.seed)
    # hotswap: the NNX objects' state (parameters, optimizer, metrics, dropout keys), replicated
    # over the mesh, is the job's state; the objects are updated from it at each step.
    objects = (model, optimizer, metrics)
    run.register(hj.replicate(nnx.state(objects), mesh), batches=batches)

    for step in run.steps(args.steps):
        with run.elastic_step():
            nnx.update(objects, run.state)  # hotswap: the restored or handed-over state, first
            index = batches.take(run.rank, run.world_size)
            loss = train_step(
                model, optimizer, metrics,
                jax.make_array_from_process_local_data(split, images[index]),
                jax.make_array_from_process_local_data(split, labels[index]),
            )
            if step % args.eval_every == 0:
                computed = metrics.compute()
                if run.rank == 0:
                    print(f"metrics step={step} accuracy={float(computed['accuracy']):.4f} loss={float(computed['loss']):.4f}", flush=True)
                metrics.reset()
            run.state = nnx.state(objects)  # hotswap: what a save or a joining peer takes
            run.report(loss=f"{float(loss):.6f}")
            time.sleep(args.step_sleep)


if __name__ == "__main__":
    main()
