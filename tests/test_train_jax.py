"""hotswap.train.jax in one process: what a missing JAX looks like, orbax checkpoints that refuse
a state of another shape naming the first leaf that differs, the handoff a survivor gives its
next program, peer failures told from bugs, and pathwaysutils' names. The multi-process
behaviour is in ``test_train_jax_processes.py`` and the drills in ``test_train_jax_demo.py``."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
from hotswap.cli.app import main

ROOT = Path(__file__).resolve().parents[1]

# Without JAX -----------------------------------------------------------------------------------


def test_without_jax_the_sdk_names_the_extra_to_install() -> None:
    probe = (
        "import sys\n"
        "sys.modules.update(jax=None, orbax=None)\n"  # as if not installed
        "import hotswap.train.jax as hj\n"
        "try:\n"
        "    hj.init\n"
        "except ImportError as error:\n"
        "    print(error)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT / "src")}
    )
    assert result.stdout.strip() == "hotswap.train.jax needs JAX and orbax: pip install 'hotswap[jax]'"


def hotswap(args: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """Run the CLI in this process; its exit code and stderr."""
    monkeypatch.setattr(sys, "argv", ["hotswap", *args])
    with pytest.raises(SystemExit) as exited:
        main()
    return int(exited.value.code or 0), capsys.readouterr().err


def test_without_jax_the_jax_drills_say_what_to_install_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real = importlib.util.find_spec
    hidden = ("jax", "orbax")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name.split(".")[0] in hidden else real(name, *a))
    code, errors = hotswap(["demo", "elastic", "--framework", "jax"], monkeypatch, capsys)
    assert code != 0
    [line] = errors.strip().splitlines()
    assert "pip install 'hotswap[jax]'" in line


def test_the_hotswap_drill_is_not_offered_for_jax(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    if importlib.util.find_spec("jax") is None:
        pytest.skip("JAX is not installed: the missing extra is reported first")
    code, errors = hotswap(["demo", "hotswap", "--framework", "jax"], monkeypatch, capsys)
    assert code != 0
    assert errors.strip() == "error: --framework jax runs the elastic and migration drills; the hotswap drill trains PyTorch jobs"


# With JAX (in this process: one CPU device, no jax.distributed) ---------------------------------


@pytest.fixture(scope="module")
def jax() -> types.ModuleType:
    return pytest.importorskip("jax", reason="the JAX SDK needs hotswap[jax]")


def checkpoints(directory: Path):  # type: ignore[no-untyped-def]
    from hotswap.train.events import EventLog
    from hotswap.train.jax.checkpoints import OrbaxCheckpoints

    return OrbaxCheckpoints(str(directory), 3, EventLog(None), record_events=False)


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


@pytest.mark.parametrize(
    ("error", "lost"),
    [
        (ValueError("UNKNOWN: Gloo all-reduce failed: [pair.cc:538] Read error: Connection reset by peer"), True),
        (RuntimeError("UNAVAILABLE: Failed to send RPC to coordination service"), True),
        (ValueError("Incompatible shapes for broadcasting: (3,) and (4,)"), False),
        (TypeError("gloo"), False),  # only runtime errors come from collectives
    ],
)
def test_peer_failures_are_told_from_bugs_in_the_step(jax, error: Exception, lost: bool) -> None:  # type: ignore[no-untyped-def]
    from hotswap.train.jax.runtime import is_peer_failure
    from hotswap.train.rendezvous import RendezvousFailed

    assert is_peer_failure(error) is lost
    assert is_peer_failure(RendezvousFailed("generation 3 did not form"))


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


def test_the_coordination_service_outlives_rank_0_then_frees_its_port() -> None:
    """Rank 0 starts the coordination service in a process of its own: when rank 0's process
    is gone the service still accepts a connection (survivors leave through it), and once
    nobody is connected it exits, so the port is free for the next attempt."""
    pytest.importorskip("jax")
    import socket
    import time

    from hotswap.train.jax import coordinator

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    rank0 = (
        "import sys\n"
        "from hotswap.train.jax import coordinator\n"
        f"print(coordinator.start({port}, 3, 10).pid, flush=True)\n"
        "sys.stdin.read()\n"  # rank 0 lives until the test closes its input
    )
    env = {k: v for k, v in os.environ.items() if k != "HOTSWAP_MEMBERSHIP_FILE"}
    rank_0 = subprocess.Popen([sys.executable, "-c", rank0], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                              env={**env, "PYTHONPATH": str(ROOT / "src")})
    assert rank_0.stdout is not None and rank_0.stdin is not None
    service = int(rank_0.stdout.readline().strip())
    try:
        survivor = None
        deadline = time.monotonic() + 30
        while survivor is None and time.monotonic() < deadline:
            try:
                survivor = socket.create_connection(("127.0.0.1", port), timeout=1)
            except OSError:
                time.sleep(0.1)
        assert survivor is not None, "the service never listened"
        rank_0.stdin.close()
        rank_0.wait(30)  # rank 0's process is gone: the service is an orphan now
        time.sleep(1.5)
        assert _alive(service), "the service went away under a survivor when rank 0's process did"
        survivor.close()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and os.path.exists(f"/proc/{service}") and coordinator.connections(port):
            time.sleep(0.1)
        assert _ends(service), "the service stayed after everyone left"
    finally:
        if _alive(service):
            os.kill(service, 9)


def _ends(pid: int, within_s: float = 10.0) -> bool:
    """Whether process ``pid`` is gone (or a zombie) within ``within_s``."""
    import time

    deadline = time.monotonic() + within_s
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not _alive(pid)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split(") ")[1][0] != "Z"
    except OSError:
        return False


_LEAVER = """
import sys, time
from hotswap.train.jax.runtime import JaxGroup, configure_runtime
from hotswap.train.rendezvous import GroupSpec
rank, port = int(sys.argv[1]), int(sys.argv[2])
configure_runtime(None)
group = JaxGroup(60)
group.form(GroupSpec(1, rank, 2, "127.0.0.1", port), lambda: False)
if rank == 0:
    print("service", group._coordinator.pid, flush=True)
assert group.agree_max([rank]) == [1]
if rank == 1:
    time.sleep(0.5)  # rank 0 waits for it to leave
group.leave({0, 1})
time.sleep(2.0)  # what a survivor does next: hand its state over, join the next generation
print("alive after leaving", flush=True)
"""


def test_every_member_lives_on_after_leaving_a_generation_and_its_service_then_ends() -> None:
    """A survivor moving to the next generation leaves its group first: no member, rank 0
    included, may be ended by the coordination service going away after it left (a JAX
    client aborts its process when its service disappears, even after disconnecting); the
    service ends by itself once nobody is connected, freeing its port."""
    pytest.importorskip("jax")
    import socket
    import time

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**{k: v for k, v in os.environ.items() if k != "HOTSWAP_MEMBERSHIP_FILE"}, "PYTHONPATH": str(ROOT / "src")}
    ranks = [
        subprocess.Popen([sys.executable, "-c", _LEAVER, str(rank), str(port)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env)
        for rank in range(2)
    ]
    outputs = [process.communicate(timeout=180) for process in ranks]
    service = next((int(line.split()[1]) for line in outputs[0][0].splitlines() if line.startswith("service ")), None)
    try:
        for rank, (process, (out, err)) in enumerate(zip(ranks, outputs)):
            assert process.returncode == 0 and "alive after leaving" in out, (rank, process.returncode, err[-2000:])
        assert service is not None
        assert _ends(service), "the service stayed after everyone left"
    finally:
        if service is not None and _alive(service):
            os.kill(service, 9)


_SUCCESSOR = """
import sys, time
from hotswap.train.jax import handoff as handoffs
from hotswap.train.jax.runtime import JaxGroup, configure_runtime
from hotswap.train.rendezvous import GroupSpec
rank, port = int(sys.argv[1]), int(sys.argv[2])
taken = handoffs.take()
group = JaxGroup(60)
if rank == 0 and taken is None:  # still training in the old generation: start the next one's service
    group.prepare_service(port, 2)
    print("prepared", group.prepared_service()[1], flush=True)
    change = handoffs.MembershipChange(1, 2, time.monotonic(), False)
    handoffs.restart(handoffs.Handoff(change, None, None, None, None, service=group.prepared_service()))
group.adopt_service(taken.service if taken else None)
configure_runtime(None)
group.form(GroupSpec(2, rank, 2, "127.0.0.1", port), lambda: False)
if rank == 0:
    print("formed on", group._coordinator.pid, flush=True)
assert group.agree_max([rank]) == [1]
group.leave({0, 1})
print("left", flush=True)
"""


def test_rank_0_of_the_next_generation_forms_it_on_the_service_it_started_ahead(tmp_path: Path) -> None:
    """The survivor that will be rank 0 of a published generation starts its coordination
    service while it still trains; its next program (after its restart) forms the group on
    that service instead of starting one then, and the others form with it."""
    pytest.importorskip("jax")
    import socket

    script = tmp_path / "successor.py"
    script.write_text(_SUCCESSOR)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**{k: v for k, v in os.environ.items() if k != "HOTSWAP_MEMBERSHIP_FILE"}, "PYTHONPATH": str(ROOT / "src")}
    ranks = [
        subprocess.Popen([sys.executable, str(script), str(rank), str(port)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env)
        for rank in range(2)
    ]
    outputs = [process.communicate(timeout=180) for process in ranks]
    for rank, (process, (out, err)) in enumerate(zip(ranks, outputs)):
        assert process.returncode == 0 and "left" in out, (rank, process.returncode, err[-2000:])
    lines = outputs[0][0].split()
    prepared = lines[lines.index("prepared") + 1]
    formed = lines[lines.index("on") + 1]
    assert formed == prepared  # the same service process: none was started after the restart


_SURVIVOR = """
import os, signal, sys, time
from hotswap.train.jax import handoff as handoffs
from hotswap.train.jax.successor import Successor
taken = handoffs.take()
if taken is None:  # the survivor: its successor starts (and imports) while it trains on
    print("survivor", os.getpid(), flush=True)
    successor = Successor()
    successor.start(sys.argv[1])
    change = handoffs.MembershipChange(1, 2, time.monotonic(), False)
    successor.take_over(handoffs.Handoff(change, {"step": 7}, None, None, None))
    raise SystemExit("the successor did not take the state")
print("successor", os.getpid(), "took step", taken.counters["step"], "marked", os.path.exists(sys.argv[1]), flush=True)
signal.signal(signal.SIGTERM, lambda *_: (print("SIGTERM at the successor", flush=True), os._exit(143)))
signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
time.sleep(120)
"""


def test_a_survivors_successor_takes_its_state_and_runs_under_its_pid(tmp_path: Path) -> None:
    """The next program of a survivor, started and imported ahead, takes the state handed
    over; the survivor's pid stays (what the supervisor knows): SIGTERM sent to it reaches the
    successor and the pid exits with the successor's status."""
    import signal
    import time

    script = tmp_path / "survivor.py"
    script.write_text(_SURVIVOR)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    mark = tmp_path / "ready-mark"  # what the survivors wait for before they move (see formation)
    worker = subprocess.Popen([sys.executable, str(script), str(mark)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    assert worker.stdout is not None
    survivor = worker.stdout.readline().split()
    successor = worker.stdout.readline().split()
    assert survivor == ["survivor", str(worker.pid)]
    assert successor[0] == "successor" and successor[1] != str(worker.pid) and successor[2:] == ["took", "step", "7", "marked", "True"]
    time.sleep(0.5)
    assert worker.poll() is None  # the pid lives on, keeping the successor's place
    worker.send_signal(signal.SIGTERM)
    out, err = worker.communicate(timeout=30)
    assert "SIGTERM at the successor" in out and worker.returncode == 143, err[-2000:]
    assert _ends(int(successor[1]))


@pytest.mark.parametrize(
    ("no_gpu", "user_platforms", "expected"),
    [(True, None, "cpu"), (False, None, ""), (True, "cpu,cuda", "cpu,cuda")],
)
def test_a_worker_of_an_emulated_slice_runs_jax_on_the_cpu_without_trying_cuda(
    no_gpu: bool, user_platforms: str | None, expected: str
) -> None:
    """On a GPU host an emulated slice's worker has its GPUs hidden: JAX's CUDA plugin would
    log an error and a traceback before falling back to the CPU (seen on an H200). The user's
    own JAX_PLATFORMS wins."""
    pytest.importorskip("jax")
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    env["PYTHONPATH"] = str(ROOT / "src")
    if user_platforms:
        env["JAX_PLATFORMS"] = user_platforms
    code = (
        "import jax\n"
        "from hotswap.train.jax.runtime import configure_runtime\n"
        f"configure_runtime(None, no_gpu={no_gpu})\n"
        "print(jax.config.jax_platforms or '')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == expected


_AHEAD = """
import os, sys, time
from hotswap.train.jax import handoff as handoffs
from hotswap.train.jax.successor import Ahead, Successor
mark = sys.argv[1]
taken = handoffs.take()
if taken is None:  # the survivor: its successor runs the script ahead while it trains on
    successor = Successor()
    successor.start(mark, Ahead(after_generation=1, generation=2, attempts=3, service=None))
    while not os.path.exists(mark):  # what the survivors wait for before they move
        time.sleep(0.01)
    print("survivor hands over", flush=True)
    change = handoffs.MembershipChange(1, 2, time.monotonic(), False)
    successor.take_over(handoffs.Handoff(change, {"step": 7}, None, None, None, attempts=3))
    raise SystemExit("the successor did not take the state")
preview = taken.preview  # a successor run ahead: what it knows before the state
print("ahead of the state: after", preview.change.after_generation, "attempts", preview.attempts, flush=True)
state = taken.wait()
print("took step", state.counters["step"], "previous slices", state.change.previous_slices, flush=True)
"""


def test_a_successor_runs_the_script_ahead_and_takes_the_state_when_it_wants_it(tmp_path: Path) -> None:
    """Run ahead, a survivor's next program runs the script before the survivor hands over
    (joining the new generation and building the model meanwhile), marks itself ready only
    when the script wants the state, and then takes the state the survivor held."""
    script = tmp_path / "survivor.py"
    script.write_text(_AHEAD)
    mark = tmp_path / "2-a-0-0"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run([sys.executable, str(script), str(mark)], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == [
        "ahead of the state: after 1 attempts 3",
        "survivor hands over",
        "took step 7 previous slices 2",
    ]


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
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root / "src"), "JAX_PLATFORMS": "cpu"}
    done = subprocess.run([sys.executable, "-c", _SHARDED_KEYS], capture_output=True, text=True, env=env, timeout=240)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]


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


def test_a_successor_asked_to_restart_while_it_waits_for_its_state_ends_instead(
    jax, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A successor run ahead waits for its survivor's state; if its watchdog moves it on
    meanwhile (a newer generation), it must end, not replace itself by a fresh program: its
    survivor still runs, and restarts plainly (two workers of one slice otherwise)."""
    from hotswap.train.jax import handoff as handoffs
    from hotswap.train.jax import run as runs_module

    run = object.__new__(runs_module.JaxRun)
    restarted: list[object] = []
    monkeypatch.setattr(handoffs, "restart", lambda handoff: restarted.append(handoff))

    def ended(code: int) -> None:
        raise SystemExit(code)

    monkeypatch.setattr(runs_module.os, "_exit", ended)

    class Waiting:
        preview = None

        def wait(self) -> None:  # the watchdog acts while the state has not come
            run._restart(handoffs.Handoff(handoffs.MembershipChange(1, 2, 0.0, True), None, None, None, None))

    run._pending = Waiting()  # type: ignore[attr-defined]
    with pytest.raises(SystemExit) as ending:
        run._take_over()  # type: ignore[attr-defined]
    assert ending.value.code == runs_module.RESTART_EXIT_CODE and restarted == []
