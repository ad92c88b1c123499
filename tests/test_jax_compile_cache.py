"""Every process of a multi-process CPU JAX job loads its compiled programs from the persistent
cache when it starts again (a JAX worker moving to a new membership generation is a new
process): real JAX processes on loopback, formed through JaxGroup, run twice."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from train_harness import free_port

ROOT = Path(__file__).resolve().parents[1]

# Each worker compiles one program over both processes' devices and says how many of its
# compilations the persistent cache answered.
_WORKER = (
    "import sys\n"
    "import jax\n"
    "from hotswap.train.jax.runtime import JaxGroup, configure_runtime\n"
    "from hotswap.train.rendezvous import GroupSpec\n"
    "rank, port, cache = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]\n"
    "configure_runtime(cache)\n"
    "hits = []\n"
    "jax.monitoring.register_event_listener(lambda event, **kw: hits.append(event) if event == '/jax/compilation_cache/cache_hits' else None)\n"
    "group = JaxGroup(rendezvous_timeout_s=30, heartbeat_timeout_s=10)\n"
    "group.form(GroupSpec(1, rank, 2, '127.0.0.1', port), lambda: False)\n"
    "import numpy as np\n"
    "from jax.sharding import Mesh, NamedSharding, PartitionSpec as P\n"
    "mesh = Mesh(np.array(jax.devices()), ('x',))\n"
    "step = jax.jit(lambda a: (a * 3.0).sum())\n"
    "total = step(jax.make_array_from_process_local_data(NamedSharding(mesh, P('x')), np.ones((2,), np.float32)))\n"
    "print(rank, float(total), len(hits), flush=True)\n"
    "group.leave(range(2))\n"
)


def _run(cache: Path) -> dict[int, int]:
    """One run of both processes: each rank's count of persistent cache hits."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "JAX_PLATFORMS": "cpu"}
    port = free_port()
    workers = [
        subprocess.Popen([sys.executable, "-c", _WORKER, str(rank), str(port), str(cache)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        for rank in range(2)
    ]
    hits = {}
    for worker in workers:
        out, err = worker.communicate(timeout=120)
        assert worker.returncode == 0, err[-2000:]
        rank, total, count = out.strip().splitlines()[-1].split()  # after gloo's own lines
        assert float(total) == 12.0  # 4 elements * 3, summed over both processes' shards
        hits[int(rank)] = int(count)
    return hits


def test_every_rank_of_a_cpu_job_loads_its_programs_from_the_cache_when_it_starts_again(tmp_path: Path) -> None:
    """JAX writes cache entries from process 0 only, and on the CPU the other processes' keys
    differ from process 0's: without hotswap's writer, rank 1 compiled every program again at
    every start (its step, at every elastic grow-back)."""
    pytest.importorskip("jax")
    cache = tmp_path / "cache"
    assert _run(cache) == {0: 0, 1: 0}  # the first start compiles everything
    again = _run(cache)
    assert again[0] > 0 and again[1] == again[0], again  # every program of every rank from the cache
