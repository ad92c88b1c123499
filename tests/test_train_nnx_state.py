"""Flax NNX objects registered as a JAX run's state (``hotswap.train.jax.flax_nnx``), in one spawned
Python with 2 CPU devices: which registrations are NNX objects; the objects' arrays are placed on
the mesh (a typed dropout key included); each boundary reads exactly the arrays NNX's own traversal
finds; a metrics reset keeps them there and a value the script
assigns anew (on one device) is placed again at the boundary, in the objects too; and a checkpoint restored into objects initialised from another
seed goes on with exactly the same steps, dropout stream included."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from jax_helpers import ROOT

pytest.importorskip("flax.nnx", reason="NNX objects need flax (hotswap[jax])")
pytest.importorskip("orbax.checkpoint", reason="the JAX SDK needs hotswap[jax]")

_SCRIPT = r"""
import tempfile
import jax
jax.config.update("jax_num_cpu_devices", 2)
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from hotswap.train.events import EventLog
from hotswap.train.jax.checkpoints import OrbaxCheckpoints
from hotswap.train.jax.flax_nnx import LiveNnx, holds_nnx
from hotswap.train.jax.trees import is_key


class Net(nnx.Module):
    def __init__(self, rngs):
        self.dense = nnx.Linear(4, 2, rngs=rngs)
        self.dropout = nnx.Dropout(0.5, rngs=rngs)

    def __call__(self, x):
        return self.dropout(self.dense(x))


def objects(seed):
    model = Net(nnx.Rngs(params=seed, dropout=seed + 1))
    optimizer = nnx.Optimizer(model, optax.adam(0.1), wrt=nnx.Param)
    return {"model": model, "optimizer": optimizer, "metrics": nnx.MultiMetric(loss=nnx.metrics.Average("loss"))}


@nnx.jit
def step(model, optimizer, metrics, x):
    loss, grads = nnx.value_and_grad(lambda m: (m(x) ** 2).mean())(model)
    metrics.update(loss=loss)
    optimizer.update(model, grads)
    return loss


def steps(held, n):
    return [float(step(held["model"], held["optimizer"], held["metrics"], x)) for _ in range(n)]


def placed(tree):
    return all(leaf.sharding.is_equivalent_to(replicated, leaf.ndim) for leaf in jax.tree.leaves(tree))


mesh = Mesh(np.array(jax.devices()), ("device",))
replicated = NamedSharding(mesh, P())
x = jax.device_put(np.arange(16, dtype=np.float32).reshape(4, 4) / 16, NamedSharding(mesh, P("device")))

held = objects(0)
assert holds_nnx(held) and holds_nnx(held["model"]) and holds_nnx((held["model"], held["optimizer"]))
assert not holds_nnx({"w": np.zeros(3)})
try:
    holds_nnx({"model": held["model"], "w": np.zeros(3)})
    raise SystemExit("a mix of NNX objects and arrays was taken")
except TypeError as error:
    assert "register NNX objects alone" in str(error)
assert not holds_nnx({}) and not placed(nnx.state(held))  # NNX made them on one device

live = LiveNnx(held, replicated)
assert placed(nnx.state(held)) and placed(live.template)  # in the objects themselves
assert any(is_key(leaf) for leaf in jax.tree.leaves(live.template))  # the dropout key, still a typed key
steps(held, 3)


def same_as_graph(state):  # the very arrays NNX's own traversal finds, in the same places
    graph = nnx.to_pure_dict(nnx.state(held))
    return jax.tree_util.tree_structure(state) == jax.tree_util.tree_structure(graph) and all(
        a is b for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(graph))
    )


assert same_as_graph(live.read())  # learns where the arrays are among the objects' leaves
steps(held, 1)
assert same_as_graph(live.read())  # read from there
held["model"].eval()  # another pytree structure (a static attribute): read through the graph again
assert same_as_graph(live.read())
held["model"].train()
assert same_as_graph(live.read())
held["metrics"].reset()  # in place (Flax writes into the arrays): still placed
assert placed(nnx.state(held["metrics"])) and all(float(leaf) == 0 for leaf in jax.tree.leaves(nnx.state(held["metrics"])))
held["model"].dense.bias.value = jnp.full(2, 0.5)  # a value assigned anew: on one device
assert not placed(nnx.state(held["model"]))
state = live.read()
assert placed(state) and placed(nnx.state(held))  # placed again, in the objects too
assert np.asarray(held["model"].dense.bias.value).tolist() == [0.5, 0.5]

checkpoints = OrbaxCheckpoints(tempfile.mkdtemp() + "/c", 2, EventLog(None), record_events=False)
checkpoints.save(3, state, {}, {"step": 3, "elastic_down_events": 0}, "periodic", wait=True)
expected = steps(held, 4)

other = objects(5)
restored = checkpoints.restore_latest(LiveNnx(other, replicated).template)
LiveNnx(other, replicated).write(restored.state)
resumed = steps(other, 4)
assert resumed == expected, (resumed, expected)
checkpoints.close()
print("ok")
"""


def test_nnx_objects_are_placed_read_back_after_a_reset_and_restored_into_in_place() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "JAX_PLATFORMS": "cpu"}
    done = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]
