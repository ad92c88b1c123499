"""What the workers' records (issue 35 item 3) cost the Kubernetes controller at 1,000 JobSets.
Prints JSON.

Each replica's record as a long run leaves it (500 steps, 5 saves, a restore), one Lease per
replica, as the controller lists them each round; measured, wall time, on this machine:

* ``read_and_judge_ms_p50``: parse every record, note when each was renewed and judge every
  workload's hang, a frozen worker's silence included (what ``controller/training.py`` adds to a
  round when every Lease changed since the last one);
* ``unchanged_read_ms``: the same when no Lease changed (parsed records are kept by
  resourceVersion);
* ``peak_mib``: what that allocates at its peak (tracemalloc); ``list_bytes``: the Leases' JSON;
* ``worker_writes_per_s_steady``: the workers' heartbeats, one per replica per
  ``heartbeat_interval`` of a cluster with as many slices as records (the controller itself
  writes nothing for them).

Two shapes: 1,000 JobSets of 2 replicas (of v6e-16: 8,000 pods) and of 10 single-host
replicas (10,000 pods, 10,000 records).

    python benchmarks/bench_kube_records.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import time
import tracemalloc

from hotswap.api.worker_report import REPORT_ANNOTATION, WorkerReport, heartbeat_interval, report_name
from hotswap.backends.kubernetes import labels
from hotswap.backends.kubernetes.controller.silence import Renewals, allowance_s
from hotswap.backends.kubernetes.worker_reports import rank_progress, reports_by_workload
from hotswap.core.hang import HangLimits, judge, next_deadline

NOW = 1_000_000.0


def leases(jobsets: int, replicas: int) -> list[dict]:
    found = []
    for index in range(jobsets):
        for replica in range(replicas):
            report = WorkerReport(replica=replica)
            t = NOW - 510
            report.fold({"t": t, "kind": "start", "process_t": t - 2}, 1)
            report.fold({"t": t + 1, "kind": "checkpoint_restore", "step": 0, "duration_s": 0.5, "source": "checkpoint"}, 1)
            for step in range(1, 501):
                t += 1.0
                report.fold({"t": t, "kind": "step", "step": step, "duration_s": 0.9, "slices": replicas}, 1)
                if step % 100 == 0:
                    report.fold({"t": t + 0.1, "kind": "checkpoint_save", "step": step, "blocking_s": 0.1}, 1)
            report.published_at = NOW
            found.append({"metadata": {
                "name": report_name(f"w{index:04d}", replica), "resourceVersion": str(len(found) + 1),
                "labels": {labels.WORKLOAD_LABEL: f"w{index:04d}"}, "annotations": {REPORT_ANNOTATION: report.encode()},
            }, "spec": {}})
    return found


def read_and_judge(items: list[dict], parsed: dict | None = None, renewals: Renewals | None = None) -> int:
    hung = 0
    renewals = renewals or Renewals()
    found = reports_by_workload(items, parsed)
    renewals.saw(found, NOW, NOW)
    for workload, reports in found.items():
        for replica, rank, report in rank_progress(reports, 1):
            hung += judge([rank], 0.0, report.published_at, HangLimits()) is not None
            due = next_deadline([rank], rank.last_step_at or report.published_at, HangLimits())
            since = renewals.unrenewed_since(workload, replica, f"{workload}-{replica}")
            hung += due is not None and since is not None and NOW - since > allowance_s(report, due)
    return hung


def measure(jobsets: int, replicas: int, rounds: int) -> dict:
    items = leases(jobsets, replicas)
    tracemalloc.start()
    assert read_and_judge(items) == 0
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        read_and_judge(items)
        times.append(time.perf_counter() - started)
    parsed: dict = {}
    renewals = Renewals()
    read_and_judge(items, parsed, renewals)
    started = time.perf_counter()
    read_and_judge(items, parsed, renewals)
    unchanged = time.perf_counter() - started
    return {
        "jobsets": jobsets, "records": len(items), "list_bytes": sum(len(json.dumps(i)) for i in items),
        "read_and_judge_ms_p50": round(1000 * sorted(times)[len(times) // 2], 1), "unchanged_read_ms": round(1000 * unchanged, 1),
        "peak_mib": round(peak / 2**20, 1), "worker_writes_per_s_steady": round(len(items) / heartbeat_interval(len(items)), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    print(json.dumps([measure(1000, 2, args.rounds), measure(1000, 10, args.rounds)]))


if __name__ == "__main__":
    main()
