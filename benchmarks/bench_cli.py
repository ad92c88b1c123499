"""How fast the CLI answers: ``hotswap --help`` and ``workload list`` (table in a pipe, JSON),
each against the floor of the same run, a bare ``python -c pass``. Prints JSON.

A local cluster of ``--slices`` slices runs ``--workloads`` sleeping workloads (the rest queue),
so the list has rows to show; the controller is up, as it is for a user.

    python benchmarks/bench_cli.py --json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time


def timed(argv: list[str], env: dict[str, str], runs: int) -> list[float]:
    seconds = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        seconds.append(time.perf_counter() - started)
    return seconds


def summary(seconds: list[float], floor: float) -> dict[str, float]:
    median = statistics.median(seconds)
    return {"p50_s": round(median, 3), "max_s": round(max(seconds), 3), "over_python_start": round(median / floor, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--slices", type=int, default=4)
    parser.add_argument("--workloads", type=int, default=12)
    parser.add_argument("--json", action="store_true", help="print JSON (the only output format)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as home:
        env = dict(os.environ, HOTSWAP_HOME=home)
        hotswap = [sys.executable, "-m", "hotswap"]
        subprocess.run([*hotswap, "cluster", "create", "--cluster", "bench", "--device-type", "v4-8",
                        "--num-slices", str(args.slices)], env=env, check=True, capture_output=True)
        try:
            for i in range(args.workloads):
                subprocess.run([*hotswap, "workload", "create", "--cluster", "bench", "--workload", f"job-{i}",
                                "--command", "sleep 3600"], env=env, check=True, capture_output=True)
            floor = statistics.median(timed([sys.executable, "-c", "pass"], env, args.runs))
            result = {
                "runs": args.runs,
                "rows": args.workloads,
                "python_start_p50_s": round(floor, 3),
                "help": summary(timed([*hotswap, "--help"], env, args.runs), floor),
                "workload_list_piped": summary(timed([*hotswap, "workload", "list", "--cluster", "bench"], env, args.runs), floor),
                "workload_list_json": summary(
                    timed([*hotswap, "workload", "list", "--cluster", "bench", "-o", "json"], env, args.runs), floor
                ),
            }
        finally:
            subprocess.run([*hotswap, "cluster", "delete", "--cluster", "bench"], env=env, capture_output=True)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
