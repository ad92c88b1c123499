"""A small GPT trained the way real PyTorch trainers are written, made to survive with hotswap.

The loop has the habits of a minimal GPT trainer (nanoGPT's): a seed per rank, batches drawn
at random from the training text, DistributedDataParallel with gradient accumulation (no
gradient all-reduce until the last micro-step), a learning rate set from the iteration
(linear warm-up, cosine decay), gradient clipping, the next micro-batch fetched while the
current one computes, an evaluation pass every ``--eval-interval`` steps that pauses training
(``--eval-pause`` makes it as long as a real one), the best validation loss kept, and an
optional ``torch.compile``. What hotswap needs is marked ``# hotswap:``.

Standalone: ``python examples/train_gpt.py --max-iters 200``. As a workload, one process per
slice (elastic down to 1 of 2 slices)::

    hotswap workload create --cluster demo --workload gpt --num-slices 2 --min-slices 1 \\
        --command "python examples/train_gpt.py --max-iters 2000"

The text is synthetic (sentences of a small grammar, generated from ``--data-seed``), so the
example needs no download; the model learns it character by character.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import random
import time

import torch
import torch.nn as nn
from torch.nn import functional as F

import hotswap.train as ht


@dataclasses.dataclass
class GPTConfig:
    block_size: int = 32
    vocab_size: int = 64
    n_layer: int = 2
    n_head: int = 2
    n_embd: int = 48
    dropout: float = 0.0


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd)
        self.n_head = config.n_head
        self.dropout = config.dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, time_steps, channels = x.size()
        q, k, v = self.c_attn(x).split(channels, dim=2)
        q, k, v = (t.view(batch, time_steps, self.n_head, -1).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(batch, time_steps, channels))


class Block(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd)
        self.mlp = nn.Sequential(
            nn.Linear(config.n_embd, 4 * config.n_embd), nn.GELU(), nn.Linear(4 * config.n_embd, config.n_embd),
            nn.Dropout(config.dropout),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.block_size, config.n_embd)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.wte.weight = self.lm_head.weight  # weight tying
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        positions = torch.arange(idx.size(1), device=idx.device)
        x = self.wte(idx) + self.wpe(positions)
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))

    def configure_optimizers(self, weight_decay: float, learning_rate: float) -> torch.optim.AdamW:
        parameters = [p for p in self.parameters() if p.requires_grad]
        groups = [
            {"params": [p for p in parameters if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in parameters if p.dim() < 2], "weight_decay": 0.0},
        ]
        return torch.optim.AdamW(groups, lr=learning_rate, betas=(0.9, 0.95))


def synthetic_text(characters: int, seed: int) -> str:
    """Sentences of a small grammar: enough structure for the loss to fall, no download."""
    chooser = random.Random(seed)
    subjects = ["the cat", "a dog", "my neighbour", "the old sailor", "every child", "the robot"]
    verbs = ["sees", "follows", "paints", "remembers", "builds", "sings to"]
    objects = ["a red boat", "the moon", "two birds", "the quiet river", "her garden", "a tall tree"]
    endings = [".", "!", " at dawn.", " every day.", " again."]
    sentences: list[str] = []
    length = 0
    while length < characters:
        sentence = f"{chooser.choice(subjects)} {chooser.choice(verbs)} {chooser.choice(objects)}{chooser.choice(endings)} "
        sentences.append(sentence.capitalize())
        length += len(sentence)
    return "".join(sentences)[:characters]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--max-iters", type=int, default=500)
    parser.add_argument("--batch-size", type=int, default=8, help="sequences per micro-batch")
    parser.add_argument("--global-micro-batches", type=int, default=4,
                        help="micro-batches per step over all ranks (gradient accumulation = this / world size)")
    parser.add_argument("--learning-rate", type=float, default=3e-3)
    parser.add_argument("--min-lr", type=float, default=3e-4)
    parser.add_argument("--warmup-iters", type=int, default=20)
    parser.add_argument("--lr-decay-iters", type=int, default=None, help="default: --max-iters")
    parser.add_argument("--weight-decay", type=float, default=0.1)
    parser.add_argument("--grad-clip", type=float, default=1.0)
    parser.add_argument("--eval-interval", type=int, default=50)
    parser.add_argument("--eval-iters", type=int, default=4)
    parser.add_argument("--eval-pause", type=float, default=0.0, help="extra seconds each evaluation takes")
    parser.add_argument("--checkpoint-every", type=int, default=25)
    parser.add_argument("--step-sleep", type=float, default=0.0, help="seconds per step, to slow down drills")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model")
    parser.add_argument("--no-ddp", action="store_true", help="average gradients with ht.average_gradients instead")
    parser.add_argument("--seed", type=int, default=1337)
    parser.add_argument("--data-seed", type=int, default=0)
    args = parser.parse_args()

    torch.set_num_threads(1)  # a tiny model: more threads only contend with the other ranks
    # hotswap: init first (it reads the worker environment and forms the process group).
    run = ht.init(checkpoint_every=args.checkpoint_every)
    torch.manual_seed(args.seed + run.rank)  # a seed per rank, as nanoGPT does
    device = run.device

    text = synthetic_text(60_000, args.data_seed)
    characters = sorted(set(text))
    encode = {c: i for i, c in enumerate(characters)}
    data = torch.tensor([encode[c] for c in text], dtype=torch.long)
    split = int(0.9 * len(data))
    train_data, val_data = data[:split], data[split:]
    config = GPTConfig(vocab_size=len(characters))

    def get_batch(which: str) -> tuple[torch.Tensor, torch.Tensor]:
        source = train_data if which == "train" else val_data
        ix = torch.randint(len(source) - config.block_size, (args.batch_size,))
        x = torch.stack([source[i : i + config.block_size] for i in ix])
        y = torch.stack([source[i + 1 : i + 1 + config.block_size] for i in ix])
        return x.to(device), y.to(device)

    raw_model = GPT(config).to(device)
    optimizer = raw_model.configure_optimizers(args.weight_decay, args.learning_rate)
    model: nn.Module = torch.compile(raw_model) if args.compile else raw_model
    best = {"val_loss": float("inf")}  # hotswap: a dict updated in place is state
    # hotswap: what a restart needs; the model's weights are also made rank 0's on every rank.
    run.register(model=raw_model, optimizer=optimizer, best=best)

    lr_decay_iters = args.lr_decay_iters or args.max_iters

    def get_lr(iteration: int) -> float:
        if iteration < args.warmup_iters:
            return args.learning_rate * (iteration + 1) / (args.warmup_iters + 1)
        if iteration > lr_decay_iters:
            return args.min_lr
        ratio = (iteration - args.warmup_iters) / max(1, lr_decay_iters - args.warmup_iters)
        return args.min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (args.learning_rate - args.min_lr)

    @torch.no_grad()
    def estimate_loss() -> dict[str, float]:
        model.eval()
        losses = {}
        for which in ("train", "val"):
            values = [model(*get_batch(which))[1].item() for _ in range(args.eval_iters)]
            losses[which] = sum(values) / len(values)
        model.train()
        time.sleep(args.eval_pause)
        return losses

    # hotswap: run.data_parallel(model) where DistributedDataParallel(model) would be: the same
    # DDP, built on the run's group, and again on the group that replaces a lost one.
    trained = model if args.no_ddp else run.data_parallel(model)
    for iteration in run.steps(args.max_iters):  # hotswap: restores first, then stops, re-forms or saves
        # hotswap: the world size is read per step: an elastic job changes it between steps.
        if args.global_micro_batches % run.world_size:
            raise SystemExit(f"--global-micro-batches {args.global_micro_batches} is not a multiple of {run.world_size} ranks")
        accumulation = args.global_micro_batches // run.world_size
        lr = get_lr(iteration)
        for group in optimizer.param_groups:
            group["lr"] = lr
        if iteration % args.eval_interval == 0:
            losses = estimate_loss()
            best["val_loss"] = min(best["val_loss"], losses["val"])
            if run.rank == 0:
                print(f"eval step={iteration} train_loss={losses['train']:.4f} val_loss={losses['val']:.4f}", flush=True)
        with run.elastic_step():  # hotswap: a peer lost mid-step re-runs the step on the others
            # hotswap: the first micro-batch is taken after the step boundary; one prefetched
            # across it would not be in the checkpoint.
            x, y = get_batch("train")
            total = 0.0
            for micro_step in range(accumulation):
                trained.require_backward_grad_sync = micro_step == accumulation - 1  # DDP's, as nanoGPT sets it
                _, loss = trained(x, y)
                loss = loss / accumulation
                if micro_step < accumulation - 1:
                    x, y = get_batch("train")  # fetched while the backward pass runs
                loss.backward()
                total += loss.item()
            if args.no_ddp:
                ht.average_gradients(raw_model)
            torch.nn.utils.clip_grad_norm_(raw_model.parameters(), args.grad_clip)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            run.report(loss=f"{total:.6f}", lr=f"{lr:.6f}")
            time.sleep(args.step_sleep)


if __name__ == "__main__":
    main()
