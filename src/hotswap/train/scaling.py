"""Scaling a hyper-parameter with the number of active slices (the linear scaling rule)."""

from __future__ import annotations

from typing import TypeVar

Number = TypeVar("Number", int, float)


def scale_by_slices(value: Number, active: int, total: int) -> Number:
    """``value`` scaled by ``active / total``: the linear scaling rule (Goyal et al., 2017).

    Data-parallel replicas each take a fixed per-replica batch, so running on ``active`` of
    ``total`` slices shrinks the global batch by ``active / total``; scaling the learning rate
    by the same factor keeps the update per sample unchanged. Use it for the learning rate,
    or for a global batch size that the job divides among the active replicas.

    An ``int`` (a batch size) is rounded down and stays at least 1; a ``float`` is scaled exactly.
    """
    if total < 1:
        raise ValueError(f"total slices must be at least 1, not {total}")
    if not 0 < active <= total:
        raise ValueError(f"active slices must be between 1 and {total}, not {active}")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"scale_by_slices scales an int or a float, not {type(value).__name__}")
    if isinstance(value, int):
        return max(1, value * active // total)
    return value * active / total
