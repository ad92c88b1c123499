"""How fast the scheduling core decides, at data-centre scale. Prints JSON.

Two measurements on one cluster of 10,000 slices (v6e-16: 40,000 nodes):

* hotswap decision: 2,000 running workloads of 5 slices fill the cluster (five priority
  levels, some elastic); one node under a running very-high workload fails and the core decides
  the replacement (preempting lower-priority work). Repeated on fresh copies of the same
  snapshot, a different victim node each time; p50/p99 of the wall time of ``decide``.
* admissions: 1,000 queued workloads (1 to 10 slices each) on the empty cluster are admitted
  in one round; admissions per second of that round.

    python benchmarks/bench_scheduler.py --json
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

from hotswap.api.catalog import get_device_type
from hotswap.api.cluster import node_name, slice_name
from hotswap.api.phases import WorkloadPhase
from hotswap.api.spec import workload_spec
from hotswap.core import actions as act
from hotswap.core import events as ev
from hotswap.core.model import Node, Slice, Snapshot, Workload
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


def bench_hotswap(slices: int, workloads: int, repeats: int, rng: random.Random) -> tuple[list[float], int]:
    snapshot = full_cluster(slices, workloads, rng)
    top = [w for w in snapshot.workloads.values() if w.priority.label == "very-high"]
    times = []
    replaced = 0
    for _ in range(repeats):
        victim = rng.choice(top)
        failed = snapshot.slices[rng.choice(victim.slices)].nodes[0]
        started = time.perf_counter()
        decision = decide(snapshot, [ev.NodeFailed(failed)], 3700.0)
        times.append(time.perf_counter() - started)
        if any(isinstance(a, act.Restart) and a.workload == victim.name for a in decision.actions):
            replaced += 1
    return times, replaced


def bench_admission(slices: int, queued: int, rng: random.Random) -> tuple[float, int]:
    slice_records, node_records = cluster(slices)
    records = []
    for i in range(queued):
        spec = workload_spec(
            name=f"q{i}", command="train", device_type=DEVICE, num_slices=rng.randint(1, 10),
            priority=rng.choice(PRIORITIES),
        )
        records.append(Workload(spec=spec, seq=i, created_at=0.0))
    snapshot = Snapshot.build(0.0, slice_records, node_records, records)
    # Any cluster event starts a round; a repair of a healthy node changes nothing else.
    started = time.perf_counter()
    decision = decide(snapshot, [ev.NodeRepaired(node_records[0].name), ev.SliceAdded("extra", DEVICE, ("extra-0", "extra-1", "extra-2", "extra-3"))], 1.0)
    elapsed = time.perf_counter() - started
    admitted = sum(1 for a in decision.actions if isinstance(a, act.Admit))
    return elapsed, admitted


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--slices", type=int, default=10_000)
    parser.add_argument("--workloads", type=int, default=2_000)
    parser.add_argument("--queued", type=int, default=1_000)
    parser.add_argument("--repeats", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print only the JSON result")
    args = parser.parse_args()
    rng = random.Random(args.seed)

    times, replaced = bench_hotswap(args.slices, args.workloads, args.repeats, rng)
    elapsed, admitted = bench_admission(args.slices, args.queued, rng)
    ms = sorted(t * 1000.0 for t in times)
    result = {
        "slices": args.slices,
        "workloads": args.workloads,
        "hotswap_decision_ms": {
            "p50": round(statistics.median(ms), 3),
            "p99": round(statistics.quantiles(ms, n=100, method="inclusive")[98], 3),
        },
        "hotswap_decisions": len(times),
        "hotswap_replaced": replaced,
        "queued": args.queued,
        "admitted": admitted,
        "admission_round_ms": round(elapsed * 1000.0, 3),
        "admissions_per_s": round(admitted / elapsed, 1),
    }
    if not args.json:
        print(f"hotswap decision over {args.slices} slices / {args.workloads} workloads:", end=" ")
        print(f"p50 {result['hotswap_decision_ms']['p50']} ms, p99 {result['hotswap_decision_ms']['p99']} ms")
        print(f"admitted {admitted} of {args.queued} queued in {result['admission_round_ms']} ms")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
