"""The JAX SDK's costs: checkpoint save and restore with orbax, and elastic MTTR. Prints JSON.

Checkpoints (one process, ``--device cpu|gpu``): a state of ``--size`` MB of float32 arrays,
sharded over a mesh of 3 devices (3 "slices"), saved by hotswap's asynchronous save (what the
training loop waits for, and until the step is committed) next to orbax's own synchronous save
(``CheckpointManager`` with async checkpointing off) in the same run; restored onto the same
mesh (hotswap's restore, with its tree check, next to a plain orbax restore), and restored
onto a mesh of 2 devices (the arrays resharded: the 3 -> 2 slices case). On CPU the devices
are host devices (``jax_num_cpu_devices``); on GPU the resharded restore needs 3 GPUs and is
reported as null with the reason otherwise; orbax's own restore onto the 2 devices is timed
next to it. ``restore_vs_orbax`` and ``resharded_restore_vs_orbax`` are the median ratios
(below 1: hotswap's restore, with its tree check, is the faster). Best and median of
``--repeat`` rounds after one untimed round of each restore, the two alternated and their
order swapped every round.

Elastic MTTR (``--mttr-runs``, local backend, the demo's job ``examples/train_jax.py``): an
elastic JAX job on 3 slices loses a node (SIGKILL) and continues on 2; MTTR is the failure to
the first step completed on 2 slices, from the workers' own records (what ``hotswap demo
elastic --framework jax`` reports). The node is then repaired and the time until the first
step on 3 slices is reported too, with the survivors' own stall on the way (``stall_up_s``: a
survivor's last step on 2 slices to its first on 3, from its records).

    python benchmarks/bench_jax.py --json [--device cpu|gpu] [--size 256] [--repeat 3] [--mttr-runs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any


def timed(action: Callable[[], Any]) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def summary(samples: list[float]) -> dict[str, float]:
    return {"best_s": round(min(samples), 4), "median_s": round(statistics.median(samples), 4)}


def alternated(repeat: int, ours: Callable[[], Any], theirs: Callable[[], Any]) -> tuple[list[float], list[float]]:
    """``repeat`` timings of each after one untimed warm-up of each, the two alternated and
    the one that goes first swapped every round: both see the same machine and page cache."""
    ours(), theirs()
    mine: list[float] = []
    other: list[float] = []
    for round_ in range(repeat):
        if round_ % 2:
            other.append(timed(theirs))
            mine.append(timed(ours))
        else:
            mine.append(timed(ours))
            other.append(timed(theirs))
    return mine, other


def checkpoint_costs(device: str, size_mb: float, repeat: int, directory: str) -> dict[str, Any]:
    import jax

    if device == "cpu":
        jax.config.update("jax_num_cpu_devices", 3)
    import jax.numpy as jnp
    import numpy as np
    import orbax.checkpoint as ocp
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    from hotswap.train.events import EventLog
    from hotswap.train.jax.checkpoints import OrbaxCheckpoints

    devices = jax.devices(device)
    slices = min(3, len(devices))
    three = Mesh(np.array(devices[:slices]), ("slice",))
    leaves = 8
    rows = max(slices * 2, int(size_mb * 2**20 / 4 / 1024 / leaves) // 6 * 6)  # divisible by 2 and 3
    sharded = NamedSharding(three, P("slice", None))
    make = jax.jit(lambda: {f"w{i}": jnp.full((rows, 1024), i, jnp.float32) for i in range(leaves)}, out_shardings=sharded)
    state = jax.block_until_ready(make())
    nbytes = sum(leaf.nbytes for leaf in jax.tree.leaves(state))
    counters = {"step": 0, "elastic_down_events": 0}

    hotswap_dir, orbax_dir = os.path.join(directory, "hotswap"), os.path.join(directory, "orbax")
    ours = OrbaxCheckpoints(hotswap_dir, 2, EventLog(None), record_events=False)
    theirs = ocp.CheckpointManager(orbax_dir, options=ocp.CheckpointManagerOptions(max_to_keep=2, enable_async_checkpointing=False))
    blocking, committed, sync = [], [], []
    for step in range(1, repeat + 2):  # the first round warms up both
        started = time.perf_counter()
        block = ours.save(step, state, {}, {**counters, "step": step}, "periodic", wait=False)
        ours.wait()
        total = time.perf_counter() - started
        plain = timed(lambda: theirs.save(step, args=ocp.args.StandardSave(state)))
        if step > 1:
            blocking.append(block)
            committed.append(total)
            sync.append(plain)

    template = jax.tree.map(jnp.zeros_like, state)
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state)
    restore, plain_restore = alternated(
        repeat,
        lambda: jax.block_until_ready(ours.restore_latest(template).state),
        lambda: jax.block_until_ready(theirs.restore(theirs.latest_step(), args=ocp.args.StandardRestore(abstract))),
    )
    result: dict[str, Any] = {
        "device": device,
        "device_kind": devices[0].device_kind,
        "state_mb": round(nbytes / 2**20, 1),
        "save_blocking": summary(blocking),
        "save_committed": summary(committed),
        "orbax_sync_save": summary(sync),
        "blocking_vs_orbax_sync": round(statistics.median(blocking) / statistics.median(sync), 4),
        "restore": summary(restore),
        "orbax_restore": summary(plain_restore),
        "restore_vs_orbax": round(statistics.median(restore) / statistics.median(plain_restore), 4),
    }
    if slices < 3:
        result["resharded_restore_3_to_2"] = None
        result["resharded_restore_note"] = f"needs 3 {device} devices, found {len(devices)}"
    else:
        two = NamedSharding(Mesh(np.array(devices[:2]), ("slice",)), P("slice", None))
        onto_two = jax.tree.map(lambda x: jax.device_put(jnp.zeros(x.shape, x.dtype), two), state)
        onto_two_abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=two), state)
        resharded, plain_resharded = alternated(
            repeat,
            lambda: jax.block_until_ready(ours.restore_latest(onto_two).state),
            lambda: jax.block_until_ready(
                theirs.restore(theirs.latest_step(), args=ocp.args.StandardRestore(onto_two_abstract))),
        )
        check = ours.restore_latest(onto_two).state["w3"]
        assert check.sharding.mesh.size == 2 and float(check[0, 0]) == 3.0
        result["resharded_restore_3_to_2"] = summary(resharded)
        result["orbax_resharded_restore_3_to_2"] = summary(plain_resharded)
        result["resharded_restore_vs_orbax"] = round(
            statistics.median(resharded) / statistics.median(plain_resharded), 4)
    for value in ("save_blocking", "save_committed", "orbax_sync_save", "restore", "orbax_restore"):
        result[value]["mb_per_s"] = round(nbytes / 2**20 / result[value]["median_s"], 1)
    ours.close()
    theirs.close()
    return result


def elastic_mttr(runs: int, step_sleep: float) -> dict[str, Any]:
    from hotswap.demo.drills import DemoOptions
    from hotswap.demo.jax_drills import JaxElasticDrill
    from hotswap.demo.observe import survivor_stall

    class MttrDrill(JaxElasticDrill):
        scenario = "bench-jax"

        def drill(self) -> dict[str, Any]:
            self.create_cluster(3)
            self.submit("elastic", priority="high", slices=3, min_slices=2)
            self.wait_steps("elastic", 30)
            down, up, stalls = [], [], []
            for _ in range(runs):
                job = self.record("elastic")
                node = f"{job['slices'][1]}-0"
                t_fail = self.node("fail", node)
                first = self.wait("a step on 2 slices", lambda: self._first_step_after(t_fail, 2))
                down.append(first.t - t_fail)
                self.wait_steps("elastic", first.step + 10)
                t_repair = self.node("uncordon", node)
                back = self.wait("a step on 3 slices", lambda: self._first_step_after(t_repair, 3))
                up.append(back.t - t_repair)
                self.wait_steps("elastic", back.step + 10)
                stall = survivor_stall(self.trace("elastic"), 0, 2, 3, t_repair)  # replica 0 survives
                stalls.append(stall["stall_s"] if stall else None)
            return {"down": down, "up": up, "stall_up": stalls}

        def _first_step_after(self, t: float, slices: int) -> Any:
            trace = self.trace("elastic")
            return next((s for s in trace.steps if s.t > t and s.slices == slices), None) if trace else None

    with tempfile.TemporaryDirectory(prefix="hotswap-bench-jax-") as home:
        os.environ["HOTSWAP_HOME"] = home
        outcome = MttrDrill(DemoOptions(step_sleep=step_sleep, timeout_s=180.0), live=False).run()
    if "down" not in outcome:
        raise SystemExit(f"benchmark failed: {outcome['checks']}")
    return {
        "runs": runs,
        "mttr_down_s": round(statistics.median(outcome["down"]), 3),
        "grow_back_s": round(statistics.median(outcome["up"]), 3),
        # the survivors' own stall on grow-back (their last step on 2 slices to their first on 3)
        "stall_up_s": round(statistics.median(s for s in outcome["stall_up"] if s is not None), 3) if any(outcome["stall_up"]) else None,
        "samples": {"down": [round(v, 3) for v in outcome["down"]], "up": [round(v, 3) for v in outcome["up"]],
                    "stall_up": outcome["stall_up"]},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cpu", "gpu"), default="cpu")
    parser.add_argument("--size", type=float, default=256.0, help="state size in MB (default 256)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dir", default=None, help="where to write checkpoints (default: the temporary directory)")
    parser.add_argument("--mttr-runs", type=int, default=3, help="elastic failures to measure (0: none)")
    parser.add_argument("--step-sleep", type=float, default=0.05, help="the demo job's seconds per step")
    parser.add_argument("--json", action="store_true", help="print only the JSON result")
    args = parser.parse_args()
    directory = tempfile.mkdtemp(prefix="hotswap-bench-jax-", dir=args.dir)
    try:
        result: dict[str, Any] = {"checkpoints": checkpoint_costs(args.device, args.size, args.repeat, directory)}
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    if args.mttr_runs:
        result["elastic"] = elastic_mttr(args.mttr_runs, args.step_sleep)
    if not args.json:
        c = result["checkpoints"]
        print(f"{c['state_mb']} MB on {c['device_kind']}: save blocks {c['save_blocking']['median_s']} s "
              f"(orbax sync save {c['orbax_sync_save']['median_s']} s), restore {c['restore']['median_s']} s")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
