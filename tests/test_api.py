"""The api layer: priorities, names, exit codes, the workload spec and the phase table."""

from __future__ import annotations

import pytest

from hotswap.api.errors import InvalidInputError
from hotswap.api.names import validate_cluster_name, validate_workload_name
from hotswap.api.phases import TRANSITIONS, IllegalTransitionError, WorkloadPhase, check_transition
from hotswap.api.priority import Priority
from hotswap.api.spec import DEFAULT_RESTART_EXIT_CODES, ExitCodes, RestartStrategy, workload_spec


@pytest.mark.parametrize(
    ("text", "value"),
    [("very-low", 100), ("low", 250), ("medium", 500), ("high", 750), ("very-high", 1000), ("HIGH", 750),
     ("very_high", 1000), ("750", 750), (250, 250)],
)
def test_priority_parses_xpk_names_and_values(text: str | int, value: int) -> None:
    assert Priority.parse(text) == value


@pytest.mark.parametrize("bad", ["urgent", "", "751", 3])
def test_unknown_priority_lists_the_valid_ones(bad: str | int) -> None:
    with pytest.raises(InvalidInputError, match="very-low, low, medium, high, very-high"):
        Priority.parse(bad)


@pytest.mark.parametrize("good", ["a", "train-1", "x" * 40, "llama-7b-run3"])
def test_valid_workload_names(good: str) -> None:
    assert validate_workload_name(good) == good


@pytest.mark.parametrize(
    ("bad", "why"),
    [("", "empty"), ("1abc", "DNS-1035"), ("Abc", "DNS-1035"), ("a_b", "DNS-1035"), ("abc-", "DNS-1035"),
     ("a" * 41, "limit is 40"), ("a.b", "DNS-1035")],
)
def test_invalid_names_say_why(bad: str, why: str) -> None:
    with pytest.raises(InvalidInputError, match=why):
        validate_workload_name(bad)
    with pytest.raises(InvalidInputError):
        validate_cluster_name(bad)


def test_exit_codes_parse_merge_and_print() -> None:
    codes = ExitCodes.parse("200-255, 42,127-199 ,43")
    assert str(codes) == "42-43,127-255"
    assert 42 in codes and 43 in codes and 130 in codes and 1 not in codes and 0 not in codes
    assert str(DEFAULT_RESTART_EXIT_CODES) == "42,127-255"
    assert str(ExitCodes.parse("none")) == "" and 137 not in ExitCodes.parse("")


@pytest.mark.parametrize("bad", ["abc", "1-", "300", "20-10", "0", "-5", "1,,2"])
def test_bad_exit_codes_are_rejected(bad: str) -> None:
    with pytest.raises(InvalidInputError, match="exit code"):
        ExitCodes.parse(bad)


def test_spec_defaults_follow_xpk_and_jobset() -> None:
    spec = workload_spec(name="w", command="python t.py", device_type="v6e-16")
    assert spec.num_slices == 1 and spec.priority is Priority.MEDIUM and spec.max_restarts == 0
    assert spec.restart_strategy is RestartStrategy.RECREATE
    assert str(spec.restart_on_exit_codes) == "42,127-255"
    assert spec.termination_grace_period_s == 30.0
    assert not spec.elastic and spec.floor_slices == 1


def test_spec_round_trips_through_json() -> None:
    spec = workload_spec(
        name="w", command="python t.py", device_type="V6E-16", num_slices=3, min_slices=2, priority="high",
        restart_strategy="blockingrecreate", restart_on_exit_codes="3,42", env={"A": "1"},
    )
    assert spec.device_type == "v6e-16" and spec.elastic and spec.floor_slices == 2
    again = type(spec).model_validate_json(spec.model_dump_json())
    assert again == spec
    assert spec.model_dump(mode="json")["restart_on_exit_codes"] == "3,42"
    assert spec.model_dump(mode="json")["priority"] == "high"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"name": "Bad_Name"}, "DNS-1035"),
        ({"device_type": "v6e-17"}, "v6e-16"),
        ({"priority": "urgent"}, "very-low"),
        ({"num_slices": 0}, "--num-slices"),
        ({"num_slices": 2, "min_slices": 3}, "--min-slices 3 is larger than --num-slices 2"),
        ({"restart_strategy": "Never"}, "Recreate or BlockingRecreate"),
        ({"restart_on_exit_codes": "x"}, "exit code"),
        ({"env": {"1X": "v"}}, "environment variable name"),
        ({"command": "  "}, "--command"),
        ({"docker_image": "a", "script_dir": "."}, "not both"),
        ({"termination_grace_period_s": -1}, "--termination-grace-period:"),  # the flag, not the field
    ],
)
def test_spec_errors_are_one_actionable_line(fields: dict, message: str) -> None:
    base = {"name": "w", "command": "python t.py", "device_type": "v6e-16"}
    with pytest.raises(InvalidInputError) as caught:
        workload_spec(**{**base, **fields})
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_phase_table() -> None:
    q, run, rst, ok, fail = (WorkloadPhase[p] for p in ("QUEUED", "RUNNING", "RESTARTING", "SUCCESSFUL", "FAILED"))
    check_transition(q, run)
    check_transition(run, q)
    check_transition(rst, run)
    for terminal in (ok, fail):
        assert terminal.terminal
        for target in WorkloadPhase:
            assert (terminal, target) not in TRANSITIONS
    with pytest.raises(IllegalTransitionError):
        check_transition(ok, run)
    with pytest.raises(IllegalTransitionError):
        check_transition(q, ok)
