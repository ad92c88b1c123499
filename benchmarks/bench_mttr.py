"""MTTR of a real PyTorch job on the local backend: hotswap with a cold restart, hotswap onto
warm spare workers, and waiting for the repair (no hotswap). Prints JSON.

MTTR here is what the demo reports: from the node failure to the first training step the
restarted job completes, read from the training processes' own records. A low-priority job on
a third slice gives hotswap somewhere to go. Each mode runs ``--runs`` failures; the median is
reported. The wait-for-repair baseline repairs the node after ``--repair-s`` seconds (GKE's
repair takes about 600 s; the default here keeps the benchmark short, and the result scales:
MTTR = repair time + restart).

    python benchmarks/bench_mttr.py --json [--runs 3] [--repair-s 10]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from typing import Any

from hotswap.backends.local import operations
from hotswap.store import registry
from hotswap.demo.drills import DEVICE, DemoOptions, Drill


class MttrBench(Drill):
    scenario = "bench"
    title = "MTTR: cold, warm, wait-for-repair"

    def __init__(self, runs: int, repair_s: float) -> None:
        super().__init__(DemoOptions(keep=False, backing="emulated"), live=False)  # warm spares: emulated slices
        self.runs = runs
        self.repair_s = repair_s

    def one_failure(self, repair_after: float | None = None) -> float:
        high = self.record("high")
        assert high is not None
        self.wait_steps("high", self.steps_of("high") + 10)
        node = f"{high['slices'][0]}-0"
        t_fail = self.node("fail", node)
        if repair_after is not None:
            time.sleep(repair_after)
            self.node("uncordon", node)
        first = self.wait("high to train again", lambda: self._first_step_of_attempt_after("high", high["attempt"]))
        if repair_after is None:
            self.node("uncordon", node)
        self.wait("low back", lambda: (self.record("low") or {}).get("status") == "RUNNING")
        return first.t - t_fail

    def _first_step_of_attempt_after(self, name: str, attempt: int) -> Any:
        trace = self.trace(name)
        return next((s for s in trace.steps if s.attempt > attempt), None) if trace else None

    def _spares_ready(self) -> bool:
        store = operations.open_store(registry.existing(self.cluster))
        try:
            spares = store.worker_rows.select(("warm",))
        finally:
            store.close()
        return len(spares) >= 2 and all(os.path.exists(os.path.join(s.dir, "ready")) for s in spares)

    def drill(self) -> dict[str, Any]:
        self.create_cluster(3)
        self.submit("low", priority="low", slices=1)
        self.submit("high", priority="high", slices=2, restart_strategy="BlockingRecreate")
        self.wait_steps("high", 30)
        cold = [self.one_failure() for _ in range(self.runs)]
        operations.create_cluster(self.cluster, DEVICE, 3, True, lambda _: True, warm_workers=2)
        warm = []
        for _ in range(self.runs):
            self.wait("spares", self._spares_ready, timeout=120)
            warm.append(self.one_failure())
        operations.create_cluster(self.cluster, DEVICE, 3, True, lambda _: True, warm_workers=0, hotswap=False)
        waited = [self.one_failure(repair_after=self.repair_s) for _ in range(self.runs)]
        return {"cold": cold, "warm": warm, "wait_for_repair": waited}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--repair-s", type=float, default=10.0)
    parser.add_argument("--json", action="store_true", help="print only the JSON result")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="hotswap-mttr-") as home:
        os.environ["HOTSWAP_HOME"] = home
        summary = MttrBench(args.runs, args.repair_s).run()
    if not summary["passed"] and "cold" not in summary:
        raise SystemExit(f"benchmark failed: {summary['checks']}")
    result = {
        "cold_s": round(statistics.median(summary["cold"]), 3),
        "warm_s": round(statistics.median(summary["warm"]), 3),
        "wait_for_repair_s": round(statistics.median(summary["wait_for_repair"]), 3),
        "repair_s": args.repair_s,
        "runs": args.runs,
        "samples": {k: [round(v, 3) for v in summary[k]] for k in ("cold", "warm", "wait_for_repair")},
    }
    if not args.json:
        print(f"MTTR median of {args.runs}: cold {result['cold_s']} s, warm {result['warm_s']} s,"
              f" wait-for-repair ({args.repair_s:g} s repair) {result['wait_for_repair_s']} s")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
