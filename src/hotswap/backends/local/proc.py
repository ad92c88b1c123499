"""What ``/proc`` says of a process: whether a pid is still the process it was (its kernel start
time), for the controller's claim, the supervisor, the zygote and ``cluster delete`` alike."""

from __future__ import annotations


def start_ticks(pid: int) -> int | None:
    """Kernel start time of ``pid`` (clock ticks since boot), None if it does not exist."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None
    if fields and fields[0] == b"Z":
        return None  # a zombie has ended; only its exit status is left
    return int(fields[19])
