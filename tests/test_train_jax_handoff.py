"""What a JAX survivor hands its next program when it restarts into a new membership
generation, in this process (one CPU device, no ``jax.distributed``, the handoff read back from
a pipe as the next program reads it): the shards, given back only into a layout they fill; the
last computed state when the live one failed with its peer; and, when its watchdog moved it on
from a step stuck on a hung peer (a real watchdog thread, the membership file rewritten by the
test), a move that began at the last step boundary. The real survivor-to-successor restart is
in ``test_train_jax_successor.py``."""

from __future__ import annotations

import os
import types
from pathlib import Path

import pytest
from jax_helpers import jax  # noqa: F401 (a fixture)


def test_a_handoff_gives_back_the_shards_and_refuses_a_layout_it_cannot_fill(jax, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import pickle

    import jax.numpy as jnp

    from hotswap.train.jax import handoff as handoffs
    from hotswap.train.jax.trees import local_shards, rebuild

    state = {"w": jnp.arange(6.0).reshape(2, 3), "n": jnp.int32(3)}
    shards = local_shards(state)
    back = rebuild(jax.tree.map(jnp.zeros_like, state), shards)
    assert back is not None and bool((back["w"] == state["w"]).all()) and int(back["n"]) == 3
    assert rebuild({"w": jnp.zeros((3, 2)), "n": jnp.int32(0)}, shards) is None  # another shape: not from here

    change = handoffs.MembershipChange(after_generation=4, previous_slices=3, started=1.0, failed=True)
    sent = handoffs.Handoff(change, {"step": 9, "elastic_down_events": 1}, shards, ["w", "n"], {"b": {"x": 1}}, attempts=2)
    read, write = os.pipe()
    os.write(write, pickle.dumps(sent))
    os.close(write)
    os.environ[handoffs.HANDOFF_FD] = str(read)
    received = handoffs.take()
    assert handoffs.HANDOFF_FD not in os.environ and handoffs.take() is None  # taken once
    assert received is not None and received.change == change and received.counters == sent.counters
    assert received.attempts == 2 and received.objects == {"b": {"x": 1}}


def test_a_survivor_hands_over_the_last_computed_state_when_the_live_one_failed(jax, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """A step's arrays arrive asynchronously: when the step failed with its peer, the state it
    assigned cannot be read, and the one before it (with its counters and objects) goes."""
    import jax.numpy as jnp

    from hotswap.train.events import EventLog
    from hotswap.train.jax import sync as syncs
    from hotswap.train.jax.handoff import MembershipChange
    from hotswap.train.progress import Progress

    progress = Progress(step=4, has_state=True)
    state = syncs.JaxStateSync(
        types.SimpleNamespace(rank=0, world_size=2), progress, EventLog(None),  # type: ignore[arg-type]
        hosts_per_slice=1, async_checkpoints=True, snapshot_every=None, handoff=None,
    )
    position = {"offset": 4}
    state.register({"w": jnp.full(3, 4.0)}, {"data": position})
    state.at_boundary()
    state.commit()  # step 4 is computed
    position["offset"] = 5
    failed = {"w": jnp.full(3, 5.0)}
    state.current, progress.step = failed, 5
    state.at_boundary()

    real = syncs.local_shards

    def unreadable(tree):  # type: ignore[no-untyped-def]
        if tree is failed:
            raise ValueError("UNKNOWN: Gloo all-reduce failed: Connection reset by peer")
        return real(tree)

    monkeypatch.setattr(syncs, "local_shards", unreadable)
    handed = state.handoff(MembershipChange(1, 2, 0.0, True), attempts=1)
    assert handed.counters is not None and handed.counters["step"] == 4
    assert handed.objects == {"data": {"offset": 4}}
    assert handed.shards is not None and float(next(iter(handed.shards[0].values()))[0]) == 4.0


def test_a_process_the_watchdog_moves_on_counts_the_stuck_step_in_the_elastic_time(jax, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A survivor stuck in a step on a hung peer (JAX cannot interrupt the collective): the
    watchdog moves it on, and the move it hands to its next program began at its last step
    boundary, so the elastic event's ``duration_s`` counts the stuck step (before: from when
    the watchdog acted, the stall uncounted)."""
    import threading
    import time

    from hotswap.api.membership import Membership
    from hotswap.api.worker import WorkerEnv
    from hotswap.train.events import EventLog
    from hotswap.train.jax.formation import RestartingFormation
    from hotswap.train.jax.handoff import Handoff
    from hotswap.train.jax.watchdog import Watchdog
    from hotswap.train.progress import Progress

    membership = tmp_path / "membership.json"
    first = Membership(1, ("a", "b", "c"), 1, "127.0.0.1", 1001)
    membership.write_text(first.to_json())
    group = types.SimpleNamespace(leave=lambda staying: None, prepared_service=lambda: None)
    sync = types.SimpleNamespace(handoff=lambda change, attempts, live=True: Handoff(change, None, None, None, None, attempts))
    handed: list[Handoff] = []
    formation = RestartingFormation(
        WorkerEnv(slice_name="a", num_slices=3, membership_file=str(membership)), group, None, sync,  # type: ignore[arg-type]
        Progress(), EventLog(None), membership_timeout_s=5.0, handoff=None, restart=handed.append,  # type: ignore[arg-type]
    )
    formation.membership = first
    moved = threading.Event()

    def on_stall(newest: Membership, forming: bool, since: float) -> None:
        formation.abandon(newest, None, since)
        moved.set()

    stall_s = 0.5
    watchdog = Watchdog(
        str(membership), stall_s=stall_s, generation=lambda: 1, forming=lambda: None, is_rank_zero=lambda: True,
        others_leaving=lambda: False, terminated=lambda: False, on_stall=on_stall, on_terminated=lambda: None,
    )
    watchdog.beat()  # the step that will hang begins
    stuck_from = time.monotonic()
    watchdog.start()
    membership.write_text(Membership(2, ("a", "c"), 1, "127.0.0.1", 1002).to_json())  # the controller left b behind
    assert moved.wait(10.0)
    watchdog.stop()
    [handoff] = handed
    assert handoff.change.failed and handoff.change.after_generation == 1 and handoff.change.previous_slices == 3
    assert handoff.change.started <= stuck_from  # not when the watchdog acted, stall_s later
