"""A seed-004-style script (pytorchjob-migration) running on hotswap's migrator.

The only change from a script written for that project is the import. On SIGTERM (pod
deletion, drain, preemption) the state is saved after the current optimizer step and the
process exits with 143; started again with the same checkpoint directory it resumes there::

    hotswap workload create --cluster demo --workload mnist-like --num-slices 2 \\
        --command "python examples/migrator_train.py --epochs 20"

Data-parallel with DistributedDataParallel when the worker environment says there are several
ranks (``torch.distributed`` initialised from RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT).
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

from hotswap.train import migrator


def synthetic_classification(samples: int, features: int, classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1234)
    centers = 2.0 * torch.randn(classes, features, generator=generator)
    labels = torch.randint(classes, (samples,), generator=generator)
    inputs = centers[labels] + torch.randn(samples, features, generator=generator)
    return inputs, labels


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--step-sleep", type=float, default=0.0, help="seconds per step, to slow down drills")
    args = parser.parse_args()

    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size > 1:
        dist.init_process_group("gloo")  # env://, from the worker environment
    rank = dist.get_rank() if world_size > 1 else 0
    torch.manual_seed(0)
    torch.set_num_threads(1)
    inputs, labels = synthetic_classification(samples=4096, features=32, classes=10)
    train_x, train_y, test_x, test_y = inputs[:3584], labels[:3584], inputs[3584:], labels[3584:]
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    if world_size > 1:
        model = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)

    # metrics to be recorded
    metrics = {"epoch": -1, "best_epoch": -1, "best_acc": 0.0}

    # A migrator helps training models on k8s more secure.
    migrator.register("model", model)
    migrator.register("optimizer", optimizer)
    migrator.register("metrics", metrics)
    migrator.listening()
    if migrator.resume:
        migrator.load_ckpt()  # load ckpt at all ranks
        print("load migration ckpt from epoch {}, metrics: {}".format(metrics["epoch"], metrics), flush=True)

    shard = args.batch_size * world_size
    steps_per_epoch = len(train_x) // shard
    first_epoch, first_batch = divmod(migrator.step, steps_per_epoch)  # skip what was done before
    for epoch in range(first_epoch, args.epochs):
        order = torch.randperm(len(train_x), generator=torch.Generator().manual_seed(epoch))
        model.train()
        for batch in range(first_batch if epoch == first_epoch else 0, steps_per_epoch):
            index = order[batch * shard + rank * args.batch_size : batch * shard + (rank + 1) * args.batch_size]
            optimizer.zero_grad()
            loss = F.cross_entropy(model(train_x[index]), train_y[index])
            loss.backward()
            optimizer.step()  # a SIGTERM is acted on right after this step
            migrator.report(loss=loss.item())
            if batch % 10 == 0 or batch == steps_per_epoch - 1:
                print(f"Train Epoch: {epoch} [{batch}/{steps_per_epoch}]\tloss={loss.item():.4f}", flush=True)
            time.sleep(args.step_sleep)
        model.eval()
        with torch.no_grad():
            accuracy = 100.0 * (model(test_x).argmax(dim=1) == test_y).float().mean().item()
        if accuracy > metrics["best_acc"]:
            metrics.update(best_acc=accuracy, best_epoch=epoch)
        metrics["epoch"] = epoch
        print(f"Test Epoch: {epoch}, acc={accuracy:.4f}", flush=True)


if __name__ == "__main__":
    main()
