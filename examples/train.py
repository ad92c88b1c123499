"""A small data-parallel training job that survives preemption, migration and slice loss.

Standalone: ``python examples/train.py --steps 200``. As a hotswap workload, one process per
host of every slice (elastic down to 2 of 3 slices)::

    hotswap workload create --cluster demo --workload mlp --num-slices 3 --min-slices 2 \\
        --command "python examples/train.py --steps 3000 --step-sleep 0.05"

An MLP learns y = sin(x . w) from a synthetic dataset that every process generates from the
same seed. Each rank trains on its part of each global batch; gradients are averaged over all
ranks of all slices.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

import hotswap.train as ht


def synthetic_dataset(samples: int, features: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, features, generator=generator)
    w = torch.randn(features, 1, generator=generator)
    y = torch.sin(x @ w) + 0.05 * torch.randn(samples, 1, generator=generator)
    return x, y


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--lr", type=float, default=0.05, help="at full size; scaled by active slices")
    parser.add_argument("--checkpoint-every", type=int, default=50)
    parser.add_argument(
        "--checkpoint-dir", default=None, help="default: $HOTSWAP_CHECKPOINT_DIR (none: no checkpoints)"
    )
    parser.add_argument("--step-sleep", type=float, default=0.0, help="seconds per step, to slow down drills")
    parser.add_argument(
        "--collective-timeout", type=float, default=None,
        help="seconds before a silent peer counts as lost (default: half the grace period, 5-60 s)"
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    torch.set_num_threads(1)  # a tiny model: more threads only contend with the other workers
    run = ht.init(
        checkpoint_dir=args.checkpoint_dir,
        checkpoint_every=args.checkpoint_every,
        collective_timeout_s=args.collective_timeout,
    )
    # The rank's own GPU on a GPU-backed slice (NCCL), the CPU on an emulated one (gloo).
    x, y = (t.to(run.device) for t in synthetic_dataset(samples=8192, features=16, seed=args.seed))
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Dropout(0.1), torch.nn.Linear(64, 1))
    model.to(run.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)

    batches = ht.ResumableBatches(len(x), args.batch_size, seed=args.seed)
    run.register(model=model, optimizer=optimizer, batches=batches)
    for _ in run.steps(args.steps):
        with run.elastic_step():
            index = batches.take(run.rank, run.world_size)
            for group in optimizer.param_groups:
                group["lr"] = ht.scale_by_slices(args.lr, run.slices, run.total_slices)
            optimizer.zero_grad()
            loss = F.mse_loss(model(x[index]), y[index])
            loss.backward()
            ht.average_gradients(model)
            optimizer.step()
            run.report(loss=loss.item())
            time.sleep(args.step_sleep)


if __name__ == "__main__":
    main()
