"""What ``/proc`` says of a process: whether a pid is still the process it was (its kernel start
time), for the controller's claim, the supervisor, the zygote and ``cluster delete`` alike; and
which boot of the machine this is (a pid and its start ticks mean something only within one)."""

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


BOOT_ID = "/proc/sys/kernel/random/boot_id"


def boot_id() -> str | None:
    """The kernel's id of this boot of the machine (a new one after every restart), if readable."""
    try:
        with open(BOOT_ID) as source:
            return source.read().strip() or None
    except OSError:
        return None
