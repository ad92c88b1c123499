"""The process group of one generation as the framework-neutral modules see it: where and as
whom to meet (:class:`GroupSpec`) and how meeting fails (:class:`RendezvousFailed`).
:mod:`hotswap.train.torch.distributed` forms the group with torch.distributed."""

from __future__ import annotations

import dataclasses


class RendezvousFailed(Exception):
    """The members of a generation did not all arrive (or the wait was interrupted)."""


@dataclasses.dataclass(frozen=True)
class GroupSpec:
    generation: int
    rank: int
    world_size: int
    master_addr: str
    master_port: int


def first_line(error: BaseException) -> str:
    """An error in one line, for warnings (gloo's messages run to many lines)."""
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__


def timed_out(error: BaseException) -> bool:
    """Whether a failed collective or rendezvous gave up waiting (a peer that hangs, or one
    that left without closing its connections), rather than seeing the peer go (gloo's
    "Connection closed by peer")."""
    text = str(error).lower()
    return any(word in text for word in ("timed out", "timeout", "deadline_exceeded", "deadline exceeded"))
