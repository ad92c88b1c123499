"""The five priority levels, with xpk's names and PriorityClass values."""

from __future__ import annotations

import enum

from hotswap.api.errors import InvalidInputError


class Priority(enum.IntEnum):
    """A workload's priority. The integer value is the Kubernetes PriorityClass value xpk uses."""

    VERY_LOW = 100
    LOW = 250
    MEDIUM = 500
    HIGH = 750
    VERY_HIGH = 1000

    @property
    def label(self) -> str:
        """The name users type: ``very-low`` ... ``very-high``."""
        return _LABELS[self]

    @classmethod
    def parse(cls, value: str | int | Priority) -> Priority:
        """Accept a label (``high``), a PriorityClass value (``750``) or a Priority."""
        if isinstance(value, Priority):
            return value
        if isinstance(value, int) or (isinstance(value, str) and value.strip().isdigit()):
            try:
                return cls(int(value))
            except ValueError:
                pass
        elif isinstance(value, str):
            key = value.strip().lower().replace("_", "-")
            for level in cls:
                if level.label == key:
                    return level
        raise InvalidInputError(
            f"unknown priority {value!r}; use one of {', '.join(p.label for p in cls)}"
            f" (or their values {', '.join(str(p.value) for p in cls)})"
        )

    def __str__(self) -> str:
        return self.label


DEFAULT_PRIORITY = Priority.MEDIUM


# Computed once: status messages name the priority at every preemption, reports once per job.
_LABELS = {level: level.name.lower().replace("_", "-") for level in Priority}
