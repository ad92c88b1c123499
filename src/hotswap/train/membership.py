"""The elastic membership file, watched cheaply: a ``stat`` per step boundary, a read only when
the controller has replaced the file."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable

from hotswap.api.membership import Membership

POLL_INTERVAL_S = 0.05


class MembershipWatcher:
    def __init__(self, path: str) -> None:
        self.path = path
        self.latest: Membership | None = None
        self._signature: tuple[int, int, int] | None = None

    def poll(self) -> Membership | None:
        """The newest membership published so far (None while there is none)."""
        try:
            status = os.stat(self.path)
        except FileNotFoundError:
            return self.latest
        # The controller replaces the file by rename, so a new version has a new inode.
        signature = (status.st_ino, status.st_mtime_ns, status.st_size)
        if signature != self._signature:
            try:
                with open(self.path) as handle:
                    membership = Membership.from_json(handle.read())
            except (FileNotFoundError, json.JSONDecodeError, KeyError, TypeError, ValueError):
                return self.latest  # caught mid-replace by a non-atomic writer: read it next time
            self._signature = signature
            if self.latest is None or membership.generation >= self.latest.generation:
                self.latest = membership
        return self.latest

    def wait_for(
        self,
        accept: Callable[[Membership], bool],
        timeout_s: float,
        interrupted: Callable[[], bool],
    ) -> Membership | None:
        """Poll until a published membership satisfies ``accept``; None on timeout or when
        ``interrupted()`` says to give up."""
        deadline = time.monotonic() + timeout_s
        while True:
            membership = self.poll()
            if membership is not None and accept(membership):
                return membership
            if interrupted() or time.monotonic() >= deadline:
                return None
            time.sleep(POLL_INTERVAL_S)
