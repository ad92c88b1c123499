"""How fast ``hotswap simulate`` is, and how its cost grows with the cluster. Prints JSON.

For each size (default 1,024, 4,096, 16,384 and 65,536 nodes of v6e-16, 30 days, all three
policies, seed 0; ``--largest`` adds 262,144) a fresh subprocess runs the comparison exactly as ``hotswap simulate`` does, and
reports its wall time, the events it simulated (timers fired: arrivals, failures, repairs,
start-ups, completions, stops) per second, and its peak resident memory: of the process
itself and of the largest worker process (each size in its own subprocess, so one size's
peak does not hide another's). Then the ratios between consecutive sizes: a simulator whose
cost is linear in events takes about 4x the time for 4x the nodes, and ``cpu_us_per_node_day``
(one row per size, in the JSON's ``cost_per_node_day``) stays flat.

    python benchmarks/bench_simulate.py --json                 # --jobs: as hotswap simulate
    python benchmarks/bench_simulate.py --json --jobs 1        # one process, policies in turn
    python benchmarks/bench_simulate.py --json --repeat 3 --baseline /path/to/older/checkout/src
    python benchmarks/bench_simulate.py --json --sizes 65536 --baseline 31f8424   # a git revision
    python benchmarks/bench_simulate.py --json --sizes 16384 --seeds 5 --baseline 31f8424  # --compare
    python benchmarks/bench_simulate.py --json --largest --baseline 31f8424   # 1k to 262k nodes

``--baseline`` runs every size with a second source tree too, its runs alternating with this
version's, and reports the ratio of CPU times (this one / baseline): on a shared machine the
ratio of two versions measured side by side is the figure to trust. It is another version's
``src`` directory, or a git revision of this repository, exported (``git archive``) into a
temporary directory for the run. With ``--repeat K`` each size runs K times per tree and the run
with the least CPU time counts. ``--seeds N`` runs what ``hotswap simulate --compare --nodes
SIZE --seeds N`` runs (every policy on N seeds of SIZE and its halvings) instead of one seed.
CPU time is the processes' own
(``resource.getrusage``), so other work on the machine does not count; ``cpu_us_per_node_day``
is what one simulated node-day cost (all policies, sizes and seeds together).
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
import tarfile
import tempfile
import time


def child(nodes: int, days: float, jobs: int | None, seeds: int | None) -> dict:
    from hotswap.sim.config import SimConfig
    from hotswap.sim.runner import compare, default_jobs

    config = SimConfig(nodes=nodes, days=days)
    started, cpu = time.perf_counter(), time.process_time()
    if seeds is None:
        runs = compare(config, jobs).runs
        node_days = nodes * days
    else:
        from hotswap.sim.sweep import ladder, sweep

        sizes = ladder(nodes, config.hosts_per_slice)  # as hotswap simulate --compare without --sizes
        runs = sweep(config, sizes, seeds, jobs).runs
        node_days = sum(sizes) * days * seeds
    wall = time.perf_counter() - started
    cpu_s = time.process_time() - cpu + resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime
    events = sum(run.counts.events for run in runs)
    return {
        "nodes": nodes,
        "days": days,
        "seeds": 1 if seeds is None else seeds,
        "sizes": [nodes] if seeds is None else sizes,
        "jobs": jobs if jobs is not None else default_jobs(len(runs)),
        "wall_s": round(wall, 2),
        # CPU seconds of this process and of its worker processes: what the simulation cost,
        # whatever else the machine was running at the time.
        "cpu_s": round(cpu_s, 2),
        "cpu_us_per_node_day": round(cpu_s / node_days * 1e6, 2),
        "events": events,
        "events_per_s": round(events / wall),
        "decisions": sum(run.counts.decisions for run in runs),
        "failures": runs[0].counts.failures,
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "peak_rss_worker_mb": round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024, 1),
        # Every figure of every run, unrounded: two versions that simulate alike print the same.
        "results_digest": _digest(runs),
        "main_goodput": {f"{run.policy}/{run.seed}": round(run.main_goodput, 4) for run in runs},
    }


def _digest(runs: list) -> str:
    import dataclasses
    import hashlib

    figures = [
        (r.policy, r.nodes, r.seed, r.goodput_by_priority, r.badput_by_priority, r.main_goodput, r.low_goodput,
         r.spare_used, r.mttr_s, dataclasses.asdict(r.counts))
        for r in runs
    ]
    return hashlib.sha256(repr(figures).encode()).hexdigest()[:16]


def cost_per_node_day(runs: list[dict]) -> dict:
    """CPU microseconds per simulated node-day at each size (and the baseline's, when it ran), and
    the largest over the smallest: 1.0 is a flat cost."""
    def spread(costs: list[float]) -> float:
        return round(costs[-1] / costs[0], 2)

    ours = [run["cpu_us_per_node_day"] for run in runs]
    table: dict = {"us": dict(zip((str(run["nodes"]) for run in runs), ours)), "largest_over_smallest": spread(ours)}
    if all("baseline" in run for run in runs):
        theirs = [run["baseline"]["cpu_us_per_node_day"] for run in runs]
        table["baseline_us"] = dict(zip((str(run["nodes"]) for run in runs), theirs))
        table["baseline_largest_over_smallest"] = spread(theirs)
    return table


def baseline_source(given: str, keep: list[tempfile.TemporaryDirectory]) -> tuple[str, str]:
    """(the baseline's src directory, what it is): a directory as given, or a git revision of this
    repository exported into a temporary directory (kept until the run ends)."""
    if pathlib.Path(given).is_dir():
        return str(pathlib.Path(given).resolve()), given
    repo = pathlib.Path(__file__).resolve().parents[1]
    commit = subprocess.run(["git", "rev-parse", "--short", given], cwd=repo, capture_output=True, text=True, check=True)
    temp = tempfile.TemporaryDirectory(prefix="bench-simulate-baseline-")
    keep.append(temp)
    archive = subprocess.run(["git", "archive", given, "src"], cwd=repo, capture_output=True, check=True).stdout
    with tarfile.open(fileobj=__import__("io").BytesIO(archive)) as tar:
        tar.extractall(temp.name, filter="data")
    return str(pathlib.Path(temp.name) / "src"), f"git {commit.stdout.strip()}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1024,4096,16384,65536", help="node counts, comma-separated")
    parser.add_argument("--largest", action="store_true", help="add 262,144 nodes (the simulator's limit) to --sizes")
    parser.add_argument("--days", type=float, default=30.0)
    parser.add_argument("--jobs", type=int, default=None, help="worker processes (default: as hotswap simulate)")
    parser.add_argument("--json", action="store_true", help="print only the JSON result")
    parser.add_argument("--seeds", type=int, help="run simulate --compare with this many seeds per size")
    parser.add_argument(
        "--baseline", help="another version to run alongside: its src/ directory, or a git revision of this repository"
    )
    parser.add_argument("--repeat", type=int, default=1, help="runs per size and tree; the least CPU time counts")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(child(args.child, args.days, args.jobs, args.seeds)))
        return
    ours = str(pathlib.Path(__file__).resolve().parents[1] / "src")
    temporary: list[tempfile.TemporaryDirectory] = []
    baseline, baseline_name = baseline_source(args.baseline, temporary) if args.baseline else (None, None)

    def run(nodes: int, source: str) -> dict:
        command = [sys.executable, __file__, "--child", str(nodes), "--days", str(args.days)]
        command += ["--jobs", str(args.jobs)] if args.jobs is not None else []
        command += ["--seeds", str(args.seeds)] if args.seeds is not None else []
        env = dict(os.environ, PYTHONPATH=source)
        return json.loads(subprocess.run(command, capture_output=True, text=True, check=True, env=env).stdout)

    sizes = [int(n) for n in args.sizes.split(",")] + ([262_144] if args.largest else [])
    runs = []
    for nodes in sizes:
        mine, theirs = [], []
        for _ in range(max(1, args.repeat)):
            mine.append(run(nodes, ours))
            if baseline is not None:
                theirs.append(run(nodes, baseline))
        best = min(mine, key=lambda r: r["cpu_s"])
        if theirs:
            base = min(theirs, key=lambda r: r["cpu_s"])
            best["baseline"] = {
                key: base[key]
                for key in ("wall_s", "cpu_s", "cpu_us_per_node_day", "events", "decisions", "peak_rss_mb",
                            "peak_rss_worker_mb", "results_digest", "main_goodput")
            }
            best["cpu_ratio_to_baseline"] = round(best["cpu_s"] / base["cpu_s"], 3)
            best["wall_ratio_to_baseline"] = round(best["wall_s"] / base["wall_s"], 3)
            best["same_results_as_baseline"] = best["results_digest"] == base["results_digest"]
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
    document = {"machine_cpus": os.cpu_count(), "load_average": [round(x, 2) for x in os.getloadavg()], "runs": runs,
                "ratios": ratios, "cost_per_node_day": cost_per_node_day(runs)}
    if baseline_name is not None:
        document["baseline"] = baseline_name
    print(json.dumps(document))


if __name__ == "__main__":
    main()
