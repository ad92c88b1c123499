"""A slice loss under the default ``Recreate``: steps lost and MTTR, with the save-lease wait
and without it, in the same run. Prints JSON.

A 2-slice PyTorch job on the local backend (one process per slice, warm spare workers, so the
new attempt starts within a fraction of a second of the loss) loses the node of its replica 0,
between two periodic checkpoints; the controller restarts the whole workload at once while the
old attempt's survivor is still saving the step it holds. ``wait`` is the SDK as it is: the
new attempt's restoring rank waits for the survivor's save in flight (hotswap.train.save_leases);
``nowait`` restores without waiting, as before the leases (``lease_wait_switch.py``: the SDK's
own ``SaveLeases`` with its wait made to return at once). Both modes run through that runner.

Per failure: steps lost (the last step the old attempt completed minus the step the new attempt
restored), MTTR (from the failure to the new attempt's first step, from the workers' own
records, as the demo reports it), ``back_s`` (from the failure until the job is past the step it
had reached: MTTR plus the lost steps run again), the restorer's wait (``save_wait_s`` of its restore event) and
the restart's phases (hotswap.demo.observe.restart_phases). Scripts: ``plain`` is
``examples/train.py`` (``ht.average_gradients``), ``gpt`` is ``examples/train_gpt.py``
(DistributedDataParallel on gloo, gradient accumulation, evaluation pauses). Each mode of each
script runs ``--runs`` failures; medians are reported, and ``mttr_wait_vs_nowait`` is the ratio
of the two medians (same run, same machine).

    python benchmarks/bench_slice_loss.py --json [--runs 3] [--scripts plain,gpt] [--step-sleep 0.05] [--checkpoint-every 50]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from hotswap.api.launch import Launch
from hotswap.api.spec import workload_spec
from hotswap.api.worker_output import EVENT_CHECKPOINT_RESTORE
from hotswap.backends.requests import new_run
from hotswap.demo.drills import LOCAL, DemoOptions, Drill, phases_of_restart, warm_spares_ready
from hotswap.store import registry

ROOT = Path(__file__).resolve().parents[1]
RUNNER = ROOT / "benchmarks" / "lease_wait_switch.py"
MODES = ("wait", "nowait")
SCRIPTS = ("plain", "gpt")


def script_argv(script: str, steps: int) -> list[str]:
    """The training command of ``script`` (the two examples name their step count differently)."""
    if script == "plain":
        return [str(ROOT / "examples" / "train.py"), "--steps", str(steps)]
    return [str(ROOT / "examples" / "train_gpt.py"), "--max-iters", str(steps)]


class SliceLossBench(Drill):
    scenario = "bench"
    title = "slice loss under Recreate: steps lost and MTTR, with and without the lease wait"

    def __init__(self, runs: int, scripts: list[str], step_sleep: float, checkpoint_every: int) -> None:
        super().__init__(DemoOptions(keep=False, backing="emulated", step_sleep=step_sleep), live=False)  # warm spares
        self.failures = runs
        self.scripts = scripts
        self.checkpoint_every = checkpoint_every
        self.margin = max(1, checkpoint_every // 5)  # steps kept clear of a periodic checkpoint

    def submit_job(self, name: str, script: str, mode: str) -> None:
        argv = [sys.executable, str(RUNNER), mode, *script_argv(script, 1_000_000),
                "--step-sleep", str(self.options.step_sleep), "--checkpoint-every", str(self.checkpoint_every)]
        spec = workload_spec(
            name=name, command=shlex.join(argv), device_type=self.device, num_slices=2, priority="high",
            restart_strategy="Recreate", termination_grace_period_s=20.0, max_restarts=self.failures + 1,
            env={"OMP_NUM_THREADS": "1"},
        )
        run = new_run(None, fresh=False)
        launch = Launch(
            environ=dict(os.environ), cwd=str(self.workdir),
            checkpoint_dir=str(registry.existing(self.cluster).checkpoint_dir(name) / run.id), run=run,
        )
        LOCAL.create_workload(self.cluster, spec, launch)
        self.event(f"{name} submitted: {script} ({mode})")

    def one_failure(self, name: str) -> dict[str, Any]:
        self.wait("spares", lambda: warm_spares_ready(self), timeout=180)
        job = self.record(name)
        assert job is not None
        at_least = max(self.steps_of(name) + 2 * self.margin, self.checkpoint_every + self.margin)

        def between_checkpoints() -> bool:  # where restoring the older checkpoint loses steps
            step = self.steps_of(name)
            return step >= at_least and self.margin <= step % self.checkpoint_every <= self.checkpoint_every - self.margin

        self.wait("a step between two checkpoints", between_checkpoints, timeout=180)
        node = f"{job['slices'][0]}-0"
        t_fail = self.node("fail", node)
        attempt = job["attempt"]
        first = self.wait(f"{name} to train again", lambda: self._first_step_after(name, attempt), timeout=180)
        self.node("uncordon", node)
        trace = self.trace(name)
        assert trace is not None
        completed = max(s.step for s in trace.steps if s.attempt == attempt)
        restored = next((r for r in trace.restores if r.attempt > attempt and r.replica == 0), None)
        beyond = self.wait(f"{name} past step {completed}", lambda: self._first_step_after(name, attempt, completed), timeout=180)
        return {
            "mttr_s": first.t - t_fail,
            "back_s": beyond.t - t_fail,
            "steps_lost": completed - (restored.step if restored else 0),
            "save_wait_s": self._save_wait(name, attempt),
            "phases": phases_of_restart(self, name, t_fail, attempt),
        }

    def _first_step_after(self, name: str, attempt: int, past: int = -1) -> Any:
        """The first step a later attempt completed (beyond step ``past``)."""
        trace = self.trace(name)
        return next((s for s in trace.steps if s.attempt > attempt and s.step > past), None) if trace else None

    def _save_wait(self, name: str, attempt: int) -> float:
        """The restorer's wait for the attempt before, from its restore event (0 when it did not wait)."""
        directory = self.workload_dir(name)
        assert directory is not None
        for path in sorted((directory / "events").glob("*.jsonl")):
            if int(path.stem.split("-")[0]) <= attempt:
                continue
            for line in path.read_text().splitlines():
                record = json.loads(line) if line.startswith("{") else {}
                if record.get("kind") == EVENT_CHECKPOINT_RESTORE:
                    return float(record.get("save_wait_s", 0.0))
        return 0.0

    def drill(self) -> dict[str, Any]:
        self.create_cluster(3, warm=2)
        samples: dict[str, dict[str, list[dict[str, Any]]]] = {}
        for script in self.scripts:
            for mode in MODES:
                name = f"{script}-{mode}"
                self.submit_job(name, script, mode)
                self.wait_steps(name, self.margin)
                samples.setdefault(script, {})[mode] = [self.one_failure(name) for _ in range(self.failures)]
                LOCAL.delete_workload(self.cluster, name)
                self.wait(f"{name} gone", lambda: LOCAL.workload_gone(self.cluster, name), timeout=120)
        return {"samples": samples}


def median(values: list[float]) -> float | None:
    return round(statistics.median(values), 3) if values else None


def summarise(samples: list[dict[str, Any]]) -> dict[str, Any]:
    phases = [s["phases"] for s in samples]
    keys = [k for k in (phases[0] if phases else {}) if any(p.get(k) is not None for p in phases)]
    return {
        "steps_lost": [s["steps_lost"] for s in samples],
        "mttr_s": median([s["mttr_s"] for s in samples]),
        "mttr_samples_s": [round(s["mttr_s"], 3) for s in samples],
        "back_s": median([s["back_s"] for s in samples]),
        "save_wait_s": [round(s["save_wait_s"], 3) for s in samples],
        "phases": {k: median([p[k] for p in phases if p.get(k) is not None]) for k in keys},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="failures per script and mode")
    parser.add_argument("--scripts", default=",".join(SCRIPTS), help=f"comma-separated: {', '.join(SCRIPTS)}")
    parser.add_argument("--step-sleep", type=float, default=0.05, help="seconds each training step sleeps after its update")
    parser.add_argument("--checkpoint-every", type=int, default=50, help="steps between periodic checkpoints (at least 2)")
    parser.add_argument("--json", action="store_true", help="print only the JSON result")
    args = parser.parse_args()
    scripts = [s for s in args.scripts.split(",") if s]
    unknown = set(scripts) - set(SCRIPTS)
    if args.checkpoint_every < 2:
        raise SystemExit("--checkpoint-every must be at least 2: the failure falls between two checkpoints")
    if unknown:
        raise SystemExit(f"unknown scripts: {', '.join(sorted(unknown))} (known: {', '.join(SCRIPTS)})")
    with tempfile.TemporaryDirectory(prefix="hotswap-slice-loss-") as home:
        os.environ["HOTSWAP_HOME"] = home
        summary = SliceLossBench(args.runs, scripts, args.step_sleep, args.checkpoint_every).run()
    if "samples" not in summary:
        raise SystemExit(f"benchmark failed: {summary['checks']}")
    result: dict[str, Any] = {
        "runs": args.runs, "step_sleep_s": args.step_sleep, "checkpoint_every": args.checkpoint_every,
        "checks_passed": summary["passed"],
    }
    for script, modes in summary["samples"].items():
        wait, nowait = summarise(modes["wait"]), summarise(modes["nowait"])
        ratio = round(wait["mttr_s"] / nowait["mttr_s"], 3) if wait["mttr_s"] and nowait["mttr_s"] else None
        result[script] = {"wait": wait, "nowait": nowait, "mttr_wait_vs_nowait": ratio}
        if not args.json:
            print(f"{script}: steps lost {nowait['steps_lost']} without the wait, {wait['steps_lost']} with it;"
                  f" MTTR median {nowait['mttr_s']} s -> {wait['mttr_s']} s ({ratio}x);"
                  f" back past the lost step {nowait['back_s']} s -> {wait['back_s']} s")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
