"""hotswap.train.jax's runtime: errors that mean a lost peer are told from bugs in the step (in
this process), and a worker of an emulated slice runs JAX on the CPU without trying CUDA, unless
the user set ``JAX_PLATFORMS`` (each case in a spawned Python, since the platform is fixed once
JAX starts)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from jax_helpers import ROOT, jax  # noqa: F401 (jax is a fixture)


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
