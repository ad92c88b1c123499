"""Running an example on the local backend and reading the loss curve each rank trained, from
the workers' own logs (for the examples' tests: issue 33)."""

from __future__ import annotations

import re
from pathlib import Path

from local_helpers import hotswap, live_workers, wait_until, workloads

from hotswap.demo.observe import read_trace

HEADER = re.compile(r"^--- hotswap: attempt (\d+) of ")
STEP_LINE = re.compile(r"^step=(\d+) .*\bloss=(\S+)")

Curves = dict[int, dict[int, dict[int, str]]]  # replica -> attempt -> step -> loss as printed


def curves(home: Path, cluster: str, workload: str, replicas: int = 2) -> Curves:
    """Each replica's losses, by attempt and step, from its log (the last line of a step wins)."""
    found: Curves = {}
    for replica in range(replicas):
        log = hotswap(home, "workload", "logs", "--cluster", cluster, "--workload", workload, "--slice", str(replica), check=True)
        attempts: dict[int, dict[int, str]] = {}
        attempt = 0
        for line in log.stdout.splitlines():
            if header := HEADER.match(line):
                attempt = int(header.group(1))
            elif step := STEP_LINE.match(line):
                attempts.setdefault(attempt, {})[int(step.group(1))] = step.group(2)
        found[replica] = attempts
    return found


def combined(attempts: dict[int, dict[int, str]]) -> dict[int, str]:
    """The curve the job trained: a later attempt's step replaces the one it re-ran."""
    curve: dict[int, str] = {}
    for attempt in sorted(attempts):
        curve.update(attempts[attempt])
    return curve


def create(home: Path, cluster: str, workload: str, command: str, *flags: str) -> None:
    hotswap(home, "workload", "create", "--cluster", cluster, "--workload", workload, "--num-slices", "2",
            "--command", command, "--env", "OMP_NUM_THREADS=1", *flags, check=True)


def steps_done(home: Path, cluster: str, workload: str) -> int:
    directory = home / "clusters" / cluster / "workloads" / f"{workload}-0"
    return max((s.step for s in read_trace(directory).steps), default=0)


def wait_for_steps(home: Path, cluster: str, workload: str, steps: int) -> None:
    """Until the job has trained ``steps`` steps; at once an error if it ended before."""

    def trained() -> bool:
        record = workloads(home, cluster).get(workload)
        if record and record["phase"] in ("SUCCESSFUL", "FAILED"):
            raise AssertionError(f"{workload} ended ({record['phase']}) before step {steps}: {record['status_message']}")
        return steps_done(home, cluster, workload) >= steps

    wait_until(trained, timeout=180, what=f"{steps} steps")


def slice_of(home: Path, cluster: str, workload: str, replica: int) -> str:
    return next(w["slice"] for w in live_workers(home, cluster, workload) if w["replica"] == replica)


def tail_mean(curve: dict[int, str], last: int, steps: int = 10) -> float:
    tail = range(last - steps + 1, last + 1)
    return sum(float(curve[s]) for s in tail) / len(tail)


def wait_for_end(home: Path, cluster: str, workload: str) -> dict:  # type: ignore[type-arg]
    return wait_until(
        lambda: (w := workloads(home, cluster).get(workload)) and w["phase"] in ("SUCCESSFUL", "FAILED") and w,
        timeout=300, what=f"{workload} to end",
    )
