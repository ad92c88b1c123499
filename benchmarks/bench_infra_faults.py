"""The infrastructure fault drills of issue 36, at full length. Prints JSON.

Runs, with ``--rounds`` rounds each (the issue's 50 by default), the drills the suite runs a few
rounds of: the whole-machine loss (every process of a cluster frozen and killed) under the crash
drill's trainer and under a plain ``sleep`` (``tests/test_host_loss_drill.py``), and drains and
preemptions of an elastic workload with the controller killed 0.06-0.56 s later
(``tests/test_drain_crash_drill.py``). Each drill passes only if no workload was FAILED or
charged a restart and no step was lost in any round; the report gives each drill's outcome, its
wall time and, on failure, the assertion (with the seed that replays it).

    python benchmarks/bench_infra_faults.py --rounds 50 --json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DRILLS = {
    "host_loss_trainer": ("tests/test_host_loss_drill.py::test_a_whole_machine_loss_under_the_trainer_is_not_charged", "HOTSWAP_HOST_LOSS_ROUNDS"),
    "host_loss_sleep": ("tests/test_host_loss_drill.py::test_a_whole_machine_loss_under_sleep_is_not_charged", "HOTSWAP_HOST_LOSS_ROUNDS"),
    "drain_or_preempt_with_controller_kill": (
        "tests/test_drain_crash_drill.py::test_drains_and_preemptions_with_controller_kills_at_random_moments",
        "HOTSWAP_DRAIN_CRASH_ROUNDS",
    ),
}


def run(test: str, variable: str, rounds: int, timeout_s: float) -> dict[str, object]:
    env = dict(os.environ, **{variable: str(rounds)})
    env.setdefault("PYTHONPATH", str(ROOT / "src"))
    started = time.monotonic()
    try:
        result = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", test],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s,
        )
    except subprocess.TimeoutExpired:
        return {"rounds": rounds, "passed": False, "seconds": round(time.monotonic() - started, 1), "failure": "timed out"}
    report: dict[str, object] = {"rounds": rounds, "passed": result.returncode == 0, "seconds": round(time.monotonic() - started, 1)}
    if result.returncode != 0:
        errors = [line for line in result.stdout.splitlines() if line.startswith("E ")]
        report["failure"] = "\n".join(errors[:6]) or result.stdout[-2000:]
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--only", choices=sorted(DRILLS), action="append", help="run only these drills")
    parser.add_argument("--timeout", type=float, default=7200.0, help="seconds per drill")
    parser.add_argument("--json", action="store_true", help="(the output is always JSON)")
    args = parser.parse_args()
    results = {
        name: run(test, variable, args.rounds, args.timeout)
        for name, (test, variable) in DRILLS.items() if not args.only or name in args.only
    }
    print(json.dumps({"load_average": os.getloadavg(), "drills": results}, indent=2))
    sys.exit(0 if all(r["passed"] for r in results.values()) else 1)


if __name__ == "__main__":
    main()
