"""How long `hotswap cluster delete` takes on the local backend. Prints JSON.

Each run creates a cluster (2 slices of ``--device-type``) and deletes it through the CLI, as a
user does: idle, and busy (a workload whose workers exit at once on SIGTERM, deleted with
``--force``). The time of a CLI call that does nothing (``hotswap --help``) is measured in the
same runs, as the floor every command pays (interpreter start, imports). With
``--baseline-src DIR`` (another checkout's ``src``, e.g. ``git archive afb3f7b src``) the same
runs are made with that tree too, and the ratio of the medians is reported.

    python benchmarks/bench_cluster_delete.py --runs 10 --json
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

SLEEPER = "import signal, sys, time\nsignal.signal(signal.SIGTERM, lambda *_: sys.exit(143))\ntime.sleep(3600)\n"


def cli(env: dict[str, str], *args: str) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "hotswap", *args], env=env, check=True, capture_output=True, timeout=300)
    return time.perf_counter() - started


def measure(src: str, runs: int, device: str, root: Path) -> dict[str, object]:
    env = dict(os.environ, HOTSWAP_HOME=str(root / "state"), PYTHONPATH=src)
    root.mkdir(parents=True)
    script = root / "sleeper.py"
    script.write_text(SLEEPER)
    noop, idle, busy = [], [], []
    for run in range(runs):
        noop.append(cli(env, "--help"))
        cluster = f"bench{run}"
        cli(env, "cluster", "create", "--cluster", cluster, "--device-type", device, "--num-slices", "2")
        idle.append(cli(env, "cluster", "delete", "--cluster", cluster))
        cli(env, "cluster", "create", "--cluster", cluster, "--device-type", device, "--num-slices", "2")
        cli(env, "workload", "create", "--cluster", cluster, "--workload", "w", "--command", f"{sys.executable} {script}")
        force = ["--force"] if "--force" in subprocess.run(
            [sys.executable, "-m", "hotswap", "cluster", "delete", "--help"], env=env, capture_output=True, text=True
        ).stdout else []
        busy.append(cli(env, "cluster", "delete", "--cluster", cluster, *force))

    def summary(values: list[float]) -> dict[str, float]:
        return {"median_s": round(statistics.median(values), 3), "max_s": round(max(values), 3)}

    return {"noop_cli": summary(noop), "delete_idle": summary(idle), "delete_busy": summary(busy),
            "idle_over_noop": round(statistics.median(idle) / statistics.median(noop), 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--device-type", default="v4-8")
    parser.add_argument("--baseline-src", help="another tree's src directory, measured in the same run")
    parser.add_argument("--json", action="store_true", help="print only the JSON result")
    args = parser.parse_args()
    here = str(Path(__file__).resolve().parents[1] / "src")
    result: dict[str, object] = {"runs": args.runs, "device_type": args.device_type, "cpus": os.cpu_count(),
                                 "load_average_1m": round(os.getloadavg()[0], 2)}
    with tempfile.TemporaryDirectory(prefix="hotswap-bench-") as scratch:
        result["this_tree"] = measure(here, args.runs, args.device_type, Path(scratch) / "this")
        if args.baseline_src:
            result["baseline"] = measure(args.baseline_src, args.runs, args.device_type, Path(scratch) / "baseline")
            mine, base = result["this_tree"], result["baseline"]
            result["delete_idle_speedup"] = round(base["delete_idle"]["median_s"] / mine["delete_idle"]["median_s"], 2)  # type: ignore[index]
    print(json.dumps(result, indent=None if args.json else 2))


if __name__ == "__main__":
    main()
