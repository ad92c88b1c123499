"""The dashboard's one reader of a cluster: a thread that looks at it through the
:class:`~hotswap.backends.base.Backend` interface every ``interval_s`` and keeps the page's
latest document (``model.page``) and a version that changes when the document does.

A look that fails (controller gone, database locked, API server unreachable, a cluster not created
yet, being created, deleted or corrupted) keeps the last good data, marked stale with the error's
one line and what the page waits for; the next look tries again, so the page recovers by itself.
Nothing a look or its report raises ends the thread. A local cluster's controller is started
again by the backend itself when a look finds it gone.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from hotswap.api.errors import HotswapError, NotFoundError
from hotswap.backends.base import Backend
from hotswap.dashboard import model
from hotswap.dashboard.history import History

FINISHED = ("SUCCESSFUL", "FAILED")


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def one_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__


class ClusterSource:
    def __init__(
        self, cluster: str, connect: Callable[[], Backend], interval_s: float = 0.5, stale_after_s: float = 3.0,
        log: Callable[[str], None] | None = None,
    ) -> None:
        self.cluster = cluster
        self.log = log or _stderr
        self.connect = connect
        self.interval_s = interval_s
        self.stale_after_s = max(stale_after_s, 3 * interval_s)
        self.history = History()
        self.described: dict[str, dict[str, Any]] = {}
        self.cluster_doc: dict[str, Any] | None = None
        self.rows: list[dict[str, Any]] = []
        self.updated: float | None = None
        self.error: str | None = None
        self.waiting_for: str | None = None  # what the page waits for while a look fails
        self.looks = 0
        self.version = 0
        self.document: dict[str, Any] = {}
        self._text = ""
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._backend: Backend | None = None

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        self.look()  # the first document is ready before the page can ask
        self._thread = threading.Thread(target=self._run, name="hotswap-dashboard-source", daemon=True)
        self._thread.start()

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.look()
            except Exception as error:  # noqa: BLE001 (the page's only reader must outlive any look)
                self._say(f"hotswap dashboard: cluster {self.cluster}: {one_line(error)} (trying again)")

    # ------------------------------------------------------------------ reading

    def snapshot(self) -> tuple[int, str]:
        """The current version and document (as JSON text), refreshed for its age."""
        with self._lock:
            self._render(time.time())
            return self.version, self._text

    def look(self) -> None:
        now = time.time()
        try:
            self._read(now)
        # A user's fault (HotswapError) or an unexpected one: neither may end the page.
        except Exception as error:  # noqa: BLE001
            self._failed(error)
        else:
            if self.error is not None:
                self._say(f"hotswap dashboard: cluster {self.cluster} readable again")
            self.error, self.waiting_for, self.updated = None, None, now
        self.looks += 1
        with self._lock:
            self._render(now)

    def _failed(self, error: BaseException) -> None:
        line = one_line(error)
        self._backend = None  # connect again next time (a new kubeconfig token, a new controller)
        if isinstance(error, NotFoundError) and self.cluster_doc is None:
            self.waiting_for = f"cluster {self.cluster} to be created"
        elif isinstance(error, NotFoundError):
            self.waiting_for = f"cluster {self.cluster} to exist again (deleted?)"
        else:
            self.waiting_for = f"cluster {self.cluster} to be readable again"
        if line != self.error:
            self.error = line
            self._say(f"hotswap dashboard: cluster {self.cluster}: {line} (showing the last data, marked stale; waiting for {self.waiting_for})")

    def _say(self, line: str) -> None:
        """Report a line; a report that fails (the caller's ``log`` reading a cluster half
        created) is dropped, never raised into the look."""
        try:
            self.log(line)
        except Exception:  # noqa: BLE001, S110
            pass

    def _read(self, now: float) -> None:
        backend = self._backend or self.connect()
        self._backend = backend
        cluster_doc = backend.describe_cluster(self.cluster)
        rows = backend.list_workloads(self.cluster, "EVERYTHING", None)
        for row in rows:
            name = row["name"]
            if row["status"] in FINISHED and name in self.described and self.described[name].get("status") in FINISHED:
                continue  # finished and already read in full
            try:
                described = backend.describe_workload(self.cluster, name)
            except HotswapError:
                continue  # deleted between the list and now
            self.described[name] = described
            progress = described.get("progress")
            self.history.take_timeline(name, described.get("timeline") or [], (progress or {}).get("timeline_t"))
            if progress is not None:
                self.history.take_progress(name, progress)
            elif described.get("goodput"):
                self.history.take_saves(name, described["goodput"], now)
            if not self.history.of(name).recorded and row["status"] != "QUEUED":  # no recorded steps: the log's, as seen
                chunks: list[bytes] = []
                try:
                    backend.logs(self.cluster, name, None, 0, False, chunks.append)
                except HotswapError:
                    pass  # no log yet (workers starting)
                else:
                    self.history.take_log(name, b"".join(chunks), now)
        names = {row["name"] for row in rows}
        for gone in set(self.described) - names:
            del self.described[gone]
        self.history.take_goodput(now, [d["goodput"] for d in self.described.values()
                                         if d.get("goodput") and not model.goodput_unknown(d["goodput"])])
        self.cluster_doc, self.rows = cluster_doc, rows

    def _render(self, now: float) -> None:
        document = model.page(
            self.cluster_doc, self.rows, self.described, self.history,
            updated=self.updated, now=now, error=self.error, stale_after_s=self.stale_after_s, waiting_for=self.waiting_for,
        )
        comparable = {k: v for k, v in document.items() if k != "age_s"}
        if comparable != {k: v for k, v in self.document.items() if k != "age_s"}:
            self.version += 1
        self.document = document
        self._text = json.dumps({**document, "version": self.version, "now": now})
