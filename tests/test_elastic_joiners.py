"""Grow-back without stalling the survivors: a generation that adds slices counts for the
survivors only once its joiners are ready to form it (their marks), so survivors keep training
while the joiners start (the demo's grow-back stall)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from test_train_neutral import Group, elastic_worker

from hotswap.api.worker import Membership
from hotswap.train import formation as formation_module


def publish(path: Path, generation: int, slices: tuple[str, ...], joined: Path) -> Membership:
    membership = Membership(generation, slices, 1, "127.0.0.1", 1000 + generation, 1, str(joined))
    temporary = path.with_suffix(".tmp")
    temporary.write_text(membership.to_json())
    os.replace(temporary, path)
    return membership


def test_survivors_move_only_when_every_joiner_is_ready(tmp_path: Path) -> None:
    joined = tmp_path / "joined"
    joined.mkdir()
    membership = tmp_path / "membership.json"
    publish(membership, 1, ("a", "b"), joined)
    survivor = elastic_worker(tmp_path, Group(), "a")
    survivor.join_first()
    assert survivor.generation == 1
    grown = publish(membership, 2, ("a", "b", "c"), joined)
    assert grown.joiners(Membership(1, ("a", "b"), 1, "127.0.0.1", 1001)) == ("c",)
    assert survivor.newest_generation() == 1 and not survivor.interrupted()  # c is still starting: train on
    joiner = elastic_worker(tmp_path, Group(), "c")
    joiner.join_first()  # a fresh joiner marks itself ready, then forms generation 2
    assert (joined / "2-c-0-0").exists() and joiner.generation == 2
    assert survivor.newest_generation() == 2 and survivor.interrupted()
    shrunk = publish(membership, 3, ("a",), joined)  # a loss needs no marks
    assert shrunk.joined_marks(grown) == [] and survivor.newest_generation() == 3


def test_survivors_move_anyway_after_the_timeout_or_without_marks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    membership = tmp_path / "membership.json"
    publish(membership, 1, ("a",), tmp_path / "joined")
    survivor = elastic_worker(tmp_path, Group(), "a")
    survivor.join_first()
    publish(membership, 2, ("a", "b"), tmp_path / "joined")
    assert survivor.newest_generation() == 1
    monkeypatch.setattr(formation_module, "JOINERS_READY_TIMEOUT_S", 0.0)
    assert survivor.newest_generation() == 2  # a joiner that never comes does not hold them forever
    without = Membership(3, ("a", "b", "c"), 1, "127.0.0.1", 1003)  # Kubernetes: no marks, move at once
    assert Membership.from_json(without.to_json()).joined_marks(Membership(2, ("a", "b"), 1, "127.0.0.1", 1002)) == []
