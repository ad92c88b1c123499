"""A Flax NNX image classifier (data-parallel JAX) that survives preemption, migration and slice loss.

Standalone: ``python examples/train_nnx.py --steps 200``. As a hotswap workload, one process per
host of every slice (elastic down to 1 of 2 slices)::

    hotswap workload create --cluster demo --workload nnx --num-slices 2 --min-slices 1 \\
        --command "python examples/train_nnx.py --steps 2000"

A small CNN (``nnx.Module``: convolution, dropout, dense layers) learns which of 4 patterns a
noisy 8x8 image shows, from a synthetic dataset every process generates from the same seed, as
Flax's MNIST tutorial writes it: an ``nnx.Optimizer``, ``nnx.MultiMetric`` and an ``nnx.jit``
train step that updates the model, the optimizer and the metrics in place. The run keeps those
objects (``run.register({...}, batches=batches)``): it places them on the mesh (replicated),
restores into them and reads them at each step boundary (``hotswap.train.jax.flax_nnx``).

Every step trains on one global batch whatever the number of processes (each process feeds its
rows), so a slice loss changes how a step is computed, not what it computes. Randomness: dropout
draws from the model's ``nnx.Rngs`` (a key in the state, one stream for the whole job: each
process computes its rows' part of the mask), and the host's random flips are drawn per
(seed, step, sample), derived rather than carried, so no process continues another's stream.
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
    from flax import nnx
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import hotswap.train.jax as hj
except ImportError as error:  # one line, not a traceback
    sys.exit(f"examples/train_nnx.py: {error}; pip install 'hotswap[jax]'")

CLASSES = 4
SIDE = 8


def synthetic_images(samples: int, seed: int, split: str) -> tuple[np.ndarray, np.ndarray]:
    """Noisy 8x8 images of one of 4 patterns (the seed's), the label being the pattern."""
    patterns = np.random.default_rng(seed).standard_normal((CLASSES, SIDE, SIDE, 1)).astype(np.float32)
    rng = np.random.default_rng([seed, {"train": 1, "test": 2}[split]])
    labels = rng.integers(0, CLASSES, samples).astype(np.int32)
    images = patterns[labels] + 3.0 * rng.standard_normal((samples, SIDE, SIDE, 1)).astype(np.float32)
    return images, labels


class Classifier(nnx.Module):
    def __init__(self, *, rngs: nnx.Rngs) -> None:
        self.conv = nnx.Conv(1, 8, kernel_size=(3, 3), rngs=rngs)
        self.dropout = nnx.Dropout(0.1, rngs=rngs)
        self.hidden = nnx.Linear(SIDE * SIDE * 8, 32, rngs=rngs)
        self.out = nnx.Linear(32, CLASSES, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = nnx.relu(self.conv(x)).reshape(x.shape[0], -1)
        x = self.dropout(nnx.relu(self.hidden(x)))
        return self.out(x)


def loss_fn(model: Classifier, images: jax.Array, labels: jax.Array) -> tuple[jax.Array, jax.Array]:
    logits = model(images)
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean(), logits


@nnx.jit
def train_step(model: Classifier, optimizer: nnx.Optimizer, metrics: nnx.MultiMetric, images: jax.Array, labels: jax.Array) -> jax.Array:
    (loss, logits), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model, images, labels)
    metrics.update(loss=loss, logits=logits, labels=labels)
    optimizer.update(model, grads)
    return loss


@nnx.jit
def eval_step(model: Classifier, metrics: nnx.MultiMetric, images: jax.Array, labels: jax.Array) -> None:
    loss, logits = loss_fn(model, images, labels)
    metrics.update(loss=loss, logits=logits, labels=labels)


def flips(seed: int, step: int, samples: np.ndarray) -> np.ndarray:
    """Random horizontal flips, a draw per (seed, step, sample): the same whichever process feeds
    the sample, and nothing to carry across a restart."""
    return np.array([np.random.default_rng((seed, step, int(i))).random() < 0.5 for i in samples])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--batch-size", type=int, default=48, help="global: split over every device (a multiple of their number)")
    parser.add_argument("--lr", type=float, default=0.005)
    parser.add_argument("--log-every", type=int, default=10, help="steps per line of training metrics")
    parser.add_argument("--eval-every", type=int, default=50)
    parser.add_argument("--checkpoint-every", type=int, default=50)
    parser.add_argument("--checkpoint-dir", default=None, help="default: $HOTSWAP_CHECKPOINT_DIR (none: no checkpoints)")
    parser.add_argument("--step-sleep", type=float, default=0.0, help="seconds per step, to slow down drills")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    run = hj.init(checkpoint_dir=args.checkpoint_dir, checkpoint_every=args.checkpoint_every)
    split = NamedSharding(run.mesh(), P(("slice", "device")))  # the global batch over every device

    images, labels = synthetic_images(4096, args.seed, "train")
    test_images, test_labels = synthetic_images(256, args.seed, "test")
    model = Classifier(rngs=nnx.Rngs(params=args.seed, dropout=args.seed + 1))
    optimizer = nnx.Optimizer(model, optax.adamw(args.lr), wrt=nnx.Param)
    metrics = nnx.MultiMetric(accuracy=nnx.metrics.Accuracy(), loss=nnx.metrics.Average("loss"))
    batches = hj.ResumableBatches(len(images), args.batch_size, seed=args.seed)
    # Placed on the mesh, restored into and read back at every step boundary by the run.
    run.register({"model": model, "optimizer": optimizer, "metrics": metrics}, batches=batches)

    for step in run.steps(args.steps):
        with run.elastic_step():
            mine = np.array_split(batches.take(), run.world_size)[run.rank]  # this process's rows
            x = np.where(flips(args.seed, step, mine)[:, None, None, None], images[mine][:, :, ::-1], images[mine])
            loss = train_step(
                model, optimizer, metrics,
                jax.make_array_from_process_local_data(split, x),
                jax.make_array_from_process_local_data(split, labels[mine]),
            )
            if step % args.log_every == 0:
                train = {f"train_{k}": float(v) for k, v in metrics.compute().items()}
                metrics.reset()  # part of the state: a restart resumes the next window's sums
                run.report(loss=loss, **train)
            else:
                run.report(loss=loss)
            if step % args.eval_every == 0:
                evaluate(model, test_images, test_labels, split, run.rank, run.world_size)
            time.sleep(args.step_sleep)


def evaluate(model: Classifier, images: np.ndarray, labels: np.ndarray, split: NamedSharding, rank: int, world_size: int) -> None:
    """An evaluation pass (dropout off), with metrics of its own: not part of the training state."""
    metrics = nnx.MultiMetric(accuracy=nnx.metrics.Accuracy(), loss=nnx.metrics.Average("loss"))
    model.eval()
    for rows in np.array_split(np.arange(len(images)), 4):
        mine = np.array_split(rows, world_size)[rank]
        eval_step(
            model, metrics,
            jax.make_array_from_process_local_data(split, images[mine]),
            jax.make_array_from_process_local_data(split, labels[mine]),
        )
    model.train()
    result = {k: round(float(v), 4) for k, v in metrics.compute().items()}
    print(f"eval accuracy={result['accuracy']} loss={result['loss']}", flush=True)


if __name__ == "__main__":
    main()
