"""Wall-clock times as people and the Kubernetes API read them: UTC, ISO 8601, ``Z``."""

from __future__ import annotations

from datetime import datetime, timezone


def iso_utc(t: float, digits: int = 0) -> str:
    """``2026-11-22T12:00:00Z``; ``digits`` (0-6) decimals of the second (the Kubernetes API's
    MicroTime has 6, a timeline 2)."""
    if not 0 <= digits <= 6:
        raise ValueError(f"digits must be 0..6, not {digits}")
    stamp = datetime.fromtimestamp(t, timezone.utc)
    text = stamp.strftime("%Y-%m-%dT%H:%M:%S")
    if digits:
        text += "." + f"{stamp.microsecond:06d}"[:digits]
    return text + "Z"


def parse_iso_utc(text: str) -> float:
    """Unix seconds of an ISO 8601 time (``Z`` or an offset)."""
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
