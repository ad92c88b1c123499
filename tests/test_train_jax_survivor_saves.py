"""A JAX slice loss without elastic slices costs 0 steps (issue 33): the survivors write the
replica they hold without their group (train/jax/survivor_saves.py), and the next attempt waits
for that save (the survivors' leases) and resumes from it when it is complete and newer than the
newest orbax checkpoint; a state sharded across slices cannot be completed by survivors and
resumes from orbax, as before. And at a fresh start every process takes process 0's state, as
DDP does, unless the script opts out. Real processes (jax.distributed, gloo on CPU), played by the
test as the controller; exact values: each step adds 1 to every element."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from jax_helpers import ROOT
from train_harness import Worker, Workers, free_port, wait_until, worker_env

from hotswap.api import worker as contract

pytest.importorskip("jax", reason="the JAX SDK needs hotswap[jax]")
pytest.importorskip("orbax.checkpoint", reason="the JAX SDK needs hotswap[jax]")

HARNESS = Path(__file__).with_name("jax_harness.py")
ROWS = 12
TIMEOUT = 120.0  # per phase: JAX starts slowly on a busy 2-core machine
SURVIVOR_SAVED = re.compile(r"^checkpoint saved step=(\d+) reason=recovery .*by a survivor")
RESTORED = re.compile(r"^restored step=(\d+) source=(\w+)")
WAITING = "waiting for the previous attempt's last save"


def expected_checksum(step: int, rows: int = ROWS) -> float:
    return float(sum(range(rows * 4)) + rows * 4 * step)


def start_job(workers: Workers, name: str, checkpoints: Path, args: list[str], attempt: int = 1) -> list[Worker]:
    port = free_port()
    job = []
    for rank in range(2):
        env = worker_env(rank=rank, world_size=2, port=port, checkpoint_dir=checkpoints, grace_s=120.0)
        env[contract.HOTSWAP_RESTART_COUNT] = attempt - 1
        env[contract.HOTSWAP_ATTEMPT] = attempt
        job.append(workers.start(f"{name}-{rank}", HARNESS, args, env))
    return job


def restored(worker: Worker) -> tuple[int, str]:
    [found] = [(int(m.group(1)), m.group(2)) for line in worker.lines() if (m := RESTORED.match(line))]
    return found


def test_the_restart_waits_for_the_survivors_save_and_resumes_at_its_step(tmp_path: Path) -> None:
    """Rank 0's slice is lost (killed) while rank 1, the survivor, is held up (stopped): the next
    attempt starts and waits for it, as a restart under Recreate does while the survivors are
    still being terminated. Let go, the survivor writes the replica it holds and exits for the
    restart; the new attempt resumes at that step, not at the orbax checkpoint before it."""
    checkpoints = tmp_path / "checkpoints"
    args = ["--rows", str(ROWS), "--shard", "none", "--checkpoint-every", "10", "--step-sleep", "0.1"]
    with Workers(tmp_path) as workers:
        first = start_job(workers, "first", checkpoints, args)
        wait_until(lambda: (checkpoints / "10").is_dir() and all(w.last_step() >= 14 for w in first), TIMEOUT, "14 steps", first)
        survivor = first[1]
        survivor.signal(signal.SIGSTOP)
        first[0].signal(signal.SIGKILL)
        second = start_job(workers, "second", checkpoints, args, attempt=2)
        try:
            wait_until(lambda: all(WAITING in "\n".join(w.lines()) for w in second), TIMEOUT, "the restart waiting", second)
        finally:
            survivor.signal(signal.SIGCONT)
        assert survivor.wait(TIMEOUT) == 42, survivor.stderr()
        [saved] = [int(m.group(1)) for line in survivor.lines() if (m := SURVIVOR_SAVED.match(line))]
        assert saved == survivor.last_step() and saved % 10 != 0
        wait_until(lambda: all(w.last_step() >= saved + 3 for w in second), TIMEOUT, "steps after the restore", second)
    for worker in second:
        assert restored(worker) == (saved, "checkpoint")
        assert float(worker.steps()[saved + 1]["checksum"]) == expected_checksum(saved + 1)
    assert "Traceback" not in survivor.stderr(), survivor.stderr()


def test_a_state_sharded_across_slices_resumes_from_the_newest_checkpoint(tmp_path: Path) -> None:
    """The lost slice held half of ``w``: the survivor's part cannot complete a replica, so the
    restart resumes from the newest orbax checkpoint, exactly."""
    checkpoints = tmp_path / "checkpoints"
    args = ["--rows", str(ROWS), "--shard", "slice", "--checkpoint-every", "10", "--step-sleep", "0.1"]
    with Workers(tmp_path) as workers:
        first = start_job(workers, "first", checkpoints, args)
        wait_until(lambda: (checkpoints / "10").is_dir() and all(w.last_step() >= 14 for w in first), TIMEOUT, "14 steps", first)
        first[1].signal(signal.SIGKILL)
        assert first[0].wait(TIMEOUT) == 42, first[0].stderr()
        second = start_job(workers, "second", checkpoints, args, attempt=2)
        wait_until(lambda: all(w.last_step() >= 25 for w in second), TIMEOUT, "steps after the restore", second)
    step, source = restored(second[0])
    assert restored(second[1]) == (step, source) and source == "checkpoint" and step % 10 == 0 and step >= 10
    for worker in second:
        assert float(worker.steps()[step + 1]["checksum"]) == expected_checksum(step + 1)


@pytest.mark.parametrize("agree", [True, False], ids=["process-0s-state", "opted-out"])
def test_a_fresh_start_gives_every_process_process_0s_state(tmp_path: Path, agree: bool) -> None:
    """Each process initialises the replicated ``w`` from a seed of its own (process 1's is off by
    1000 per element): JAX takes the copies to be equal and never checks, so without the
    agreement each process would train its own model (the opted-out run shows it)."""
    args = ["--rows", str(ROWS), "--shard", "none", "--steps", "3", "--seed-per-process", "--step-sleep", "0"]
    if not agree:
        args.append("--no-sync-initial-state")
    with Workers(tmp_path) as workers:
        job = start_job(workers, "job", tmp_path / "checkpoints", args)
        for worker in job:
            assert worker.wait(TIMEOUT) == 0, worker.stderr()
    sums = [float(worker.steps()[1]["checksum"]) for worker in job]
    assert sums[0] == expected_checksum(1)
    assert (sums[1] == sums[0]) is agree, sums


_FILES = r"""
import json, sys
from pathlib import Path
import jax
jax.config.update("jax_num_cpu_devices", 4)
import jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from hotswap.train.jax.survivor_saves import SurvivorSaves, SurvivorSaveUnreadable
from hotswap.train.jax.trees import index_of, leaf_names, local_shards

directory = Path(sys.argv[1])
devices = np.array(jax.devices())
slices = Mesh(devices.reshape(2, 2), ("slice", "device"))  # 2 slices of 2 hosts (a device each)
special = np.array([np.nan, -0.0, np.inf, 1e-45], np.float32).view(np.uint32)
special[0] |= 0x1234  # a NaN payload
state = {
    "rows": jax.device_put(np.arange(8 * 3, dtype=np.float32).reshape(8, 3), NamedSharding(slices, P("device", None))),
    "bits": jax.device_put(special.view(np.float32), NamedSharding(slices, P("device"))),
    "half": jax.device_put(np.arange(6, dtype=np.float32).astype(jnp.bfloat16), NamedSharding(slices, P())),
    "key": jax.device_put(jax.random.key(7), NamedSharding(slices, P())),
    "count": jax.device_put(np.int32(5), NamedSharding(slices, P())),
    "host": np.arange(3, dtype=np.int64),
    "lr": 0.25,
}
counters = {"step": 17, "elastic_down_events": 0, "last_checkpoint_step": 10}
saves = SurvivorSaves(directory)
# Slice 1 survives: its host 0 holds device 2's shards, its host 1 device 3's.
shards = local_shards(state)
def part_of(device):
    kept = []
    for held, (path, leaf) in zip(shards, jax.tree_util.tree_flatten_with_path(state)[0]):
        if not isinstance(leaf, jax.Array):
            kept.append(held)
            continue
        wanted = index_of(leaf.sharding.addressable_devices_indices_map(leaf.shape)[devices.reshape(-1)[device]], leaf.shape)
        kept.append({wanted: held[wanted]})
    return kept
def write(rank, device):
    saves.write(attempt=1, rank=rank, template=state, counters=counters, shards=part_of(device),
                leaves=leaf_names(state), objects={"batches": {"position": 3}}, reason="recovery")
write(2, 2)
result = {"one_part": saves.newest_complete(newer_than=None)}
write(3, 3)
found = saves.newest_complete(newer_than=None)
result["complete"] = [found.step, found.attempt]
result["older_than_orbax"] = saves.newest_complete(newer_than=17)
# Restored onto 3 devices in another layout, and onto 1.
for name, mesh in (("three", Mesh(devices[:3], ("d",))), ("one", Mesh(devices[:1], ("d",)))):
    def place(leaf):
        if not isinstance(leaf, jax.Array):
            return leaf
        spec = P(None, "d") if leaf.ndim == 2 and name == "three" else P()
        return jax.device_put(jnp.zeros_like(leaf) if leaf.dtype != state["key"].dtype else leaf, NamedSharding(mesh, spec))
    template = jax.tree.map(place, state)
    back = saves.read(found, template, leaf_names(template))
    same = all(
        np.array_equal(np.asarray(jax.random.key_data(a) if k == "key" else a).reshape(-1).view(np.uint8), np.asarray(jax.random.key_data(b) if k == "key" else b).reshape(-1).view(np.uint8))
        for k, a, b in ((k, back.state[k], state[k]) for k in ("rows", "bits", "half", "key", "count", "host"))
    )
    result[name] = {"same": same, "lr": back.state["lr"], "counters": back.counters, "objects": back.objects,
                    "reason": back.reason, "sharding": str(back.state["rows"].sharding.spec)}
try:
    saves.read(found, {**state, "rows": jnp.zeros((4, 3))}, leaf_names(state))
    result["other_shape"] = "read"
except SurvivorSaveUnreadable as error:
    result["other_shape"] = "refused"
try:
    saves.read(found, state, leaf_names({"other": 1}))
    result["other_tree"] = "read"
except SurvivorSaveUnreadable as error:
    result["other_tree"] = "refused"
data = directory / "survivors" / "17" / "1-3.bin"
damaged = bytearray(data.read_bytes()); damaged[5] ^= 0xFF; data.write_bytes(bytes(damaged))
try:
    saves.read(found, state, leaf_names(state))
    result["damaged"] = "read"
except SurvivorSaveUnreadable as error:
    result["damaged"] = str(error)
saves.prune(up_to=17)
result["pruned"] = sorted(p.name for p in (directory / "survivors").iterdir())
print(json.dumps(result))
"""


def test_survivor_parts_combine_into_a_replica_restored_onto_another_mesh_exactly(tmp_path: Path) -> None:
    """The two hosts of a surviving slice each write their half: one part alone is not a save,
    both are; read back bit for bit (NaN payloads, -0.0, bfloat16, a typed key, host values) onto
    3 devices in another layout and onto 1; another shape or tree, or damaged bytes, refused;
    pruned once an orbax checkpoint of its step is committed."""
    import json

    result = subprocess.run(
        [sys.executable, "-c", _FILES, str(tmp_path)], capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src"), "JAX_PLATFORMS": "cpu"},
    )
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert found["one_part"] is None and found["complete"] == [17, 1] and found["older_than_orbax"] is None
    for name in ("three", "one"):
        assert found[name]["same"] and found[name]["lr"] == 0.25 and found[name]["reason"] == "recovery", found[name]
        assert found[name]["counters"]["step"] == 17 and found[name]["objects"] == {"batches": {"position": 3}}
    assert found["three"]["sharding"] in ("PartitionSpec(None, 'd')", "P(None, 'd')")
    assert found["other_shape"] == "refused" and found["other_tree"] == "refused"
    assert "damaged" in found["damaged"] and found["pruned"] == []
