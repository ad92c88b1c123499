"""The page's document, built from what a backend said (``cluster describe``, ``workload
list``/``describe``, ``node list``: the JSON contracts of DESIGN.md) and the dashboard's
:class:`~hotswap.dashboard.history.History`. Pure: the same inputs give the same document.

Never copied to the page: a workload's environment values (``spec.env``, the launch record),
which may hold secrets; only the variables' names are shown.
"""

from __future__ import annotations

from typing import Any

from hotswap.api import xpk_status as xpk
from hotswap.api.priority import Priority
from hotswap.dashboard.history import KEPT_CATEGORIES, History

GPU_FAULT_WORDS = ("gpu", "xid", "ecc", "nvml")
PAGE_EVENTS = 200
WORKLOAD_FIELDS = ("name", "priority", "status", "status_message", "slices", "num_slices", "restarts", "preemptions", "attempt")


def status_words(row: dict[str, Any]) -> str:
    """A workload's status as the page shows it: xpk's words, then hotswap's own state where it
    says more (``Admitted · RESTARTING``), as ``workload list`` shows them."""
    view = xpk.with_xpk_words(row)
    words, state = view["xpk_status"], view["hotswap_state"]
    return words if state.lower() == words.lower() else f"{words} · {state}"


def node_health(node: dict[str, Any], gpu_backed: bool) -> str:
    """Ready, Cordoned, Failed, or GPU unhealthy (a GPU-backed node failed by a GPU fault)."""
    state = str(node.get("state", "Unknown"))
    reason = str(node.get("reason") or "").lower()
    if gpu_backed and state == "Failed" and any(word in reason for word in GPU_FAULT_WORDS):
        return "GPU unhealthy"
    return state


def slices_grid(cluster: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """Each slice with its holder and its nodes' health, and the capacity by kind."""
    gpu_backed = cluster.get("backing") == "gpu"
    grid = []
    counts = {"held": 0, "spare": 0, "unhealthy": 0}
    for item in cluster.get("slices", []):
        nodes = [
            {"name": n["name"], "health": node_health(n, gpu_backed), "reason": n.get("reason") or ""}
            for n in item.get("nodes", [])
        ]
        healthy = bool(item.get("healthy", all(n["health"] == "Ready" for n in nodes)))
        kind = "held" if item.get("workload") else ("spare" if healthy else "unhealthy")
        counts[kind] += 1
        grid.append({"name": item["name"], "holder": item.get("workload"), "kind": kind, "nodes": nodes,
                     "gpus": len(item.get("gpus", []))})
    return grid, counts


def queue_order(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Queued workloads by priority (highest first), then FIFO, each with why it waits."""
    queued = [r for r in rows if r["status"] == "QUEUED"]
    queued.sort(key=lambda r: (-Priority.parse(r["priority"]).value, r.get("created_time") or ""))
    return [
        {"position": i + 1, "name": r["name"], "priority": r["priority"], "since": r.get("status_time"),
         "reason": r.get("status_message") or "waiting for capacity"}
        for i, r in enumerate(queued)
    ]


def goodput_unknown(goodput: dict[str, Any]) -> bool:
    """Whether a workload's goodput cannot be told: no step was reported (the backend says why in
    ``reason``; its figure is no measure of training)."""
    if not goodput:
        return False
    return goodput.get("goodput") is None or bool(goodput.get("unknown")) or (
        bool(goodput.get("reason")) and goodput.get("source") != "workers")


def workload_row(row: dict[str, Any], described: dict[str, Any] | None, history: History) -> dict[str, Any]:
    described = described or {}
    goodput = described.get("goodput") or {}
    kept = history.workloads.get(row["name"])
    unknown = goodput_unknown(goodput)
    out = {key: row.get(key) for key in WORKLOAD_FIELDS}
    out.update(
        xpk_status=status_words(row),
        run_id=described.get("run_id") or row.get("run_id"),
        step=kept.step if kept else None,
        # Only a running workload trains: a queued, restarting or ended one has no rate.
        steps_per_s=kept.steps_per_s() if kept and row.get("status") == "RUNNING" else None,
        mttr_s=kept.mttr_s if kept else None,
        failures=sum(1 for m in kept.marks if m["kind"] == "failure") if kept else 0,
        # No step reported (``source`` "controller", with the backend's ``reason``): unknown, not 0.
        goodput=None if unknown else goodput.get("goodput"),
        goodput_source=goodput.get("source"),
        goodput_unknown=unknown,
        goodput_reason=goodput.get("reason") if unknown else None,
        # Unknown: no startup charged for time whose use no record tells.
        badput={k: v for k, v in (goodput.get("badput") or {}).items() if v and not (unknown and k == "startup")},
        env_names=sorted((described.get("spec") or {}).get("env") or {}),
    )
    return out


def page_events(events: list[dict[str, Any]], limit: int = PAGE_EVENTS) -> list[dict[str, Any]]:
    """The newest ``limit`` timeline entries, oldest first; failures, restarts, preemptions and
    elastic changes first: routine entries (admissions, checkpoint runs) only fill the room
    they leave, so no amount of routine pushes a failure off the page."""
    kept = [e for e in events if e["category"] in KEPT_CATEGORIES][-limit:]
    routine = [e for e in events if e["category"] not in KEPT_CATEGORIES]
    shown = kept + (routine[-(limit - len(kept)):] if len(kept) < limit else [])
    return [{k: v for k, v in e.items() if k != "base"} for e in sorted(shown, key=lambda e: e["t"])]


def page(
    cluster: dict[str, Any] | None,
    rows: list[dict[str, Any]],
    described: dict[str, dict[str, Any]],
    history: History,
    *,
    updated: float | None,
    now: float,
    error: str | None,
    stale_after_s: float,
    waiting_for: str | None = None,
) -> dict[str, Any]:
    """The whole document the page renders (sent on every change)."""
    grid, counts = slices_grid(cluster or {})
    age = None if updated is None else max(0.0, now - updated)
    return {
        "cluster": {
            key: (cluster or {}).get(key)
            for key in ("name", "backend", "device_type", "num_slices", "hosts_per_slice", "warm_workers", "backing",
                        "controller_pid", "gpu_health")
        },
        "capacity": {**counts, "warm_workers": int((cluster or {}).get("warm_workers") or 0)},
        "slices": grid,
        "queue": queue_order(rows),
        "workloads": [workload_row(r, described.get(r["name"]), history) for r in rows],
        "events": page_events(history.events),
        "steps": {name: kept.steps for name, kept in history.workloads.items() if kept.steps},
        "marks": {name: kept.marks for name, kept in history.workloads.items() if kept.marks},
        "goodput": history.goodput,
        "updated": updated,
        "age_s": age,
        "stale": error is not None or age is None or age > stale_after_s,
        "error": error,
        "waiting_for": waiting_for if error is not None else None,
    }
