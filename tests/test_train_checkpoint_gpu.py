"""Checkpoints of GPU state: saved through pinned staging buffers on a side stream, restored
straight to the GPU, bit for bit. Needs CUDA (marker ``gpu``); skipped without it.

    python -m pytest -q -m gpu tests/test_train_checkpoint_gpu.py
"""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

from hotswap.train.torch import staging as staging_module  # noqa: E402
from hotswap.train.torch import tensorfiles  # noqa: E402
from hotswap.train.torch.checkpointer import Checkpointer  # noqa: E402
from hotswap.train.events import EventLog  # noqa: E402
from hotswap.train.torch.state import StateRegistry, build_tree, rng_state  # noqa: E402
from hotswap.train.torch.store import CheckpointStore  # noqa: E402


@pytest.fixture
def small_buffers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Several files, each through many staging buffers: every hand-over is exercised."""
    monkeypatch.setattr(tensorfiles, "MIN_FILE_BYTES", 1 << 16)
    monkeypatch.setattr(staging_module, "STAGING_BYTES", 4096 + 17)


def gpu_job(seed: int = 0) -> tuple[torch.nn.Module, torch.optim.Optimizer, StateRegistry]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(64, 300), torch.nn.LayerNorm(300), torch.nn.Linear(300, 7)).cuda()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.randn(16, 64, device="cuda")).sum().backward()
    optimizer.step()
    registry = StateRegistry()
    registry.register("model", model)
    registry.register("optimizer", optimizer)
    registry.register("extra", {"cpu": torch.arange(1000.0), "half": torch.randn(333, device="cuda").half()})
    return model, optimizer, registry


def checkpointer(directory: Path, threads: int = 3) -> Checkpointer:
    return Checkpointer(CheckpointStore(directory), EventLog(None), threads=threads)


def tensors_of(tree: object) -> list[torch.Tensor]:
    from hotswap.train.torch.codec import encode

    return [t for t in encode(tree).arrays if isinstance(t, torch.Tensor)]


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_gpu_state_is_restored_to_the_gpu_bit_for_bit(tmp_path: Path, small_buffers: None, asynchronous: bool) -> None:
    model, optimizer, registry = gpu_job()
    tree = build_tree(registry, {"step": 3, "elastic_down_events": 0}, [rng_state()])
    expected = [t.detach().cpu().clone() for t in tensors_of(tree)]
    saver = checkpointer(tmp_path)
    if asynchronous:
        saver.save_async(3, tree, "periodic", registry.changed_only_by_optimizers())
        saver.wait_for_copy()
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.add_(1.0)  # the loop trains on; the snapshot must not see it
        saver.wait()
    else:
        info = saver.save(3, tree, "termination")
        assert len([name for name in info.files if name.startswith("tensors-")]) == 3

    restored, info = checkpointer(tmp_path, threads=2).restore_latest()
    got = tensors_of(restored)
    assert [t.device.type for t in got] == [t.device.type for t in tensors_of(tree)]  # GPU ones on the GPU
    assert all(a.dtype == b.dtype and torch.equal(a.cpu(), b) for a, b in zip(got, expected, strict=True))

    fresh_model, fresh_optimizer, fresh_registry = gpu_job(seed=1)
    fresh_registry.load(restored["objects"])
    for a, b in zip(fresh_model.state_dict().values(), expected, strict=False):
        assert torch.equal(a.cpu(), b)
    assert fresh_optimizer.state_dict()["state"].keys() == optimizer.state_dict()["state"].keys()
