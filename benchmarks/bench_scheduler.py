"""How fast the scheduling core decides, from 1,000 to 100,000 slices. Prints JSON.

At each size (default 1,000, 10,000 and 100,000 slices of v6e-16, i.e. 4,000 to 400,000
nodes), two measurements:

* hotswap decision: running workloads of 5 slices fill the cluster (one per 5 slices: 2,000 at
  10,000 slices; five priority levels, a quarter elastic); one node under a running very-high
  workload fails and the core decides the replacement (preempting or shrinking lower-priority
  work). Repeated on the same snapshot, a different victim node each time; p50/p99 of the wall
  time of ``decide``.
* admissions: queued workloads (one per 10 slices, 1 to 10 slices each) on the empty cluster
  are admitted in one round; the round's time and admissions per second.

The core's cost should follow what a round changes, not the cluster: 100,000 slices should cost
no more than 3x 10,000.

    python benchmarks/bench_scheduler.py --json
    python benchmarks/bench_scheduler.py --json --sizes 10000,100000 --baseline 31f8424

``--baseline`` (another version's src directory, or a git revision of this repository) measures
that version too, each size in a fresh process per version, alternating, and reports the ratios
of CPU per admission and of the decisions' CPU p99 (this one / baseline), and whether both
versions decided alike (``actions_digest``: every action of every measured round). The
admission round is timed ``--admission-rounds`` times on the same snapshot; the least CPU counts.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import itertools
import json
import os
import pathlib
import random
import statistics
import subprocess
import sys
import tempfile
import time

from hotswap.api.catalog import get_device_type
from hotswap.api.cluster import node_name, slice_name
from hotswap.api.phases import WorkloadPhase
from hotswap.api.spec import workload_spec
from hotswap.core import actions as act
from hotswap.core import events as ev
from hotswap.core.model import Node, Slice, Snapshot
from hotswap.core.workload import Workload
from hotswap.core.scheduler import decide

DEVICE = "v6e-16"
PRIORITIES = ["very-low", "low", "medium", "high", "very-high"]


def cluster(slices: int) -> tuple[list[Slice], list[Node]]:
    hosts = get_device_type(DEVICE).hosts_per_slice
    slice_records, node_records = [], []
    for i in range(slices):
        name = slice_name("bench", i)
        nodes = tuple(node_name(name, h) for h in range(hosts))
        slice_records.append(Slice(name, DEVICE, nodes, i))
        node_records.extend(Node(n, name, h) for h, n in enumerate(nodes))
    return slice_records, node_records


def full_cluster(slices: int, workloads: int, rng: random.Random) -> Snapshot:
    slice_records, node_records = cluster(slices)
    per = slices // workloads
    records = []
    for i in range(workloads):
        elastic = i % 4 == 0
        spec = workload_spec(
            name=f"w{i}",
            command="train",
            device_type=DEVICE,
            num_slices=per,
            min_slices=per - 2 if elastic else None,
            priority=PRIORITIES[i % len(PRIORITIES)],
        )
        held = tuple(slice_records[i * per + k].name for k in range(per))
        records.append(
            Workload(
                spec=spec,
                seq=i,
                created_at=0.0,
                phase=WorkloadPhase.RUNNING,
                slices=held,
                attempt=1,
                running_since=rng.uniform(0, 3600),
                last_checkpoint_at=rng.uniform(0, 3600),
            )
        )
    return Snapshot.build(3600.0, slice_records, node_records, records)


def bench_hotswap(
    slices: int, workloads: int, repeats: int, rng: random.Random, digest: hashlib._Hash
) -> tuple[list[float], list[float], int]:
    """Wall and CPU seconds of each decision, and how many restarted the failed workload."""
    snapshot = full_cluster(slices, workloads, rng)
    # The snapshot lives for the whole run, as a controller's does: keep the collector from
    # rescanning its half million records at every full collection (a pause that belongs to
    # the benchmark's set-up, not to the decision that happens to trigger it).
    gc.collect()
    gc.freeze()
    top = [w for w in snapshot.workloads.values() if w.priority.label == "very-high"]
    wall, cpu = [], []
    replaced = 0
    for _ in range(repeats):
        victim = rng.choice(top)
        failed = snapshot.slices[rng.choice(victim.slices)].nodes[0]
        started, started_cpu = time.perf_counter(), time.process_time()
        decision = decide(snapshot, [ev.NodeFailed(failed)], 3700.0)
        cpu.append(time.process_time() - started_cpu)
        wall.append(time.perf_counter() - started)
        digest.update(repr(decision.actions).encode())
        if any(isinstance(a, act.Restart) and a.workload == victim.name for a in decision.actions):
            replaced += 1
    gc.unfreeze()
    return wall, cpu, replaced


def bench_admission(
    slices: int, queued: int, rng: random.Random, rounds: int, digest: hashlib._Hash
) -> tuple[float, float, int]:
    """Wall and CPU seconds of the round that admits the queue (the least of ``rounds`` on the
    same snapshot), and how many it admitted."""
    slice_records, node_records = cluster(slices)
    records = []
    for i in range(queued):
        spec = workload_spec(
            name=f"q{i}", command="train", device_type=DEVICE, num_slices=rng.randint(1, 10),
            priority=rng.choice(PRIORITIES),
        )
        records.append(Workload(spec=spec, seq=i, created_at=0.0))
    snapshot = Snapshot.build(0.0, slice_records, node_records, records)
    # A new slice starts a scheduling round over the whole queue.
    added = ev.SliceAdded("extra", DEVICE, ("extra-0", "extra-1", "extra-2", "extra-3"))
    elapsed = cpu = float("inf")
    for _ in range(max(1, rounds)):
        gc.collect()
        started, started_cpu = time.perf_counter(), time.process_time()
        decision = decide(snapshot, [added], 1.0)
        cpu = min(cpu, time.process_time() - started_cpu)
        elapsed = min(elapsed, time.perf_counter() - started)
    digest.update(repr(decision.actions).encode())
    admitted = sum(1 for a in decision.actions if isinstance(a, act.Admit))
    return elapsed, cpu, admitted


def _percentiles(seconds: list[float]) -> dict[str, float]:
    ms = sorted(t * 1000.0 for t in seconds)
    return {
        "p50": round(statistics.median(ms), 3),
        "p99": round(statistics.quantiles(ms, n=100, method="inclusive")[98], 3),
    }


def measure(slices: int, repeats: int, rng: random.Random, rounds: int = 5) -> dict:
    workloads, queued = slices // 5, slices // 10
    digest = hashlib.sha256()
    wall, cpu, replaced = bench_hotswap(slices, workloads, repeats, rng, digest)
    elapsed, cpu_s, admitted = bench_admission(slices, queued, rng, rounds, digest)
    return {
        "slices": slices,
        "workloads": workloads,
        # Wall time includes the moments other processes on the machine run instead of this
        # one; CPU time is what the decision itself costs.
        "hotswap_decision_ms": _percentiles(wall),
        "hotswap_decision_cpu_ms": _percentiles(cpu),
        "hotswap_decisions": len(wall),
        "hotswap_replaced": replaced,
        "queued": queued,
        "admitted": admitted,
        "admission_round_ms": round(elapsed * 1000.0, 3),
        "admission_round_cpu_ms": round(cpu_s * 1000.0, 3),
        "admissions_per_s": round(admitted / elapsed, 1),
        "admissions_per_cpu_s": round(admitted / cpu_s, 1),
        "actions_digest": digest.hexdigest()[:16],
        "admissions_per_cpu_s": round(admitted / cpu_s, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1000,10000,100000", help="slice counts, comma-separated")
    parser.add_argument("--repeats", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--admission-rounds", type=int, default=5, help="timings of the admission round; the least counts")
    parser.add_argument("--json", action="store_true", help="print only the JSON result")
    parser.add_argument("--baseline", help="another version to measure alongside: its src/ directory or a git revision")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        rng = random.Random(f"{args.seed}:{args.child}")
        print(json.dumps(measure(args.child, args.repeats, rng, args.admission_rounds)))
        return
    from bench_simulate import baseline_source  # (this directory's: the same export of a revision)

    temporary: list[tempfile.TemporaryDirectory] = []
    baseline, baseline_name = baseline_source(args.baseline, temporary) if args.baseline else (None, None)
    ours = str(pathlib.Path(__file__).resolve().parents[1] / "src")

    def run(slices: int, source: str) -> dict:
        command = [sys.executable, __file__, "--child", str(slices), "--repeats", str(args.repeats), "--seed",
                   str(args.seed), "--admission-rounds", str(args.admission_rounds)]
        env = dict(os.environ, PYTHONPATH=source)
        return json.loads(subprocess.run(command, capture_output=True, text=True, check=True, env=env).stdout)

    results = []
    for slices in (int(s) for s in args.sizes.split(",")):
        result = run(slices, ours)
        if baseline is not None:
            base = run(slices, baseline)
            result["baseline"] = {key: base[key] for key in (
                "hotswap_decision_ms", "hotswap_decision_cpu_ms", "admission_round_cpu_ms", "admissions_per_cpu_s",
                "actions_digest")}
            result["admissions_per_cpu_s_ratio_to_baseline"] = round(
                result["admissions_per_cpu_s"] / base["admissions_per_cpu_s"], 3)
            result["hotswap_cpu_p99_ratio_to_baseline"] = round(
                result["hotswap_decision_cpu_ms"]["p99"] / base["hotswap_decision_cpu_ms"]["p99"], 3)
            result["same_decisions_as_baseline"] = result["actions_digest"] == base["actions_digest"]
        results.append(result)
        if not args.json:
            print(
                f"{slices:>7} slices / {result['workloads']} workloads: hotswap decision p50"
                f" {result['hotswap_decision_ms']['p50']} ms, p99 {result['hotswap_decision_ms']['p99']} ms"
                f" (CPU p99 {result['hotswap_decision_cpu_ms']['p99']} ms);"
                f" {result['admitted']} of {result['queued']} admitted in {result['admission_round_ms']} ms"
                f" (CPU {result['admission_round_cpu_ms']} ms)"
            )
    ratios = [
        {
            "slices": f"{a['slices']}->{b['slices']}",
            "hotswap_p50": round(b["hotswap_decision_ms"]["p50"] / a["hotswap_decision_ms"]["p50"], 2),
            "hotswap_p99": round(b["hotswap_decision_ms"]["p99"] / a["hotswap_decision_ms"]["p99"], 2),
            "hotswap_cpu_p99": round(b["hotswap_decision_cpu_ms"]["p99"] / a["hotswap_decision_cpu_ms"]["p99"], 2),
            "per_admission_cpu": round(
                (b["admission_round_cpu_ms"] / b["admitted"]) / (a["admission_round_cpu_ms"] / a["admitted"]), 2
            ),
        }
        for a, b in itertools.pairwise(results)
    ]
    document = {"load_average": [round(x, 2) for x in os.getloadavg()], "runs": results, "ratios": ratios}
    if baseline_name is not None:
        document["baseline"] = baseline_name
    print(json.dumps(document))


if __name__ == "__main__":
    main()
