"""The cluster registry (``store/registry.py``): every cluster of every backend, found the same way."""

from __future__ import annotations

from pathlib import Path

import pytest

from hotswap.api.errors import NotFoundError
from hotswap.core.model import Node, Slice, Snapshot
from hotswap.store import registry
from hotswap.store.paths import ClusterPaths
from hotswap.store.state import ClusterRecord, Store


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HOTSWAP_HOME", str(tmp_path))
    return tmp_path


def record(name: str, backend: str, slices: int) -> None:
    with Store.open(ClusterPaths.of(name).database, create=True) as store:
        store.init_cluster(ClusterRecord(name, backend, "v6e-4", 1.0))
        items = [Slice(f"{name}-np-{i}", "v6e-4", (f"{name}-np-{i}-0",), i) for i in range(slices)]
        nodes = [Node(f"{name}-np-{i}-0", f"{name}-np-{i}", 0) for i in range(slices)]
        store.save_snapshot(Snapshot.build(), Snapshot.build(0.0, items, nodes))


def test_clusters_of_both_backends_are_listed_alike() -> None:
    record("gke", "kubernetes", 4)
    record("laptop", "local", 2)
    assert registry.cluster_names() == ["gke", "laptop"]
    assert [(s.name, s.backend, s.num_slices, s.workloads, s.controller_pid) for s in registry.summaries()] == [
        ("gke", "kubernetes", 4, 0, None),
        ("laptop", "local", 2, 0, None),
    ]
    assert registry.record_of("gke").backend == "kubernetes" and registry.find("nope") is None


def test_a_missing_cluster_is_one_line_naming_the_others() -> None:
    record("laptop", "local", 1)
    with pytest.raises(NotFoundError, match="no cluster named ghost: .*; clusters: laptop$"):
        registry.existing("ghost")
