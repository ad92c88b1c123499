"""Issue 26 item 3: hotswap's JAX restore (train/jax/step_reader.py) reads a step's arrays
itself, faster than orbax's own restore of the same step, and still restores exactly what was
saved onto the registered state's shardings (3 slices -> 2, another layout, replicated, on the
host), refusing another tree, shape or dtype, and handing trees it does not read to orbax."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from jax_helpers import ROOT, checkpoints, jax  # noqa: F401 (jax is a fixture)

_RESHARD = r"""
import sys
import jax
jax.config.update("jax_num_cpu_devices", 3)
import jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from hotswap.train.events import EventLog
from hotswap.train.jax import step_reader
from hotswap.train.jax.checkpoints import OrbaxCheckpoints

devices = jax.devices()
def on(n, spec):
    return NamedSharding(Mesh(np.array(devices[:n]), ("slice",)), spec)

special = np.array([np.nan, -0.0, np.inf, 1e-45] * 3, np.float32).view(np.uint32)
special[0] |= 0x1234  # a NaN payload
rows = np.arange(12 * 5, dtype=np.float32).reshape(12, 5)
saved = {
    "rows": jax.device_put(rows, on(3, P("slice", None))),
    "cols": jax.device_put(np.arange(4 * 6, dtype=np.int32).reshape(4, 6), on(3, P(None, "slice"))),
    "same": jax.device_put(np.arange(6, dtype=np.float32), on(3, P())),
    "bits": jax.device_put(special.view(np.float32), on(3, P("slice"))),
    "half": jax.device_put(np.arange(12, dtype=np.float32).astype(jnp.bfloat16), on(3, P("slice"))),
    "count": jax.device_put(np.int32(7), on(3, P())),
    "host": np.arange(3, dtype=np.int64),
}
store = OrbaxCheckpoints(sys.argv[1], 2, EventLog(None), record_events=False)
store.save(3, saved, {}, {"step": 3, "elastic_down_events": 0}, "periodic", wait=True)
layouts = {
    "2 slices": lambda x: on(2, P("slice", *([None] * (x.ndim - 1))) if x.ndim and x.shape[0] % 2 == 0 else P()),
    "columns": lambda x: on(3, P(None, "slice")) if x.ndim == 2 and x.shape[1] % 3 == 0 else on(3, P()),
    "one device": lambda x: on(1, P()),
}
if len(sys.argv) > 2:
    step_reader.IN_FLIGHT_BYTES = 1  # every read waits for the one before to be placed
for name, layout in layouts.items():
    template = {k: (v if isinstance(v, np.ndarray) else jax.device_put(jnp.zeros(v.shape, v.dtype), layout(v))) for k, v in saved.items()}
    restored = OrbaxCheckpoints(sys.argv[1], 2, EventLog(None), record_events=False).restore_latest(template)
    assert restored is not None and restored.step == 3, name
    for key, value in saved.items():
        got = restored.state[key]
        assert type(got) is type(template[key]), (name, key, type(got))
        assert got.dtype == value.dtype and got.shape == value.shape, (name, key)
        assert np.asarray(got).tobytes() == np.asarray(value).tobytes(), (name, key)
        if not isinstance(got, np.ndarray):
            assert got.sharding == template[key].sharding, (name, key, got.sharding)
            for shard in got.addressable_shards:
                assert np.asarray(shard.data).tobytes() == np.asarray(value)[shard.index].tobytes(), (name, key)
print("ok")
"""


@pytest.mark.parametrize("window", ["unbounded", "one read at a time"])
def test_a_restore_reshards_onto_the_registered_layout_with_every_bit_as_saved(jax, tmp_path: Path, window: str) -> None:
    """Saved on 3 CPU devices, restored onto 2 (the elastic 3 -> 2 case), onto another
    partitioning of 3, and onto 1: every leaf comes back bit for bit (NaN payload, -0.0,
    bfloat16, a 0-d count, a replicated leaf, a NumPy leaf) on the template's sharding, each
    device holding its own part; also when host memory lets only one read be in flight."""
    argv = [sys.executable, "-c", _RESHARD, str(tmp_path)] + (["window"] if window != "unbounded" else [])
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "JAX_PLATFORMS": "cpu"}
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=240)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]


def test_a_plain_state_is_read_by_hotswap_s_reader_not_by_orbax_s_restore(
    jax, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 26 item 3: a state of plain arrays is read by hotswap's reader (what makes the
    restore faster than orbax's own: ``benchmarks/bench_jax.py`` measures it; tests assert no
    times), bit for bit: orbax's array restore is not called at all."""
    import jax.numpy as jnp
    import orbax.checkpoint as ocp

    state = {f"w{i}": jnp.full((64, 128), i, jnp.float32) for i in range(4)}
    ours = checkpoints(tmp_path / "hotswap")
    ours.save(1, state, {}, {"step": 1, "elastic_down_events": 0}, "periodic", wait=True)

    def refused(*args: object, **kwargs: object) -> None:
        raise AssertionError("orbax's array restore was called for a plain state")

    monkeypatch.setattr(ocp.PyTreeCheckpointHandler, "restore", refused)
    restored = ours.restore_latest(state)
    assert restored is not None and restored.step == 1
    assert all(bool((restored.state[k] == state[k]).all()) for k in state)


def test_a_tree_the_reader_leaves_to_orbax_still_restores_and_is_still_checked(jax, tmp_path: Path) -> None:
    """A typed PRNG key and a Python scalar are not read by hotswap's reader: orbax's restore
    reads that step, and a template with another dtype is still refused. (Before, a state
    holding a typed key could not be restored at all: the tree check failed on its dtype.)"""
    import jax.numpy as jnp

    from hotswap.train.jax.trees import StateMismatchError

    state = {"key": jax.random.key(3), "w": jnp.arange(4.0), "lr": 0.5}
    checkpoints(tmp_path).save(2, state, {}, {"step": 2, "elastic_down_events": 0}, "periodic", wait=True)
    restored = checkpoints(tmp_path).restore_latest(state)
    assert restored is not None and restored.step == 2 and restored.state["lr"] == 0.5
    assert bool((jax.random.key_data(restored.state["key"]) == jax.random.key_data(state["key"])).all())
    with pytest.raises(StateMismatchError, match="'w' is float32"):
        checkpoints(tmp_path).restore_latest({**state, "w": jnp.zeros(4, jnp.int32)})
    from hotswap.train.jax import step_reader

    assert step_reader.open_step(tmp_path / "2" / "state", state) is None  # orbax's restore read it


def test_a_step_saved_after_a_restore_is_what_the_next_restore_reads(jax, tmp_path: Path) -> None:
    """Nothing read by one restore is kept for the next: the same object restores step 1, saves
    step 2 and reads step 2's values; another directory's step 2 does not leak into it."""
    import jax.numpy as jnp

    store = checkpoints(tmp_path)
    counters = {"step": 1, "elastic_down_events": 0}
    store.save(1, {"w": jnp.arange(4.0)}, {}, counters, "periodic", wait=True)
    first = store.restore_latest({"w": jnp.zeros(4)})
    assert first is not None and first.state["w"].tolist() == [0.0, 1.0, 2.0, 3.0]
    store.save(2, {"w": jnp.arange(4.0) * 10}, {}, {**counters, "step": 2}, "periodic", wait=True)
    second = store.restore_latest({"w": jnp.zeros(4)})
    assert second is not None and second.step == 2 and second.state["w"].tolist() == [0.0, 10.0, 20.0, 30.0]
    other = checkpoints(tmp_path / "other")
    other.save(2, {"w": jnp.full(4, 7.0)}, {}, {**counters, "step": 2}, "periodic", wait=True)
    assert other.restore_latest({"w": jnp.zeros(4)}).state["w"].tolist() == [7.0] * 4  # type: ignore[union-attr]
    assert store.restore_latest({"w": jnp.zeros(4)}).state["w"].tolist() == [0.0, 10.0, 20.0, 30.0]  # type: ignore[union-attr]


@pytest.mark.gpu
def test_on_gpus_the_restore_places_every_shard_on_its_gpu_bit_for_bit(jax, tmp_path: Path) -> None:
    """On a GPU host (``-m gpu``; skipped where JAX sees no GPU): hotswap's reader copies each
    shard to its GPU (sharded across every GPU, and replicated), values as saved. Its speed
    against orbax's restore is ``bench_jax.py --device gpu`` in ``benchmarks/gpu_acceptance.sh``."""
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    if jax.default_backend() != "gpu":
        pytest.skip("needs a GPU visible to JAX")
    gpus = jax.devices()
    mesh = Mesh(np.array(gpus), ("slice",))
    rows = 1024 * len(gpus)
    values = np.random.default_rng(0).standard_normal((rows, 2048)).astype(np.float32)
    state = {
        "sharded": jax.device_put(values, NamedSharding(mesh, P("slice", None))),
        "half": jax.device_put(values[:, :512].astype(jnp.bfloat16), NamedSharding(mesh, P("slice", None))),
        "replicated": jax.device_put(values[:8], NamedSharding(mesh, P())),
    }
    checkpoints(tmp_path).save(1, state, {}, {"step": 1, "elastic_down_events": 0}, "periodic", wait=True)
    template = jax.tree.map(lambda x: jax.device_put(jnp.zeros(x.shape, x.dtype), x.sharding), state)
    restored = checkpoints(tmp_path).restore_latest(template)
    assert restored is not None and restored.step == 1
    for key, value in state.items():
        got = restored.state[key]
        assert got.sharding == value.sharding and got.devices() == set(value.sharding.device_set), key
        assert np.asarray(got).tobytes() == np.asarray(value).tobytes(), key
