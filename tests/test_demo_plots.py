"""The drill's picture: every step point of every run, the lost slice, every event explained in
a legend (figure objects inspected, not pixels); and the survivors' stall read from step times."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

pytest.importorskip("matplotlib")

from hotswap.demo.observe import StepRecord, Trace, survivor_stall  # noqa: E402
from hotswap.demo.plot import OUTAGE_LABEL, draw_drill, slice_outages  # noqa: E402
from matplotlib.colors import to_rgb  # noqa: E402

CLUSTER = "demo-elastic-ab12"


def _row(t: float, kind: str, workload: str | None = None, **data: Any) -> dict[str, Any]:
    return {"t": t, "kind": kind, "workload": workload, "data": json.dumps(data) if data else None, "message": ""}


def elastic_summary() -> dict[str, Any]:
    slices = [f"{CLUSTER}-np-{i}" for i in range(3)]
    timeline = [
        _row(100.0, "admit", "elastic", slices=slices),
        _row(110.0, "node-failed", node=f"{CLUSTER}-np-1-0", reason="hotswap node fail"),
        _row(110.1, "scaledown", "elastic", slices=[slices[0], slices[2]], removed=[slices[1]]),
        _row(120.0, "node-repaired", node=f"{CLUSTER}-np-1-0", reason=""),
        _row(120.1, "scaleup", "elastic", slices=[slices[0], slices[2], slices[1]], added=[slices[1]]),
    ]
    progress = [(101.0 + 0.1 * i, i + 1, 3) for i in range(90)]  # to t=109.9
    progress += [(110.5 + 0.1 * i, 91 + i, 2) for i in range(95)]  # to t=119.9
    progress += [(126.0 + 0.1 * i, 186 + i, 3) for i in range(40)]  # after a 6 s grow-back stall
    marks = [{"t": 110.0, "what": "fail", "node": f"{CLUSTER}-np-1-0"}, {"t": 120.0, "what": "uncordon", "node": f"{CLUSTER}-np-1-0"}]
    return {"scenario": "elastic", "cluster": CLUSTER, "timeline": timeline, "marks": marks, "progress": {"elastic": progress}}


def test_elastic_plot_shows_every_step_the_lost_slice_and_both_events() -> None:
    summary = elastic_summary()
    figure = draw_drill(summary)
    slices_ax, steps_ax = figure.axes
    drawn = {line.get_label(): line for line in steps_ax.get_lines()}
    on_two, on_three = drawn["elastic on 2 slice(s)"], drawn["elastic on 3 slice(s)"]
    assert len(on_two.get_xdata()) == 95 and len(on_three.get_xdata()) == 130  # every point, none thinned
    assert to_rgb(on_two.get_color()) != to_rgb(on_three.get_color())  # each slice count a colour of its own
    # The lost slice: a hatched bar on np-1's row from the failure to the repair.
    hatched = [c for c in slices_ax.collections if c.get_hatch() and c.get_label() == OUTAGE_LABEL]
    assert len(hatched) == 1
    (x0, y0), (x1, y1) = hatched[0].get_paths()[0].get_extents().get_points()
    assert (round(x0, 1), round(x1, 1)) == (10.0, 20.0) and y0 < 1 < y1
    assert [t.get_text() for t in slices_ax.get_yticklabels()] == ["np-0", "np-1", "np-2"]
    # Both events: a line on each axis, a number on the line, the words in the legend.
    legend = [t.get_text() for t in steps_ax.get_legend().get_texts()]
    assert f"1. node failed: {CLUSTER}-np-1-0 at 10.0 s" in legend and f"2. node repaired: {CLUSTER}-np-1-0 at 20.0 s" in legend
    assert OUTAGE_LABEL in [t.get_text() for t in slices_ax.get_legend().get_texts()]
    assert sorted(a.get_text() for a in steps_ax.texts) == ["1", "2"]
    vertical = [line for line in steps_ax.get_lines() if list(line.get_xdata()) in ([10.0, 10.0], [20.0, 20.0])]
    assert len(vertical) == 2
    # The line that joins the points is broken over the stalls instead of bridging them.
    joined = next(line for line in steps_ax.get_lines() if line.get_linestyle() == "-" and len(line.get_xdata()) > 200)
    assert sum(math.isnan(y) for y in joined.get_ydata()) == 1  # the 6 s grow-back stall


def test_the_plot_times_from_the_commands_start_as_the_live_log_does() -> None:
    """The drill's log times its lines from the command's start (``started_t``); so does the
    plot: a failure logged at 15.0 s is drawn, and named, at 15.0 s."""
    summary = dict(elastic_summary(), started_t=95.0)  # the command started 5 s before the first record
    figure = draw_drill(summary)
    _, steps_ax = figure.axes
    legend = [t.get_text() for t in steps_ax.get_legend().get_texts()]
    assert f"1. node failed: {CLUSTER}-np-1-0 at 15.0 s" in legend, legend
    assert steps_ax.get_xlabel() == "seconds since the command started"
    vertical = [line for line in steps_ax.get_lines() if list(line.get_xdata()) == [15.0, 15.0]]
    assert len(vertical) == 1


def test_migration_plot_shows_both_runs_and_the_delete_and_create() -> None:
    slice_ = f"{CLUSTER}-np-0"
    timeline = [_row(100.0, "admit", "mnist", slices=[slice_]), _row(105.0, "remove", "mnist"), _row(105.2, "admit", "mnist", slices=[slice_])]
    first = [(101.0 + 0.1 * i, i + 1, 1) for i in range(40)]
    second = [(107.0 + 0.1 * i, 41 + i, 1) for i in range(20)]
    marks = [{"t": 105.0, "what": "delete", "workload": "mnist"}, {"t": 105.2, "what": "create", "workload": "mnist"}]
    figure = draw_drill({"scenario": "migration", "cluster": CLUSTER, "timeline": timeline, "marks": marks,
                         "progress": {"mnist": first + second}})
    _, steps_ax = figure.axes
    series = next(line for line in steps_ax.get_lines() if line.get_label() == "mnist (1 slice(s))")
    assert sum(not math.isnan(y) for y in series.get_ydata()) == 60
    legend = [t.get_text() for t in steps_ax.get_legend().get_texts()]
    assert any(text.startswith("1. deleted") for text in legend) and any(text.startswith("2. created again") for text in legend)


def test_outages_follow_failures_and_repairs() -> None:
    slices = {f"{CLUSTER}-np-{i}" for i in range(2)}
    rows = [_row(1.0, "node-failed", node=f"{CLUSTER}-np-1-0"), _row(3.0, "node-repaired", node=f"{CLUSTER}-np-1-0"),
            _row(4.0, "node-cordoned", node=f"{CLUSTER}-np-0-0")]
    assert slice_outages(rows, slices, 9.0) == {f"{CLUSTER}-np-1": [(1.0, 3.0)], f"{CLUSTER}-np-0": [(4.0, 9.0)]}


def test_survivor_stall_is_the_gap_in_the_survivors_own_steps() -> None:
    steps = [StepRecord(10.0 + 0.1 * i, i, 1, 0, 0, 2, None) for i in range(20)]  # on 2 slices until t=11.9
    steps += [StepRecord(19.9, 20, 1, 0, 0, 3, None), StepRecord(20.0, 21, 1, 0, 0, 3, None)]  # first on 3 at 19.9
    steps += [StepRecord(19.9, 20, 1, 1, 0, 3, None)]  # a joiner's step does not count
    stall = survivor_stall(Trace(steps, [], []), replica=0, before_slices=2, after_slices=3, since=11.0)
    assert stall == {"stall_s": 8.0, "usual_step_s": 0.1, "last_step": 19, "first_step": 20}
    assert survivor_stall(Trace(steps[:20], [], []), 0, 2, 3, 11.0) is None  # not grown back yet
