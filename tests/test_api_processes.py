"""One reading of /proc for every room (api/processes.py): a process's start and the boot."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from hotswap.api import processes

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="Linux /proc")


def test_a_process_start_tells_a_live_process_from_an_ended_one() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    ticks = None
    while True:  # until the child is a zombie: ended, not reaped
        with open(f"/proc/{child.pid}/stat", "rb") as stat:
            state = stat.read().rsplit(b")", 1)[1].split()[0]
        if state == b"Z":
            break
        ticks = ticks or processes.start_ticks(child.pid)
        time.sleep(0.01)
    assert ticks is not None and ticks >= processes.start_ticks()  # the child started after this process
    assert processes.start_ticks(child.pid) is None  # a zombie has ended
    child.wait()
    assert processes.start_ticks(child.pid) is None  # gone


def test_this_process_started_before_now_and_the_boot_has_an_id() -> None:
    started = processes.started_at()
    assert started is not None and started <= time.time()
    assert processes.started_at(os.getppid()) is not None and processes.started_at(os.getppid()) <= started + 1.0 / os.sysconf("SC_CLK_TCK")
    assert processes.boot_id()
