"""What a checkpoint directory may hold that no whole checkpoint is (issue 36, item 7): a step's
name that is a symbolic link is a damaged checkpoint (named in one line, set aside, exit 65 when
nothing usable is left), not a step the job silently starts over beside; a final save that
cannot be written is a non-zero exit (both SDKs); a killed save's ``.partial-*`` leftover is
removed at the next successful save once its writer is gone, never while a live saver writes it."""

from __future__ import annotations

import logging
import os
import shutil
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from hotswap.api import worker as contract  # noqa: E402
from hotswap.train.events import EventLog  # noqa: E402
from hotswap.train.files import DAMAGED_DIR  # noqa: E402
from hotswap.train.save_leases import SaveLeases  # noqa: E402
from hotswap.train.torch.checkpointer import Checkpointer  # noqa: E402
from hotswap.train.torch.store import CheckpointStore  # noqa: E402
from test_train_damaged_checkpoints import TRAIN, train, tree_at  # noqa: E402
from train_harness import ROOT, Workers, clean_environ  # noqa: E402

# A process that never ran (pid_max is at most 2**22): a killed saver, gone.
GONE_PID = 2**22 + 7


def _link_elsewhere(step: Path, scratch: Path) -> Path:
    """Replace the step's directory by a symbolic link to a copy of it elsewhere."""
    elsewhere = scratch / f"elsewhere-{step.name}"
    shutil.copytree(step, elsewhere)
    shutil.rmtree(step)
    step.symlink_to(elsewhere)
    return elsewhere


def test_a_symlinked_step_directory_is_damaged_and_refused_like_the_others(tmp_path: Path) -> None:
    """The job's only checkpoint is a link to a whole checkpoint elsewhere: it is named in one
    line and set aside, and the worker exits 65 instead of training from step 0 and exiting 0
    (then failing its final save on the link: "Not a directory")."""
    checkpoints = tmp_path / "checkpoints"
    with Workers(tmp_path) as workers:
        code, errors, _ = train(workers, "first", checkpoints)
        assert code == 0, errors
        shutil.rmtree(checkpoints / "step-0000000002")
        _link_elsewhere(checkpoints / "step-0000000004", tmp_path)

        code, errors, lines = train(workers, "second", checkpoints)
        assert code == contract.CHECKPOINTS_UNUSABLE_EXIT_CODE, errors
        assert not any(line.startswith("step=") for line in lines) and "Traceback" not in errors, errors
        said = errors.strip().splitlines()
        [named] = [line for line in said if line.startswith(f"hotswap: damaged checkpoint {checkpoints / 'step-0000000004'}: ")]
        assert "it is a symbolic link (to " in named and f"moved to {checkpoints / DAMAGED_DIR}" in named, named
        assert said[-1].startswith("hotswap: no usable checkpoint: 1 damaged one(s) were set aside"), errors

        code, errors, lines = train(workers, "allowed", checkpoints, **{contract.HOTSWAP_ALLOW_FRESH_START: "1"})
        assert code == 0, errors
        assert [line.split()[0] for line in lines if line.startswith("step=")] == [f"step={n}" for n in range(1, 5)]
        final = checkpoints / "step-0000000004"
        assert final.is_dir() and not final.is_symlink()  # its final save is a checkpoint of its own


def test_a_link_planted_where_a_save_commits_is_set_aside_and_the_save_commits(tmp_path: Path) -> None:
    checkpoints = tmp_path / "checkpoints"
    saver = Checkpointer(CheckpointStore(checkpoints), EventLog(None))
    (tmp_path / "target").mkdir()
    (checkpoints / "step-0000000003").symlink_to(tmp_path / "target")
    assert saver.save(3, tree_at(3, 5.0), "final").step == 3
    assert (checkpoints / "step-0000000003").is_dir() and not (checkpoints / "step-0000000003").is_symlink()
    assert [path.is_symlink() for path in (checkpoints / DAMAGED_DIR).iterdir()] == [True]
    assert list((tmp_path / "target").iterdir()) == []  # nothing was written through the link


# The last step is done, then the disk is "full" for anything bigger than a few KiB (a file size
# limit, as a full disk fails a write: an OSError): the final save cannot be written.
_TORCH_FULL_DISK = """
import resource, signal
import torch
import hotswap.train as ht

run = ht.init(checkpoint_every=None)
run.register(model=torch.nn.Linear(256, 256))
for step in run.steps(3):
    run.report()
    if step == 3:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.RLIM_INFINITY))
print("the script went on", flush=True)
"""

_JAX_FULL_DISK = """
import resource, signal
import jax
import hotswap.train.jax as hj

run = hj.init(checkpoint_every=None, compilation_cache=False)
run.register({"w": jax.random.normal(jax.random.key(0), (256, 256))})  # random: it does not compress
for step in run.steps(3):
    with run.elastic_step():
        run.state = {"w": run.state["w"] + 1}
        run.report()
    if step == 3:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.RLIM_INFINITY))
print("the script went on", flush=True)
"""


@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_a_final_save_that_fails_is_a_non_zero_exit(tmp_path: Path, framework: str) -> None:
    if framework == "jax":
        pytest.importorskip("jax")
        pytest.importorskip("orbax.checkpoint")
    script = tmp_path / "trainer.py"
    script.write_text(textwrap.dedent(_TORCH_FULL_DISK if framework == "torch" else _JAX_FULL_DISK))
    env = {**clean_environ(), "PYTHONPATH": str(ROOT / "src"), contract.HOTSWAP_CHECKPOINT_DIR: str(tmp_path / "checkpoints"),
           "JAX_PLATFORMS": "cpu"}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert done.returncode == contract.CHECKPOINTS_UNUSABLE_EXIT_CODE, (done.returncode, done.stderr[-3000:])
    assert "the script went on" not in done.stdout  # the run ended there, not after a silent loss
    assert any(
        line.startswith("hotswap: the final checkpoint of step 3 could not be saved: ") for line in done.stderr.splitlines()
    ), done.stderr[-3000:]


def test_a_killed_save_s_leftover_goes_at_the_next_save_a_live_saver_s_stays(tmp_path: Path) -> None:
    """Leftovers of killed saves of this host (their writer no longer runs, its lease left
    behind or not) are removed when the next save commits; one a live process of this host is
    writing stays, as do this process's own (its next save) and another host's (its writer
    cannot be seen from here: it goes after STALE_PARTIAL_S, as before)."""
    checkpoints = tmp_path / "checkpoints"
    store = CheckpointStore(checkpoints)
    host = socket.gethostname()
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    try:
        killed = checkpoints / f"step-0000000001.partial-{host}-{GONE_PID}-aaaaaaaa"
        killed_leased = checkpoints / f"step-0000000001.partial-{host}-{GONE_PID + 1}-bbbbbbbb"
        live_here = checkpoints / f"step-0000000001.partial-{host}-{sleeper.pid}-cccccccc"
        elsewhere = checkpoints / "step-0000000001.partial-other-host-77-dddddddd"
        own = checkpoints / f"step-0000000009.partial-{host}-{os.getpid()}-eeeeeeee"
        for partial in (killed, killed_leased, live_here, elsewhere, own):
            partial.mkdir()
            (partial / "tensors-0.bin").write_bytes(b"x" * 1024)
        SaveLeases(checkpoints, attempt=1, pid=GONE_PID + 1).hold()  # its holder was killed: never released
        Checkpointer(store, EventLog(None)).save(2, tree_at(2, 1.0), "periodic")
        store.settle()
        left = sorted(path.name for path in checkpoints.iterdir() if ".partial-" in path.name)
        assert left == sorted(path.name for path in (live_here, elsewhere, own)), left
    finally:
        sleeper.kill()
        sleeper.wait()


def test_jax_a_symlinked_step_is_damaged_named_and_set_aside(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The JAX SDK's orbax steps the same: a step that is a link to a whole step elsewhere is
    named in one line and set aside, never restored; with nothing else left, nothing restores
    (and the fresh-start rule sees what was set aside)."""
    pytest.importorskip("jax")
    pytest.importorskip("orbax.checkpoint")
    import jax.numpy as jnp
    from jax_helpers import checkpoints

    from hotswap.train.files import fresh_start_refusal

    root = tmp_path / "checkpoints"
    store = checkpoints(root)
    store.save(2, {"w": jnp.arange(4.0)}, {}, {"step": 2, "elastic_down_events": 0}, "periodic", wait=True)
    store.close()
    _link_elsewhere(root / "2", tmp_path)

    store = checkpoints(root)
    with caplog.at_level(logging.WARNING, logger="hotswap.train"):
        assert store.restore_latest({"w": jnp.zeros(4)}) is None
    said = [record.getMessage() for record in caplog.records if record.name == "hotswap.train"]
    assert len(said) == 1 and said[0].startswith(f"hotswap: damaged checkpoint {root / '2'}: it is a symbolic link (to "), said
    assert not os.path.lexists(root / "2") and fresh_start_refusal([root], allowed=False) is not None
