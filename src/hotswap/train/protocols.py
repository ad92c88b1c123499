"""What the framework-neutral modules (formation, boundary, termination) need of a framework.

A framework provides a :class:`Group` (the processes of one membership generation and the few
collectives a step boundary needs) and a :class:`ReplicaState` (the job's state moving between
ranks and disk). PyTorch provides them in :mod:`hotswap.train.torch.distributed` and
:mod:`hotswap.train.torch.sync`, JAX in :mod:`hotswap.train.jax`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from hotswap.train.rendezvous import GroupSpec


class Group(Protocol):
    """The process group of one generation."""

    @property
    def rank(self) -> int: ...

    @property
    def world_size(self) -> int: ...

    def is_peer_failure(self, error: BaseException) -> bool:
        """Whether ``error`` means a peer died, hung or left (not a bug in the step)."""
        ...

    def adopt_existing(self) -> bool:
        """Use a group the training script formed itself; False when it formed none."""
        ...

    def expect(self, spec: GroupSpec) -> None:
        """Take this rank's place in ``spec`` before forming it (a deferred first join)."""
        ...

    def form(self, spec: GroupSpec, interrupted: Callable[[], bool]) -> None:
        """Meet the other members of ``spec``; raises RendezvousFailed when they do not all
        arrive or ``interrupted()`` says to give up."""
        ...

    def destroy(self, before_teardown: bool = False) -> None:
        """Leave the group; ``before_teardown``: the interpreter is torn down next."""
        ...

    def agree_max(self, values: list[int]) -> list[int]:
        """The element-wise maximum of every rank's ``values``."""
        ...


class ReplicaState(Protocol):
    """The job's state: into every rank when a group forms, onto disk at the right moments."""

    def synchronise(self, interrupted: Callable[[], bool]) -> None:
        """Make every rank hold the same state (from the most advanced rank, else from disk)."""
        ...

    def can_start_save(self) -> bool: ...

    def save_periodic(self) -> None: ...

    def save_last(self, reason: str) -> bool:
        """The last save of this process (every rank calls it); True on the rank that reports it.
        A ``final`` save that fails raises :class:`~hotswap.train.files.FinalSaveFailed`."""
        ...

    def save_own(self, reason: str) -> None:
        """Save without a group, if this rank can."""
        ...

    def wait_for_writes(self) -> None: ...
