"""The GPU drill (``hotswap demo gpu``): a preempted job saves its GPU state inside its grace
period and resumes on the GPU, bit for bit, at the step where it stopped.

On one GPU-backed slice (one GPU is enough): a low-priority job trains with ``state_gb`` of
model and Adam state on the GPU; a high-priority job needs that slice, so the low job gets
SIGTERM, saves, and exits; the high job runs on the GPU once the low job has left it (never two
processes on one GPU), and finishes; the low job is admitted again and resumes. Checks: the
save ended inside the grace period, the high job started only after the low job had left,
the low job restored the step it stopped at, on the GPU, and the SHA-256 of its parameters
after the restore is the one it saved. The summary puts the save's time and bytes/s next to a
raw write (and fsync) of as many bytes to the same directory, measured in the same run.

Without a free GPU (or with ``--backing emulated``) the same drill runs on an emulated slice
with a small state on the CPU: every step and check but the GPU's own.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from hotswap.api import worker as contract
from hotswap.api.worker_output import EVENT_CHECKPOINT_SAVE, EVENT_STOP, parse_fields
from hotswap.demo.drills import Drill, DrillFailed
from hotswap.demo.observe import log_lines
from hotswap.store import registry
from hotswap.store.paths import new_dirs_private, open_private

GRACE_S = 60.0
EMULATED_STATE_GB = 0.02  # on the CPU of an emulated slice: the drill's logic, not its scale
SCRIPT = "state_train.py"
RAW_WRITE_CHUNK = 64 << 20


class GpuDrill(Drill):
    scenario = "gpu"
    title = "a preempted job saves its GPU state on SIGTERM and resumes on the GPU bit for bit"

    def drill(self) -> dict[str, Any]:
        self.create_cluster(1)
        state_gb = self.options.state_gb if self.backed else EMULATED_STATE_GB
        self.submit("low", priority="low", slices=1, script=SCRIPT, args=f"--state-gb {state_gb} --checkpoint-every 0",
                    termination_grace_period_s=GRACE_S)
        self.wait_steps("low", 20)
        low = self.record("low")
        assert low is not None
        t_preempt = time.time()
        self.submit("high", priority="high", slices=1, steps=30, script=SCRIPT,
                    args=f"--state-gb {min(state_gb, 0.1)} --checkpoint-every 0")
        stop = self.wait("low to save and stop", lambda: self._stop_of("low", low["attempt"]), timeout=GRACE_S + 30)
        self.wait("high to finish", lambda: (self.record("high") or {}).get("status") == "SUCCESSFUL", timeout=300)
        resumed = self.wait("low to train again", lambda: self._first_step_after("low", low["attempt"]), timeout=300)
        trace = self.trace("low")
        assert trace is not None
        stopped_at = max(s.step for s in trace.steps if s.attempt == low["attempt"])
        restored = next((r for r in trace.restores if r.attempt > low["attempt"]), None)
        save = self._termination_save("low", low["attempt"])
        saved, after = self._checksums("low")
        high_trace = self.trace("high")
        high_first = min((s.t for s in high_trace.steps), default=None) if high_trace else None
        devices = [line for line in log_lines(self.main_log("low")) if line.startswith("state device=")]

        self.check("low saved on SIGTERM inside its grace period",
                   stop["reason"] == "terminated" and stop["exit_code"] == contract.CHECKPOINTED_EXIT_CODE
                   and save is not None and float(stop["t"]) - t_preempt < GRACE_S,
                   f"stopped {float(stop['t']) - t_preempt:.1f}s after the preemption (grace {GRACE_S:.0f}s),"
                   f" exit {stop['exit_code']}, save {save['total_s'] if save else '-'}s")
        high = self.record("high") or {}
        self.check("high ran on low's slice and finished", high.get("status") == "SUCCESSFUL" and high_first is not None,
                   f"high is {high.get('status')}: {high.get('status_message')}")
        if self.backed:
            self.check("high started only after low left the GPU",
                       high_first is not None and high_first > float(stop["t"]),
                       f"low left at {float(stop['t']):.2f}, high's first step at {high_first or 0:.2f}")
            self.check("low resumed on the GPU", len(devices) >= 2 and devices[-1].split()[1].startswith("device=cuda"),
                       devices[-1] if devices else "no device line")
        self.check("low resumed at the step where it stopped", restored is not None and restored.step == stopped_at,
                   f"stopped after {stopped_at}, restored {restored.step if restored else '-'}"
                   f" ({restored.source if restored else '-'}), next step {resumed.step}")
        self.check("parameters bit-identical after the restore (SHA-256)", saved is not None and saved == after,
                   f"saved {(saved or '-')[:16]}..., restored {(after or '-')[:16]}...")
        raw = self._raw_write(int(save["bytes"])) if save else None
        result: dict[str, Any] = {
            "mttr_s": round(resumed.t - float(stop["t"]), 3),
            "steps_lost": stopped_at - restored.step if restored else None,
            "preempted": ["low"],
            "logs": str(self.main_log("low")),
            "device": devices[-1].split()[1].removeprefix("device=") if devices else None,
            "state_gb": state_gb,
            "goodput": {name: self.goodput(name) for name in ("low", "high")},
        }
        if save is not None and raw is not None:
            result["save"] = {
                "bytes": int(save["bytes"]), "seconds": float(save["total_s"]),
                "bytes_per_s": int(save["bytes"]) / max(float(save["total_s"]), 1e-9),
            }
            result["raw_write"] = {"bytes": int(save["bytes"]), "seconds": raw, "bytes_per_s": int(save["bytes"]) / max(raw, 1e-9)}
            result["save_vs_raw_write"] = round(float(save["total_s"]) / max(raw, 1e-9), 3)
        return result

    # ------------------------------------------------------------------ what the workers wrote

    def _events(self, name: str, attempt: int) -> list[dict[str, Any]]:
        directory = self.workload_dir(name)
        records: list[dict[str, Any]] = []
        for path in sorted((directory / "events").glob(f"{attempt}-0-0-*.jsonl")) if directory else []:
            for line in path.read_text().splitlines():
                try:
                    records.append(json.loads(line))
                except ValueError:
                    continue
        return records

    def _stop_of(self, name: str, attempt: int) -> dict[str, Any] | None:
        return next((r for r in self._events(name, attempt) if r.get("kind") == EVENT_STOP), None)

    def _termination_save(self, name: str, attempt: int) -> dict[str, Any] | None:
        return next(
            (r for r in self._events(name, attempt)
             if r.get("kind") == EVENT_CHECKPOINT_SAVE and r.get("reason") == "termination"),
            None,
        )

    def _first_step_after(self, name: str, attempt: int) -> Any:
        trace = self.trace(name)
        return next((s for s in trace.steps if s.attempt > attempt), None) if trace else None

    def _checksums(self, name: str) -> tuple[str | None, str | None]:
        """The checksum the job saved at the step it restored (the last one it saved, before a
        restore), and the one it found after restoring. Saved lines are keyed by step: the SDK
        also reads the registered state when it is registered (step 0), before the restore."""
        saved_at: dict[str, str | None] = {}
        saved = after = None
        for line in log_lines(self.main_log(name)):
            if line.startswith("params_checksum"):
                fields = parse_fields(line)
                if fields.get("when") == "saved":
                    saved_at[fields.get("step", "")] = saved = fields.get("sha256")
                elif fields.get("when") == "restored":
                    saved = saved_at.get(fields.get("step", ""))
                    after = fields.get("sha256") if fields.get("saved") == saved else None
        return saved, after

    def _raw_write(self, size: int) -> float:
        """Seconds to write and fsync ``size`` bytes where the checkpoints are (the disk's pace)."""
        directory = registry.existing(self.cluster).checkpoint_dir("low")
        new_dirs_private(directory)
        target = directory / "raw-write.bin"
        block = os.urandom(min(size, RAW_WRITE_CHUNK)) if size else b""
        started = time.monotonic()
        try:
            with os.fdopen(open_private(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), "wb") as handle:
                left = size
                while left > 0:
                    left -= handle.write(block[: min(left, len(block))])
                handle.flush()
                os.fsync(handle.fileno())
            return time.monotonic() - started
        except OSError as error:
            raise DrillFailed(f"the raw write to {target} failed: {error}") from error
        finally:
            target.unlink(missing_ok=True)
