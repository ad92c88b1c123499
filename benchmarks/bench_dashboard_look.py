"""The dashboard's own cost of one look at a cluster of many workloads: the source reading a
backend's answers into its history and rendering the page's document (``ClusterSource.look``),
with a backend that answers at once from memory, so the figure is the dashboard's alone (a local
backend's reads add the store's and the events files'). Each workload is a running one with a
timeline, goodput and recorded progress (steps, restores, saves, recoveries) that grow every look.
``--hogs N`` runs N busy processes beside it (a loaded host). Prints JSON.

    python benchmarks/bench_dashboard_look.py --workloads 100 --looks 50 --hogs 2
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import time
from typing import Any

from hotswap.dashboard.source import ClusterSource


def _hog() -> None:
    while True:
        pass


class MemoryBackend:
    name = "memory"

    def __init__(self, workloads: int) -> None:
        self.names = [f"w{i:03d}" for i in range(workloads)]
        self.look = 0

    def describe_cluster(self, cluster: str) -> dict[str, Any]:
        self.look += 1
        return {"name": cluster, "backend": "local", "slices": [
            {"name": f"s{i}", "workload": n, "healthy": True, "nodes": [{"name": f"s{i}-0", "state": "Ready"}]}
            for i, n in enumerate(self.names)]}

    def list_workloads(self, cluster: str, status: str, prefix: str | None) -> list[dict[str, Any]]:
        return [{"name": n, "priority": "medium", "status": "RUNNING", "status_message": "running",
                 "status_time": "2026-11-23T10:00:00Z", "created_time": "2026-11-23T10:00:00Z",
                 "slices": [f"s{i}"], "num_slices": 1, "restarts": 0, "preemptions": 0} for i, n in enumerate(self.names)]

    def describe_workload(self, cluster: str, name: str) -> dict[str, Any]:
        base, k = 1_700_000_000.0, self.look
        timeline = [{"time": "2026-11-23T10:00:00Z", "event": "admit", "message": "admitted"}] * (1 + k // 10)
        return {
            "timeline": timeline,
            "goodput": {"source": "workers", "goodput": 0.8, "wall_s": 100.0 + k, "badput": {"startup": 0.1},
                        "slice_seconds": {"checkpoint_save": 0.1 * k}},
            "progress": {
                "mttr_s": 0.44, "timeline_t": [base + i for i in range(len(timeline))],
                "recoveries": [{"failed_at": base + 5, "recovered_at": base + 5.44, "seconds": 0.44}],
                "restores": [{"t": base + 5.2, "step": 3, "source": "checkpoint", "attempt": 2}],
                "steps": [[base + 0.1 * s, s] for s in range(max(0, 10 * k - 200), 10 * k)],
                "saves": [[base + s, 0.01] for s in range(max(0, k - 200), k)],
            },
        }

    def logs(self, *args: Any) -> None:
        raise AssertionError("a workload with recorded progress is not read from its log")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", type=int, default=100)
    parser.add_argument("--looks", type=int, default=50)
    parser.add_argument("--hogs", type=int, default=0, help="busy processes beside it")
    args = parser.parse_args()
    hogs = [multiprocessing.Process(target=_hog, daemon=True) for _ in range(args.hogs)]
    for hog in hogs:
        hog.start()
    try:
        backend = MemoryBackend(args.workloads)
        source = ClusterSource("bench", lambda: backend, log=lambda line: None)  # type: ignore[arg-type,return-value]
        costs = []
        for _ in range(args.looks):
            start = time.perf_counter()
            source.look()
            costs.append(time.perf_counter() - start)
        size = len(source.snapshot()[1])
    finally:
        for hog in hogs:
            hog.terminate()
    costs.sort()
    print(json.dumps({
        "workloads": args.workloads, "looks": args.looks, "hogs": args.hogs,
        "look_ms_median": round(1000 * statistics.median(costs), 2),
        "look_ms_p95": round(1000 * costs[int(0.95 * (len(costs) - 1))], 2),
        "look_ms_max": round(1000 * costs[-1], 2),
        "document_bytes": size, "error": source.error,
    }))


if __name__ == "__main__":
    main()
