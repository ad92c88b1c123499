"""Helpers for tests that run the real controller against the world: a cluster set up as
``cluster create`` leaves it, workloads submitted as ``workload create`` does, and the
controller wired to the world's API server and clock."""

from __future__ import annotations

from typing import Any

from k8s_fixtures.world import World, load_nodes
from k8s_fixtures.world.store import EVENTS, JOBS

from hotswap.api import worker as contract
from hotswap.api.spec import workload_spec
from hotswap.backends.kubernetes import labels
from hotswap.backends.kubernetes import operations as ops
from hotswap.backends.kubernetes.discovery import discover
from hotswap.backends.kubernetes.render import render_jobset, render_kueue, render_priority_classes
from hotswap.backends.kubernetes.settings import KubeSettings
from hotswap.backends.kubernetes.controller.loop import KubeController

CLUSTER = "c"
POOLS = ["tpu-v6e-np-0", "tpu-v6e-np-1", "tpu-v6e-np-2"]


def make_world(kueue: bool = False, nodes: str | list[dict[str, Any]] = "gke_v6e16_nodes.yaml", interleave: bool = True, **options: Any) -> World:
    """A cluster as ``hotswap cluster create --backend kubernetes [--kueue]`` leaves it (nodes:
    a fixture's file name, or Node objects). Its controllers react to each write of the
    controller under test before the next one (``interleave``), as on a real control plane."""
    node_objects = load_nodes(nodes) if isinstance(nodes, str) else nodes
    world = World(node_objects, kueue=kueue, interleave=interleave, **options)
    world.install_priority_classes(render_priority_classes())
    if kueue:
        settings = KubeSettings(kueue=True)
        for obj in render_kueue(settings, discover(node_objects, settings).slices_by_type()):
            world.apply(obj)
    return world


def settings_of(world: World) -> KubeSettings:
    return KubeSettings(kueue=world.kueue is not None, namespace=world.namespace)


def make_controller(world: World, **options: Any) -> KubeController:
    logs: list[str] = []
    controller = KubeController(world.client(settings_of(world)), CLUSTER, clock=lambda: world.clock.now, log=logs.append, **options)
    controller.logs = logs  # type: ignore[attr-defined]
    return controller


def submit(world: World, name: str, priority: str = "medium", slices: int = 1, device_type: str = "v6e-16", **fields: Any) -> dict[str, Any]:
    spec = workload_spec(name=name, command="python3 train.py", device_type=device_type, num_slices=slices, priority=priority, **fields)
    return world.apply(render_jobset(spec, CLUSTER, settings_of(world)))


def running(world: World, jobset: str, attempt: int | None = None) -> int:
    """How many workers of a workload run (of one attempt, if given): its slices' pods, not an
    elastic workload's coordinator."""
    return sum(
        1 for p in world.running(jobset)
        if p["metadata"]["labels"].get("jobset.sigs.k8s.io/replicatedjob-name") == "slice"
        and (attempt is None or p["metadata"]["annotations"].get("hotswap.dev/attempt") == str(attempt))
    )


def listed(world: World, name: str) -> dict[str, Any]:
    """The workload's row of ``workload list --output json``."""
    from k8s_fixtures.world.store import KUEUE_RESOURCES

    from hotswap.backends.kubernetes.live_objects import read_jobset
    from hotswap.backends.kubernetes.views import kueue_status, view_of

    kueue = kueue_status(world.store.list(KUEUE_RESOURCES[0])) if world.kueue is not None else {}
    return view_of(read_jobset(world.jobset(name)), kueue)


def events(world: World, jobset: str | None = None) -> list[tuple[str, str, str]]:
    """(object, reason, message) of the Events recorded (by hotswap, JobSet, the Job controller)."""
    found = []
    for event in world.store.list(EVENTS):
        involved = (event.get("involvedObject") or {}).get("name", "")
        if jobset is None or involved == jobset:
            found.append((involved, event.get("reason", ""), event.get("message", "")))
    return found


def run_until(world: World, controller: KubeController, done: Any, limit_s: float = 600.0, step: float = 1.0) -> float:
    """Advance until ``done()`` holds (returns the virtual seconds it took); fails after ``limit_s``."""
    start = world.clock.now
    while not done():
        if world.clock.now - start > limit_s:
            raise AssertionError(f"not done after {limit_s} virtual seconds")
        world.advance(step, controller)
    return world.clock.now - start


def slice_jobs(world: World, jobset: str) -> set[str]:
    """The names of a JobSet's live child Jobs of its slices (not its coordinator's, not one
    being deleted)."""
    return {
        job["metadata"]["name"] for job in world.store.items(JOBS)
        if job["metadata"].get("labels", {}).get(labels.JOBSET_NAME_LABEL) == jobset
        and job["metadata"].get("labels", {}).get(labels.REPLICATED_JOB_NAME_LABEL) != contract.COORDINATOR_JOB
        and "deletionTimestamp" not in job["metadata"]
    }


def retired_jobs(operations: list[ops.Operation], jobset: str) -> set[str]:
    """The Jobs of a JobSet a reconcile deleted because a decision replaced them."""
    return {op.name for op in operations if isinstance(op, ops.DeleteJob) and op.jobset == jobset and op.why == "retired"}
