"""How fast ``hotswap simulate`` is, and how its cost grows with the cluster. Prints JSON.

For each size (default 1,024, 4,096 and 16,384 nodes of v6e-16, 30 days, all three policies,
seed 0) a fresh subprocess runs the comparison exactly as ``hotswap simulate`` does, and
reports its wall time, the events it simulated (timers fired: arrivals, failures, repairs,
start-ups, completions, stops) per second, and its peak resident memory: of the process
itself and of the largest worker process (each size in its own subprocess, so one size's
peak does not hide another's). Then the ratios between consecutive sizes: a simulator whose
cost is linear in events takes about 4x the time for 4x the nodes.

    python benchmarks/bench_simulate.py --json                 # --jobs: as hotswap simulate
    python benchmarks/bench_simulate.py --json --jobs 1        # one process, policies in turn
    python benchmarks/bench_simulate.py --json --repeat 3 --baseline /path/to/older/checkout/src

``--baseline`` runs every size with a second source tree too (another version's ``src``), its
runs alternating with this version's, and reports the ratio of CPU times (this one / baseline):
on a shared machine the ratio of two versions measured side by side is the figure to trust.
With ``--repeat K`` each size runs K times per tree and the run with the least CPU time counts.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import pathlib
import resource
import subprocess
import sys
import time


def child(nodes: int, days: float, jobs: int | None) -> dict:
    from hotswap.sim.config import SimConfig
    from hotswap.sim.runner import compare, default_jobs

    config = SimConfig(nodes=nodes, days=days)
    started, cpu = time.perf_counter(), time.process_time()
    comparison = compare(config, jobs)
    wall = time.perf_counter() - started
    events = sum(run.counts.events for run in comparison.runs)
    return {
        "nodes": nodes,
        "days": days,
        "jobs": jobs if jobs is not None else default_jobs(len(config.policies)),
        "wall_s": round(wall, 2),
        # CPU seconds of this process and of its worker processes: what the simulation cost,
        # whatever else the machine was running at the time.
        "cpu_s": round(time.process_time() - cpu + resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime, 2),
        "events": events,
        "events_per_s": round(events / wall),
        "decisions": sum(run.counts.decisions for run in comparison.runs),
        "failures": comparison.runs[0].counts.failures,
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "peak_rss_worker_mb": round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024, 1),
        "main_goodput": {run.policy: round(run.main_goodput, 4) for run in comparison.runs},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1024,4096,16384", help="node counts, comma-separated")
    parser.add_argument("--days", type=float, default=30.0)
    parser.add_argument("--jobs", type=int, default=None, help="worker processes (default: as hotswap simulate)")
    parser.add_argument("--json", action="store_true", help="print only the JSON result")
    parser.add_argument("--baseline", help="another version's source directory (its src/) to run alongside")
    parser.add_argument("--repeat", type=int, default=1, help="runs per size and tree; the least CPU time counts")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(child(args.child, args.days, args.jobs)))
        return
    ours = str(pathlib.Path(__file__).resolve().parents[1] / "src")

    def run(nodes: int, source: str) -> dict:
        command = [sys.executable, __file__, "--child", str(nodes), "--days", str(args.days)]
        command += ["--jobs", str(args.jobs)] if args.jobs is not None else []
        env = dict(os.environ, PYTHONPATH=source)
        return json.loads(subprocess.run(command, capture_output=True, text=True, check=True, env=env).stdout)

    runs = []
    for nodes in (int(n) for n in args.sizes.split(",")):
        mine, theirs = [], []
        for _ in range(max(1, args.repeat)):
            mine.append(run(nodes, ours))
            if args.baseline is not None:
                theirs.append(run(nodes, str(pathlib.Path(args.baseline).resolve())))
        best = min(mine, key=lambda r: r["cpu_s"])
        if theirs:
            base = min(theirs, key=lambda r: r["cpu_s"])
            best["baseline"] = {key: base[key] for key in ("wall_s", "cpu_s", "events", "decisions", "main_goodput")}
            best["cpu_ratio_to_baseline"] = round(best["cpu_s"] / base["cpu_s"], 3)
        runs.append(best)
        if not args.json:
            print(f"{nodes:>6} nodes: {best['wall_s']:6.2f} s (CPU {best['cpu_s']} s),"
                  f" {best['events_per_s']:>7} events/s,"
                  f" peak RSS {best['peak_rss_mb']} MB (worker {best['peak_rss_worker_mb']} MB)"
                  + (f", CPU {best['cpu_ratio_to_baseline']}x the baseline's" if theirs else ""))
    ratios = [
        {"nodes": f"{a['nodes']}->{b['nodes']}", "time": round(b["wall_s"] / a["wall_s"], 2),
         "cpu": round(b["cpu_s"] / a["cpu_s"], 2), "events": round(b["events"] / a["events"], 2)}
        for a, b in itertools.pairwise(runs)
    ]
    print(json.dumps({"machine_cpus": os.cpu_count(), "runs": runs, "ratios": ratios}))


if __name__ == "__main__":
    main()
