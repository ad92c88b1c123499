"""Failover time of the local backend: node failure -> replacement workers started. Prints JSON.

A cluster of 3 slices (``--device-type``, default v6e-4: 1 host per slice) runs a low-priority
workload on 1 slice and a high-priority one on 2, both tiny Python workers that write the time
they started. Each run fails a node under the high workload and measures, from the moment the
failure is submitted to the controller, until every replacement worker has started running
its script (its own timestamp). Then it repairs the node and waits for the low workload to run
again before the next run.

    python benchmarks/bench_local.py --json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import textwrap
import time
from pathlib import Path

WORKER = textwrap.dedent(
    """
    import os, sys, time
    stamp = time.time()
    name = "%s-%s-%s-%s" % (os.environ["HOTSWAP_WORKLOAD"], os.environ["HOTSWAP_ATTEMPT"], os.environ["JOB_INDEX"], os.environ["JOB_COMPLETION_INDEX"])
    with open(os.path.join(os.environ["MARKS"], name), "w") as f:
        f.write(repr(stamp))
    time.sleep(3600)
    """
)


def wait_for(predicate, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError("benchmark condition not reached")
        time.sleep(0.005)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--device-type", default="v6e-4")
    parser.add_argument("--json", action="store_true", help="print only the JSON result")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="hotswap-bench-") as scratch:
        root = Path(scratch)
        os.environ["HOTSWAP_HOME"] = str(root / "state")
        marks = root / "marks"
        marks.mkdir()
        script = root / "worker.py"
        script.write_text(WORKER)

        from hotswap.api.spec import workload_spec
        from hotswap.api.launch import Launch
        from hotswap.backends.local.commands import client
        from hotswap.backends.local.commands import clusters as cluster_commands
        from hotswap.backends.local.commands import workloads as workload_commands
        from hotswap.backends.local.queries import workloads as workload_queries
        from hotswap.backends.local.requests import ChangeNodes, NodeOperation
        from hotswap.store import registry

        cluster = "bench"
        cluster_commands.create_cluster(cluster, args.device_type, 3, force=True, confirm=lambda _: True)
        paths = registry.existing(cluster)
        launch = Launch(environ=dict(os.environ), cwd=str(root), checkpoint_dir=str(root / "ckpt"))
        command = f"{sys.executable} {script}"
        for name, priority, slices in (("low", "low", 1), ("high", "high", 2)):
            spec = workload_spec(
                name=name, command=command, device_type=args.device_type, num_slices=slices, priority=priority,
                env={"MARKS": str(marks)},
            )
            workload_commands.create_workload(cluster, spec, launch)

        def record(name: str) -> dict:
            return next(v for v in workload_queries.list_workloads(cluster) if v["name"] == name)

        def started(name: str, attempt: int) -> list[float]:
            hosts = len(list(marks.glob(f"{name}-1-0-*"))) or 1
            stamps = [float(p.read_text()) for p in marks.glob(f"{name}-{attempt}-*") if p.read_text()]
            return stamps if len(stamps) == hosts * record(name)["num_slices"] else []

        failover_ms, decision_ms = [], []
        try:
            for _ in range(args.runs):
                high = wait_for(lambda: record("high")["status"] == "RUNNING" and started("high", record("high")["attempt"]) and record("high"))
                wait_for(lambda: record("low")["status"] == "RUNNING" and started("low", record("low")["attempt"]))
                node = f"{high['slices'][0]}-0"
                t0 = time.time()
                outcome = client.request(paths, ChangeNodes(NodeOperation.FAIL, (node,)))
                decided = time.time()
                assert outcome.status == "done", outcome.message
                attempt = high["attempt"] + 1
                stamps = wait_for(lambda: started("high", attempt))
                failover_ms.append((max(stamps) - t0) * 1000.0)
                decision_ms.append((decided - t0) * 1000.0)
                client.request(paths, ChangeNodes(NodeOperation.UNCORDON, (node,)))
        finally:
            cluster_commands.delete_cluster(cluster)

    ordered = sorted(failover_ms)
    result = {
        "failover_ms": {
            "p50": round(statistics.median(ordered), 1),
            "p99": round(statistics.quantiles(ordered, n=100, method="inclusive")[98], 1) if len(ordered) > 1 else round(ordered[0], 1),
        },
        "decision_committed_ms": {"p50": round(statistics.median(decision_ms), 1)},
        "runs": len(ordered),
        "device_type": args.device_type,
    }
    if not args.json:
        print(f"node failure -> replacement workers running, over {len(ordered)} runs:", end=" ")
        print(f"p50 {result['failover_ms']['p50']} ms, p99 {result['failover_ms']['p99']} ms")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
