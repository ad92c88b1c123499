"""What the training processes themselves reported: steps, restores, elastic changes.

The demo measures recovery from these records, not from the controller's view: MTTR ends at
the first training step completed after a failure, as the workers logged it. Sources are the
goodput events files (``HOTSWAP_EVENTS_FILE``: precise times) and the per-host logs (the
contract's ``step=`` and ``restored`` lines, which the seed-001 awk script also reads).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from hotswap.api.worker_output import (
    EVENT_CHECKPOINT_RESTORE,
    EVENT_CHECKPOINT_SAVE,
    EVENT_ELASTIC,
    EVENT_START,
    EVENT_STEP,
    EVENT_STOP,
    parse_fields,
)


@dataclasses.dataclass(frozen=True)
class StepRecord:
    t: float
    step: int
    attempt: int
    replica: int
    host: int
    slices: int | None
    loss: float | None
    formed_t: float | None = None  # a process's first step: when its group was formed
    restored_t: float | None = None  # ... and when its state was restored


@dataclasses.dataclass(frozen=True)
class RestoreRecord:
    t: float
    step: int
    source: str
    attempt: int
    replica: int = 0  # the replica index of the worker that restored (its events file says)
    host: int = 0


@dataclasses.dataclass(frozen=True)
class SaveRecord:
    """A checkpoint a worker saved (its event is written once the checkpoint is committed)."""

    t: float
    step: int
    reason: str
    attempt: int


@dataclasses.dataclass
class Trace:
    """Every worker's records of one workload, in time order."""

    steps: list[StepRecord]
    restores: list[RestoreRecord]
    stops: list[dict]
    saves: list[SaveRecord] = dataclasses.field(default_factory=list)

    starts: list[dict] = dataclasses.field(default_factory=list)
    elastic: list[dict] = dataclasses.field(default_factory=list)  # membership changes a worker applied

    def last_save_up_to(self, attempt: int) -> SaveRecord | None:
        """The newest checkpoint the workers of ``attempt`` and earlier saved: what a restart
        after it must restore (a termination save while stopping included)."""
        return max((s for s in self.saves if s.attempt <= attempt), key=lambda s: (s.step, s.t), default=None)

    @property
    def last_step(self) -> int:
        return max((s.step for s in self.steps), default=0)

    def last_step_before(self, t: float) -> int:
        return max((s.step for s in self.steps if s.t <= t), default=0)

    def first_step_after(self, t: float) -> StepRecord | None:
        return next((s for s in self.steps if s.t > t), None)

    def restore_after(self, t: float, replica: int | None = None) -> RestoreRecord | None:
        """The first restore after ``t`` (by ``replica``'s workers only, if given)."""
        return next((r for r in self.restores if r.t > t and replica in (None, r.replica)), None)

    def latest_loss(self) -> float | None:
        return next((s.loss for s in reversed(self.steps) if s.loss is not None), None)


def survivor_stall(trace: Trace, replica: int, before_slices: int, after_slices: int, since: float) -> dict[str, float] | None:
    """How long a surviving worker (``replica``'s host 0) stopped training across a membership
    change after ``since``: from its last step on ``before_slices`` slices to its first step on
    ``after_slices``, as its own step timestamps say; and its usual step time before, to compare.
    None if the change is not (yet) in the trace."""
    own = [s for s in trace.steps if s.replica == replica and s.host == 0]
    first = next((s for s in own if s.t > since and s.slices == after_slices), None)
    if first is None:
        return None
    last = max((s for s in own if s.t < first.t and s.slices == before_slices), key=lambda s: s.t, default=None)
    if last is None:
        return None
    earlier = [s.t for s in own if s.t <= last.t and s.slices == before_slices][-21:]
    gaps = sorted(b - a for a, b in zip(earlier, earlier[1:]))
    usual = gaps[len(gaps) // 2] if gaps else 0.0
    return {"stall_s": round(first.t - last.t, 3), "usual_step_s": round(usual, 3), "last_step": last.step, "first_step": first.step}


PHASES = ("decision", "stop", "spawn", "import", "formed", "restored", "first_step")


def restart_phases(trace: Trace, t_fail: float, after_attempt: int, decision_t: float | None = None) -> dict[str, float | None]:
    """When each phase of the restart after a failure at ``t_fail`` ended, in seconds after it,
    from the workers' own records of the attempts after ``after_attempt`` (the slowest worker
    of each phase; None where no record says): ``decision`` (the controller decided: given),
    ``stop`` (the failed attempt's last worker recorded its stop), ``spawn`` (the new processes
    began, or a warm spare was handed over), ``import`` (the run was created: Python, the
    script's imports and set-up done), ``formed`` (the process group formed), ``restored``
    (the state restored) and ``first_step`` (the first step done)."""

    def after(t: float | None) -> float | None:
        return None if t is None else round(t - t_fail, 3)

    starts = [s for s in trace.starts if s["attempt"] > after_attempt and s["t"] > t_fail]
    firsts = [s for s in trace.steps if s.attempt > after_attempt and s.restored_t is not None and s.t > t_fail]
    stops = [s["t"] for s in trace.stops if s["attempt"] <= after_attempt and s["t"] > t_fail]
    first = next((s for s in trace.steps if s.attempt > after_attempt and s.t > t_fail), None)
    spawned = [s["process_t"] for s in starts if s.get("process_t") is not None]
    return {
        "decision_s": after(decision_t),
        "stop_s": after(max(stops)) if stops else None,
        "spawn_s": after(max(spawned)) if spawned else None,
        "import_s": after(max(s["t"] for s in starts)) if starts else None,
        "formed_s": after(max(s.formed_t for s in firsts if s.formed_t is not None)) if firsts else None,
        "restored_s": after(max(s.restored_t for s in firsts if s.restored_t is not None)) if firsts else None,
        "first_step_s": after(first.t) if first else None,
    }


def read_trace(workload_dir: Path) -> Trace:
    steps: list[StepRecord] = []
    restores: list[RestoreRecord] = []
    stops: list[dict] = []
    saves: list[SaveRecord] = []
    starts: list[dict] = []
    elastic: list[dict] = []
    for path in sorted((workload_dir / "events").glob("*.jsonl")):
        try:
            attempt, replica, host = (int(part) for part in path.stem.split("-")[:3])
        except ValueError:
            continue
        for line in path.read_text().splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut short by a kill
            kind = record.get("kind")
            if kind == EVENT_STEP:
                loss = record.get("loss")
                steps.append(
                    StepRecord(
                        float(record["t"]), int(record["step"]), attempt, replica, host,
                        record.get("slices"), float(loss) if loss is not None else None,
                        record.get("formed_t"), record.get("restored_t"),
                    )
                )
            elif kind == EVENT_START:
                starts.append({**record, "attempt": attempt, "replica": replica, "host": host})
            elif kind == EVENT_CHECKPOINT_RESTORE:
                restores.append(
                    RestoreRecord(float(record["t"]), int(record.get("step", 0)), str(record.get("source", "")), attempt, replica, host)
                )
            elif kind == EVENT_CHECKPOINT_SAVE:
                saves.append(SaveRecord(float(record["t"]), int(record.get("step", 0)), str(record.get("reason", "")), attempt))
            elif kind == EVENT_STOP:
                stops.append({**record, "attempt": attempt, "replica": replica, "host": host})
            elif kind == EVENT_ELASTIC:
                elastic.append({**record, "attempt": attempt, "replica": replica, "host": host})
    steps.sort(key=lambda s: (s.t, s.step))
    restores.sort(key=lambda r: r.t)
    saves.sort(key=lambda r: r.t)
    return Trace(steps, restores, stops, saves, sorted(starts, key=lambda s: s["t"]), sorted(elastic, key=lambda e: e["t"]))


def resumed_from_last_checkpoint(trace: Trace, attempt: int) -> tuple[bool, str]:
    """Whether the first attempt after ``attempt`` restored exactly the newest checkpoint that
    ``attempt`` (or an earlier one) saved, as the workers' own records say; and the evidence."""
    restored = next((r for r in trace.restores if r.attempt > attempt), None)
    saved = trace.last_save_up_to(attempt)
    done_before = max((s.step for s in trace.steps if s.attempt <= attempt), default=0)
    passed = restored is not None and saved is not None and restored.step == saved.step
    detail = (
        f"restored step {restored.step if restored else '-'} ({restored.source if restored else '-'}),"
        f" last checkpoint saved before the restart: step {saved.step if saved else '-'}"
        f"{f' ({saved.reason})' if saved and saved.reason else ''}, last step done: {done_before}"
    )
    return passed, detail


def log_lines(path: Path) -> list[str]:
    try:
        return path.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return []


def slice_count_changes(lines: list[str]) -> list[tuple[int, int, int]]:
    """(step, old, new) whenever ``elastic_manager.good_slice_count`` changes: what the seed-001
    awk script prints, computed the same way."""
    changes = []
    previous: int | None = None
    for line in lines:
        if "step=" not in line or "elastic_manager.elastic_down_event_count=" not in line:
            continue
        fields = parse_fields(line)
        count = int(fields.get("elastic_manager.good_slice_count", "0"))
        if previous is not None and count != previous:
            changes.append((int(fields.get("step", "0")), previous, count))
        previous = count
    return changes


IDENTITY = ("JOB_INDEX", "RANK", "MEGASCALE_SLICE_ID")  # one worker's own, never another live one's


def process_environment(pid: int) -> dict[str, str]:
    """The environment a live worker runs with (its first child's, under the shim), as the
    kernel shows it; empty when the process is gone."""
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        raw = Path(f"/proc/{int(children[0]) if children else pid}/environ").read_bytes()
    except (OSError, ValueError):
        return {}
    return dict(item.decode(errors="replace").partition("=")[::2] for item in raw.split(b"\0") if b"=" in item)


def shared_identities(environments: list[dict[str, str]]) -> list[str]:
    """Each index that more than one live worker holds (``JOB_INDEX=2 x2``); none when every
    worker has its own replica index, rank and slice id."""
    shared = []
    for name in IDENTITY:
        values = [env.get(name, "?") for env in environments]
        shared += [f"{name}={value} x{values.count(value)}" for value in sorted(set(values)) if values.count(value) > 1]
    return shared


def repeated_steps(lines: list[str]) -> list[int]:
    """Steps that one log reports more than once: two workers appending to the same file (a
    worker's own log never repeats a step without a restart, and an elastic drill has none)."""
    seen: set[int] = set()
    repeated = []
    for line in lines:
        if "step=" not in line or "elastic_manager.good_slice_count=" not in line:
            continue
        step = int(parse_fields(line).get("step", "-1"))
        if step in seen:
            repeated.append(step)
        seen.add(step)
    return repeated
