"""A trainer as users write one without DDP (tests/test_train_one_model.py runs it): a seed per
rank set before the model is built, gradients averaged with ``ht.average_gradients``, gradient
accumulation derived from the world size (and derived again when it changes), the best loss
kept as a registered number. Each step line reports a digest of the weights the step starts
from, the step's first random draw, and the accumulation it used."""

from __future__ import annotations

import argparse
import hashlib
import time

import torch
import torch.nn.functional as F

import hotswap.train as ht

GLOBAL_MICRO_BATCHES = 4

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=3)
parser.add_argument("--step-sleep", type=float, default=0.0)
parser.add_argument("--no-sync", action="store_true", help="each rank keeps its own initial model")
args = parser.parse_args()

torch.set_num_threads(1)
run = ht.init(checkpoint_every=None, sync_initial_state=not args.no_sync)
torch.manual_seed(1000 + run.rank)  # each rank its own seed: its own initial weights and batches
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
run.register(model=model, optimizer=optimizer, best_loss=float("inf"))

accumulation = GLOBAL_MICRO_BATCHES // run.world_size


def rescale(world_size: int) -> None:
    global accumulation
    accumulation = GLOBAL_MICRO_BATCHES // world_size
    print(f"world_size_changed world_size={world_size} step={run.step} accumulation={accumulation}", flush=True)


run.on_world_size_change(rescale)


def digest() -> str:
    weights = torch.cat([p.detach().flatten() for p in model.parameters()])
    return hashlib.sha256(weights.numpy().tobytes()).hexdigest()[:16]


for step in run.steps(args.steps):
    with run.elastic_step():
        weights = digest()
        optimizer.zero_grad()
        draws = []
        for _ in range(accumulation):
            x = torch.randn(2, 4)
            draws.append(x[0, 0].item())
            loss = F.mse_loss(model(x), x.sum(1, keepdim=True)) / accumulation
            loss.backward()
        ht.average_gradients(model)
        optimizer.step()
        run.scalars["best_loss"] = min(run.scalars["best_loss"], loss.item())
        run.report(weights=weights, draw=f"{draws[0]:.9f}", accumulation=accumulation)
    time.sleep(args.step_sleep)
