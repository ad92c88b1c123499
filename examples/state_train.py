"""A job whose model and optimizer state is large and lives on its device: the GPU drill's job.

Standalone: ``python examples/state_train.py --state-gb 0.05 --steps 50``. As a hotswap
workload on a GPU-backed slice, the state is on the rank's own GPU (NCCL); on an emulated
slice, on the CPU (gloo)::

    hotswap workload create --cluster gpu --workload big --priority low \\
        --command "python examples/state_train.py --state-gb 1.2 --steps 100000"

An MLP of square layers trained with Adam: parameters and Adam's two moments together take
``--state-gb``. A registered :class:`ParameterChecksum` puts a SHA-256 of the parameters into
every checkpoint; after a restore the job prints it next to the checksum of what it restored,
so a drill can tell that the state came back bit for bit.
"""

from __future__ import annotations

import argparse
import hashlib
import math
import time
from collections.abc import Callable

import torch

import hotswap.train as ht

ADAM_COPIES = 3  # parameters, exp_avg, exp_avg_sq


def checksum(model: torch.nn.Module) -> str:
    digest = hashlib.sha256()
    for parameter in model.parameters():
        digest.update(parameter.detach().contiguous().cpu().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


class ParameterChecksum:
    """Checkpointed with the model: the checksum of the parameters as they were saved."""

    def __init__(self, model: torch.nn.Module, step: Callable[[], int]) -> None:
        self.model = model
        self.step = step
        self.saved: str | None = None

    def state_dict(self) -> dict[str, object]:
        value = checksum(self.model)
        print(f"params_checksum when=saved step={self.step()} sha256={value}", flush=True)
        return {"sha256": value}

    def load_state_dict(self, state: dict[str, object]) -> None:
        self.saved = str(state["sha256"])


def build(state_bytes: float, device: torch.device) -> torch.nn.Sequential:
    width = 4096 if state_bytes >= 256 * 2**20 else 512
    layers = max(1, math.ceil(state_bytes / (ADAM_COPIES * 4 * width * width)))
    blocks: list[torch.nn.Module] = []
    for _ in range(layers):
        blocks += [torch.nn.Linear(width, width, bias=False, device=device), torch.nn.Tanh()]
    return torch.nn.Sequential(*blocks)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--state-gb", type=float, default=1.2, help="model + Adam state, in GB (10^9 bytes)")
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--step-sleep", type=float, default=0.0)
    parser.add_argument("--checkpoint-every", type=int, default=0, help="0: only on SIGTERM and at the end")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    run = ht.init(checkpoint_every=args.checkpoint_every or None)
    model = build(args.state_gb * 1e9, run.device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    probe = ParameterChecksum(model, lambda: run.step)
    run.register(model=model, optimizer=optimizer, checksum=probe)
    parameters = sum(p.numel() for p in model.parameters())
    gpu = torch.cuda.get_device_name(run.device) if run.device.type == "cuda" else "-"
    print(
        f"state device={run.device} gpu={gpu.replace(' ', '_')} local_rank={run.local_rank}"
        f" parameters={parameters} state_bytes={parameters * 4 * ADAM_COPIES}",
        flush=True,
    )
    width = model[0].in_features
    for _ in run.steps(args.steps):
        if probe.saved is not None:  # the first step after a restore: compare before training
            print(
                f"params_checksum when=restored step={run.step} sha256={checksum(model)} saved={probe.saved}",
                flush=True,
            )
            probe.saved = None
        x = torch.randn(args.batch_size, width, device=run.device)
        loss = model(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        ht.average_gradients(model)
        optimizer.step()
        run.report(loss=f"{loss.item():.6f}")
        time.sleep(args.step_sleep)


if __name__ == "__main__":
    main()
