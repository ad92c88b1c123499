"""The JobSet's state annotation as a typed record (``state_annotation.StateRecord``): the text
each earlier release wrote reads back and is written again byte for byte, a record round-trips,
what anyone may have edited reads leniently or as no record, never as an error."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hotswap.api.phases import WorkloadPhase
from hotswap.api.runs import START_CAUSES
from hotswap.api.spec import workload_spec
from hotswap.backends.kubernetes.state_annotation import StateRecord, decode_state, state_of
from hotswap.core.placement import kept_map
from hotswap.core.workload import Workload

SPEC = workload_spec(name="w", command="python3 train.py", device_type="v6e-16", num_slices=3, min_slices=2)

# As each release wrote them (its own state_of and encode_state, run on the same workloads): a
# queued workload, and one running after a hotswap with released workers and a retired Job.
QUEUED = (
    '{"attempt": 0, "created_at": 1767690000.0, "disruptions": 0, "exited_ok": [], "last_checkpoint_at": null, '
    '"last_checkpoint_step": null, "membership": 0, "phase": "QUEUED", "phase_seconds": {}, "phase_since": 1767690000.0, '
    '"preemptions": 0, "replicas": [null, null, null], "restarts": 0, "running_since": null, "seq": 7, "slices": [], '
    '"status_message": "queued: waiting for 3 slice(s) of v6e-16", "status_time": 1767690000.0, "stopping": []}'
)
_RUNNING_HEAD = (
    '{"attempt": 2, "created_at": 1767690000.0, "disruptions": 1, "exited_ok": [["np-1", 3]], "last_checkpoint_at": null, '
    '"last_checkpoint_step": null, "membership": 0, "phase": "RUNNING", "phase_seconds": {"QUEUED": 5.0, "RESTARTING": 5.5, '
    '"RUNNING": 55.0}, "phase_since": 1767690065.5, "preemptions": 0, '
)
_RELEASED = '"released_jobs": {"3f1c-uid-a": "0-3", "3f1c-uid-b": "0,2-3"}, '
_RUNNING_MIDDLE = '"replicas": ["np-0", "np-2", "np-1"], "restarts": 0, '
_RETIRING = '"retiring": {"9e0d-uid-old": "w-slice-0"}, '
_RUNNING_TAIL_HEAD = '"running_since": 1767690065.5, "seq": 7, "slices": ["np-0", "np-2", "np-1"], '
_START_CAUSE = '"start_cause": "hotswap", '
_RUNNING_TAIL = (
    '"status_message": "restarted on np-0, np-2, np-1 (attempt 2): node np-3-0 failed", "status_time": 1767690065.5, '
    '"stopping": [1]}'
)


def _running(released: bool, start_cause: bool, retiring: bool) -> str:
    return (
        _RUNNING_HEAD + (_RELEASED if released else "") + _RUNNING_MIDDLE + (_RETIRING if retiring else "")
        + _RUNNING_TAIL_HEAD + (_START_CAUSE if start_cause else "") + _RUNNING_TAIL
    )


RELEASES = {
    "2dd49f8 (the first: workload, replicas, phase ledger)": _running(False, False, False),
    "7c126ee (+ released_jobs)": _running(True, False, False),
    "4619df0 (+ start_cause)": _running(True, True, False),
    "1a4a74d (+ retiring), as written since": _running(True, True, True),
}

RUNNING = Workload(
    spec=SPEC, seq=7, created_at=1767690000.0, phase=WorkloadPhase.RUNNING, slices=("np-0", "np-2", "np-1"), attempt=2,
    stopping=frozenset({1}), disruptions=1, running_since=1767690065.5, exited_ok=frozenset({("np-1", 3)}),
    status_message="restarted on np-0, np-2, np-1 (attempt 2): node np-3-0 failed", status_time=1767690065.5,
)


def test_the_first_releases_queued_record_reads_back_and_is_written_the_same() -> None:
    record = decode_state(QUEUED, SPEC)
    assert record == StateRecord(
        Workload(spec=SPEC, seq=7, created_at=1767690000.0, status_message="queued: waiting for 3 slice(s) of v6e-16",
                 status_time=1767690000.0),
        phase_since=1767690000.0,
    )
    assert record.encode() == QUEUED
    assert state_of(record.workload, record, now=1767690100.0).encode() == QUEUED  # a round with nothing new


@pytest.mark.parametrize("release", RELEASES)
def test_each_releases_record_reads_back_and_the_first_round_after_an_upgrade_writes_nothing(release: str) -> None:
    text = RELEASES[release]
    record = decode_state(text, SPEC)
    assert record is not None
    assert record.workload == RUNNING and record.workload.replica_map == ("np-0", "np-2", "np-1")
    assert (record.phase_seconds, record.phase_since) == ({"QUEUED": 5.0, "RESTARTING": 5.5, "RUNNING": 55.0}, 1767690065.5)
    assert record.released == ({"3f1c-uid-a": frozenset({0, 1, 2, 3}), "3f1c-uid-b": frozenset({0, 2, 3})} if _RELEASED in text else {})
    assert record.start_cause == ("hotswap" if _START_CAUSE in text else None)
    assert record.retiring == ({"9e0d-uid-old": "w-slice-0"} if _RETIRING in text else {})
    assert record.encode() == text
    again = state_of(record.workload, record, 1767690100.0, record.released, record.start_cause, record.retiring)
    assert again.written_as(record) and again.encode() == text


def test_the_phase_ledger_closes_the_phase_the_record_was_in() -> None:
    record = decode_state(RELEASES["1a4a74d (+ retiring), as written since"], SPEC)
    assert record is not None
    queued = Workload(spec=SPEC, seq=7, created_at=1767690000.0, preemptions=1)
    after = state_of(queued, record, now=1767690100.0)
    assert after.phase_seconds == {"QUEUED": 5.0, "RESTARTING": 5.5, "RUNNING": 55.0 + 34.5} and after.phase_since == 1767690100.0
    assert not after.written_as(record) and after.released == {} and after.start_cause is None


def test_what_the_record_does_not_keep_is_no_reason_to_write_it() -> None:
    """The core's workload may carry fields the record does not keep (``checkpoint_every``):
    the record is compared as it is written."""
    record = state_of(RUNNING, None, now=1767690065.5)
    read = decode_state(record.encode(), SPEC)
    assert read is not None and read.written_as(record)
    noted = state_of(Workload(**{**_fields(RUNNING), "checkpoint_every": 60.0}), read, now=1767690100.0)
    assert noted != read and noted.written_as(read)


def _fields(workload: Workload) -> dict:
    return {name: getattr(workload, name) for name in Workload.__dataclass_fields__}


# ---------------------------------------------------------------------- what anyone may have written


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("seq", "7"), ("seq", -1), ("created_at", None), ("phase", 3), ("phase", "SOMEWHERE"), ("slices", "np-0"),
        ("slices", [1]), ("attempt", "2"), ("attempt", 2.5), ("stopping", [None]), ("membership", True),
        ("restarts", -1), ("disruptions", "x"), ("preemptions", []), ("running_since", "now"),
        ("last_checkpoint_at", [1]), ("last_checkpoint_step", 1.5), ("exited_ok", [["np-1"]]),
        ("exited_ok", [[1, 2]]), ("status_message", None), ("status_time", "t"),
    ],
)
def test_a_workload_field_of_the_wrong_type_reads_as_no_record(key: str, value: object) -> None:
    """It would reach the core and break every round (a count that is text)."""
    data = json.loads(RELEASES["1a4a74d (+ retiring), as written since"])
    assert decode_state(json.dumps({**data, key: value}), SPEC) is None
    del data[key]
    assert decode_state(json.dumps(data), SPEC) is None  # missing


def test_the_kubernetes_keys_read_leniently_and_keep_the_workload() -> None:
    data = json.loads(RELEASES["1a4a74d (+ retiring), as written since"])
    edited = {
        **data,
        "phase_seconds": {"QUEUED": "5", "RUNNING": 55},
        "phase_since": "later",
        "released_jobs": {"a": "0-1,x", "b": 3, "c": "", "d": "2"},
        "start_cause": "because",
        "retiring": {"u": 5, "v": "w-slice-1"},
        "a-key-of-a-later-release": 1,
    }
    record = decode_state(json.dumps(edited), SPEC)
    assert record is not None and record.workload == RUNNING
    assert (record.phase_seconds, record.phase_since) == ({"RUNNING": 55.0}, None)
    assert record.released == {"d": frozenset({2})} and record.start_cause is None and record.retiring == {"v": "w-slice-1"}
    for value in ([], "x", None):
        other = decode_state(json.dumps({**data, "phase_seconds": value, "released_jobs": value, "retiring": value}), SPEC)
        assert other is not None and (other.phase_seconds, other.released, other.retiring) == ({}, {}, {})


# ---------------------------------------------------------------------- round trip (property)

_times = st.floats(min_value=0, max_value=4e9, allow_nan=False)
_counts = st.integers(min_value=0, max_value=1000)


@st.composite
def records(draw: st.DrawFn) -> StateRecord:
    phase = draw(st.sampled_from(list(WorkloadPhase)))
    slices = tuple(draw(st.lists(st.sampled_from(["np-0", "np-1", "np-2", "np-3"]), unique=True, max_size=3)))
    order = draw(st.permutations(slices))
    parked = draw(st.lists(st.booleans(), min_size=len(order), max_size=len(order))) if len(order) < 3 else []
    replicas: list[str | None] = []
    for slice_name, park in zip(order, parked or [False] * len(order)):
        if park and len(replicas) < 3 - len(order):
            replicas.append(None)
        replicas.append(slice_name)
    workload = Workload(
        spec=SPEC, seq=draw(_counts), created_at=draw(_times), phase=phase, slices=slices,
        replicas=kept_map(tuple(replicas), slices), attempt=draw(_counts),
        stopping=frozenset(draw(st.lists(_counts, max_size=3))), membership=draw(_counts), restarts=draw(_counts),
        disruptions=draw(_counts), preemptions=draw(_counts), running_since=draw(st.none() | _times),
        last_checkpoint_at=draw(st.none() | _times), last_checkpoint_step=draw(st.none() | st.integers(-5, 10**6)),
        exited_ok=frozenset(draw(st.lists(st.tuples(st.sampled_from(slices or ("np-9",)), _counts), max_size=3))),
        status_message=draw(st.text(max_size=30)), status_time=draw(_times),
    )
    uids = st.text(alphabet="abcdef0123456789-", min_size=1, max_size=12)
    return StateRecord(
        workload=workload,
        phase_seconds=draw(st.dictionaries(st.sampled_from([p.value for p in WorkloadPhase]), _times, max_size=3)),
        phase_since=draw(_times),
        released=draw(st.dictionaries(uids, st.frozensets(st.integers(0, 64), min_size=1, max_size=6), max_size=3)),
        start_cause=draw(st.none() | st.sampled_from(START_CAUSES)),
        retiring=draw(st.dictionaries(uids, st.text(min_size=1, max_size=20), max_size=3)),
    )


@given(records())
def test_a_record_round_trips_as_itself_and_as_its_text(record: StateRecord) -> None:
    text = record.encode()
    read = decode_state(text, SPEC)
    assert read == record and read.written_as(record)
    assert read.encode() == text
    # A round that changes nothing writes nothing.
    again = state_of(read.workload, read, (record.phase_since or 0.0) + 60.0, read.released, read.start_cause, read.retiring)
    assert again.written_as(read)
