"""The pieces between live Kubernetes objects and the core, each on its own: parsing live
objects, the state annotation, planning's action handlers, and the operations' order and log."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from hotswap.api import worker as contract
from hotswap.api.phases import WorkloadPhase
from hotswap.api.spec import workload_spec
from hotswap.backends.kubernetes import labels
from hotswap.backends.kubernetes import operations as ops
from hotswap.backends.kubernetes.lease import micro_time
from hotswap.backends.kubernetes.live_objects import read_jobset, read_pod
from hotswap.backends.kubernetes.observation import observe
from hotswap.backends.kubernetes.child_jobs import ReplacedJobs
from hotswap.backends.kubernetes.planning import elastic_membership, enacted, plan, replaced_jobs
from hotswap.backends.kubernetes.settings import KubeSettings
from hotswap.backends.kubernetes.state_annotation import StateRecord, decode_state, replica_slots, state_of
from hotswap.backends.kubernetes.views import view_of
from hotswap.backends.kubernetes.worker_reports import goodput_view
from hotswap.core import actions as act
from hotswap.core.effects import effect_of, effects_of
from hotswap.core.workload import Workload

SPEC = workload_spec(name="w", command="python3 train.py", device_type="v6e-16", num_slices=3, min_slices=2)


def jobset(annotations: dict[str, str] | None = None, conditions: list[dict[str, str]] | None = None, suspend: bool = True) -> dict:
    return {
        "metadata": {
            "name": "w",
            "uid": "u-1",
            "creationTimestamp": "2026-01-06T09:00:00Z",
            "annotations": {labels.SPEC_ANNOTATION: SPEC.model_dump_json(), **(annotations or {})},
        },
        "spec": {"suspend": suspend},
        "status": {"restartsCountTowardsMax": 2, "conditions": conditions or []},
    }


# ---------------------------------------------------------------------- live objects


def test_a_jobset_reads_as_its_spec_state_and_conditions() -> None:
    state = state_of(Workload(spec=SPEC, seq=1, created_at=5.0, phase=WorkloadPhase.RUNNING, slices=("a", "b", "c"), attempt=1), None, 5.0)
    job = read_jobset(jobset({labels.STATE_ANNOTATION: state.encode()}, [{"type": "Failed", "status": "True", "message": "boom"}], suspend=False))
    assert (job.name, job.uid, job.spec, job.record, job.suspended, job.restarts) == ("w", "u-1", SPEC, state, False, 2)
    assert job.replicas == state.to_json()["replicas"]  # the record's map, for describe and logs
    assert (job.terminal, job.terminal_message) == (WorkloadPhase.FAILED, "boom")
    assert job.created == 1_767_690_000.0


def test_what_hotswap_did_not_write_reads_as_not_there() -> None:
    job = read_jobset(jobset({labels.SPEC_ANNOTATION: "{not json", labels.STATE_ANNOTATION: "{not json"}, [{"type": "Completed", "status": "False"}]))
    assert (job.spec, job.record, job.terminal) == (None, None, None)
    assert read_jobset({"metadata": {"name": "bare"}}).created == 0.0


def test_api_times_keep_their_formats() -> None:
    assert micro_time(1_767_690_000.25) == "2026-01-06T09:00:00.250000Z"  # the Lease's MicroTime


def test_pods_of_other_owners_are_not_read_and_ours_carry_their_indices() -> None:
    assert read_pod({"metadata": {"name": "p", "labels": {"app": "x"}}}) is None
    pod = read_pod(
        {
            "metadata": {
                "name": "p",
                "labels": {labels.JOBSET_NAME_LABEL: "w", labels.JOB_INDEX_LABEL: "1"},
                "annotations": {labels.JOB_COMPLETION_INDEX_ANNOTATION: "3"},
                "ownerReferences": [{"kind": "Job", "uid": "j-1"}],
                "deletionTimestamp": "2026-01-06T10:00:00Z",
            },
            "spec": {"nodeName": "n", "schedulingGates": [{"name": labels.PLACEMENT_GATE}]},
            "status": {"phase": "Running"},
        }
    )
    assert pod is not None
    assert (pod.workload, pod.replica, pod.host, pod.node, pod.owner_uid) == ("w", 1, 3, "n", "j-1")
    assert pod.gated and pod.terminating and not pod.finished


# ---------------------------------------------------------------------- the state annotation


def test_state_round_trips_and_closes_the_phase_ledger_only_on_a_phase_change() -> None:
    queued = Workload(spec=SPEC, seq=4, created_at=100.0)
    first = state_of(queued, None, now=100.0)
    assert decode_state(first.encode(), SPEC) == first and first.workload == queued
    assert first.to_json()["replicas"] == [None, None, None] and first.to_json()["phase_seconds"] == {}
    assert state_of(queued, first, now=150.0) == first  # nothing to rewrite
    running = Workload(spec=SPEC, seq=4, created_at=100.0, phase=WorkloadPhase.RUNNING, slices=("a", "b", "c"), attempt=1)
    second = state_of(running, first, now=160.0)
    assert second.phase_seconds == {"QUEUED": 60.0} and second.phase_since == 160.0
    assert second.to_json()["replicas"] == ["a", "b", "c"]
    assert decode_state(second.encode(), SPEC) == second
    # The replica map is the core's record: one entry per replica index, parked ones None.
    shrunk = Workload(spec=SPEC, seq=4, created_at=100.0, phase=WorkloadPhase.RUNNING, slices=("a", "c"), replicas=("a", None, "c"))
    third = state_of(shrunk, second, now=170.0)
    assert third.to_json()["replicas"] == ["a", None, "c"] and decode_state(third.encode(), SPEC) == third


def test_a_state_record_that_is_not_one_reads_as_none() -> None:
    record = state_of(Workload(spec=SPEC, seq=4, created_at=100.0), None, now=100.0).to_json()
    assert decode_state('{"phase": "SOMEWHERE"}', SPEC) is None
    assert decode_state(json.dumps({**record, "phase": "SOMEWHERE"}), SPEC) is None
    assert decode_state("[", SPEC) is None
    for text in ("[]", "[1, 2]", '"x"', "null", "3"):
        assert decode_state(text, SPEC) is None, text  # valid JSON, not a record


def _with(record: dict, replicas: object) -> str:
    return json.dumps({**record, "replicas": replicas})


def test_a_replica_map_that_is_not_one_of_the_slices_reads_as_the_slices_own() -> None:
    """Anyone can edit the annotation: a map that is not a list of slice names, or not a map
    of exactly the workload's slices, reads as the map of a (re)start (replica i on slices[i])."""
    shrunk = Workload(spec=SPEC, seq=4, created_at=100.0, phase=WorkloadPhase.RUNNING, slices=("a", "c"), replicas=("a", None, "c"))
    record = state_of(shrunk, None, now=100.0).to_json()
    padded = decode_state(_with(record, ["a", None, "c", None]), SPEC)  # padded further
    assert padded is not None and padded.workload == shrunk
    for bad in (5, ["a", 1], ["a", "b", "c"], ["a", "a", "c"], ["a", None, None, "c"], None):
        read = decode_state(_with(record, bad), SPEC)
        assert read is not None and read.workload.replica_map == ("a", "c"), bad
    del record["replicas"]  # as no release wrote it, but a record is a record
    read = decode_state(json.dumps(record), SPEC)
    assert read is not None and read.workload.replica_map == ("a", "c")


@pytest.mark.parametrize("kueue", [False, True], ids=["hotswap-admits", "kueue"])
@pytest.mark.parametrize("text", ["[]", "[1]", '"state"', "null", '{"replicas": 5, "seq": "x", "phase_seconds": [1]}', "WRONG_TYPE"])
def test_a_state_annotation_that_is_not_a_record_never_breaks_a_reconcile(kueue: bool, text: str) -> None:
    """Anyone can write an annotation; a JSON value that is not a record (or a record with
    fields of the wrong type) must read as "no record", not crash every reconcile."""
    from hotswap.core.scheduler import decide

    if text == "WRONG_TYPE":  # a whole record but for one field: a count that is text
        running = Workload(spec=SPEC, seq=4, created_at=100.0, phase=WorkloadPhase.RUNNING, slices=("a", "b", "c"), attempt=1)
        text = json.dumps({**state_of(running, None, now=100.0).to_json(), "attempt": "2"})
    job = jobset({labels.STATE_ANNOTATION: text}, suspend=not kueue)
    assert read_jobset(job).record is None
    observation = observe([], [job], [], [], KubeSettings(kueue=kueue), "c", now=100.0)
    decision = decide(observation.snapshot, observation.events, observation.now)
    plan(observation, decision, effects_of(decision.actions))
    view = view_of(read_jobset(job), {})
    assert view["name"] == "w" and view["restarts"] == 2
    goodput_view(read_jobset(job), {}, 200.0)


# ---------------------------------------------------------------------- planning


ENACTED = [
    (act.Reject("w", "too big"), "Rejected", True),
    (act.Admit("w", 1, ("a", "b", "c")), "Admitted", False),
    (act.Preempt("w", "h", "preempted by h"), "Preempted", True),
    (act.Restart("w", 2, ("x", "b", "c"), "lost", charged=False), "Restarted", False),
    (act.StartWorkers("w", 2, ("x", "b", "c")), None, False),
    (act.Requeue("w", "no capacity"), "Requeued", True),
    (act.ScaleDown("w", ("b",), ("a", "c"), 1, "lost", ("a", None, "c"), (1,)), "ScaledDown", True),
    (act.ScaleUp("w", ("b",), ("a", "c", "b"), 2, ("a", "b", "c")), "ScaledUp", False),
    (act.Fail("w", "boom"), "Failed", True),
    (act.Complete("w"), None, False),  # JobSet reports it itself
    (act.Remove("w"), None, False),  # nothing left to report it on
]


def test_the_enactment_table_has_every_action_type() -> None:
    assert {type(action) for action, _, _ in ENACTED} == set(act.ACTION_TYPES)


@pytest.mark.parametrize(
    ("action", "event", "warning"), ENACTED, ids=lambda value: type(value).__name__ if isinstance(value, act.ACTION_TYPES) else None
)
def test_each_action_is_enacted_from_its_effect(action: act.Action, event: str | None, warning: bool) -> None:
    """An action's Event (the local timeline's message) is read off its effect: no second
    per-action handler here (the Jobs it replaces too: the next test)."""
    effect = effect_of(action)
    assert enacted("w", effect) == ([ops.RecordEvent("w", event, effect.message, warning=warning)] if event else [])


def test_the_replica_map_recorded_has_an_entry_per_replica_index() -> None:
    queued = Workload(spec=SPEC, seq=0, created_at=0.0)
    assert replica_slots(queued) == [None, None, None]
    shrunk = Workload(spec=SPEC, seq=0, created_at=0.0, phase=WorkloadPhase.RUNNING, slices=("a", "c"), replicas=("a", None, "c"))
    assert replica_slots(shrunk) == ["a", None, "c"]
    given = Workload(spec=SPEC, seq=0, created_at=0.0, phase=WorkloadPhase.RUNNING, slices=("a", "b"))
    assert replica_slots(given) == ["a", "b", None]  # the last replica gave its slice away


def test_what_stops_a_workload_is_suspension_and_under_kueue_a_restart_in_place() -> None:
    """Only Kueue may suspend a JobSet it admitted: a workload the core preempts or requeues is
    suspended without Kueue (level-triggered, no operation here) and restarted in place under
    Kueue, its new pods held behind the gate."""
    for kueue in (False, True):
        def replaced(action: act.Action) -> ReplacedJobs | None:
            return replaced_jobs(effect_of(action), suspends=not kueue)

        # The Event says what the local timeline says (one text per action: core/effects.py).
        assert enacted("w", effect_of(act.Admit("w", 1, ("a", "b", "c")))) == [
            ops.RecordEvent("w", "Admitted", "admitted on a, b, c (attempt 1)")
        ]
        assert replaced(act.Admit("w", 1, ("a", "b", "c"))) is None
        assert (replaced(act.Requeue("w", "no capacity")) == ReplacedJobs()) is kueue
        assert (replaced(act.Preempt("w", "h", "preempted by h")) == ReplacedJobs()) is kueue
        assert replaced(act.Restart("w", 2, ("x", "b", "c"), "lost", charged=False)) == ReplacedJobs()
        assert replaced(act.Fail("w", "boom")) is None
        scaled = replaced(act.ScaleDown("w", ("b",), ("a", "c"), 1, "lost", ("a", None, "c"), (1,)))
        assert scaled == ReplacedJobs((1,))  # only the parked replica's Job, in both modes


def test_elastic_membership_is_coordinated_by_the_first_active_replica() -> None:
    workload = Workload(
        spec=SPEC, seq=0, created_at=0.0, phase=WorkloadPhase.RUNNING, slices=("b", "c"), replicas=(None, "b", "c"), membership=3
    )
    membership = elastic_membership("w", workload, 4)
    assert membership.master_addr == contract.coordinator_host("w", 1) == "w-slice-1-0.w"
    assert membership.master_port == contract.DEFAULT_MASTER_PORT + 4  # a port per generation
    assert (membership.slices, membership.world_size) == (("b", "c"), 8)


# ---------------------------------------------------------------------- operations


def test_the_record_commits_a_decision_before_its_side_effects() -> None:
    """The JobSet's record (guarded by its resourceVersion) first: JobSet reacting to a Job's
    deletion can then never make the controller take the decision again (issue 23)."""
    record = ops.PatchJobSet("w", True, {labels.STATE_ANNOTATION: "{}"}, "41")
    delete = ops.DeleteJob("w", "w-slice-0", "uid-1")
    forced = ops.DeletePod("w", "q", True, "its node n was deleted")
    event = ops.RecordEvent("w", "Restarted", "restarted on a (attempt 2)")
    planned = [ops.PlacePod("w", "p", {}, {labels.SLICE_ANNOTATION: "a"}, ()), delete, forced, event, record]
    assert ops.in_order(planned) == [record, event, delete, forced, planned[0]]
    assert ops.decisions_summary(ops.in_order(planned)) == [
        "suspend jobset/w",
        "Restarted jobset/w: restarted on a (attempt 2)",
        "recreate job/w-slice-0 of jobset/w (retired)",
        "force-delete pod/q (its node n was deleted)",
        "release pod/p on a",
    ]


def test_settings_validate_a_checkpoint_volume_without_the_renderer() -> None:
    """settings -> render -> settings was an import cycle; settings now stand alone."""
    probe = (
        "import sys\n"
        "from hotswap.backends.kubernetes.settings import KubeSettings\n"
        "KubeSettings.from_options({'checkpoint_volume': 'pvc:ckpt'})\n"
        "print('hotswap.backends.kubernetes.render' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


def test_goodput_is_never_the_controllers_running_time() -> None:
    """A JobSet preempted before its first step spent time RUNNING (pods up, no step): that is not
    goodput. No replica recorded a step, so goodput is unknown with the reason (issue 25 item 5;
    issue 34 item 4: not a 0 nobody measured), and none of it is booked as a badput."""
    state = StateRecord(Workload(spec=SPEC, seq=4, created_at=100.0), phase_since=150.0, phase_seconds={"QUEUED": 10.0, "RUNNING": 40.0})
    job = read_jobset(jobset({labels.STATE_ANNOTATION: state.encode()}, suspend=True))
    view = goodput_view(job, {}, 200.0)
    assert view["goodput"] is None
    assert view["reason"].startswith("no step was reported") and "no replica wrote its record" in view["reason"]
    assert view["running_share"] == pytest.approx(40 / 100)
    assert view["badput"]["recovery"] == 0 and view["badput"]["startup"] == 0
