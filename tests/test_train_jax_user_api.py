"""What a JAX user's script registers and calls, in this process: registered objects must have
a JSON state, and pathwaysutils' ``Manager`` on a run reports its slices and scales by them."""

from __future__ import annotations

import types

import pytest
from jax_helpers import jax  # noqa: F401 (a fixture)


def test_registered_objects_must_have_a_json_state(jax) -> None:  # type: ignore[no-untyped-def]
    from hotswap.train import ResumableBatches
    from hotswap.train.jax.objects import ObjectRegistry

    registry = ObjectRegistry()
    batches = ResumableBatches(100, 10)
    registry.register("batches", batches)
    registry.register("extra", {"when": object()})
    with pytest.raises(TypeError, match="'extra' is not JSON-serialisable"):
        registry.state()
    with pytest.raises(TypeError, match="cannot register a int"):
        registry.register("n", 3)


def test_pathwaysutils_scaling_rule(jax) -> None:  # type: ignore[no-untyped-def]
    from hotswap.train.jax.elastic import Manager

    run = types.SimpleNamespace(total_slices=3, slices=2, sync=types.SimpleNamespace(snapshot_every=None))
    manager = Manager(run=run)  # type: ignore[arg-type]
    assert (manager.good_slice_count, manager.active_slice_indices, manager.inactive_slice_indices) == (2, {0, 1}, {2})
    assert manager.scale_by_active_slices(30) == 20 and manager.scale_by_active_slices(0.3) == pytest.approx(0.2)
    with pytest.raises(ValueError, match="remainder"):
        manager.scale_by_good_slices(31)
