"""DistributedDataParallel that follows the run's process group: built when a training forward
first needs it (the group exists then, also in an elastic job, whose first group forms at the
first step), dropped before the run frees a group it leaves, and built again on the group
that replaces it. What the user gets from :meth:`hotswap.train.torch.run.Run.data_parallel`.

DDP binds the default group when it is constructed; kept across an elastic re-form it would
run its all-reduce on a destroyed group, and, holding that group, keep its connections open
so that the peers still waiting in it learn that this rank left only at their timeout.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel

from hotswap.train.torch.distributed import ProcessGroup


class DataParallel(torch.nn.Module):
    """Wraps ``module`` as DistributedDataParallel on the current group, whatever the group
    (see the module). Its ``state_dict`` is the module's (no ``module.`` prefix), so a checkpoint
    restores into the bare module and the other way round.

    Training forwards (``module.training`` and gradients enabled) go through DDP; evaluation
    forwards run the module itself, so evaluating on one rank only never waits for the others.
    ``no_sync()`` and ``require_backward_grad_sync`` work as on DDP.
    """

    def __init__(self, module: torch.nn.Module, group: ProcessGroup, **ddp_options: Any) -> None:
        super().__init__()
        self.module = module
        # The SDK gives every rank the same state before a group trains, so DDP's own broadcast
        # of rank 0's parameters at each construction is not needed (the user may still ask).
        self._options = {"init_sync": False, **ddp_options}
        self._group = group
        self.require_backward_grad_sync = True
        self._ddp: DistributedDataParallel | None = None
        self._built_for: int | None = None  # the generation of the group the DDP runs on
        group.before_destroy(self.release)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        ddp = self._current() if self.training and torch.is_grad_enabled() else None
        if ddp is None:
            return self.module(*args, **kwargs)
        ddp.require_backward_grad_sync = self.require_backward_grad_sync
        return ddp(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Accumulate gradients locally (no all-reduce) in the backward passes inside."""
        ddp = self._current()
        if ddp is None:
            yield
            return
        with ddp.no_sync():
            yield

    def release(self) -> None:
        """Drop the DDP (the run is about to free its group); the next training forward builds
        one on the group then current."""
        self._ddp, self._built_for = None, None

    def _current(self) -> DistributedDataParallel | None:
        spec = self._group.spec
        if spec is None or spec.world_size == 1 or not torch.distributed.is_initialized():
            self.release()
            return None
        if self._ddp is None or self._built_for != spec.generation:
            self.release()
            self._ddp, self._built_for = DistributedDataParallel(self.module, **self._options), spec.generation
        return self._ddp

    # The module's state, not the wrapper's ---------------------------------------------------

    def state_dict(self, *args: Any, **kwargs: Any) -> Any:
        return self.module.state_dict(*args, **kwargs)

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False) -> Any:
        return self.module.load_state_dict(state_dict, strict=strict, assign=assign)

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "_ddp" or name == "_group":  # never a submodule: its parameters are the module's
            object.__setattr__(self, name, value)
        else:
            super().__setattr__(name, value)
