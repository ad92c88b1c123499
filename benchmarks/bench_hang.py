"""How fast the local backend declares a hung job hung: a real PyTorch job (the SDK example)
trains on one slice, its training process is SIGSTOPped, and the time from its last completed
step to the controller's ``hung`` decision is measured. Prints JSON.

The anchors are fixed numbers, not runs: NVIDIA's resiliency extension checks heartbeats every
5 s and torchft declares a replica dead 5 s after its last heartbeat; ``vs_5s_anchor`` is the
measured latency over 5 s (below 1 is faster). With fast steps hotswap's timeout is its floor
(60 s since issue 33; it was 4 s, which failed healthy jobs), so a run now takes about a minute;
with slow steps it is 5 times the longest recent step interval.

    python benchmarks/bench_hang.py --json [--runs 3] [--step-sleep 0.05 1.0]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import tempfile
from pathlib import Path
from typing import Any

from hotswap.backends.local.commands import workloads as workload_commands
from hotswap.demo.drills import DemoOptions, Drill

ANCHOR_S = 5.0


class HangBench(Drill):
    scenario = "bench"
    title = "hang detection latency"

    def __init__(self, runs: int, step_sleeps: list[float]) -> None:
        super().__init__(DemoOptions(keep=False, backing="emulated"), live=False)
        self.runs = runs
        self.step_sleeps = step_sleeps

    def detection(self, name: str, step_sleep: float) -> float:
        """Seconds from the last step of a SIGSTOPped training process to the hang decision."""
        self.options.step_sleep = step_sleep
        self.submit(name, priority="medium", slices=1, max_restarts=1)  # restarted, never failed: the drill goes on
        self.wait_steps(name, max(10, int(8 / max(step_sleep, 0.05))))  # a step history to derive from
        with self.store() as store:
            (worker,) = [w for w in store.worker_rows.select(("running",)) if w.identity.workload == name]
        (process,) = (int(p) for p in Path(f"/proc/{worker.pid}/task/{worker.pid}/children").read_text().split())
        os.kill(process, signal.SIGSTOP)
        try:
            decided = self.wait("the hang", lambda: self._hung_at(name), timeout=300)
        finally:
            os.kill(process, signal.SIGCONT)
        trace = self.trace(name)
        assert trace is not None
        workload_commands.delete_workload(self.cluster, name)
        return decided - max(s.t for s in trace.steps if s.t <= decided)

    def _hung_at(self, name: str) -> float | None:
        return next((float(e["t"]) for e in self.timeline() if e["kind"] == "hung" and e["workload"] == name), None)

    def drill(self) -> dict[str, Any]:
        self.create_cluster(1)
        return {
            "detection": {
                step_sleep: [self.detection(f"job-{i}-{int(step_sleep * 1000)}", step_sleep) for i in range(self.runs)]
                for step_sleep in self.step_sleeps
            }
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--step-sleep", type=float, nargs="+", default=[0.05, 1.0])
    parser.add_argument("--json", action="store_true", help="print only the JSON result")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="hotswap-hang-") as home:
        os.environ["HOTSWAP_HOME"] = home
        summary = HangBench(args.runs, args.step_sleep).run()
    if "detection" not in summary:
        raise SystemExit(f"benchmark failed: {summary['checks']}")
    results = []
    for step_sleep, samples in summary["detection"].items():
        median = statistics.median(samples)
        results.append({
            "step_sleep_s": step_sleep, "detection_s": round(median, 3), "vs_5s_anchor": round(median / ANCHOR_S, 3),
            "samples": [round(s, 3) for s in samples],
        })
        if not args.json:
            print(f"steps of ~{step_sleep} s: hang declared {median:.2f} s after the last step ({median / ANCHOR_S:.2f} x 5 s)")
    print(json.dumps({"runs": args.runs, "anchor_s": ANCHOR_S, "results": results}))


if __name__ == "__main__":
    main()
