"""What each action does to a workload's workers (``hotswap.core.effects``): one pure account,
which the local backend, the Kubernetes backend and the simulator only enact; and nothing
outside ``core/actions.py`` branches on action types itself."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from hotswap.api.runs import START_CAUSES
from hotswap.backends.kubernetes import operations as ops
from hotswap.backends.kubernetes.controller.enactment import Enactment
from hotswap.core import actions as act
from hotswap.core import effects
from hotswap.core.effects import Outcome, Placement, Stop, effect_of

SRC = Path(__file__).resolve().parents[1] / "src" / "hotswap"
ACTION_NAMES = {cls.__name__ for cls in act.ACTION_TYPES}


def _type_names(node: ast.expr) -> list[str]:
    """The class names an isinstance's second argument or a class pattern names."""
    if isinstance(node, ast.Tuple):
        return [name for element in node.elts for name in _type_names(element)]
    if isinstance(node, ast.Attribute):
        return [node.attr]
    if isinstance(node, ast.Name):
        return [node.id]
    return []


def _imports(tree: ast.Module, package: str, module: str) -> bool:
    """Whether a module imports ``package.module`` or names from it."""
    whole = f"{package}.{module}"
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == package and any(a.name == module for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and node.module == whole:
            return True
        if isinstance(node, ast.Import) and any(a.name == whole for a in node.names):
            return True
    return False


def _branches_on(names: set[str], home: Path, package: str, module: str) -> list[str]:
    """Where a module of ``src`` other than ``home`` uses isinstance or a class pattern on one of
    the types ``names`` (of ``package.module``, which it imports)."""
    found = []
    for path in sorted(SRC.rglob("*.py")):
        if path == home:
            continue
        tree = ast.parse(path.read_text(), str(path))
        if not _imports(tree, package, module):
            continue
        for node in ast.walk(tree):
            types: list[str] = []
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "isinstance" and len(node.args) == 2:
                types = _type_names(node.args[1])
            elif isinstance(node, ast.MatchClass):
                types = _type_names(node.cls)
            if names & set(types):
                found.append(f"{path.relative_to(SRC)}:{node.lineno}")
    return found


def test_no_branching_on_action_types_outside_the_actions_module() -> None:
    """Enacting an action goes through ``actions.dispatch`` or its effect's fields, so a new
    action type is a missing handler method everywhere at once, not a forgotten branch."""
    found = _branches_on(ACTION_NAMES, SRC / "core" / "actions.py", "hotswap.core", "actions")
    assert not found, f"branching on action types outside core/actions.py: {found}"


def test_no_branching_on_operation_types_outside_the_operations_module() -> None:
    """The same for the Kubernetes controller's operations: applied and logged through
    ``operations.dispatch``."""
    names = {cls.__name__ for cls in ops.OPERATION_TYPES}
    found = _branches_on(names, SRC / "backends" / "kubernetes" / "operations.py", "hotswap.backends.kubernetes", "operations")
    assert not found, f"branching on operation types outside backends/kubernetes/operations.py: {found}"
    assert set(ops.HANDLER_METHODS) == set(ops.OPERATION_TYPES)
    for handler in (Enactment, ops._Summary):
        assert all(callable(getattr(handler, method, None)) for method in ops.HANDLER_METHODS.values()), handler


def test_the_effects_and_messages_handle_every_action_type() -> None:
    for handler in (effects._Effects, effects._Messages):
        assert all(callable(getattr(handler, method, None)) for method in act.HANDLER_METHODS.values()), handler


def test_a_hotswap_restart_stops_the_old_attempt_and_starts_the_new_one_on_the_new_slices() -> None:
    effect = effect_of(act.Restart("w", 3, ("x", "b"), "node lost", charged=False))
    assert effect.stop is Stop.OLDER and effect.attempt == 3  # workers of attempts before 3
    assert effect.start == effect.replicas == effect.generation == ("x", "b")
    assert (effect.replica_of("x"), effect.replica_of("b")) == (0, 1)
    assert effect.cause == "hotswap" and effect.hotswap and effect.replaced and not effect.graceful
    assert not effect.preemption and not effect.held and effect.placement is Placement.PLACE
    assert (effect.event, effect.warning) == ("Restarted", False)


def test_a_charged_restart_is_a_failure_not_a_hotswap() -> None:
    effect = effect_of(act.Restart("w", 2, ("a",), "exit code 42", charged=True))
    assert effect.cause == "failure" and not effect.hotswap and effect.replaced


def test_a_held_back_restart_starts_nothing_until_its_workers_are_started() -> None:
    held = effect_of(act.Restart("w", 2, ("a", "b"), "lost", charged=False, start=False))
    assert held.held and held.start == () and held.generation is None and held.replicas == ("a", "b")
    assert held.stop is Stop.OLDER and held.cause == "hotswap"
    # The slices reserved meanwhile (here b was replaced by c while the old workers stopped).
    started = effect_of(act.StartWorkers("w", 2, ("a", "c")))
    assert started.start == started.generation == started.replicas == ("a", "c") and started.attempt == 2
    assert started.placement is Placement.PLACE and started.replica_of("c") == 1
    assert started.stop is Stop.NONE and started.cause is None  # the restart's cause, kept by the backend
    assert started.event is None  # the restart was reported


def test_admission_starts_the_run_and_a_later_one_follows_a_preemption() -> None:
    first = effect_of(act.Admit("w", 1, ("a", "b")))
    assert first.cause == "start" and first.start == ("a", "b") and first.stop is Stop.OLDER and not first.replaced
    assert (first.event, first.warning, first.replica_of("b")) == ("Admitted", False, 1)
    assert effect_of(act.Admit("w", 2, ("a",))).cause == "preemption"
    assert effect_of(act.Admit("w", 1, ("a",), start=False)).held


def test_a_scale_down_stops_only_the_removed_slices_workers() -> None:
    lost = effect_of(act.ScaleDown("w", ("b",), ("a", "c"), 2, "node lost", ("a", None, "c"), (1,)))
    assert (lost.stop, lost.removed, lost.parked, lost.generation, lost.start) == (Stop.REMOVED, ("b",), (1,), ("a", "c"), ())
    assert lost.replicas == ("a", None, "c")  # the survivors keep their indexes
    assert not lost.graceful and not lost.replaced and lost.placement is Placement.SHRINK
    assert (lost.event, lost.warning) == ("ScaledDown", True)
    given = effect_of(act.ScaleDown("w", ("c",), ("a", "b"), 2, "gave 1 slice(s) to h", ("a", "b"), (2,), preemptor="h"))
    assert given.graceful  # coordinated: nothing is lost


def test_a_scale_up_starts_the_joiners_as_the_parked_replicas() -> None:
    effect = effect_of(act.ScaleUp("w", ("d",), ("a", "c", "d"), 3, ("a", "d", "c")))
    assert effect.start == ("d",) and effect.generation == ("a", "c", "d") and effect.replicas == ("a", "d", "c")
    assert effect.replica_of("d") == 1 and effect.placement is Placement.GROW
    assert effect.stop is Stop.NONE and effect.cause == "elastic" and effect.attempt is None
    assert (effect.event, effect.warning) == ("ScaledUp", False)


@pytest.mark.parametrize(
    ("action", "preemption", "replaced", "outcome", "event", "requeued"),
    [
        (act.Preempt("w", "h", "preempted by h"), True, False, None, "Preempted", True),
        (act.Requeue("w", "no capacity"), False, True, None, "Requeued", True),
        (act.Fail("w", "too many restarts"), False, False, Outcome.FAILED, "Failed", False),
        (act.Remove("w"), False, False, Outcome.DELETED, None, False),
    ],
)
def test_stopping_a_workload_stops_every_worker(
    action: act.Action, preemption: bool, replaced: bool, outcome: Outcome | None, event: str | None, requeued: bool
) -> None:
    effect = effect_of(action)
    assert effect.stop is Stop.ALL and effect.start == () and effect.cause is None
    assert (effect.preemption, effect.replaced, effect.outcome) == (preemption, replaced, outcome)
    assert (effect.event, effect.warning, effect.requeued) == (event, event is not None, requeued)
    parks = not isinstance(action, act.Remove)  # a deleted workload has no map left to say
    assert effect.placement is (Placement.PARK if parks else Placement.KEEP) and effect.replicas == ()


def test_completion_and_rejection_stop_nothing() -> None:
    completed = effect_of(act.Complete("w"))
    assert completed.stop is Stop.NONE and completed.outcome is Outcome.COMPLETED and completed.event is None
    rejected = effect_of(act.Reject("w", "too big"))
    assert rejected.stop is Stop.NONE and rejected.outcome is Outcome.REJECTED and rejected.placement is Placement.KEEP
    assert (rejected.event, rejected.warning, rejected.rejection) == ("Rejected", True, "too big")


def test_the_kinds_of_an_effect_are_enums() -> None:
    """Compared with ``is``: a misspelt kind is an AttributeError, not a branch never taken."""
    for action in (act.Admit("w", 1, ("a",)), act.Fail("w", "x"), act.Complete("w"), act.Reject("w", "x")):
        effect = effect_of(action)
        assert isinstance(effect.stop, Stop) and isinstance(effect.placement, Placement)
        assert effect.outcome is None or isinstance(effect.outcome, Outcome)


def test_each_consumer_gets_every_effect_of_a_decision_at_once() -> None:
    actions = [act.Admit("w", 1, ("a",)), act.Preempt("v", "w", "preempted by w")]
    assert effects.effects_of(actions) == [effect_of(a) for a in actions]


def test_every_start_cause_is_a_published_one() -> None:
    for action in (act.Admit("w", 1, ("a",)), act.Admit("w", 2, ("a",)), act.ScaleUp("w", ("b",), ("a", "b"), 1, ("a", "b")),
                   act.Restart("w", 2, ("a",), "x", charged=True), act.Restart("w", 2, ("a",), "x", charged=False)):
        assert effect_of(action).cause in START_CAUSES
    assert effects.with_resume("start", resumes=True) == "resume" in START_CAUSES
    assert effects.with_resume("hotswap", resumes=True) == "hotswap"


@pytest.mark.parametrize(
    ("action", "message"),
    [
        (act.Reject("w", "too big"), "rejected: too big"),
        (act.Admit("w", 1, ("a", "b")), "admitted on a, b (attempt 1)"),
        (act.Admit("w", 2, ("a",), start=False), "admitted on a (attempt 2); waiting for old workers"),
        (act.Preempt("w", "h", "preempted by h (priority high)"), "preempted by h (priority high)"),
        (act.Restart("w", 2, ("x",), "node lost", charged=False), "restarted on x (attempt 2): node lost"),
        (act.Restart("w", 2, ("x",), "lost", charged=False, start=False), "restarted on x (attempt 2): lost; waiting to start"),
        (act.StartWorkers("w", 2, ("x",)), "workers started on x (attempt 2)"),
        (act.Requeue("w", "no capacity"), "requeued: no capacity"),
        (act.ScaleDown("w", ("b",), ("a",), 2, "lost", ("a",), (1,)), "scaled down to 1 slice(s), without b: lost"),
        (act.ScaleUp("w", ("b",), ("a", "b"), 3, ("a", "b")), "scaled up to 2 slice(s), adding b"),
        (act.Fail("w", "boom"), "failed: boom"),
        (act.Complete("w"), "completed: every worker exited 0"),
        (act.Remove("w"), "deleted"),
    ],
)
def test_one_message_per_action(action: act.Action, message: str) -> None:
    """The local timeline's entry and the Kubernetes Event's message."""
    assert effect_of(action).message == message
