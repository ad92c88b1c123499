"""A data position that survives restarts and changes of world size."""

from __future__ import annotations

import random
from typing import Any


class ResumableBatches:
    """Batches of sample indices for data-parallel training, resumable and elastic.

    Each epoch visits the dataset in a seeded random order (the same for every rank). A step
    consumes one *global* batch, ``batch_size`` samples per rank; rank ``r`` of ``n`` takes the
    ``r``-th of the ``n`` consecutive per-rank slices. The position is the epoch and the offset
    of the next global batch, so after a restart, or when the world size changes, training
    continues with the samples that come next. A last global batch that does not fit into the
    epoch is dropped (every rank gets a full batch).

    Register it with the run (``run.register(..., batches=batches)``): it is checkpointed, and
    a step abandoned because a peer was lost gets the same batch again when it is re-run.
    """

    def __init__(self, dataset_size: int, batch_size: int, seed: int = 0, shuffle: bool = True) -> None:
        if dataset_size < 1:
            raise ValueError(f"dataset_size must be at least 1, not {dataset_size}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, not {batch_size}")
        self.dataset_size = dataset_size
        self.batch_size = batch_size
        self.seed = seed
        self.shuffle = shuffle
        self.epoch = 0
        self.offset = 0
        self._order: tuple[int, list[int]] | None = None  # (epoch, permutation), cached

    def take(self, rank: int = 0, world_size: int = 1) -> list[int]:
        """The sample indices of this rank's part of the next global batch; advances the position."""
        global_batch = self.batch_size * world_size
        if global_batch > self.dataset_size:
            raise ValueError(
                f"a global batch of {global_batch} ({self.batch_size} x {world_size} ranks) "
                f"does not fit a dataset of {self.dataset_size} samples"
            )
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside a world of {world_size}")
        if self.offset + global_batch > self.dataset_size:
            self.epoch += 1
            self.offset = 0
        start = self.offset + rank * self.batch_size
        indices = self._permutation()[start : start + self.batch_size]
        self.offset += global_batch
        return indices

    def _permutation(self) -> list[int]:
        if self._order is None or self._order[0] != self.epoch:
            order = list(range(self.dataset_size))
            if self.shuffle:
                random.Random(f"{self.seed}/{self.epoch}").shuffle(order)
            self._order = (self.epoch, order)
        return self._order[1]

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "offset": self.offset, "dataset_size": self.dataset_size, "seed": self.seed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if int(state["dataset_size"]) != self.dataset_size:
            raise ValueError(
                f"the checkpointed data position is for {state['dataset_size']} samples, "
                f"this dataset has {self.dataset_size}"
            )
        self.seed = int(state["seed"])
        self.epoch = int(state["epoch"])
        self.offset = int(state["offset"])
