"""hotswap.train's PyTorch side, in process: registering state, saving and restoring it
(synchronously and in the background), host snapshots, the tensor transport layout, and the
helpers for gradients and peer failures."""

from __future__ import annotations

import copy
import random
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
numpy = pytest.importorskip("numpy")

from hotswap.train import ResumableBatches  # noqa: E402
from hotswap.train.torch.checkpointer import Checkpointer  # noqa: E402
from hotswap.train.torch.distributed import _copy_between, average_gradients, is_peer_failure  # noqa: E402
from hotswap.train.events import EventLog  # noqa: E402
from hotswap.train.torch.migration import Migrator  # noqa: E402
from hotswap.train.torch.snapshot import HostStaging, join_tensors, split_tensors  # noqa: E402
from hotswap.train.torch.state import (  # noqa: E402
    StateRegistry,
    build_tree,
    derived_rng_state,
    rng_state,
    set_rng_state,
)
from hotswap.train.files import write_file_durably  # noqa: E402
from hotswap.train.torch.store import CheckpointStore  # noqa: E402


class Job:
    """A tiny training job with every kind of state the SDK registers."""

    def __init__(self, seed: int = 0) -> None:
        torch.manual_seed(seed)
        self.model = torch.nn.Sequential(
            torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Dropout(0.2), torch.nn.Linear(8, 1)
        )
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=0.01)
        self.scheduler = torch.optim.lr_scheduler.StepLR(self.optimizer, step_size=2, gamma=0.5)
        self.metrics = {"epoch": 0, "best": float("inf"), "history": []}
        self.batches = ResumableBatches(64, 8, seed=seed)
        self.data = torch.randn(64, 4, generator=torch.Generator().manual_seed(99))
        self.registry = StateRegistry()
        for name in ("model", "optimizer", "scheduler", "metrics", "batches"):
            self.registry.register(name, getattr(self, name))

    def train_step(self) -> float:
        index = self.batches.take()
        self.optimizer.zero_grad()
        noise = torch.randn(8, 1) * random.random() * float(numpy.random.rand())  # every RNG in play
        loss = (self.model(self.data[index]) - noise).pow(2).mean()
        loss.backward()
        self.optimizer.step()
        self.scheduler.step()
        self.metrics["epoch"] = self.batches.epoch
        self.metrics["history"].append(loss.item())
        return loss.item()

    def tree(self, step: int) -> dict:  # type: ignore[type-arg]
        return build_tree(self.registry, {"step": step, "elastic_down_events": 0}, [rng_state()])

    def load(self, tree: dict) -> None:  # type: ignore[type-arg]
        self.registry.load(tree["objects"])
        set_rng_state(tree["rng"][0])


def checkpointer(directory: Path) -> Checkpointer:
    return Checkpointer(CheckpointStore(directory), EventLog(None))


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_a_restored_job_continues_exactly_as_the_uninterrupted_one(tmp_path: Path, asynchronous: bool) -> None:
    original = Job()
    for _ in range(5):
        original.train_step()
    saver = checkpointer(tmp_path)
    if asynchronous:
        saver.save_async(5, original.tree(5), "periodic")
    else:
        saver.save(5, original.tree(5), "periodic")
    expected = [original.train_step() for _ in range(6)]  # trains on while the write finishes
    saver.wait()

    resumed = Job(seed=1)  # a fresh process: other initial weights, data position, RNG
    tree, info = checkpointer(tmp_path).restore_latest()
    assert info.step == 5 and tree["progress"]["step"] == 5
    resumed.load(tree)
    assert [resumed.train_step() for _ in range(6)] == expected
    assert resumed.metrics == original.metrics
    assert resumed.scheduler.get_last_lr() == original.scheduler.get_last_lr()


def test_an_async_snapshot_is_isolated_from_training_that_goes_on(tmp_path: Path) -> None:
    weights = {"w": torch.zeros(1000)}
    registry = StateRegistry()
    registry.register("weights", weights)
    saver = checkpointer(tmp_path)
    saver.save_async(1, build_tree(registry, {"step": 1, "elastic_down_events": 0}, []), "periodic")
    weights["w"].add_(1.0)  # the loop moves on at once
    saver.wait()
    tree, _ = saver.restore_latest()
    assert torch.equal(tree["objects"]["weights"]["w"], torch.zeros(1000))


def test_parameters_and_optimizer_state_may_be_copied_until_the_next_optimizer_step(tmp_path: Path) -> None:
    job = Job()
    for _ in range(2):
        job.train_step()
    expected = copy.deepcopy(job.tree(2))
    deferrable = job.registry.changed_only_by_optimizers()
    parameters = list(job.model.parameters())
    moments = [t for state in job.optimizer.state.values() for t in state.values()]
    buffers = list(job.model.buffers())
    assert all(deferrable(t) for t in parameters + moments)
    assert not any(deferrable(t) for t in buffers)

    saver = checkpointer(tmp_path)
    saver.save_async(2, job.tree(2), "periodic", deferrable)
    for buffer in buffers:  # the next forward updates batch-norm statistics at once
        buffer.add_(7)
    saver.wait_for_copy()  # what the run's optimizer pre-hook does before the update
    with torch.no_grad():
        for tensor in parameters + moments:
            tensor.add_(1.0)
    saver.wait()
    tree, _ = saver.restore_latest()
    for name in ("model", "optimizer"):
        saved, wanted = split_tensors(tree["objects"][name])[1], split_tensors(expected["objects"][name])[1]
        assert len(saved) == len(wanted) and all(torch.equal(a, b) for a, b in zip(saved, wanted, strict=True))


def test_host_staging_reuses_its_buffers_and_copies_the_values() -> None:
    staging = HostStaging()
    params = {"a": torch.randn(100, 10), "b": torch.arange(5)}
    first = staging.capture(params)
    params["a"].mul_(2)
    second = staging.capture(params)
    assert [t.data_ptr() for t in first.arrays] == [t.data_ptr() for t in second.arrays]
    assert torch.equal(second.tree()["a"], params["a"]) and second.tree()["a"].data_ptr() != params["a"].data_ptr()


def test_split_and_join_keep_shared_tensors_shared() -> None:
    shared = torch.ones(3)
    tree = {"x": shared, "y": [shared, 2, "text"], "z": {"w": torch.zeros(2, 2)}}
    structure, tensors = split_tensors(tree)
    assert len(tensors) == 2
    rebuilt = join_tensors(structure, [t.clone() for t in tensors])
    assert rebuilt["x"] is rebuilt["y"][0] and rebuilt["y"][1:] == [2, "text"]
    assert torch.equal(rebuilt["z"]["w"], torch.zeros(2, 2))


def test_the_transport_layout_round_trips_any_split_into_chunks() -> None:
    """broadcast_tree sends the tensors' bytes in fixed-size pieces; every byte must land back
    in its tensor whatever the sizes and the piece boundaries."""
    generator = torch.Generator().manual_seed(3)
    sources = [torch.randint(0, 256, (n,), dtype=torch.uint8, generator=generator) for n in (0, 1, 7, 64, 3, 129)]
    targets = [torch.zeros_like(t) for t in sources]
    total = sum(t.numel() for t in sources)
    for piece_size in (1, 5, 64, total):
        for target in targets:
            target.zero_()
        for start in range(0, total, piece_size):
            piece = torch.empty(min(piece_size, total - start), dtype=torch.uint8)
            _copy_between(sources, start, piece, into_piece=True)
            _copy_between(targets, start, piece, into_piece=False)
        assert all(torch.equal(s, t) for s, t in zip(sources, targets, strict=True))


def test_rng_states_round_trip() -> None:
    state = rng_state()
    draws = (random.random(), float(numpy.random.rand()), torch.rand(1).item())
    set_rng_state(copy.deepcopy(state))
    assert (random.random(), float(numpy.random.rand()), torch.rand(1).item()) == draws


def test_registration_accepts_state_objects_dicts_lists_and_scalars_only() -> None:
    registry = StateRegistry()
    history = [1, 2]
    registry.register("history", history)
    with pytest.raises(TypeError, match="cannot register a object: register objects with state_dict"):
        registry.register("epoch", object())
    with pytest.raises(ValueError, match="a different object is already registered as 'history'"):
        registry.register("history", [3])
    registry.register("history", history)  # the same object again: harmless
    assert list(registry.state()) == ["history"]
    with pytest.raises(TypeError, match=r"^cannot checkpoint 'metrics'\['loss_fn'\]: a builtins.function is not plain"):
        registry.register("metrics", {"loss_fn": lambda x: x})  # caught now, not at the first save
    assert list(registry.state()) == ["history"]


def test_loading_tells_about_missing_and_unknown_objects(caplog: pytest.LogCaptureFixture) -> None:
    registry = StateRegistry()
    kept = {"a": 1}
    registry.register("kept", kept)
    registry.load({"other": {"b": 2}})
    assert kept == {"a": 1}
    assert "nothing for 'kept'" in caplog.text and "nobody registered: other" in caplog.text


def test_a_checkpoint_that_cannot_be_loaded_is_skipped_for_an_older_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = CheckpointStore(tmp_path)
    saver = Checkpointer(store, EventLog(None))
    registry = StateRegistry()
    registry.register("weights", {"w": torch.ones(2)})
    saver.save(1, build_tree(registry, {"step": 1, "elastic_down_events": 0}, []), "periodic")
    store.write(2, "periodic", lambda directory: {"index.json": write_file_durably(directory / "index.json", b"{x")})
    tree, info = saver.restore_latest()
    assert info.step == 1
    assert "cannot be loaded" in caplog.text


def test_average_gradients_does_nothing_in_a_single_process() -> None:
    layer = torch.nn.Linear(2, 1)
    layer(torch.ones(1, 2)).sum().backward()
    before = layer.weight.grad.clone()
    average_gradients(layer)
    assert torch.equal(layer.weight.grad, before)


def test_peer_failures_are_told_from_bugs_in_the_step() -> None:
    gloo_lost_peer = RuntimeError(
        "[../third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:4242"
    )
    assert is_peer_failure(gloo_lost_peer)
    assert is_peer_failure(torch.distributed.DistBackendError("NCCL communicator was aborted"))
    assert not is_peer_failure(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
    assert not is_peer_failure(ValueError("gloo"))


def test_the_migrator_asks_for_listening_first_and_checks_registrations() -> None:
    migrator = Migrator()
    with pytest.raises(RuntimeError, match=r"call migrator.listening\(\) first"):
        migrator.load_ckpt()
    with pytest.raises(RuntimeError, match=r"call migrator.listening\(\) first"):
        _ = migrator.resume
    with pytest.raises(TypeError, match="cannot register a float"):
        migrator.register("lr", 0.1)


def test_scalars_register_and_restore_by_name() -> None:
    """``best_val_loss = float("inf")`` in a trainer: registered by value, read and set by name."""
    registry = StateRegistry()
    registry.register("best_val_loss", float("inf"))
    registry.register("iter_num", 0)
    registry.scalars["best_val_loss"] = 1.25
    registry.scalars["iter_num"] = 7
    saved = copy.deepcopy(registry.state())
    assert saved == {"best_val_loss": 1.25, "iter_num": 7}
    restarted = StateRegistry()
    restarted.register("best_val_loss", float("inf"))
    restarted.register("iter_num", 0)
    restarted.load(saved)
    assert restarted.scalars == {"best_val_loss": 1.25, "iter_num": 7}
    with pytest.raises(ValueError, match="already registered as 'history'"):
        registry.register("history", [])  # fine
        registry.register("history", 3)


def _net(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))


@pytest.mark.parametrize("saved_compiled", [True, False], ids=["compiled-to-plain", "plain-to-compiled"])
def test_a_torch_compiled_model_restores_with_compile_on_or_off(saved_compiled: bool) -> None:
    """torch.compile's OptimizedModule names its keys ``_orig_mod.``: registered, it is the
    model it wraps, so either side of a restart may compile (backend "eager": no C compiler)."""
    source, target = _net(0), _net(1)
    writer, reader = StateRegistry(), StateRegistry()
    writer.register("model", torch.compile(source, backend="eager") if saved_compiled else source)
    compiled_target = torch.compile(target, backend="eager")
    reader.register("model", target if saved_compiled else compiled_target)
    reader.load(copy.deepcopy(writer.state()))
    assert all(torch.equal(a, b) for a, b in zip(source.state_dict().values(), target.state_dict().values(), strict=True))
    x = torch.randn(3, 4)
    assert torch.equal(compiled_target(x), source(x))


def test_a_checkpoint_saved_with_wrapper_prefixes_loads_into_the_bare_model() -> None:
    """Checkpoints of an earlier release registered the wrapper itself: keys ``_orig_mod.`` or
    ``module.`` (DDP), or both."""
    source, target = _net(0), _net(1)
    registry = StateRegistry()
    registry.register("model", target)
    for prefix in ("_orig_mod.", "module.", "module._orig_mod."):
        registry.load({"model": {prefix + k: v for k, v in source.state_dict().items()}})
        assert all(torch.equal(a, b) for a, b in zip(source.state_dict().values(), target.state_dict().values(), strict=True))


def test_a_rank_without_saved_streams_gets_its_own_reproducible_ones() -> None:
    """A joiner, or a restore onto more ranks than saved: each rank draws its own numbers, the
    same ones again when the run is repeated, none of them the saved rank's."""
    tree = {"progress": {"step": 40}, "rng": [rng_state()]}
    draws = {}
    for rank in (0, 1, 2):
        set_rng_state(derived_rng_state(tree, rank))
        draws[rank] = (random.random(), float(numpy.random.rand()), torch.rand(1).item())
    set_rng_state(tree["rng"][0])
    saved = (random.random(), float(numpy.random.rand()), torch.rand(1).item())
    assert len({*draws.values(), saved}) == 4
    set_rng_state(derived_rng_state(tree, 1))
    assert (random.random(), float(numpy.random.rand()), torch.rand(1).item()) == draws[1]
    later = {**tree, "progress": {"step": 41}}
    set_rng_state(derived_rng_state(later, 1))
    assert torch.rand(1).item() != draws[1][2]


def test_dropping_gradients_clears_what_an_abandoned_step_accumulated() -> None:
    job = Job()
    job.model(job.data[:8]).sum().backward()
    assert all(p.grad is not None for p in job.model.parameters())
    job.registry.drop_gradients()
    assert all(p.grad is None for p in job.model.parameters())
