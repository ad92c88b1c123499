"""The worker's end of the channel to the Kubernetes controller: the first process of each
replica (host 0, local rank 0) folds its own goodput events into its replica's record
(:mod:`hotswap.api.worker_report`) and writes it to the replica's Lease, which ``workload
create`` made beforehand and which the workload's ServiceAccount may only read and update
(RBAC ``resourceNames``: these Leases and no other object).

Written with the standard library (no Kubernetes client in the image): a PUT with the
resourceVersion of the last write, as the API server's optimistic concurrency wants; a conflict
(another writer: the previous attempt's pod, still saving as it terminates) reads the Lease,
keeps the other writer's attempts, and writes again. At most one write every heartbeat interval
while only steps happen (the interval the Lease asks for, :func:`~hotswap.api.worker_report.interval_of`,
read from each answer: 10 s, longer in a large cluster; the record says which it keeps), at
once (at most one a second) on anything else, and a last one when the worker ends. A refusal
(403: the RBAC does not allow it; 404: no Lease, a workload of an earlier release) is said once
on stderr and ends publishing: training never waits for, nor fails on, its report.
"""

from __future__ import annotations

import json
import os
import ssl
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any

from hotswap.api.worker import HOTSWAP_ATTEMPT, HOTSWAP_REPORT_LEASES, HOTSWAP_WORKLOAD, JOB_COMPLETION_INDEX, JOB_INDEX, LOCAL_RANK, MEGASCALE_SLICE_ID
from hotswap.api.worker_report import IN_CLUSTER, MIN_PUBLISH_GAP_S, REPORT_ANNOTATION, WorkerReport, decode_report, interval_of, report_name

SERVICE_ACCOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"


def in_cluster_leases(env: Mapping[str, str]) -> str | None:
    """The Leases of the pod's own namespace, on the API server the pod reaches (its service)."""
    host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT", "443")
    try:
        with open(os.path.join(SERVICE_ACCOUNT, "namespace")) as handle:
            namespace = handle.read().strip()
    except OSError:
        return None
    if not host or not namespace:
        return None
    host = f"[{host}]" if ":" in host else host
    return f"https://{host}:{port}/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
TIMEOUT_S = 5.0


class ReportChannel:
    """Publishes one replica's record (see the module)."""

    def __init__(
        self, url: str, attempt: int, replica: int, token_file: str | None, ca_file: str | None,
        clock: Callable[[], float] = time.time, background: bool = True,
    ) -> None:
        """``background``: a thread writes at the bounded rate (False: only :meth:`publish` does)."""
        self.url = url  # the Lease's own URL
        self.clock = clock
        self.attempt = attempt
        self.report = WorkerReport(replica=replica)
        self.token_file = token_file
        self.context = ssl.create_default_context(cafile=ca_file) if ca_file and url.startswith("https") else None
        self.version: str | None = None
        self.lease: dict[str, Any] | None = None
        self.lock = threading.Lock()
        self.due = threading.Event()
        self.closed = False
        self.refused = False
        self.written_at = 0.0
        self.thread = threading.Thread(target=self._run, name="hotswap-report", daemon=True)
        if background:
            self.thread.start()

    @classmethod
    def from_environ(cls, env: Mapping[str, str]) -> ReportChannel | None:
        """The channel of this process, when it is the one that reports for its replica."""
        leases = env.get(HOTSWAP_REPORT_LEASES)
        if leases == IN_CLUSTER:
            leases = in_cluster_leases(env)
        if not leases or env.get(JOB_COMPLETION_INDEX, "0") != "0" or env.get(LOCAL_RANK, "0") != "0":
            return None
        replica = int(env.get(MEGASCALE_SLICE_ID) or env.get(JOB_INDEX) or 0)
        workload = env.get(HOTSWAP_WORKLOAD, "")
        token = os.path.join(SERVICE_ACCOUNT, "token")
        ca = os.path.join(SERVICE_ACCOUNT, "ca.crt")
        return cls(
            f"{leases.rstrip('/')}/{report_name(workload, replica)}", int(env.get(HOTSWAP_ATTEMPT) or 1), replica,
            token if os.path.exists(token) else None, ca if os.path.exists(ca) else None,
        )

    def record(self, record: dict[str, Any]) -> None:
        """One event record of this worker (called by the event log, on any thread)."""
        with self.lock:
            urgent = self.report.fold(record, self.attempt)
        if urgent:
            self.due.set()

    def close(self) -> None:
        """The worker ends: write what is left, briefly."""
        self.closed = True
        self.due.set()
        if self.thread.is_alive():
            self.thread.join(timeout=2 * TIMEOUT_S)
        else:
            self.publish()

    def _run(self) -> None:
        while not self.refused:
            self.due.wait(self.report.interval_s)
            gap = self.written_at + MIN_PUBLISH_GAP_S - self.clock()
            if gap > 0 and not self.closed:
                time.sleep(gap)
            self.due.clear()
            self.publish()
            if self.closed:
                return

    def publish(self) -> None:
        """Write the record once (read and merge first on a conflict, at most twice); nothing
        once refused."""
        for _ in range(0 if self.refused else 3):
            if self.lease is None and not self._read():
                return
            with self.lock:
                self.report.published_at = self.clock()
                body = self._body()
            status, answer = self._call("PUT", body)
            if status == 200:
                self.lease, self.written_at = answer, self.clock()
                self._adopt_interval()
                return
            if status == 409:
                self.lease = None
                continue
            self._refuse(status, answer)
            return

    def _body(self) -> dict[str, Any]:
        lease = dict(self.lease or {})
        meta = dict(lease.get("metadata") or {})
        stored = decode_report((meta.get("annotations") or {}).get(REPORT_ANNOTATION))
        if stored is not None:  # keep what other attempts' pods of this replica wrote
            mine = {a.attempt for a in self.report.attempts}
            others = [a for a in stored.attempts if a.attempt not in mine]
            self.report.attempts = sorted(others + self.report.attempts, key=lambda a: a.attempt)[-16:]
            if max((a.attempt for a in others), default=0) > self.attempt:
                self.report.progress = stored.progress  # a newer attempt's pod reports the progress
        meta["annotations"] = {**(meta.get("annotations") or {}), REPORT_ANNOTATION: self.report.encode()}
        lease["metadata"] = meta
        spec = dict(lease.get("spec") or {})
        spec["renewTime"] = time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime(self.clock()))
        lease["spec"] = spec
        return lease

    def _read(self) -> bool:
        status, answer = self._call("GET", None)
        if status == 200:
            self.lease = answer
            self._adopt_interval()
            return True
        self._refuse(status, answer)
        return False

    def _adopt_interval(self) -> None:
        """Keep the heartbeat interval the Lease asks for (its next write says so)."""
        annotations = ((self.lease or {}).get("metadata") or {}).get("annotations")
        with self.lock:
            self.report.interval_s = interval_of(annotations)

    def _refuse(self, status: int, answer: Any) -> None:
        if status in (403, 404, 401):
            self.refused = True
            why = (answer or {}).get("message") if isinstance(answer, dict) else None
            print(f"hotswap: the replica's report is not published ({status}: {why or 'refused'}); training goes on",
                  file=sys.stderr, flush=True)

    def _call(self, method: str, body: dict[str, Any] | None) -> tuple[int, Any]:
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        if self.token_file:
            try:
                with open(self.token_file) as handle:  # re-read: a projected token rotates
                    headers["Authorization"] = f"Bearer {handle.read().strip()}"
            except OSError:
                pass
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.url, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT_S, context=self.context) as answer:
                return answer.status, json.loads(answer.read() or b"{}")
        except urllib.error.HTTPError as error:
            try:
                return error.code, json.loads(error.read() or b"{}")
            except ValueError:
                return error.code, None
        except (OSError, ValueError):
            return 0, None  # unreachable for now: the next write tries again
