"""What one reconcile of the Kubernetes controller costs as the cluster grows. Prints JSON.

The real controller and client against the test world (tests/k8s_fixtures/world: an HTTP API
server in this process), ``--pools`` v6e-16 node pools (4 nodes each) and one running 2-slice
workload per two pools (two pools left spare). Measured, wall time:

* ``controller_ms``: the controller's own work in a steady-state reconcile (one that finds
  nothing to change: what every watch event and every 30 s resync costs): parsing the listed
  objects, building the snapshot and events, the core's ``decide``, planning. p50/p99 over
  ``--rounds``, on objects listed once; ``decide_share`` is the core's part of it;
* ``api_ms``: the five list calls of a reconcile against the world's API server, for scale
  only (a Python test server on this machine, not GKE's);
* ``steady_writes``: write calls of a steady reconcile (must be 0);
* ``hotswap_reconcile_ms``: the whole reconcile that sees a failed node and restarts a workload;
* ``round_peak_mib``: the memory one steady round allocates at its peak (tracemalloc: the listed
  objects, the snapshot, the decision, the plan, and the replicas' records);
* with the workers' records (issue 35; skipped on a tree without them): one report Lease per
  replica, each holding a realistic record (500 steps, 5 saves, a restore), listed and read into
  hang judgements every round (``report_leases``, included in the times above), and the steady
  write rate of the workers' heartbeats, one per replica per ``PUBLISH_INTERVAL_S``
  (``worker_writes_per_s``; the controller's own stays 0).

    python benchmarks/bench_kube_reconcile.py --json [--pools 16 64 256] [--rounds 30]
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from k8s_fixtures.scenario import make_controller, make_world, running, submit  # noqa: E402
from k8s_fixtures.world import load_nodes  # noqa: E402

from hotswap.backends.kubernetes import labels  # noqa: E402
from hotswap.backends.kubernetes.observation import observe  # noqa: E402
from hotswap.backends.kubernetes.planning import plan  # noqa: E402
from hotswap.core.effects import effects_of  # noqa: E402
from hotswap.core.scheduler import decide  # noqa: E402

try:  # the workers' records (issue 35 item 3): absent from a tree before them
    from hotswap.api.worker_report import PUBLISH_INTERVAL_S, WorkerReport, report_name  # noqa: E402
    from hotswap.backends.kubernetes.controller.training import TrainingRecords  # noqa: E402
except ImportError:
    TrainingRecords = None  # type: ignore[assignment,misc]


def _p99(values: list[float]) -> float:
    return sorted(values)[min(len(values) - 1, int(0.99 * len(values)))]


def pools(count: int) -> list[dict]:
    template = [n for n in load_nodes() if n["metadata"]["labels"].get("cloud.google.com/gke-nodepool") == "tpu-v6e-np-0"]
    nodes = []
    for pool in range(count):
        for host, original in enumerate(template):
            node = copy.deepcopy(original)
            name = f"gke-tpu-bench-{pool:04d}-{host}"
            node["metadata"]["name"] = node["metadata"]["labels"]["kubernetes.io/hostname"] = name
            node["metadata"]["labels"]["cloud.google.com/gke-nodepool"] = f"tpu-bench-{pool:04d}"
            nodes.append(node)
    return nodes


def measure(pool_count: int, rounds: int) -> dict:
    world = make_world(nodes=pools(pool_count))
    try:
        controller = make_controller(world)
        workloads = pool_count // 2 - 1  # leave two pools spare for the hotswap
        for index in range(workloads):
            submit(world, f"w{index:04d}", "high", 2)
        deadline = world.clock.now + 600
        while sum(running(world, f"w{i:04d}") for i in range(workloads)) < workloads * 8 and world.clock.now < deadline:
            world.advance(1, controller)
        world.advance(5, controller)
        if TrainingRecords is not None:
            _report_leases(world, workloads)
        client = controller.client
        started = time.perf_counter()
        lists = {
            "nodes": client.list_nodes(),
            "jobsets": client.list_jobsets("c"),
            "jobs": client.list_jobs(),
            "pods": client.list_pods(labels.WORKLOAD_LABEL),
            "others": client.list_unfinished_pods(),
            "leases": client.list_report_leases() if TrainingRecords is not None else [],
        }
        api_s = time.perf_counter() - started
        own, decide_s = [], []
        peak = 0
        for index in range(rounds):
            if index == 0:
                tracemalloc.start()
            started = time.perf_counter()
            observation = observe(lists["nodes"], lists["jobsets"], lists["jobs"], lists["pods"], controller.settings, "c",
                                  world.clock.now, others=lists["others"])
            if TrainingRecords is not None:
                hangs = TrainingRecords(lambda: lists["leases"]).read(observation)
                assert hangs == [], hangs
            before_decide = time.perf_counter()
            decision = decide(observation.snapshot, observation.events, observation.now, controller.config)
            decide_s.append(time.perf_counter() - before_decide)
            operations = plan(observation, decision, effects_of(decision.actions))
            own.append(time.perf_counter() - started)
            if index == 0:
                peak = tracemalloc.get_traced_memory()[1]
                tracemalloc.stop()
                own.pop()  # (tracing slows it: not a timing)
                decide_s.pop()
            assert operations == [], operations
        mark = len(world.api.requests)
        controller.reconcile()
        steady_writes = len(world.api.writes(mark))
        world.fail_node(world.nodes_of_pool(world.pools_of("w0000")[0])[0])
        world.advance(world.nodes.grace_s + 1)
        started = time.perf_counter()
        operations = controller.reconcile()
        hotswap_s = time.perf_counter() - started
        return {
            "pools": pool_count,
            "nodes": pool_count * 4,
            "running_workloads": workloads,
            "pods": workloads * 8,
            "controller_ms": {"p50": round(1000 * statistics.median(own), 2), "p99": round(1000 * _p99(own), 2)},
            "decide_share": round(statistics.median(decide_s) / statistics.median(own), 3),
            "api_ms": round(1000 * api_s, 1),
            "steady_writes": steady_writes,
            "hotswap_reconcile_ms": round(1000 * hotswap_s, 1),
            "hotswap_operations": len(operations),
            "round_peak_mib": round(peak / 2**20, 1),
            "report_leases": len(lists["leases"]),
            "worker_writes_per_s": round(len(lists["leases"]) / PUBLISH_INTERVAL_S, 1) if TrainingRecords is not None else 0,
        }
    finally:
        world.close()


def _report_leases(world, workloads: int) -> None:
    """One Lease per replica with a record as a long run leaves it (written into the world's
    store directly: what is measured is the controller's list and read)."""
    from k8s_fixtures.world.store import LEASES

    for index in range(workloads):
        name = f"w{index:04d}"
        for replica in range(2):
            report = WorkerReport(replica=replica)
            t = world.clock.now - 510  # its last step a few seconds before its last write
            report.fold({"t": t, "kind": "start", "process_t": t - 2}, 1)
            report.fold({"t": t + 1, "kind": "checkpoint_restore", "step": 0, "duration_s": 0.5}, 1)
            for step in range(1, 501):
                t += 1.0
                report.fold({"t": t, "kind": "step", "step": step, "duration_s": 0.9, "slices": 2}, 1)
                if step % 100 == 0:
                    report.fold({"t": t + 0.1, "kind": "checkpoint_save", "step": step, "blocking_s": 0.1}, 1)
            report.published_at = world.clock.now
            world.store.create(LEASES, {"metadata": {
                "name": report_name(name, replica), "namespace": world.namespace, "labels": {labels.WORKLOAD_LABEL: name},
                "annotations": {"hotswap.dev/report": report.encode()}}, "spec": {}})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pools", type=int, nargs="*", default=[16, 64, 256])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--json", action="store_true", help="print JSON only")
    args = parser.parse_args()
    results = [measure(count, args.rounds) for count in args.pools]
    print(json.dumps(results, indent=None if args.json else 2))


if __name__ == "__main__":
    main()
