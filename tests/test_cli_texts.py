"""Texts a user reads, each said once and meaning what it says (issue 25 item 8)."""

from __future__ import annotations

import types

import pytest

from hotswap.api.errors import WorkloadFailedError
from hotswap.cli.waiting import Until, reached
from hotswap.demo.observe import Trace, resumed_from_last_checkpoint


def test_a_failed_workload_is_named_failed_once() -> None:
    view = {"name": "ex2", "status": "FAILED", "status_message": "failed: worker c-np-0/0 exit code 1 is not a restart code"}
    with pytest.raises(WorkloadFailedError) as raised:
        reached(view, Until.RUNNING)
    assert str(raised.value) == "workload ex2 failed: worker c-np-0/0 exit code 1 is not a restart code"
    assert raised.value.exit_code == 125


def test_the_demo_says_the_last_step_before_the_failure_was_done() -> None:
    restored = types.SimpleNamespace(step=40, source="checkpoint", attempt=2, t=5.0)
    saved = types.SimpleNamespace(step=40, reason="termination", attempt=1, t=4.0)
    step = types.SimpleNamespace(step=41, attempt=1, t=3.0)
    trace = Trace([step], [restored], [], [saved])
    passed, text = resumed_from_last_checkpoint(trace, attempt=1)
    assert passed
    assert "last step done: 41" in text
    assert "done before" not in text


def test_the_demo_summary_says_why_a_job_that_never_trained_has_no_goodput(capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 25 item 5, issue 34 item 4: a job that reported no step has goodput "unknown" with
    its reason, never a bare figure, nor a startup it did not spend."""
    from hotswap.cli.demo import _print_summary

    reason = "no step was reported: its workers started hotswap.train and stopped before their first step"
    _print_summary({"scenario": "hotswap", "checks": [], "passed": True, "wall_s": 20.0, "goodput": {
        "low": {"goodput": None, "wall_s": 13.0, "badput": {"queued": 0.846, "startup": 0.0}, "reason": reason,
                "running_share": 0.154},
        "high": {"goodput": 0.8, "wall_s": 10.0, "badput": {"queued": 0.1, "degraded": 0.1}},
    }})
    out = " ".join(capsys.readouterr().out.split())
    assert "goodput of low unknown over 13 s (badput: queued 84.6%; running with no step reported 15.4%; no step" in out
    assert "startup" not in out
    assert "goodput of high 80.0% over 10 s (badput: queued 10.0%, degraded 10.0%)" in out


@pytest.mark.parametrize(("zygote", "said"), [(True, "no spare, forked from the zygote"), (False, "cold restart")])
def test_the_hotswap_demo_says_how_the_restart_without_a_spare_started(
    zygote: bool, said: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the cluster has a zygote, the restart that finds no spare is forked, not cold."""
    from hotswap.cli.demo import _print_summary

    monkeypatch.setenv("COLUMNS", "160")  # one row per line

    _print_summary({"scenario": "hotswap", "checks": [], "passed": True, "wall_s": 20.0, "mttr_s": 0.4,
                    "mttr_warm_s": 0.25, "zygote": zygote})
    out = " ".join(capsys.readouterr().out.split())
    assert f"MTTR (failure -> first training step), {said} 0.40 s" in out
