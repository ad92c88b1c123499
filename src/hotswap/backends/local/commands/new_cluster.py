"""What a new local cluster keeps where its creator did not say: its warm spare workers
(``--warm-workers``, ``$HOTSWAP_WARM_WORKERS``) and its zygote (``$HOTSWAP_ZYGOTE``), sized by
:mod:`hotswap.core.warm_policy` from this machine's free memory. Read in the CLI's process,
before any of the cluster's state exists; the controller runs what is decided here
(``workers/spares.py``, ``workers/zygotes.py``)."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from hotswap.api.errors import InvalidInputError
from hotswap.backends.local.protocol import MAX_WARM_WORKERS
from hotswap.core.warm_policy import auto_warm_workers, auto_zygote

AUTO = "auto"
WARM_WORKERS_VARIABLE = "HOTSWAP_WARM_WORKERS"  # what a new cluster gets without --warm-workers (default: auto)


def parse_warm_workers(value: int | str | None, source: str = "--warm-workers") -> int | str | None:
    """``--warm-workers`` (or ``source``, which names where the value came from): a count (0 to
    MAX_WARM_WORKERS), ``auto``, or None (unsaid)."""
    if value is None or value == AUTO:
        return value
    text = str(value).strip()
    count = value if isinstance(value, int) else int(text) if text.isascii() and text.isdigit() else -1
    if not 0 <= count <= MAX_WARM_WORKERS:
        raise InvalidInputError(f"{source} must be auto or a count between 0 and {MAX_WARM_WORKERS}, not {value!r}")
    return count


def available_memory() -> int | None:
    """This machine's available memory in bytes (Linux MemAvailable), None where unknown."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def default_warm_workers(num_slices: int, hosts_per_slice: int, zygote: bool | None = None) -> int:
    """What ``--warm-workers auto`` means here and now (see hotswap.core.warm_policy), for a
    cluster that keeps a zygote or not (None: as auto decides)."""
    memory = available_memory()
    return auto_warm_workers(
        num_slices, hosts_per_slice, memory, MAX_WARM_WORKERS, auto_zygote(memory) if zygote is None else zygote
    )


ZYGOTE_VARIABLE = "HOTSWAP_ZYGOTE"  # whether a new cluster keeps a zygote: auto (the default), 1 or 0
ZYGOTE_SETTINGS = {AUTO: None, "1": True, "0": False}


@dataclasses.dataclass(frozen=True)
class NewClusterDefaults:
    """What a new cluster gets where its creator did not say: ``$HOTSWAP_WARM_WORKERS`` (a
    count or auto) and ``$HOTSWAP_ZYGOTE`` (auto, 1 or 0); unset or empty, auto.

    Read, and a bad value refused naming its variable, before any of the cluster's state exists.
    """

    warm_workers: int | str  # a count, or AUTO
    zygote: bool | None  # None: auto

    @classmethod
    def read(cls) -> NewClusterDefaults:
        warm_workers = parse_warm_workers(os.environ.get(WARM_WORKERS_VARIABLE) or AUTO, WARM_WORKERS_VARIABLE)
        text = os.environ.get(ZYGOTE_VARIABLE) or AUTO
        if text.strip().lower() not in ZYGOTE_SETTINGS:
            raise InvalidInputError(f"{ZYGOTE_VARIABLE} must be auto, 1 or 0, not {text!r}")
        return cls(AUTO if warm_workers is None else warm_workers, ZYGOTE_SETTINGS[text.strip().lower()])

    def keeps_zygote(self) -> bool:
        """Whether a new cluster keeps a zygote (auto: see hotswap.core.warm_policy.auto_zygote)."""
        return self.zygote if self.zygote is not None else auto_zygote(available_memory())

    def settings(
        self, warm_workers: int | str | None, zygote: bool | None, num_slices: int, hosts_per_slice: int,
        current_zygote: bool | None,
    ) -> dict[str, Any]:
        """The spare settings a ``cluster create`` asks the controller for: those given, else
        on a new cluster (``current_zygote`` None; else the zygote it keeps) these defaults;
        ``auto`` counted here and now, the cluster's zygote as one spare."""
        fresh = current_zygote is None
        if zygote is None and fresh:
            zygote = self.keeps_zygote()
        if warm_workers is None and fresh:
            warm_workers = self.warm_workers
        if warm_workers == AUTO:
            warm_workers = default_warm_workers(num_slices, hosts_per_slice, current_zygote if zygote is None else zygote)
        given = {"zygote": zygote, "warm_workers": warm_workers}
        return {key: value for key, value in given.items() if value is not None}


def new_cluster_zygote() -> bool:
    """Whether a cluster created here and now keeps a zygote (zygotes.py)."""
    return NewClusterDefaults.read().keeps_zygote()


def new_cluster_warm_workers(num_slices: int, hosts_per_slice: int) -> int:
    """The spares a cluster created here and now without ``--warm-workers`` keeps."""
    return int(NewClusterDefaults.read().settings(None, None, num_slices, hosts_per_slice, None)["warm_workers"])
