"""Watches that never die: each tells the controller that something changed, and survives every
answer an API server can give.

The events are read as raw JSON lines (the client's own ``Watch`` raises ``KeyError`` on an
``ERROR`` event when not deserializing, and gives up after one 410). Here:

- every event but a BOOKMARK sets ``changed``; the reconcile that follows re-lists the objects;
- the stream resumes from the last resourceVersion seen (bookmarks included), so a closed
  connection loses nothing;
- ``410 Gone`` (the resourceVersion was compacted away) restarts the watch from now and sets
  ``changed``, so the next reconcile re-lists what was missed;
- any other error (an ``ERROR`` event, 403, a missing CRD, a dropped connection, a malformed
  line) is logged once while it lasts and retried with exponential backoff (1 s to 30 s); a
  403 only from the second in a row (a restarted API server refuses for a moment).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

from hotswap.backends.kubernetes import labels
from hotswap.backends.kubernetes.client.calls import ApiCalls

INITIAL_BACKOFF_S = 1.0
MAX_BACKOFF_S = 30.0


class Gone(Exception):
    """410: the resourceVersion is too old; watch again from now."""


class WatchFailed(Exception):
    pass


class Watcher:
    def __init__(
        self,
        kind: str,
        function: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        changed: threading.Event,
        stop: threading.Event,
        timeout_s: int = 300,
        log: Callable[[str], None] | None = None,
    ) -> None:
        self.kind = kind
        self.function = function
        self.args = args
        self.kwargs = kwargs
        self.changed = changed
        self.stop = stop
        self.timeout_s = timeout_s
        self.log = log or (lambda line: None)
        self.resource_version: str | None = None
        self.failures = 0  # consecutive; the backoff grows with them
        self.last_error: str | None = None
        self.forbidden = 0  # consecutive 403s

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                self._stream()
                self._recovered()
            except Gone:
                self.resource_version = None
                self._recovered()
            except Exception as error:  # noqa: BLE001 - a watcher must outlive every error
                self._failed(error)
            self.changed.set()  # whatever happened meanwhile is picked up by a full reconcile

    def _stream(self) -> None:
        from kubernetes.watch.watch import iter_resp_lines

        kwargs = dict(self.kwargs, watch=True, _preload_content=False, timeout_seconds=self.timeout_s, allow_watch_bookmarks=True)
        if self.resource_version is not None:
            kwargs["resource_version"] = self.resource_version
        response = self.function(*self.args, **kwargs)
        try:
            for line in iter_resp_lines(response):
                if self.stop.is_set():
                    return
                self._event(line)
        finally:
            response.close()
            response.release_conn()

    def _event(self, line: str) -> None:
        if not line.strip():
            return
        try:
            event = json.loads(line)
        except ValueError:
            raise WatchFailed(f"malformed watch event {line[:80]!r}") from None
        kind = event.get("type") if isinstance(event, dict) else None
        obj = event.get("object") if isinstance(event, dict) else None
        obj = obj if isinstance(obj, dict) else {}
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise Gone()
            raise WatchFailed(f"{obj.get('code')} {obj.get('reason') or ''}: {obj.get('message') or 'error event'}")
        version = (obj.get("metadata") or {}).get("resourceVersion")
        if isinstance(version, str) and version:
            self.resource_version = version
        if kind != "BOOKMARK":
            self.changed.set()

    def _failed(self, error: Exception) -> None:
        from hotswap.backends.kubernetes.client.connection import api_error

        described = str(error) if isinstance(error, WatchFailed) else api_error(error, f"watch {self.kind}").message
        # A first 403 is retried quietly (a restarted API server refuses for a moment: see
        # FORBIDDEN_RETRY_S); only a 403 that persists is a permission problem worth a line.
        forbidden = getattr(error, "status", None) == 403
        self.forbidden = self.forbidden + 1 if forbidden else 0
        if described != self.last_error and not (forbidden and self.forbidden == 1):
            self.log(f"warning: watch {self.kind}: {described}; retrying with backoff")
            self.last_error = described
        self.failures += 1
        self.resource_version = None
        self.stop.wait(min(INITIAL_BACKOFF_S * 2 ** (self.failures - 1), MAX_BACKOFF_S))

    def _recovered(self) -> None:
        if self.last_error is not None:
            self.log(f"watch {self.kind}: working again")
        self.failures, self.last_error, self.forbidden = 0, None, 0


class Watches(ApiCalls):
    """The watches the controller keeps open, each run by a :class:`Watcher`."""

    def watch_call(self, kind: str, cluster: str) -> tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]:
        """The list call a watch of ``kind`` (nodes, jobsets, pods) streams."""
        calls: dict[str, tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]] = {
            "nodes": (self.core.list_node, (), {}),
            "pods": (self.core.list_namespaced_pod, (self.namespace,), {"label_selector": labels.WORKLOAD_LABEL}),
            "jobsets": (
                self.custom.list_namespaced_custom_object,
                (labels.JOBSET_GROUP, labels.JOBSET_VERSION, self.namespace, labels.JOBSET_PLURAL),
                {"label_selector": self._jobset_selector(cluster)},
            ),
        }
        return calls[kind]

    def watch(
        self, kind: str, cluster: str, changed: threading.Event, stop: threading.Event, timeout_s: int = 300,
        log: Callable[[str], None] | None = None,
    ) -> None:
        """Set ``changed`` whenever an object of ``kind`` changes, until ``stop`` (a
        :class:`Watcher`: it never dies of an error)."""
        function, args, kwargs = self.watch_call(kind, cluster)
        Watcher(kind, function, args, kwargs, changed, stop, timeout_s, log).run()
