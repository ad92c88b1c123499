"""hotswap.train.jax's orbax checkpoints, in this process (one CPU device, no
``jax.distributed``): a step restores exactly and another tree is refused naming its first
differing leaf; a restore reads the step once and still refuses another dtype; no checkpoint
restores nothing; a damaged step is named, set aside and its step saved again; a process joining
a live elastic job leaves the survivors' save in flight alone. Restores onto other layouts are in
``test_train_jax_restore.py``, saves by real worker processes in ``test_train_jax_processes.py``."""

from __future__ import annotations

from pathlib import Path

import pytest
from jax_helpers import checkpoints, jax  # noqa: F401 (jax is a fixture)


def test_a_checkpoint_restores_exactly_and_refuses_another_tree_naming_the_first_leaf(jax, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import jax.numpy as jnp

    from hotswap.train.jax.trees import StateMismatchError

    state = {"params": {"w": jnp.arange(12.0).reshape(4, 3), "b": jnp.ones(3)}, "opt": (jnp.zeros(3), jnp.int32(7))}
    store = checkpoints(tmp_path)
    store.save(5, state, {"batches": {"epoch": 1}}, {"step": 5, "elastic_down_events": 0}, "termination", wait=True)

    restored = checkpoints(tmp_path).restore_latest(jax.tree.map(jnp.zeros_like, state))
    assert restored is not None and restored.step == 5 and restored.reason == "termination"
    assert restored.objects == {"batches": {"epoch": 1}}
    assert jax.tree.all(jax.tree.map(lambda a, b: bool((a == b).all()), restored.state, state))

    cast = {**state, "params": {"w": state["params"]["w"], "b": jnp.ones(3, jnp.bfloat16)}}
    grown = {**state, "params": {**state["params"], "c": jnp.ones(2)}}
    shrunk = {"params": state["params"]}
    reshaped = {**state, "params": {"w": jnp.zeros((3, 4)), "b": state["params"]["b"]}}
    for template, words in (
        (cast, ["'params/b'", "float32[3]", "bfloat16[3]"]),
        (grown, ["no leaf 'params/c'"]),
        (shrunk, ["'opt/0'", "lacks"]),
        (reshaped, ["'params/w'", "float32[4,3]", "float32[3,4]"]),
    ):
        with pytest.raises(StateMismatchError) as error:
            checkpoints(tmp_path).restore_latest(template)
        assert all(word in str(error.value) for word in words), str(error.value)


def test_a_restore_reads_the_step_once_and_still_refuses_a_cast(jax, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """Issue 26 item 3: the restore is no slower than orbax's own. The tree check uses what the
    restore opened (the arrays' shapes and dtypes as saved, never cast to the template), so a
    step that restores is not read a second time for its metadata; another dtype is still refused."""
    import jax.numpy as jnp
    import numpy as np
    import orbax.checkpoint as ocp

    from hotswap.train.jax.trees import StateMismatchError

    state = {"w": jnp.arange(6.0).reshape(2, 3), "host": np.arange(3, dtype=np.int32)}
    opened_before = checkpoints(tmp_path)  # the step is written by another after this opened
    checkpoints(tmp_path).save(4, state, {}, {"step": 4, "elastic_down_events": 0}, "periodic", wait=True)
    reads: list[int] = []
    real = ocp.CheckpointManager.item_metadata
    monkeypatch.setattr(ocp.CheckpointManager, "item_metadata", lambda self, step: reads.append(step) or real(self, step))

    restored = checkpoints(tmp_path).restore_latest({"w": jnp.zeros((2, 3)), "host": np.zeros(3, np.int32)})
    assert restored is not None and restored.step == 4 and reads == []
    assert bool((restored.state["w"] == state["w"]).all()) and restored.state["host"].tolist() == [0, 1, 2]
    late = opened_before.restore_latest({"w": jnp.zeros((2, 3)), "host": np.zeros(3, np.int32)})
    assert late is not None and late.step == 4 and opened_before.latest_step() == 4  # its next save knows
    for template, words in (
        ({"w": jnp.zeros((2, 3), jnp.bfloat16), "host": np.zeros(3, np.int32)}, ["'w'", "float32[2,3]", "bfloat16[2,3]"]),
        ({"w": jnp.zeros((2, 3)), "host": np.zeros(3, np.int64)}, ["'host'", "int32[3]", "int64[3]"]),
        ({"w": jnp.zeros((2, 4)), "host": np.zeros(3, np.int32)}, ["'w'", "float32[2,3]", "float32[2,4]"]),
    ):
        with pytest.raises(StateMismatchError) as error:
            checkpoints(tmp_path).restore_latest(template)
        assert all(word in str(error.value) for word in words), str(error.value)
    assert (tmp_path / "4").is_dir()  # refused, not set aside as damaged


def test_no_checkpoint_restores_nothing(jax, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    assert checkpoints(tmp_path).restore_latest({"w": jax.numpy.ones(2)}) is None


def test_a_damaged_step_is_named_set_aside_and_its_step_saved_again(jax, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:  # type: ignore[no-untyped-def]
    """Issue 24 item 3, JAX: a step whose metadata is damaged is skipped with one line naming it
    and moved into ``damaged/`` (kept, never read again), so a later save of that step works
    (orbax refused it: StepAlreadyExistsError)."""
    import logging

    import jax.numpy as jnp

    state = {"w": jnp.arange(4.0)}
    counters = {"step": 1, "elastic_down_events": 0}
    store = checkpoints(tmp_path)
    store.save(1, state, {}, counters, "periodic", wait=True)
    store.save(2, {"w": state["w"] + 1}, {}, {**counters, "step": 2}, "periodic", wait=True)
    store.close()
    (tmp_path / "2" / "state" / "_METADATA").write_text("garbage")

    store = checkpoints(tmp_path)
    with caplog.at_level(logging.WARNING, logger="hotswap.train"):
        restored = store.restore_latest({"w": jnp.zeros(4)})
    assert restored is not None and restored.step == 1
    said = [r.getMessage() for r in caplog.records if r.name == "hotswap.train"]
    [aside] = (tmp_path / "damaged").iterdir()
    assert len(said) == 1 and said[0].startswith(f"hotswap: damaged checkpoint {tmp_path / '2'}: its metadata cannot be read")
    assert f"moved to {aside}" in said[0] and aside.name.startswith("2-") and not (tmp_path / "2").exists()

    store.save(2, {"w": state["w"] + 5}, {}, {**counters, "step": 2}, "final", wait=True)
    store.close()
    again = checkpoints(tmp_path).restore_latest({"w": jnp.zeros(4)})
    assert again is not None and again.step == 2 and again.reason == "final"
    assert bool((again.state["w"] == state["w"] + 5).all())


def test_a_process_joining_a_live_elastic_job_leaves_the_survivors_save_in_flight_alone(jax, tmp_path: Path) -> None:
    """A survivor's next program run ahead, or a grow-back's joiner, opens the checkpoint
    directory while the survivors may still be saving: orbax's clean-up of temporary step
    directories at that moment removed their save in flight (its commit then failed and the
    survivors waited 10 s for it: seen in the grow-back drill). A fresh start still cleans up."""
    import shutil

    import jax.numpy as jnp

    from hotswap.api.worker import WorkerEnv
    from hotswap.train.events import EventLog
    from hotswap.train.jax import handoff as handoffs
    from hotswap.train.jax.checkpoints import OrbaxCheckpoints
    from hotswap.train.jax.run import joins_live_job

    change = handoffs.MembershipChange(1, 2, 0.0, False)
    assert joins_live_job(WorkerEnv(start_cause="elastic"), None)  # a grow-back's joiner
    assert joins_live_job(WorkerEnv(start_cause="start"), handoffs.Handoff(change, None, None, None, None))
    assert not joins_live_job(WorkerEnv(start_cause="failure"), None)  # every process of the job starts

    directory = tmp_path / "checkpoints"
    saved = checkpoints(directory)
    saved.save(1, {"w": jnp.ones(4)}, {}, {"step": 1, "elastic_down_events": 0}, "periodic", wait=True)
    in_flight = directory / "2.orbax-checkpoint-tmp"  # what orbax writes a step into until it commits
    shutil.copytree(directory / "1", in_flight)
    counters = {"step": 3, "elastic_down_events": 0}
    joining = OrbaxCheckpoints(str(directory), 3, EventLog(None), record_events=False, clean_leftovers=False)
    joining.save(3, {"w": jnp.ones(4)}, {}, counters, "periodic", wait=True)  # orbax's clean-up is done by then
    assert in_flight.exists()
    fresh = OrbaxCheckpoints(str(directory), 3, EventLog(None), record_events=False)  # a fresh start
    fresh.save(4, {"w": jnp.ones(4)}, {}, {**counters, "step": 4}, "periodic", wait=True)
    assert not in_flight.exists() and (directory / "1").exists()
