"""What the Kubernetes controller costs as the cluster grows: its rounds, writes and memory. Prints JSON.

The real controller and client against the test world (tests/k8s_fixtures/world: an HTTP API
server in this process and the cluster's controllers on a virtual clock), ``--jobsets`` running
2-slice JobSets of v6e-16 (8 pods each) on 2 node pools each (4 nodes a pool), two pools spare.
Measured:

* ``setup_s``: building that world and running every JobSet (wall time);
* ``controller_ms``: the controller's own work in a steady-state reconcile (one that finds
  nothing to change: what every watch event and every 30 s resync costs): parsing the listed
  objects, building the snapshot and events, the core's ``decide``, planning. p50/p99 over
  ``--rounds``, on objects listed once; ``decide_share`` is the core's part of it;
* ``reconcile_ms``: whole steady rounds, the lists over HTTP included (``--rounds`` / 3 of them,
  one per 30 s resync); ``api_ms``: the list calls of one round alone, for scale only (a Python
  test server on this machine, not GKE's);
* ``steady_writes_per_s``: the controller's writes per second over those rounds (its Lease
  renewals aside; must be 0);
* ``--failures`` nodes of different JobSets fail: ``hotswap_reconcile_ms``, the round that sees
  them; ``failure_writes_per_s``, the controller's writes per second over ``--window`` virtual
  seconds from that round on (rounds at most every 5 s);
* ``round_peak_mib``: the memory one steady round allocates at its peak (tracemalloc: the listed
  objects, the snapshot, the decision, the plan, and the replicas' records);
  ``process_peak_rss_mib``: the whole process's, the world included;
* with the workers' records (issue 35; skipped on a tree without them): one report Lease per
  replica, each holding a realistic record (500 steps, 5 saves, a restore), listed and read into
  hang judgements every round (``report_leases``, included in the times above), and the
  workers' own write rate, one heartbeat per replica per ``PUBLISH_INTERVAL_S``
  (``worker_writes_per_s``, counted apart from the controller's).

``--baseline REV`` measures the controller of git revision REV (its ``src`` exported to a
temporary directory) in this same world, size by size, in a child process.

    python benchmarks/bench_kube_reconcile.py --json [--jobsets 8 32 100] [--baseline 31f8424]
    python benchmarks/bench_kube_reconcile.py --json --jobsets 1000 --rounds 6 --window 30
"""

from __future__ import annotations

import argparse
import copy
import io
import json
import os
import resource
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from k8s_fixtures.scenario import make_controller, make_world, submit  # noqa: E402
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
try:  # the heartbeat interval that grows with the cluster: absent from a tree before it
    from hotswap.api.worker_report import heartbeat_interval  # noqa: E402
except ImportError:
    heartbeat_interval = None  # type: ignore[assignment]


def _heartbeat_s(slices: int) -> float:
    """Each replica's heartbeat interval in a cluster of ``slices`` slices (fixed on older trees)."""
    return heartbeat_interval(slices) if heartbeat_interval is not None else PUBLISH_INTERVAL_S


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


def _running_slice_pods(world) -> int:
    """The workers running, counted in one pass (``scenario.running`` per workload copies every
    pod each time: quadratic at 10,000 pods)."""
    from k8s_fixtures.world.store import PODS

    return sum(
        1 for p in world.store.items(PODS)
        if p["status"].get("phase") == "Running" and "deletionTimestamp" not in p["metadata"]
        and p["metadata"].get("labels", {}).get("jobset.sigs.k8s.io/replicatedjob-name") == "slice"
    )


def _controller_writes(world, mark: int) -> int:
    """The controller's writes since request ``mark``: every write but its own Lease renewal
    (the workers' report Leases are not written through this server in the benchmark)."""
    return len(world.api.writes(mark))


def measure(jobsets: int, rounds: int, failures: int, window_s: float) -> dict:
    setup_started = time.perf_counter()
    # The cluster's controllers act between the controller's rounds (each tick), not after
    # each of its writes: interleaving settles the whole world per write, which is quadratic
    # in the cluster's size and is not what is measured here.
    world = make_world(nodes=pools(2 * jobsets + 2), interleave=False)  # two pools spare for hotswaps
    try:
        controller = make_controller(world)
        for index in range(jobsets):
            submit(world, f"w{index:04d}", "high", 2)
        wanted = jobsets * 8
        deadline = world.clock.now + 900
        while _running_slice_pods(world) < wanted and world.clock.now < deadline:
            world.advance(1, controller)
        assert _running_slice_pods(world) == wanted, (_running_slice_pods(world), wanted)
        world.advance(5, controller)
        if TrainingRecords is not None:
            _report_leases(world, jobsets, 2 * jobsets + 2)
        setup_s = time.perf_counter() - setup_started
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
        # The steady state: whole rounds (lists over HTTP included), one per 30 s resync,
        # nothing to change; every write the controller makes is counted.
        mark = len(world.api.requests)
        full = []
        for _ in range(max(2, rounds // 3)):
            world.clock.now += world.resync_s
            started = time.perf_counter()
            controller.reconcile()
            full.append(time.perf_counter() - started)
            world.settle()
        steady_writes = _controller_writes(world, mark)
        steady_s = len(full) * world.resync_s
        # ``failures`` nodes die, each in another workload's slice (a spare pool takes two of
        # them; the others wait for a pool): the controller's writes over the window after.
        victims = [world.nodes_of_pool(world.pools_of(f"w{i:04d}")[0])[0] for i in range(min(failures, jobsets))]
        for node in victims:
            world.fail_node(node)
        world.advance(world.nodes.grace_s + 1)
        mark = len(world.api.requests)
        started = time.perf_counter()
        operations = controller.reconcile()
        hotswap_s = time.perf_counter() - started
        world.settle()
        world.advance(window_s, controller, step=5.0)  # at most one round per 5 s: the rate counts writes, not rounds
        failure_writes = _controller_writes(world, mark)
        return {
            "jobsets": jobsets,
            "nodes": (2 * jobsets + 2) * 4,
            "pods": wanted,
            "setup_s": round(setup_s, 1),
            "controller_ms": {"p50": round(1000 * statistics.median(own), 2), "p99": round(1000 * _p99(own), 2)},
            "decide_share": round(statistics.median(decide_s) / statistics.median(own), 3),
            "reconcile_ms": {"p50": round(1000 * statistics.median(full), 1), "p99": round(1000 * _p99(full), 1), "rounds": len(full)},
            "api_ms": round(1000 * api_s, 1),
            "steady_writes_per_s": round(steady_writes / steady_s, 3),
            "node_failures": len(victims),
            "hotswap_reconcile_ms": round(1000 * hotswap_s, 1),
            "hotswap_operations": len(operations),
            "failure_writes_per_s": round(failure_writes / window_s, 2),
            "failure_writes": failure_writes,
            "round_peak_mib": round(peak / 2**20, 1),
            "process_peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            "report_leases": len(lists["leases"]),
            "worker_writes_per_s": round(len(lists["leases"]) / _heartbeat_s(2 * jobsets + 2), 1) if TrainingRecords is not None else 0,
        }
    finally:
        world.close()


def baseline_source(revision: str, keep: list[tempfile.TemporaryDirectory]) -> tuple[str, str]:
    """(the ``src`` directory of git ``revision`` of this repository, exported into a temporary
    directory kept until the run ends; the revision's short name)."""
    repo = Path(__file__).resolve().parents[1]
    short = subprocess.run(["git", "rev-parse", "--short", revision], cwd=repo, capture_output=True, text=True, check=True).stdout.strip()
    temp = tempfile.TemporaryDirectory(prefix="bench-kube-baseline-")
    keep.append(temp)
    archive = subprocess.run(["git", "archive", revision, "src"], cwd=repo, capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(temp.name, filter="data")
    return str(Path(temp.name) / "src"), short


def run_baseline(source: str, jobsets: int, args: argparse.Namespace) -> dict:
    """This benchmark and this test world, with the controller of ``source`` (a separate
    process: one interpreter imports one ``hotswap``)."""
    command = [sys.executable, __file__, "--json", "--jobsets", str(jobsets), "--rounds", str(args.rounds),
               "--failures", str(args.failures), "--window", str(args.window)]
    env = {**os.environ, "PYTHONPATH": source}
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout)["results"][0]


def _report_leases(world, workloads: int, slices: int) -> None:
    """One Lease per replica with a record as a long run leaves it (written into the world's
    store directly: what is measured is the controller's list and read), asking for the heartbeat
    interval of the cluster's ``slices`` slices as `workload create` would (a controller that
    keeps the interval patches none of them in the steady state measured)."""
    from k8s_fixtures.world.store import LEASES

    interval = _heartbeat_s(slices)

    for index in range(workloads):
        name = f"w{index:04d}"
        for replica in range(2):
            report = WorkerReport(replica=replica)
            report.interval_s = interval
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
                "annotations": {"hotswap.dev/report": report.encode(), "hotswap.dev/report-interval-s": f"{interval:g}"}}, "spec": {}})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobsets", type=int, nargs="*", default=[8, 32, 100], help="running 2-slice JobSets (8 pods each)")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--failures", type=int, default=5, help="nodes failed after the steady state")
    parser.add_argument("--window", type=float, default=120.0, help="virtual seconds the write rates are counted over")
    parser.add_argument("--baseline", help="a git revision: its controller measured in the same run, in this world")
    parser.add_argument("--json", action="store_true", help="print JSON only")
    args = parser.parse_args()
    keep: list[tempfile.TemporaryDirectory] = []
    source, name = baseline_source(args.baseline, keep) if args.baseline else (None, None)
    results = []
    for count in args.jobsets:
        result = measure(count, args.rounds, args.failures, args.window)
        if source is not None:
            result["baseline"] = run_baseline(source, count, args)
        results.append(result)
        if not args.json:
            print(json.dumps(result), file=sys.stderr, flush=True)
    document = {"machine": f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}", "baseline": name, "results": results}
    print(json.dumps(document, indent=None if args.json else 2))


if __name__ == "__main__":
    main()
