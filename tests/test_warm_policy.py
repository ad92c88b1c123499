"""Warm spare workers by default (``--warm-workers auto``): how many, decided purely from the
cluster's shape and a reading of free memory, and what a new local cluster gets from it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from local_helpers import hotswap, home  # noqa: F401 (home: a fixture)

from hotswap.core.warm_policy import SPARE_BYTES, auto_warm_workers, auto_zygote

GIB = 1 << 30


@pytest.mark.parametrize(
    ("slices", "hosts", "free_gib", "expected"),
    [
        (3, 1, 64, 2),  # the demo's cluster on a GPU host: two slices' workers restart on spares
        (1, 1, 64, 1),  # one slice: one spare
        (8, 4, 64, 8),  # 4-host slices: two slices' worth, one per host
        (8, 4, 12, 3),  # a quarter of 12 GiB holds three 1 GiB spares, not eight
        (3, 1, 3, 0),  # a quarter of 3 GiB holds none: restarts stay cold
        (64, 16, 1 << 20, 5),  # never beyond the maximum
    ],
)
def test_auto_keeps_two_slices_of_spares_within_a_quarter_of_free_memory(slices: int, hosts: int, free_gib: int, expected: int) -> None:
    assert SPARE_BYTES == GIB
    assert auto_warm_workers(slices, hosts, free_gib * GIB, maximum=5 if free_gib > 1000 else 64) == expected


def test_auto_keeps_none_where_free_memory_is_unknown() -> None:
    assert auto_warm_workers(3, 1, None, 64) == 0


@pytest.mark.parametrize(
    ("free_gib", "zygote", "spares"),
    [
        (64, True, 2),  # room for all: the zygote and two slices' spares
        (12, True, 2),  # a quarter holds three processes: the zygote and two spares
        (8, True, 1),  # a quarter holds two: the zygote counts as one, one spare is left
        (4, True, 0),  # a quarter holds one: the zygote (every restart forked), no spare
        (3, False, 0),  # a quarter holds none: cold restarts
    ],
)
def test_the_zygote_is_kept_where_one_process_fits_and_counts_as_a_spare(free_gib: int, zygote: bool, spares: int) -> None:
    assert auto_zygote(free_gib * GIB) is zygote
    assert auto_warm_workers(3, 1, free_gib * GIB, 64, zygote=zygote) == spares
    assert auto_zygote(None) is False


def test_a_new_cluster_gets_auto_spares_without_a_flag_and_keeps_its_setting(
    home: Path, monkeypatch: pytest.MonkeyPatch  # noqa: F811
) -> None:
    from hotswap.backends.local.commands import clusters as cluster_commands
    from hotswap.backends.local.queries import clusters as cluster_queries
    from hotswap.backends.local.commands import new_cluster

    monkeypatch.setenv("HOTSWAP_HOME", str(home))
    monkeypatch.delenv("HOTSWAP_WARM_WORKERS", raising=False)  # the suite's default is 0 (conftest)
    monkeypatch.setattr(new_cluster, "available_memory", lambda: 3 * GIB)
    cluster_commands.create_cluster("small", "v6e-4", 3, True, lambda _: True)
    assert cluster_queries.describe_cluster("small")["warm_workers"] == 0  # too little memory: cold restarts
    monkeypatch.setattr(new_cluster, "available_memory", lambda: 64 * GIB)
    cluster_commands.create_cluster("big", "v6e-4", 3, True, lambda _: True, warm_preload=["json"])
    assert cluster_queries.describe_cluster("big")["warm_workers"] == 2  # no flag: spares
    cluster_commands.create_cluster("big", "v6e-4", 4, True, lambda _: True)  # a resize keeps the setting
    assert cluster_queries.describe_cluster("big")["warm_workers"] == 2
    cluster_commands.create_cluster("big", "v6e-4", 4, True, lambda _: True, warm_workers=0)
    assert cluster_queries.describe_cluster("big")["warm_workers"] == 0
    cluster_commands.create_cluster("big", "v6e-4", 4, True, lambda _: True, warm_workers="auto")
    assert cluster_queries.describe_cluster("big")["warm_workers"] == 2


def test_warm_workers_takes_auto_or_a_count_and_refuses_anything_else_in_one_line(home: Path) -> None:  # noqa: F811
    for bad in ("many", "-1", "65", "²"):
        result = hotswap(home, "cluster", "create", "--cluster", "w", "--device-type", "v6e-4", "--num-slices", "1",
                         "--warm-workers", bad)
        assert result.returncode != 0 and result.stdout == ""
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and "--warm-workers must be auto or a count between 0 and 64" in lines[0], result.stderr
    assert not (home / "clusters" / "w").exists()


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("HOTSWAP_WARM_WORKERS", "bogus", "HOTSWAP_WARM_WORKERS must be auto or a count between 0 and 64, not 'bogus'"),
        ("HOTSWAP_WARM_WORKERS", "65", "HOTSWAP_WARM_WORKERS must be auto or a count between 0 and 64, not '65'"),
        ("HOTSWAP_ZYGOTE", "bogus", "HOTSWAP_ZYGOTE must be auto, 1 or 0, not 'bogus'"),
        ("HOTSWAP_ZYGOTE", "true", "HOTSWAP_ZYGOTE must be auto, 1 or 0, not 'true'"),  # was taken as auto
    ],
)
def test_a_bad_default_in_the_environment_is_refused_by_its_name_and_leaves_no_cluster(
    home: Path, monkeypatch: pytest.MonkeyPatch, variable: str, value: str, message: str  # noqa: F811
) -> None:
    """The variables say what a new cluster gets without a flag; a bad value is refused in one
    line that names the variable (not a flag the user did not give), before the cluster exists:
    no cluster is left behind, stopped with no slices."""
    monkeypatch.setenv(variable, value)
    result = hotswap(home, "cluster", "create", "--cluster", "a", "--device-type", "v6e-4", "--num-slices", "1")
    assert result.returncode != 0 and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "--warm-workers" not in lines[0], result.stderr
    monkeypatch.delenv(variable)
    listed = hotswap(home, "cluster", "list", "-o", "json", check=True)
    assert json.loads(listed.stdout) == [], listed.stdout
    assert not (home / "clusters" / "a").exists()


def test_a_spare_leaves_cuda_uninitialised_so_a_gpu_worker_chooses_its_gpus_at_hand_over(tmp_path: Path) -> None:
    """A spare imports PyTorch with no GPU visible; it must not initialise CUDA (then the GPUs
    a GPU-backed worker names in CUDA_VISIBLE_DEVICES could not apply): it says so with a
    marker, and the worker runs with its own CUDA_VISIBLE_DEVICES and a hand-over time."""
    pytest.importorskip("torch")
    from spare_helpers import run_spare

    from hotswap.api.worker import HOTSWAP_HANDED_OVER_AT  # the contract's name: warm.py spells it out

    script = (
        "import os, sys, torch\n"
        "print('cuda initialised', torch.cuda.is_initialized(), 'visible', repr(os.environ['CUDA_VISIBLE_DEVICES']),"
        f" 'handed', {HOTSWAP_HANDED_OVER_AT!r} in os.environ, 'warm', 'torch._dynamo' in sys.modules, flush=True)\n"
    )
    env = {"PATH": os.environ.get("PATH", ""), "CUDA_VISIBLE_DEVICES": "0"}
    spare, log = run_spare(tmp_path / "spare", ["torch", "torch.optim", "torch._dynamo"], env, script)
    assert (spare / "cuda-untouched").exists()
    assert "cuda initialised False visible '0' handed True warm True" in log, log


def test_the_pool_gives_a_gpu_backed_worker_only_a_spare_that_left_cuda_untouched(tmp_path: Path) -> None:
    from hotswap.backends.local.workers.spares import SparePool

    class Alive:
        def alive(self, row: object) -> bool:
            return True

    class Rows:
        def __init__(self, rows: list[object]) -> None:
            self.rows = rows

        def select(self, states: tuple[str, ...]) -> list[object]:
            return self.rows

    class Row:
        def __init__(self, directory: Path) -> None:
            self.dir = str(directory)

    started = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTORCH_NVML_BASED_CUDA_CHECK": "1"}
    untouched, touched = tmp_path / "untouched", tmp_path / "touched"
    for directory in (untouched, touched):
        directory.mkdir()
        (directory / "ready").write_text("1")
        (directory / "env.json").write_text(json.dumps(started))
    (untouched / "cuda-untouched").touch()
    store = type("Store", (), {"worker_rows": Rows([Row(touched), Row(untouched)])})()
    pool = SparePool(store, Alive(), tmp_path, 2)  # type: ignore[arg-type]
    gpu_worker = {**os.environ, "CUDA_VISIBLE_DEVICES": "GPU-0f1e"}
    assert pool.take(gpu_worker).dir == str(untouched)  # type: ignore[union-attr]
    assert pool.take({**os.environ, "CUDA_VISIBLE_DEVICES": ""}).dir == str(touched)  # type: ignore[union-attr]
    (untouched / "cuda-untouched").unlink()
    assert pool.take(gpu_worker) is None  # a spare that initialised CUDA serves emulated workers only
