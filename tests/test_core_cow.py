"""The copy-on-write containers of a round, against plain dicts and sorted lists (hypothesis)."""

from __future__ import annotations

import bisect

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hotswap.core.cow import Layered, Overlay, OwnedSortedPerKey, SortedPerKey

KEYS = st.integers(0, 40)
# One round: a list of writes (key, value) and deletions (key, None).
ROUND = st.lists(st.tuples(KEYS, st.one_of(st.none(), st.integers(0, 5))), max_size=30)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(KEYS, st.integers(0, 5)), st.lists(ROUND, max_size=25))
def test_versions_read_like_dicts_and_never_change(start: dict[int, int], rounds: list) -> None:
    model = dict(start)
    version = Layered(start)
    history: list[tuple[Layered, dict[int, int]]] = [(version, dict(model))]
    for writes in rounds:
        overlay = Overlay(version)
        for key, value in writes:
            if value is None:
                if key in model:
                    del overlay[key]
                    del model[key]
                else:
                    assert overlay.pop(key, "absent") == "absent"
                    with pytest.raises(KeyError):
                        del overlay[key]
                    with pytest.raises(KeyError):
                        overlay[key]  # noqa: B018 (the read is the test)
            else:
                overlay[key] = value
                model[key] = value
            # The round reads its own writes.
            assert (key in overlay) == (key in model)
            assert overlay.get(key, "absent") == model.get(key, "absent")
        version = overlay.freeze()  # type: ignore[assignment]
        history.append((version, dict(model)))
        assert dict(version.items()) == model and len(version) == len(model)
        assert all(version[k] == v for k, v in model.items())
    # Every earlier version still reads as it was.
    for old, expected in history:
        assert dict(old.items()) == expected and len(old) == len(expected)


def test_a_key_deleted_in_the_round_is_absent_even_if_an_earlier_round_changed_it() -> None:
    version = Overlay(Layered({"a": 1}))
    version["a"] = 2  # in the next version's delta
    frozen = version.freeze()
    round_ = Overlay(frozen)
    del round_["a"]
    assert "a" not in round_ and round_.get("a") is None
    round_["a"] = 3
    assert round_["a"] == 3


def test_an_unchanged_round_returns_the_same_mapping() -> None:
    original = Layered({"a": 1})
    round_ = Overlay(original)
    round_["a"] = original["a"]  # written back unchanged
    assert round_.freeze() is original


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("xy"), st.integers(0, 30), st.sampled_from(["add", "discard", "add_all"])),
                max_size=60))
def test_sorted_per_key_matches_sorted_lists(operations: list[tuple[str, int, str]]) -> None:
    original = {"x": (1, 5, 9)}
    model = {"x": [1, 5, 9], "y": []}
    sorted_ = SortedPerKey(original)
    for key, item, operation in operations:
        if operation == "add_all":  # the item and those above it up to the next multiple of 4
            new = [i for i in range(item, item + 4 - item % 4) if i not in model[key]]
            sorted_.add_all(key, new)
            model[key] = sorted(model[key] + new)
        elif operation == "add" and item not in model[key]:
            sorted_.add(key, item)
            bisect.insort(model[key], item)
        elif operation == "discard":
            sorted_.discard(key, item)
            if item in model[key]:
                model[key].remove(item)
        assert list(sorted_.view(key)) == model[key]
    assert sorted(sorted_.keys()) == sorted(k for k, v in model.items() if v)
    frozen = sorted_.freeze()
    assert {k: list(v) for k, v in frozen.items()} == {k: v for k, v in model.items() if v}
    assert original == {"x": (1, 5, 9)}  # the snapshot's tuples are never changed


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from("xyz"), st.integers(0, 30), st.sampled_from(["add", "discard", "add_all", "take"])),
             max_size=60),
    st.booleans(),
)
def test_a_view_follows_every_change_until_a_key_gets_a_list_of_its_own(
    operations: list[tuple[str, int, str]], owned: bool
) -> None:
    """The demand queue holds the views of a level's keys through a round and takes them again
    only when ``copied`` changed: until then every change must show in the views it holds."""
    sorted_ = (OwnedSortedPerKey if owned else SortedPerKey)({"x": (1, 5, 9)})
    held = {key: sorted_.view(key) for key in "xyz"}
    stamp = sorted_.copied
    for key, item, operation in operations:
        if operation == "add" and item not in sorted_.view(key):
            sorted_.add(key, item)
        elif operation == "add_all":
            sorted_.add_all(key, [i for i in range(item, item + 3) if i not in sorted_.view(key)])
        elif operation == "discard":
            sorted_.discard(key, item)
        elif operation == "take":
            sorted_.take_last(key, item % 3)
        if sorted_.copied != stamp:
            held = {k: sorted_.view(k) for k in "xyz"}
            stamp = sorted_.copied
        assert {k: list(v) for k, v in held.items()} == {k: list(sorted_.view(k)) for k in "xyz"}


def test_taking_from_the_end_hands_out_the_last_items_first() -> None:
    sorted_ = SortedPerKey({"x": (1, 2, 3, 4)})
    assert sorted_.take_last("x", 2) == [4, 3]
    assert sorted_.take_last("x", 5) == [2, 1]  # fewer than asked: all there is
    assert sorted_.take_last("x", 1) == [] and list(sorted_.view("x")) == []
    assert sorted_.freeze() == {}


def test_an_owned_copy_of_a_layered_mapping_holds_what_it_holds() -> None:
    """``Owned.of`` (a round that consumes its snapshot) copies a Layered mapping from its parts:
    base, changes and deletions, as the mapping reads."""
    from hotswap.core.cow import Owned

    layered = Layered.adopt({"a": 1, "b": 2, "c": 3}).derive({"d": 4, "b": 20}, {"a"}).derive({"a": 10}, {"c"})
    owned = Owned.of(layered)
    assert owned == dict(layered) == {"a": 10, "b": 20, "d": 4}
    assert Owned.of(owned) is owned  # the last round's: taken as it is
