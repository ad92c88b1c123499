"""Issue 35 item 3: the workers' own records reach the Kubernetes controller, one Lease per replica
written by its first process (hotswap.train.report_channel, the real code, against the world's
API server), and the controller books goodput, MTTR and hangs from them as the local backend
does from its events files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from k8s_fixtures.scenario import make_controller, make_world, run_until, running, submit
from k8s_fixtures.world.apiserver import Fault
from k8s_fixtures.world.rbac import RBAC_RESOURCES, token_of
from k8s_fixtures.world.store import JOBSETS, LEASES

from hotswap.backends.kubernetes.client.connection import ForbiddenError
from hotswap.api.spec import workload_spec
from hotswap.api.worker_report import REPORT_ANNOTATION, WorkerReport, decode_report, report_name
from hotswap.backends.kit.metrics import ControllerMetrics
from hotswap.backends.kubernetes import labels
from hotswap.backends.kubernetes.live_objects import read_jobset
from hotswap.backends.kubernetes.render.reports import report_access, report_leases, worker_service_account
from hotswap.backends.kubernetes.worker_reports import goodput_view, progress_view, reports_by_workload
from hotswap.train.report_channel import ReportChannel
from test_kubernetes_metrics import sample


def _create(world: Any, name: str, slices: int = 1, **fields: Any) -> dict[str, Any]:
    """What ``workload create`` makes (backend.create_workload): the workers' ServiceAccount,
    Role and RoleBinding, the JobSet, then the same owned by it, and the replicas' Leases."""
    spec = workload_spec(name=name, command="python3 train.py", device_type="v6e-16", num_slices=slices, priority="high", **fields)
    for obj in report_access(spec, world.namespace):
        world.apply(obj)
    jobset = submit(world, name, "high", slices, **fields)
    for obj in report_access(spec, world.namespace, owner=jobset) + report_leases(spec, world.namespace, jobset):
        world.apply(obj)
    return jobset


def _lease(world: Any, workload: str, replica: int) -> None:
    """The replica's Lease alone, as ``workload create`` makes it (for a channel tested without its JobSet)."""
    world.store.create(LEASES, {"metadata": {"name": report_name(workload, replica), "namespace": world.namespace,
                                             "labels": {labels.WORKLOAD_LABEL: workload}}, "spec": {}})


def _channel(world: Any, workload: str, replica: int, attempt: int, token: Path | None = None, lease: str | None = None) -> ReportChannel:
    """The channel of a replica's first process; ``token``: the pod's ServiceAccount token (none: the admin)."""
    url = f"{world.api.url}/apis/coordination.k8s.io/v1/namespaces/{world.namespace}/leases/{lease or report_name(workload, replica)}"
    return ReportChannel(url, attempt, replica, str(token) if token else None, None, clock=lambda: world.clock.now, background=False)


def _token(tmp_path: Path, world: Any, workload: str) -> Path:
    path = tmp_path / f"token-{workload}"
    path.write_text(token_of(world.namespace, worker_service_account(workload)))
    return path


def _steps(channel: ReportChannel, first: int, count: int, t0: float, slices: int = 1, duration: float = 1.0) -> float:
    t = t0
    for step in range(first, first + count):
        t += duration
        channel.record({"t": t, "kind": "step", "step": step, "duration_s": duration, "slices": slices})
    return t


def _trained(world: Any, workload: str, replica: int = 0, slices: int = 1) -> ReportChannel:
    """A replica's channel (attempt 1) that has recorded its start and 10 steps, and written them."""
    channel = _channel(world, workload, replica, attempt=1)
    channel.record({"t": world.clock.now, "kind": "start"})
    _steps(channel, 1, 10, world.clock.now - 10, slices=slices)
    channel.publish()
    return channel


def _stored(world: Any, workload: str, replica: int = 0) -> WorkerReport:
    lease = world.store.get(LEASES, world.namespace, report_name(workload, replica))
    report = decode_report(lease["metadata"]["annotations"][REPORT_ANNOTATION])
    assert report is not None
    return report


def test_goodput_from_the_records_books_the_local_categories() -> None:
    """Startup, restore, productive, save; a restart that restores an earlier step wastes the
    steps after it; time on fewer slices is degraded; no step at all is unknown."""
    report = WorkerReport(replica=0)
    report.fold({"t": 100.0, "kind": "start", "process_t": 98.0}, 1)
    t = 100.0
    for step in range(1, 11):
        t += 1.0
        report.fold({"t": t, "kind": "step", "step": step, "duration_s": 1.0, "slices": 2}, 1)
        if step == 5:
            report.fold({"t": t + 0.5, "kind": "checkpoint_save", "step": 5, "blocking_s": 0.5}, 1)
            t += 0.5
    report.fold({"t": 120.0, "kind": "start", "process_t": 119.0}, 2)
    report.fold({"t": 121.0, "kind": "checkpoint_restore", "step": 5, "duration_s": 1.0, "source": "checkpoint"}, 2)
    report.fold({"t": 123.0, "kind": "step", "step": 6, "duration_s": 1.0, "slices": 2}, 2)
    report.fold({"t": 125.0, "kind": "elastic", "slices": 1, "duration_s": 1.0}, 2)
    report.fold({"t": 130.0, "kind": "step", "step": 7, "duration_s": 1.0, "slices": 1}, 2)
    report.published_at = 130.0
    assert decode_report(report.encode()) == report  # the Lease's text reads back as written

    from hotswap.backends.kubernetes.state_annotation import StateRecord
    from hotswap.core.workload import Workload
    from hotswap.api.phases import WorkloadPhase
    from hotswap.api.spec import workload_spec

    spec = workload_spec(name="w", command="python3 train.py", device_type="v6e-16", num_slices=2, min_slices=1)
    record = StateRecord(Workload(spec=spec, seq=1, created_at=90.0, phase=WorkloadPhase.RUNNING, slices=("a", "b"), attempt=2),
                         phase_seconds={"QUEUED": 5.0}, phase_since=95.0)
    obj = {"metadata": {"name": "w", "uid": "u", "creationTimestamp": "1970-01-01T00:01:30Z",
                        "annotations": {labels.SPEC_ANNOTATION: spec.model_dump_json(), labels.STATE_ANNOTATION: record.encode()}},
           "spec": {}, "status": {}}
    job = read_jobset(obj)
    view = goodput_view(job, {0: report}, now=500.0)
    seconds = view["slice_seconds"]
    assert view["source"] == "workers" and view["as_of"] == 130.0  # as of the records, not the controller's look
    assert seconds["queued"] == pytest.approx(10.0)
    assert seconds["wasted_progress"] == pytest.approx(2 * 5.0)  # steps 6-10 of attempt 1, re-done after the restore of step 5
    assert seconds["productive"] == pytest.approx(2 * 5.0 + 2 * 1.0 + 1 * 1.0)
    assert seconds["checkpoint_save"] == pytest.approx(2 * 0.5)
    assert seconds["checkpoint_restore"] == pytest.approx(2 * 1.0)
    assert seconds["degraded"] >= 5.0  # the stretch on one slice of two
    assert seconds["elastic"] == pytest.approx(1.0)
    assert sum(seconds.values()) == pytest.approx(2 * (130.0 - 90.0))  # every slice-second booked once
    assert 0 < view["goodput"] < 1
    unknown = goodput_view(job, {}, now=500.0)
    assert unknown["goodput"] is None and unknown["reason"].startswith("no step was reported")


def test_the_recovery_ends_at_the_first_step_after_it_not_when_pods_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """hotswap_recovery_seconds and describe's MTTR: failure -> the first productive step after
    it, from the records (the old metric stopped at all pods Running). The controller reads the
    record rounds after it was written (a watch delay): the figure is the records', unchanged."""
    from k8s_fixtures.scenario import CLUSTER, settings_of

    from hotswap.backends.kubernetes import backend as kube_backend

    world = make_world()
    monkeypatch.setattr(kube_backend, "settings_of", lambda cluster: settings_of(world))
    monkeypatch.setattr(kube_backend.KubernetesBackend, "_client", lambda self, settings: world.client(settings))
    try:
        metrics = ControllerMetrics()
        controller = make_controller(world, metrics=metrics)
        _create(world, "w", 1)
        run_until(world, controller, lambda: running(world, "w") == 4)
        first = _channel(world, "w", 0, attempt=1)
        first.record({"t": world.clock.now, "kind": "start"})
        _steps(first, 1, 5, world.clock.now)
        first.publish()
        world.fail_node(world.nodes_of_pool(world.pools_of("w")[0])[0])
        run_until(world, controller, lambda: running(world, "w", attempt=2) == 4)
        world.advance(20, controller)
        assert sample(metrics.exposition(), "hotswap_recovery_seconds_count") == 0  # pods run; no step yet
        second = _channel(world, "w", 0, attempt=2)
        second.record({"t": world.clock.now, "kind": "start"})
        stepped = _steps(second, 6, 3, world.clock.now, duration=2.0) - 4.0  # the first step's end
        second.publish()
        world.advance(40, controller)  # read on a later round (watch delay, resync)
        failures = world.state("w")["failures"]
        assert [attempt for _, attempt in failures] == [1]
        text = metrics.exposition()
        assert sample(text, "hotswap_recovery_seconds_count") == 1
        assert sample(text, "hotswap_recovery_seconds_sum") == pytest.approx(stepped - failures[0][0], abs=1e-3)
        reports = reports_by_workload(world.store.list(LEASES))["w"]
        progress = progress_view([tuple(f) for f in failures], reports)
        assert progress["mttr_s"] == pytest.approx(stepped - failures[0][0], abs=1e-3)
        described = kube_backend.KubernetesBackend().describe_workload(CLUSTER, "w")  # says the same
        assert described["progress"]["mttr_s"] == progress["mttr_s"]
        assert described["goodput"]["source"] == "workers" and 0 < described["goodput"]["goodput"] < 1
        assert described["goodput"]["slice_seconds"]["recovery"] > 0  # from the failure to the new attempt's start
        assert [a.attempt for a in _stored(world, "w").attempts] == [1, 2]
    finally:
        world.close()


def test_two_pods_of_one_replica_write_its_record_without_losing_each_others_attempts() -> None:
    """The old attempt's pod, terminating, records its save while the new one steps: the API
    server refuses the stale resourceVersion (409); the channel reads, keeps the other's attempt
    and writes again."""
    world = make_world()
    try:
        _lease(world, "w", 0)
        old, new = _channel(world, "w", 0, attempt=1), _channel(world, "w", 0, attempt=2)
        old.record({"t": 10.0, "kind": "start"})
        _steps(old, 1, 3, 10.0)
        old.publish()
        new.record({"t": 20.0, "kind": "start"})
        _steps(new, 4, 2, 20.0)
        new.publish()
        old.record({"t": 21.0, "kind": "stop", "reason": "terminated"})
        conflicts = len([r for r in world.api.requests if r.status == 409])
        old.publish()
        assert len([r for r in world.api.requests if r.status == 409]) == conflicts + 1
        stored = _stored(world, "w")
        assert [a.attempt for a in stored.attempts] == [1, 2]
        assert stored.attempts[0].stop == "terminated" and stored.attempts[1].steps == 2
        assert stored.progress.last_step == 5  # the newer attempt's progress is the replica's
    finally:
        world.close()


def test_a_pod_may_write_its_own_records_and_nothing_else(tmp_path: Path) -> None:
    """The workload's ServiceAccount (RBAC as the API server authorizes it): get and update its
    replicas' Leases; another workload's record, a JobSet, a new Lease: 403. Deleting the JobSet
    takes its records and its workers' access with it."""
    world = make_world()
    try:
        _create(world, "w", 2)
        _create(world, "other", 1)
        token = _token(tmp_path, world, "w")
        for replica in (0, 1):
            mine = _channel(world, "w", replica, attempt=1, token=token)
            _steps(mine, 1, 2, 10.0)
            mine.publish()
            assert not mine.refused and _stored(world, "w", replica).attempts[0].steps == 2
        theirs = _channel(world, "w", 0, attempt=1, token=token, lease=report_name("other", 0))
        _steps(theirs, 1, 2, 10.0)
        theirs.publish()
        assert theirs.refused and reports_by_workload(world.store.list(LEASES)).get("other") is None
        client = world.client()
        client.api_client.set_default_header("Authorization", f"Bearer {token.read_text()}")  # as the pod's ServiceAccount
        client.sleep = lambda _: None  # (its retries of a 403 while RBAC caches fill)
        with pytest.raises(ForbiddenError, match='cannot patch resource "jobsets"'):
            client.patch_jobset("w", {"metadata": {"annotations": {"x": "y"}}})
        with pytest.raises(ForbiddenError, match='cannot create resource "leases"'):
            client.create_lease({"metadata": {"name": "w-report-9"}})
        world.store.delete(JOBSETS, world.namespace, "w")
        world.settle()
        assert not [o for r in (LEASES, *RBAC_RESOURCES) for o in world.store.items(r)
                    if o["metadata"].get("labels", {}).get(labels.WORKLOAD_LABEL) == "w"]
    finally:
        world.close()


def test_a_pod_the_rbac_refuses_says_so_once_and_trains_on(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """403 (a pod whose ServiceAccount has no Role, as a workload created by an earlier release):
    one line, no more writes, nothing raised into training; goodput unknown with the reason."""
    world = make_world()
    try:
        _lease(world, "w", 0)
        channel = _channel(world, "w", 0, attempt=1, token=_token(tmp_path, world, "w"))
        _steps(channel, 1, 3, 10.0)
        channel.publish()
        channel.publish()
        assert channel.refused
        assert capsys.readouterr().err.count("not published (403") == 1
        assert len([r for r in world.api.requests if r.path.endswith("/leases/w-report-0")]) == 1  # refused once, never asked again
        assert reports_by_workload(world.store.list(LEASES)) == {}
    finally:
        world.close()


def _hung_world(hang_timeout: float | None = None) -> tuple[Any, Any, ReportChannel]:
    world = make_world()
    controller = make_controller(world)
    _create(world, "w", 1, max_restarts=3, **({"hang_timeout_s": hang_timeout} if hang_timeout else {}))
    run_until(world, controller, lambda: running(world, "w") == 4)
    channel = _channel(world, "w", 0, attempt=1)
    channel.record({"t": world.clock.now, "kind": "start"})
    return world, controller, channel


def _heartbeats(world: Any, controller: Any, channel: ReportChannel, seconds: float, every: float = 10.0) -> None:
    for _ in range(int(seconds / every)):
        world.advance(every, controller)
        channel.publish()


@pytest.mark.parametrize("refused", [False, True])
def test_a_replica_that_stops_stepping_is_hung_by_its_own_heartbeat(refused: bool) -> None:
    """Judged as locally; a round whose record of the decision is refused (409) decided nothing,
    so the next round finds the hang again."""
    world, controller, channel = _hung_world()
    try:
        _steps(channel, 1, 10, world.clock.now)
        channel.publish()
        _heartbeats(world, controller, channel, 40)
        assert world.state("w")["attempt"] == 1
        if refused:  # the first write to the JobSet from now on (steady until then): the hang's decision
            world.api.faults.append(Fault("PATCH", f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/{world.namespace}/jobsets/w", 409,
                                          "Conflict", "the object has been modified", times=1))
        _heartbeats(world, controller, channel, 50)
        world.advance(5, controller)
        assert world.state("w")["attempt"] == 2  # restarted, charged, as locally
        assert world.state("w")["restarts"] == 1
        assert len([line for line in controller.logs if "hung" in line and "changed meanwhile" not in line]) >= 1
        assert not refused or any("changed meanwhile" in line for line in controller.logs)
    finally:
        world.close()


@pytest.mark.parametrize("case", ["stale_heartbeat", "stopped", "long_first_step", "saving", "evaluation_pause"])
def test_what_is_never_a_hang(case: str) -> None:
    """A controller that looks late (the last heartbeat is old: a loaded host, a controller that
    was away), a worker that recorded its stop, a first step that takes long, an announced save,
    an evaluation pause within the timeout: never hung."""
    world, controller, channel = _hung_world()
    try:
        if case != "long_first_step":
            _steps(channel, 1, 10, world.clock.now)
        if case == "evaluation_pause":  # 50 s without a step, then training goes on, 5 times
            for round_ in range(5):
                channel.publish()
                _heartbeats(world, controller, channel, 50)
                _steps(channel, 11 + 10 * round_, 10, world.clock.now - 10)
        if case == "stopped":
            channel.record({"t": world.clock.now + 11, "kind": "stop", "reason": "complete"})
        if case == "saving":
            channel.record({"t": world.clock.now + 11, "kind": "checkpoint_begin", "step": 10, "reason": "periodic"})
        channel.publish()
        if case == "stale_heartbeat":  # the controller saw the record, then did not run for 300 s (not leading,
            controller.reconcile()         # starved): what it did not watch is no silence of the worker's (issue 35:
            world.advance(300)             # a silence it watched is)
        elif case != "evaluation_pause":
            _heartbeats(world, controller, channel, 300 if case != "saving" else 200)
        world.advance(5, controller)
        assert world.state("w")["attempt"] == 1
    finally:
        world.close()


def test_a_real_pytorch_run_writes_its_replicas_record(tmp_path: Path) -> None:
    """The SDK end to end (examples/train.py, PyTorch on CPU): the replica's first process
    writes its record to its Lease as the pod would (the world's API server standing for the
    pod's), its steps, saves and stop included, the last at its exit."""
    from train_harness import TRAIN_EXAMPLE, Workers, free_port, worker_env

    world = make_world()
    try:
        _create(world, "w", 1)
        leases = f"{world.api.url}/apis/coordination.k8s.io/v1/namespaces/{world.namespace}/leases"
        env = worker_env(rank=0, world_size=1, port=free_port(), checkpoint_dir=tmp_path / "ckpt")
        env.update({"HOTSWAP_WORKLOAD": "w", "HOTSWAP_REPORT_LEASES": leases, "JOB_COMPLETION_INDEX": 0})
        with Workers(tmp_path) as workers:
            worker = workers.start("w", TRAIN_EXAMPLE, ["--steps", "30", "--checkpoint-every", "10"], env)
            assert worker.process.wait(timeout=300) == 0, worker.errors.read_text()
        report = _stored(world, "w")
        (attempt,) = report.attempts
        assert attempt.steps == 30 and attempt.last_step == 30 and attempt.first_step is not None
        assert [step for step, _ in attempt.saves][-1] == 30 and attempt.stop == "complete"
        assert report.progress.leaving
        writes = [r for r in world.api.requests if r.method == "PUT" and r.path.endswith("/w-report-0")]
        assert 2 <= len(writes) <= 30  # bounded: not one per step
    finally:
        world.close()


def test_a_controller_whose_role_cannot_list_leases_goes_on_without_the_records() -> None:
    """A controller deployed with an earlier release's Role: one warning, and every round still
    decides and acts (the workload is admitted and runs); no hang, no figure from records."""
    world = make_world()
    try:
        world.api.faults.append(Fault("GET", f"/apis/coordination.k8s.io/v1/namespaces/{world.namespace}/leases", 403, "Forbidden",
                                      'leases.coordination.k8s.io is forbidden: User "hotswap" cannot list resource "leases"', watch=False))
        controller = make_controller(world)
        controller.client.sleep = lambda _: None
        _create(world, "w", 1)
        run_until(world, controller, lambda: running(world, "w") == 4)
        warnings = [line for line in controller.logs if "cannot list resource \"leases\"" in line]
        assert len(warnings) == 1 and "apply `hotswap controller manifests` again" in warnings[0]
    finally:
        world.close()


def test_a_replica_lost_to_an_elastic_shrink_is_not_hung_by_its_silence() -> None:
    """The lost replica's record stops where its pod died; the survivors re-form and train on,
    writing theirs. Each replica is judged as of its own last write, and a parked replica not
    at all: no hang."""
    world = make_world()
    try:
        controller = make_controller(world)
        _create(world, "el", 3, min_slices=2, max_restarts=3)
        run_until(world, controller, lambda: running(world, "el") == 12)
        channels = [_trained(world, "el", replica, slices=3) for replica in range(3)]
        world.fail_node(world.nodes_of_pool(world.pools_of("el")[2])[0])
        run_until(world, controller, lambda: world.state("el")["membership"] == 1)
        survivors = channels[:2]
        for channel in survivors:
            channel.record({"t": world.clock.now, "kind": "elastic", "slices": 2, "duration_s": 1.0})
        step = 11
        for _ in range(20):  # 200 s of training on two slices
            world.advance(10, controller)
            for channel in survivors:
                _steps(channel, step, 10, world.clock.now - 10, slices=2)
                channel.publish()
            step += 10
        assert world.state("el")["attempt"] == 1 and world.state("el")["phase"] == "RUNNING"
    finally:
        world.close()
