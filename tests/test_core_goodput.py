"""core/goodput.account_run: one attempt booked stretch by stretch, by the simulator's rule."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hotswap.core.goodput import Category, Ledger, Spent, Stretch, account_run


def test_missing_slices_are_degraded_and_steps_on_the_others_are_goodput() -> None:
    ledger = Ledger()
    stretches = [Stretch(0.0, 10.0, 4), Stretch(10.0, 20.0, 3)]
    spent = [Spent(Category.PRODUCTIVE, 0.0, 10.0, 4), Spent(Category.ELASTIC, 10.0, 11.0), Spent(Category.PRODUCTIVE, 11.0, 20.0, 3)]
    assert account_run(ledger, 4, stretches, spent) == 0.0
    assert ledger.seconds[Category.DEGRADED] == pytest.approx(10.0)
    assert ledger.seconds[Category.ELASTIC] == pytest.approx(3.0)
    assert ledger.seconds[Category.PRODUCTIVE] == pytest.approx(40.0 + 27.0)
    assert ledger.seconds[Category.RECOVERY] == 0.0


def test_uncovered_time_is_recovery_at_full_size_and_degraded_below_it() -> None:
    ledger = Ledger()
    account_run(ledger, 2, [Stretch(0.0, 5.0, 2), Stretch(5.0, 10.0, 1)], [])
    assert ledger.seconds[Category.RECOVERY] == pytest.approx(10.0)
    assert ledger.seconds[Category.DEGRADED] == pytest.approx(5.0 + 5.0)


def test_without_a_reported_step_the_running_time_is_returned_not_booked() -> None:
    ledger = Ledger()
    unknown = account_run(ledger, 2, [Stretch(0.0, 5.0, 2), Stretch(5.0, 10.0, 1)], [], stepped=False)
    assert unknown == pytest.approx(15.0)
    assert ledger.seconds[Category.DEGRADED] == pytest.approx(5.0)
    assert ledger.total == pytest.approx(5.0)


@given(
    size=st.integers(1, 8),
    cuts=st.lists(st.tuples(st.floats(0.01, 100.0), st.integers(1, 8)), min_size=1, max_size=6),
    spans=st.lists(st.tuples(st.sampled_from(list(Category)), st.floats(0.0, 600.0), st.floats(0.0, 5.0)), max_size=8),
)
def test_every_slice_second_lands_in_one_category_when_the_records_do_not_overlap(
    size: int, cuts: list[tuple[float, int]], spans: list[tuple[Category, float, float]]
) -> None:
    """Records that do not overlap never book more than the run held, nor less."""
    stretches, t = [], 0.0
    for length, slices in cuts:
        stretches.append(Stretch(t, t + length, min(slices, size)))
        t += length
    spent, cursor = [], 0.0
    for category, gap, length in spans:
        spent.append(Spent(category, cursor + gap, cursor + gap + length))
        cursor += gap + length
    ledger = Ledger()
    account_run(ledger, size, stretches, spent)
    assert ledger.total == pytest.approx(size * t)
