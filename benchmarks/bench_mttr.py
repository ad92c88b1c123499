"""MTTR of a real PyTorch job on the local backend: hotswap with a cold restart (a new Python
process), hotswap with no spare ready but the cluster's zygote (the process forked from the
pre-imported zygote: ``cold_zygote``), hotswap onto warm spare workers, and waiting for the
repair (no hotswap). Prints JSON; ``zygote_vs_cold`` is cold_zygote / cold, same run.

MTTR here is what the demo reports: from the node failure to the first training step the
restarted job completes, read from the training processes' own records. A low-priority job on
a third slice gives hotswap somewhere to go. Each mode runs ``--runs`` failures; the median is
reported. The wait-for-repair baseline repairs the node after ``--repair-s`` seconds (GKE's
repair takes about 600 s; the default here keeps the benchmark short, and the result scales:
MTTR = repair time + restart).

Each failure also reports the phases of the restart, from the workers' own records (the train
SDK's events; hotswap.demo.observe.restart_phases): seconds after the failure when the
controller decided, the old workers stopped, the new processes began (or a warm spare was
handed over), the run was created (Python and imports done), the group formed, the state was
restored, the first step was done. ``phases`` gives, per mode, the median of each.

``--python PATH`` also times ``import torch`` in that interpreter, with the page cache of its
torch (and nvidia-*) files evicted (cold: posix_fadvise DONTNEED, no root needed) and warm;
e.g. a virtual environment holding the CUDA build of PyTorch, to see the import cost of a GPU
host on any machine. ``--import-only`` measures only that.

    python benchmarks/bench_mttr.py --json [--runs 3] [--repair-s 10] [--python /tmp/cudavenv/bin/python]
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
from typing import Any

from hotswap.backends.local.commands import clusters as cluster_commands

from hotswap.backends.local.commands.new_cluster import ZYGOTE_VARIABLE, new_cluster_warm_workers, new_cluster_zygote
from hotswap.store.paths import ClusterPaths
from hotswap.demo.drills import DEVICE, DemoOptions, Drill, phases_of_restart, warm_spares_ready


class MttrBench(Drill):
    scenario = "bench"
    title = "MTTR: cold, cold with the zygote, warm, wait-for-repair"

    def __init__(self, runs: int, repair_s: float) -> None:
        super().__init__(DemoOptions(keep=False, backing="emulated"), live=False)  # warm spares: emulated slices
        self.failures = runs  # (Drill.runs is the drill's own record of workload directories)
        self.repair_s = repair_s
        self.default_spares = 0
        self.default_zygote = False

    def one_failure(self, repair_after: float | None = None) -> tuple[float, dict[str, float | None]]:
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
        return first.t - t_fail, phases_of_restart(self, "high", t_fail, high["attempt"])

    def _first_step_of_attempt_after(self, name: str, attempt: int) -> Any:
        trace = self.trace(name)
        return next((s for s in trace.steps if s.attempt > attempt), None) if trace else None

    def _zygote_ready(self) -> bool:
        return (ClusterPaths.of(self.cluster).root / "zygote" / "ready").exists()

    def drill(self) -> dict[str, Any]:
        self.default_zygote = new_cluster_zygote()  # what a new cluster keeps without HOTSWAP_ZYGOTE
        before = os.environ.get(ZYGOTE_VARIABLE)
        os.environ[ZYGOTE_VARIABLE] = "0"  # cold first: no zygote at all (today's start without one)
        try:
            self.create_cluster(3)
        finally:
            os.environ.pop(ZYGOTE_VARIABLE) if before is None else os.environ.__setitem__(ZYGOTE_VARIABLE, before)
        self.submit("low", priority="low", slices=1)
        self.submit("high", priority="high", slices=2, restart_strategy="BlockingRecreate")
        self.wait_steps("high", 30)
        cold = [self.one_failure() for _ in range(self.failures)]
        cluster_commands.create_cluster(self.cluster, DEVICE, 3, True, lambda _: True, warm_workers=0, zygote=True)
        self.wait("the zygote", self._zygote_ready, timeout=120)
        cold_zygote = [self.one_failure() for _ in range(self.failures)]
        self.default_spares = new_cluster_warm_workers(3, 1)  # what a new cluster keeps without --warm-workers
        cluster_commands.create_cluster(self.cluster, DEVICE, 3, True, lambda _: True, warm_workers=2)
        warm = []
        for _ in range(self.failures):
            self.wait("spares", lambda: warm_spares_ready(self), timeout=120)
            warm.append(self.one_failure())
        cluster_commands.create_cluster(self.cluster, DEVICE, 3, True, lambda _: True, warm_workers=0, hotswap=False)
        waited = [self.one_failure(repair_after=self.repair_s) for _ in range(self.failures)] if self.repair_s >= 0 else []
        runs = {"cold": cold, "cold_zygote": cold_zygote, "warm": warm, "wait_for_repair": waited}
        return {mode: [m for m, _ in samples] for mode, samples in runs.items()} | {
            "phases": {mode: [p for _, p in samples] for mode, samples in runs.items()}
        }


def median_phases(samples: list[dict[str, float | None]]) -> dict[str, float | None]:
    """Each phase's median over the failures that recorded it."""
    keys = list(samples[0]) if samples else []
    medians = {}
    for key in keys:
        values = [s[key] for s in samples if s.get(key) is not None]
        medians[key] = round(statistics.median(values), 3) if values else None
    return medians


EVICT_PACKAGES = ("torch", "nvidia", "triton", "numpy")


def evict_page_cache(python: str) -> int:
    """Drop the page cache of the interpreter's torch and CUDA library files (posix_fadvise
    DONTNEED: clean pages of files one can read, no root needed); returns the bytes advised."""
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], capture_output=True, text=True, check=True
    ).stdout.strip()
    advised = 0
    for package in EVICT_PACKAGES:
        for path in Path(site).glob(f"{package}*/**/*"):
            if path.is_file():
                try:
                    fd = os.open(path, os.O_RDONLY)
                except OSError:
                    continue
                try:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                    advised += path.stat().st_size
                finally:
                    os.close(fd)
    return advised


def torch_import_cost(python: str, runs: int) -> dict[str, Any]:
    """``import torch`` in a fresh ``python``: cold (page cache evicted first) and warm; median."""
    probe = "import time; t = time.perf_counter(); import torch; print(time.perf_counter() - t, torch.__version__, torch.version.cuda)"

    def once() -> tuple[float, str, str]:
        out = subprocess.run([python, "-c", probe], capture_output=True, text=True, check=True).stdout.split()
        return float(out[0]), out[1], out[2]

    cold, warm, advised = [], [], 0
    for _ in range(runs):
        advised = evict_page_cache(python)
        cold.append(once()[0])
        warm.append(once()[0])
    _, version, cuda = once()
    return {
        "python": python, "torch": version, "cuda": None if cuda == "None" else cuda, "evicted_bytes": advised,
        "cold_s": round(statistics.median(cold), 3), "warm_s": round(statistics.median(warm), 3),
        "samples": {"cold": [round(v, 3) for v in cold], "warm": [round(v, 3) for v in warm]},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--repair-s", type=float, default=10.0, help="seconds before the repair in the wait-for-repair baseline (negative: skip it)")
    parser.add_argument("--json", action="store_true", help="print only the JSON result")
    parser.add_argument("--python", action="append", default=[], help="also time `import torch` in this interpreter (repeatable)")
    parser.add_argument("--import-runs", type=int, default=3, help="cold and warm imports to time per interpreter (0: none)")
    parser.add_argument("--import-only", action="store_true", help="only the import times (this interpreter's and --python's)")
    args = parser.parse_args()
    imports = [torch_import_cost(python, args.import_runs) for python in [sys.executable, *args.python]] if args.import_runs > 0 else []
    if args.import_only:
        if not args.json:
            for i in imports:
                print(f"import torch {i['torch']} (cuda {i['cuda']}) in {i['python']}: cold {i['cold_s']} s, warm {i['warm_s']} s")
        print(json.dumps({"torch_import": imports}))
        return
    with tempfile.TemporaryDirectory(prefix="hotswap-mttr-") as home:
        os.environ["HOTSWAP_HOME"] = home
        bench = MttrBench(args.runs, args.repair_s)
        summary = bench.run()
    if not summary["passed"] and "cold" not in summary:
        raise SystemExit(f"benchmark failed: {summary['checks']}")
    result = {
        "cold_s": round(statistics.median(summary["cold"]), 3),
        "cold_zygote_s": round(statistics.median(summary["cold_zygote"]), 3),
        "zygote_vs_cold": round(statistics.median(summary["cold_zygote"]) / statistics.median(summary["cold"]), 3),
        "warm_s": round(statistics.median(summary["warm"]), 3),
        # What a user gets without a flag: spares by default (auto) when they cover the restart,
        # else the zygote where memory allows one (auto), else cold.
        "default_s": round(statistics.median(summary[
            "warm" if bench.default_spares >= 2 else "cold_zygote" if bench.default_zygote else "cold"
        ]), 3),
        "default_warm_workers": bench.default_spares,
        "default_zygote": bench.default_zygote,
        "wait_for_repair_s": round(statistics.median(summary["wait_for_repair"]), 3) if summary["wait_for_repair"] else None,
        "repair_s": args.repair_s,
        "runs": args.runs,
        "samples": {k: [round(v, 3) for v in summary[k]] for k in ("cold", "cold_zygote", "warm", "wait_for_repair")},
        "phases": {mode: median_phases(samples) for mode, samples in summary["phases"].items()},
        "torch_import": imports,
        "torch_import_s": imports[0]["warm_s"] if imports else None,
    }
    if not args.json:
        print(f"MTTR median of {args.runs}: default ({bench.default_spares} spares) {result['default_s']} s, cold {result['cold_s']} s,"
              f" cold with the zygote {result['cold_zygote_s']} s ({result['zygote_vs_cold']}x), warm {result['warm_s']} s,"
              f" wait-for-repair ({args.repair_s:g} s repair) {result['wait_for_repair_s']} s")
        for mode, phases in result["phases"].items():
            print(f"  {mode} phases (s after the failure): " + ", ".join(f"{k.removesuffix('_s')} {v}" for k, v in phases.items()))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
