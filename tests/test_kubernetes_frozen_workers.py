"""Issue 35 (its notes' last items): the heartbeat interval grows with the cluster so that all
replicas' heartbeats together stay within a bounded write rate, and the controller knows it from
each record; a worker that writes nothing any more while its pod runs (a frozen process) is hung
as locally, and nothing else is: not a long interval on a slow host, not an API server outage,
not a worker whose record was refused (403, 404). The real channel (hotswap.train.report_channel)
against the world's API server, on the world's virtual clock."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from k8s_fixtures.scenario import make_controller, make_world, run_until, running, submit
from k8s_fixtures.world.apiserver import Fault
from k8s_fixtures.world.rbac import ROLES
from k8s_fixtures.world.store import LEASES
from test_kubernetes_worker_reports import _channel, _steps, _stored, _token, _trained

from hotswap.api.spec import workload_spec
from hotswap.api.worker_report import (
    HEARTBEATS_PER_S,
    INTERVAL_ANNOTATION,
    MAX_PUBLISH_INTERVAL_S,
    heartbeat_interval,
    interval_of,
    report_name,
)
from hotswap.backends.kubernetes.render.reports import report_access, report_leases, worker_service_account
from hotswap.train.report_channel import ReportChannel


def _create(world: Any, name: str, interval_s: float, **fields: Any) -> None:
    """What ``workload create`` makes, its Leases asking for a heartbeat every ``interval_s``."""
    spec = workload_spec(name=name, command="python3 train.py", device_type="v6e-16", num_slices=1, priority="high", max_restarts=3, **fields)
    for obj in report_access(spec, world.namespace):
        world.apply(obj)
    jobset = submit(world, name, "high", 1, max_restarts=3, **fields)
    for obj in report_access(spec, world.namespace, owner=jobset) + report_leases(spec, world.namespace, jobset, interval_s):
        world.apply(obj)


def _running_world(interval_s: float = 10.0, token_dir: Path | None = None) -> tuple[Any, Any, ReportChannel]:
    """A running workload whose replica 0 has stepped and written its record (``token_dir``:
    as its pod's ServiceAccount, so the RBAC applies; else as the admin)."""
    world = make_world()
    controller = make_controller(world)
    controller.intervals.interval_of_cluster = lambda slices: interval_s  # the world stands for a cluster of that interval's size
    _create(world, "w", interval_s)
    run_until(world, controller, lambda: running(world, "w") == 4)
    token = _token(token_dir, world, "w") if token_dir is not None else None
    channel = _channel(world, "w", 0, attempt=1, token=token)
    channel.record({"t": world.clock.now, "kind": "start"})
    _steps(channel, 1, 10, world.clock.now - 10)
    channel.publish()
    return world, controller, channel


def _train(world: Any, controller: Any, channel: ReportChannel, seconds: float, step_every: float, write_every: float | None) -> None:
    """The worker steps every ``step_every`` seconds and writes every ``write_every`` (None: never)."""
    step = (channel.report.progress.last_step or 0) + 1
    since_write = 0.0
    for _ in range(int(seconds / step_every)):
        world.advance(step_every, controller)
        channel.record({"t": world.clock.now, "kind": "step", "step": step, "duration_s": step_every, "slices": 1})
        step += 1
        since_write += step_every
        if write_every is not None and since_write >= write_every - 1e-9:
            channel.publish()
            since_write = 0.0


@pytest.mark.parametrize(("slices", "interval"), [(1, 10.0), (100, 10.0), (1_000, 10.0), (10_000, 100.0), (1_000_000, 600.0)])
def test_the_heartbeat_interval_holds_the_clusters_write_rate(slices: int, interval: float) -> None:
    """10 s (as a node's Lease) up to 1,000 slices, then growing: all replicas' heartbeats stay
    within HEARTBEATS_PER_S writes a second (10,000 single-host replicas: 100/s, not 1,000/s),
    up to the longest interval (beyond 60,000 slices)."""
    assert heartbeat_interval(slices) == interval
    assert slices / heartbeat_interval(slices) <= HEARTBEATS_PER_S or interval == MAX_PUBLISH_INTERVAL_S


@pytest.mark.parametrize(("asked", "kept"), [("100", 100.0), ("1", 10.0), ("1e9", 600.0), ("nan", 10.0), ("soon", 10.0), (None, 10.0)])
def test_a_lease_asks_only_an_interval_within_the_bounds(asked: str | None, kept: float) -> None:
    """Anyone who can write the Lease can write anything: a frozen worker is never left unseen
    for longer than the longest interval allows."""
    assert interval_of({INTERVAL_ANNOTATION: asked} if asked is not None else {}) == kept


def test_the_lease_tells_the_worker_its_interval_and_the_record_tells_the_controller() -> None:
    world, controller, channel = _running_world(interval_s=100.0)
    try:
        assert channel.report.interval_s == 100.0  # read from its Lease's answer: the background thread waits that long
        assert _stored(world, "w").interval_s == 100.0
    finally:
        world.close()


def test_no_false_hang_with_the_long_interval_on_a_slow_host() -> None:
    """A cluster of 10,000 slices: a heartbeat every 100 s, each 40 s late (a host loaded far
    beyond its cores), the worker stepping every 5 s. The controller allows the record's own
    interval, not the default 10 s (with which this silence of 140 s would be a hang)."""
    world, controller, channel = _running_world(interval_s=heartbeat_interval(10_000))
    try:
        _train(world, controller, channel, 700, step_every=5.0, write_every=140.0)
        assert world.state("w")["attempt"] == 1 and world.state("w")["restarts"] == 0
        assert not [line for line in controller.logs if "frozen" in line]
    finally:
        world.close()


def test_a_frozen_process_is_hung_as_locally() -> None:
    """SIGSTOP: no step, no heartbeat, the pod Running. Hung once the controller has seen the
    record unrenewed for the hang rule's 60 s, two heartbeats and the margin (110 s), not
    sooner; restarted and charged, as a hang locally."""
    world, controller, channel = _running_world()
    try:
        world.advance(100, controller)
        assert world.state("w")["attempt"] == 1
        world.advance(30, controller)
        assert world.state("w")["attempt"] == 2 and world.state("w")["restarts"] == 1
        (line,) = [line for line in controller.logs if "frozen" in line]
        assert "rank replica 0/host 0: its record was not renewed for" in line and "heartbeat every 10s" in line
    finally:
        world.close()


def test_an_api_server_outage_suspends_the_judgement() -> None:
    """The API server fails writes (503) for 200 s: the worker's heartbeats and the controller's
    record of the hang it would decide alike. A failed round restarts the silences it measured,
    so the round after the outage, before the worker's next heartbeat, finds no hang."""
    world, controller, channel = _running_world()
    try:
        lease = f"/apis/coordination.k8s.io/v1/namespaces/{world.namespace}/leases/{report_name('w', 0)}"
        jobset = f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/{world.namespace}/jobsets/w"
        outage = [Fault("PUT", lease, 503, "ServiceUnavailable"), Fault("PATCH", jobset, 503, "ServiceUnavailable")]
        world.api.faults.extend(outage)
        _train(world, controller, channel, 200, step_every=5.0, write_every=10.0)
        for fault in outage:
            world.api.faults.remove(fault)
        controller.reconcile()  # the controller's first round after the outage comes before the worker's heartbeat
        _train(world, controller, channel, 100, step_every=5.0, write_every=10.0)
        assert world.state("w")["attempt"] == 1 and world.state("w")["restarts"] == 0
    finally:
        world.close()


@pytest.mark.parametrize("refusal", [403, 404])
def test_a_worker_refused_its_record_trains_on_and_is_not_hung(refusal: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """403: someone deleted the workers' Role mid-run; 404: their Lease. The worker says so once
    and trains on, writing nothing more. The controller sees no record (404), or a silent one
    whose writers may no longer write it (403: it reads their Role before judging): no hang,
    said once."""
    world, controller, channel = _running_world(token_dir=tmp_path)
    try:
        if refusal == 403:
            world.store.delete(ROLES, world.namespace, worker_service_account("w"))
        else:
            world.store.delete(LEASES, world.namespace, report_name("w", 0))
        _train(world, controller, channel, 400, step_every=5.0, write_every=10.0)
        assert channel.refused and capsys.readouterr().err.count(f"not published ({refusal}") == 1
        assert world.state("w")["attempt"] == 1 and world.state("w")["restarts"] == 0
        warnings = [line for line in controller.logs if "may no longer write it" in line]
        assert len(warnings) == (1 if refusal == 403 else 0)
    finally:
        world.close()


def test_an_elastic_replica_grown_back_is_not_hung_for_the_record_its_lost_pod_left() -> None:
    """Replica 2's pod dies with its node (no stop recorded); the workload shrinks, trains on two
    slices, and grows back once the node is repaired. The new pod runs long before its process
    writes (imports, re-forming): the old record's silence is not its."""
    world = make_world()
    try:
        controller = make_controller(world)
        spec = workload_spec(name="el", command="python3 train.py", device_type="v6e-16", num_slices=3, priority="high",
                             min_slices=2, max_restarts=3)
        for obj in report_access(spec, world.namespace):
            world.apply(obj)
        jobset = submit(world, "el", "high", 3, min_slices=2, max_restarts=3)
        for obj in report_access(spec, world.namespace, owner=jobset) + report_leases(spec, world.namespace, jobset):
            world.apply(obj)
        run_until(world, controller, lambda: running(world, "el") == 12)
        channels = [_trained(world, "el", replica, slices=3) for replica in range(3)]
        dead = world.nodes_of_pool(world.pools_of("el")[2])[0]
        world.fail_node(dead)
        run_until(world, controller, lambda: world.state("el")["membership"] == 1)
        survivors = channels[:2]
        for channel in survivors:
            channel.record({"t": world.clock.now, "kind": "elastic", "slices": 2, "duration_s": 1.0})
        for _ in range(20):  # 200 s on two slices
            world.advance(10, controller)
            for channel in survivors:
                _steps(channel, (channel.report.progress.last_step or 0) + 1, 10, world.clock.now - 10, slices=2)
                channel.publish()
        world.repair_node(dead)
        run_until(world, controller, lambda: running(world, "el") == 12)
        for _ in range(15):  # 150 s: the grown-back replica's process has not written yet
            world.advance(10, controller)
            for channel in survivors:
                _steps(channel, (channel.report.progress.last_step or 0) + 1, 10, world.clock.now - 10, slices=3)
                channel.publish()
        state = world.state("el")
        assert (state["attempt"], state["phase"], state["restarts"]) == (1, "RUNNING", 0)
        assert not [line for line in controller.logs if "frozen" in line]
    finally:
        world.close()
