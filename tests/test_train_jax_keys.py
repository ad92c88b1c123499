"""A state holding typed PRNG keys (``jax.random.key``) goes on with the same random stream
wherever it travels: across a survivor's restart, to a returning slice and through a checkpoint,
and a handoff is not taken into a state whose key is of another kind (in this process, one CPU
device); sharded across 3 slices' devices, it travels shard by shard from a handoff and from a
peer (in one spawned Python with 3 CPU devices)."""

from __future__ import annotations

import os
import subprocess
import sys
import types
from pathlib import Path

from jax_helpers import ROOT, checkpoints, jax  # noqa: F401 (jax is a fixture)


def _key_sync(jax, step: int, handoff, checkpoint_dir: Path | None = None):  # type: ignore[no-untyped-def]
    from hotswap.train.events import EventLog
    from hotswap.train.jax import sync as syncs
    from hotswap.train.progress import Progress

    sync = syncs.JaxStateSync(
        types.SimpleNamespace(rank=0, world_size=1), Progress(step=step, has_state=step > 0), EventLog(None),  # type: ignore[arg-type]
        hosts_per_slice=1, async_checkpoints=False, snapshot_every=1, handoff=handoff,
    )
    if checkpoint_dir is not None:
        sync.checkpoints = checkpoints(checkpoint_dir)
    return sync


def test_a_state_holding_typed_prng_keys_goes_on_with_the_same_random_stream(jax, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A state holding typed PRNG keys (``jax.random.key``: a dropout key) is handed across a
    survivor's restart from its host snapshot, sent to a returning slice and saved and restored
    on SIGTERM, each time with the keys bit for bit (the same random numbers after), and a
    handoff is not taken into a state whose key is of another kind. (Before, such a state
    failed at the first step boundary, and its host snapshot and sending it to a slice failed.)"""
    import pickle

    import jax.numpy as jnp
    import numpy as np

    from hotswap.train.jax import handoff as handoffs
    from hotswap.train.jax.trees import broadcast_shards, place_local_data

    def draws(state):  # type: ignore[no-untyped-def]
        return np.asarray(jax.vmap(lambda k: jax.random.uniform(k, (3,)))(state["keys"])).tolist() + [
            np.asarray(jax.random.normal(state["key"], (3,))).tolist()
        ]

    def fresh(impl: str = "threefry2x32"):  # type: ignore[no-untyped-def]
        return {"w": jnp.zeros(3), "key": jax.random.key(0, impl=impl), "keys": jax.random.split(jax.random.key(0, impl=impl), 4)}

    state = {"w": jnp.full(3, 6.0), "key": jax.random.split(jax.random.key(7))[1], "keys": jax.random.split(jax.random.key(8), 4)}
    survivor = _key_sync(jax, 6, None)
    survivor.register(state, {})
    survivor.at_boundary()  # the host snapshot of step 6
    survivor.commit()  # at every boundary: step 6 is computed
    assert survivor.committed is not None and survivor.snapshot is not None
    survivor.current = None  # the live arrays are gone (donated to a failed step)
    handed = survivor.handoff(handoffs.MembershipChange(1, 2, 0.0, True), attempts=1)
    handed = pickle.loads(pickle.dumps(handed))  # as the next program reads it

    successor = _key_sync(jax, 0, handed)
    successor.register(fresh(), {})
    successor.synchronise(lambda: False)
    got = successor.current
    assert successor.progress.step == 6 and str(got["key"].dtype) == "key<fry>" and got["keys"].shape == (4,)
    assert draws(got) == draws(state) and bool((got["w"] == 6.0).all())

    other = _key_sync(jax, 0, handed)  # the next program's key is another kind: not taken
    other.register(fresh("rbg"), {})
    other.checkpoints = checkpoints(tmp_path / "none")
    other.allow_fresh_start = True
    other.synchronise(lambda: False)
    assert other.progress.step == 0 and str(other.current["key"].dtype) == "key<rbg>"

    # A returning slice: the survivor's shards, sent and placed on the returning slice's mesh.
    sent = place_local_data(fresh(), broadcast_shards(fresh(), state, is_source=True)[0])
    assert str(sent["key"].dtype) == "key<fry>" and draws(sent) == draws(state)

    saver = _key_sync(jax, 6, None, tmp_path / "checkpoints")
    saver.register(state, {})
    assert saver.save_last("termination")
    reader = _key_sync(jax, 0, None, tmp_path / "checkpoints")
    reader.register(fresh(), {})
    reader.synchronise(lambda: False)
    assert reader.progress.step == 6 and draws(reader.current) == draws(state)


_SHARDED_KEYS = r"""
import pickle
import jax
jax.config.update("jax_num_cpu_devices", 3)
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from hotswap.train.jax.trees import broadcast_shards, local_shards, place_local_data, rebuild

mesh = Mesh(np.array(jax.devices()), ("slice",))
def state(seed):
    keys = jax.random.split(jax.random.key(seed), 6)
    return {"keys": jax.device_put(keys, NamedSharding(mesh, P("slice"))), "key": jax.device_put(keys[0], NamedSharding(mesh, P()))}
saved, template = state(5), state(0)
for name, got in (
    ("handoff", rebuild(template, pickle.loads(pickle.dumps(local_shards(saved))))),
    ("peer", place_local_data(template, broadcast_shards(template, saved, is_source=True)[0])),
):
    for leaf in ("keys", "key"):
        assert got[leaf].dtype == saved[leaf].dtype and got[leaf].sharding == saved[leaf].sharding, (name, leaf)
        for mine, theirs in zip(got[leaf].addressable_shards, saved[leaf].addressable_shards):
            assert mine.device == theirs.device and mine.index == theirs.index, (name, leaf)
            assert (np.asarray(jax.random.key_data(mine.data)) == np.asarray(jax.random.key_data(theirs.data))).all()
    assert (np.asarray(jax.random.uniform(got["keys"][4])) == np.asarray(jax.random.uniform(saved["keys"][4])))
print("ok")
"""


def test_typed_keys_sharded_across_slices_travel_shard_by_shard(jax) -> None:  # type: ignore[no-untyped-def]
    """A batch of keys sharded across 3 slices' devices (one dropout key per slice) and a
    replicated key: each device gets back its own shard of the keys, bit for bit, from a
    handoff and from a peer."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "JAX_PLATFORMS": "cpu"}
    done = subprocess.run([sys.executable, "-c", _SHARDED_KEYS], capture_output=True, text=True, env=env, timeout=240)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]
