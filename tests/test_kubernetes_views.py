"""What ``describe`` and ``node list`` show about live objects, built without an API server."""

from __future__ import annotations

from k8s_fixtures.world import load_nodes

from hotswap.backends.kubernetes import labels
from hotswap.backends.kubernetes.discovery import discover
from hotswap.backends.kubernetes.live_objects import LivePod
from hotswap.backends.kubernetes.settings import KubeSettings
from hotswap.backends.kubernetes.views import placement_view, slice_holders, workers_view


def pod(
    name: str, replica: int, host: int, node: str | None, gates: tuple[str, ...] = (), terminating: bool = False,
    phase: str = "Pending", exit_code: int | None = None,
) -> LivePod:
    finished = phase in ("Succeeded", "Failed")
    return LivePod(name, "w", replica, host, node, gates, terminating, finished, "j", {}, {}, phase=phase, exit_code=exit_code)


def test_slices_are_held_by_the_workloads_whose_rows_list_them() -> None:
    rows = [{"name": "a", "slices": ["np-0", "np-1"]}, {"name": "b", "slices": []}, {"name": "c", "slices": ["np-2"]}]
    assert slice_holders(rows) == {"np-0": "a", "np-1": "a", "np-2": "c"}


def test_placement_and_workers_of_a_workload() -> None:
    discovery = discover(load_nodes(), KubeSettings())
    first, second = discovery.slices[0], discovery.slices[1]
    placement = placement_view([None, first.name], discovery)
    assert [(p["replica"], p["slice"]) for p in placement] == [(1, first.name)]
    assert [n["name"] for n in placement[0]["nodes"]] == list(first.nodes)
    pods = [
        pod("p-1-0", 1, 0, None, gates=(labels.PLACEMENT_GATE,)),
        pod("p-0-1", 0, 1, second.nodes[1], terminating=True),
        pod("p-0-0", 0, 0, second.nodes[0]),
        pod("p-1-1", 1, 1, None),
        pod("p-0-2", 0, 2, second.nodes[2], phase="Running"),
        pod("p-0-3", 0, 3, second.nodes[3], phase="Failed", exit_code=3),
        pod("p-1-2", 1, 2, second.nodes[2], phase="Succeeded", exit_code=0),
    ]
    rows = workers_view(pods, discovery, attempt=2)
    assert [(r["pid"], r["slice"], r["state"], r["exit_code"]) for r in rows] == [
        ("p-0-0", second.name, "scheduled", None),
        ("p-0-1", second.name, "terminating", None),
        ("p-0-2", second.name, "running", None),
        ("p-0-3", second.name, "exited", 3),
        ("p-1-0", None, "gated", None),
        ("p-1-1", None, "pending", None),
        ("p-1-2", second.name, "exited", 0),
    ]
    assert {r["attempt"] for r in rows} == {2}


def test_the_timeline_is_the_jobsets_events_oldest_first_without_an_earlier_namesakes() -> None:
    from hotswap.backends.kubernetes.views import timeline_view

    def event(reason: str, at: str, uid: str, count: int = 1) -> dict:
        return {"involvedObject": {"kind": "JobSet", "name": "w", "uid": uid}, "reason": reason, "message": reason.lower(),
                "lastTimestamp": at, "count": count}

    events = [event("Restarted", "2026-11-22T12:05:00Z", "u2", 2), event("Admitted", "2026-11-22T12:00:00Z", "u2"),
              event("Failed", "2026-11-21T12:00:00Z", "u1")]
    assert timeline_view(events, "u2") == [
        {"time": "2026-11-22T12:00:00Z", "event": "Admitted", "message": "admitted"},
        {"time": "2026-11-22T12:05:00Z", "event": "Restarted", "message": "restarted (x2)"},
    ]


def test_a_workers_row_says_when_its_pod_runs_and_how_its_container_ended() -> None:
    """`workload create --wait` reads these rows: a running pod is "running", a finished one
    "exited" with the container's exit code, as the local backend's rows say (issue 25 item 3)."""
    import dataclasses

    discovery = discover(load_nodes(), KubeSettings())
    nodes = discovery.slices[0].nodes
    running = dataclasses.replace(pod("p-0-0", 0, 0, nodes[0]), phase="Running")
    failed = dataclasses.replace(pod("p-0-1", 0, 1, nodes[1]), phase="Failed", finished=True, exit_code=1)
    rows = workers_view([running, failed], discovery, attempt=1)
    assert [(r["pid"], r["state"], r["exit_code"]) for r in rows] == [("p-0-0", "running", None), ("p-0-1", "exited", 1)]
    # A pod released for an earlier attempt says so: it is not one of the current workers.
    old = dataclasses.replace(failed, annotations={labels.ATTEMPT_ANNOTATION: "1"})
    rows = workers_view([running, old], discovery, attempt=2)
    assert [(r["pid"], r["attempt"]) for r in rows] == [("p-0-0", 2), ("p-0-1", 1)]
