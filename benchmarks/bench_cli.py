"""How fast the CLI answers: ``hotswap --help`` and ``workload list`` (table in a pipe, JSON),
each against the floor of the same run, a bare ``python -c pass``. Prints JSON.

A local cluster of ``--slices`` slices runs ``--workloads`` sleeping workloads (the rest queue),
so the list has rows to show; the controller is up, as it is for a user. Byte-code caching is on
(``PYTHONDONTWRITEBYTECODE`` is dropped, and a first untimed run writes the caches), as after a
``pip install``, which compiles every module: without caches each command compiles ~55 modules.

    python benchmarks/bench_cli.py --json
    python benchmarks/bench_cli.py --json --baseline /path/to/older/checkout/src

``--baseline`` times a second source tree (another version's ``src``) against the same cluster,
its runs alternating with this version's, and reports the ratio (this one / baseline).
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
from pathlib import Path


def timed(argv: list[str], env: dict[str, str], runs: int) -> list[float]:
    seconds = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        seconds.append(time.perf_counter() - started)
    return seconds


def alternating(argv: list[str], env: dict[str, str], other: dict[str, str], runs: int) -> tuple[list[float], list[float]]:
    """Times ``argv`` under two environments, interleaved, so load changes hit both alike."""
    ours: list[float] = []
    theirs: list[float] = []
    for _ in range(runs):
        ours += timed(argv, env, 1)
        theirs += timed(argv, other, 1)
    return ours, theirs


def summary(seconds: list[float], floor: float) -> dict[str, float]:
    median = statistics.median(seconds)
    return {"p50_s": round(median, 3), "max_s": round(max(seconds), 3), "over_python_start": round(median / floor, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--slices", type=int, default=4)
    parser.add_argument("--workloads", type=int, default=12)
    parser.add_argument("--json", action="store_true", help="print JSON (the only output format)")
    parser.add_argument("--baseline", help="another version's source directory (its src/) to time alongside")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as home:
        env = dict(os.environ, HOTSWAP_HOME=home)
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        hotswap = [sys.executable, "-m", "hotswap"]
        subprocess.run([*hotswap, "cluster", "create", "--cluster", "bench", "--device-type", "v4-8",
                        "--num-slices", str(args.slices)], env=env, check=True, capture_output=True)
        try:
            for i in range(args.workloads):
                subprocess.run([*hotswap, "workload", "create", "--cluster", "bench", "--workload", f"job-{i}",
                                "--command", "sleep 3600"], env=env, check=True, capture_output=True)
            subprocess.run([*hotswap, "workload", "list", "--cluster", "bench", "-o", "json"], env=env,
                           check=True, capture_output=True)  # writes the byte-code caches of the read path
            floor = statistics.median(timed([sys.executable, "-c", "pass"], env, args.runs))
            commands = {
                "help": ["--help"],
                "workload_list_piped": ["workload", "list", "--cluster", "bench"],
                "workload_list_json": ["workload", "list", "--cluster", "bench", "-o", "json"],
            }
            result: dict[str, object] = {
                "runs": args.runs,
                "rows": args.workloads,
                "python_start_p50_s": round(floor, 3),
            }
            if args.baseline is None:
                result.update({key: summary(timed([*hotswap, *argv], env, args.runs), floor) for key, argv in commands.items()})
            else:
                older = dict(env, PYTHONPATH=str(Path(args.baseline).resolve()))
                for key, argv in commands.items():
                    ours, theirs = alternating([*hotswap, *argv], env, older, args.runs)
                    result[key] = {**summary(ours, floor), "baseline": summary(theirs, floor),
                                   "ratio_to_baseline": round(statistics.median(ours) / statistics.median(theirs), 2)}
        finally:
            subprocess.run([*hotswap, "cluster", "delete", "--cluster", "bench"], env=env, capture_output=True)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
