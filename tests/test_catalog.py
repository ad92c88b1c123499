"""The device catalog: xpk's names, their real shapes, and helpful errors for wrong names."""

from __future__ import annotations

import dataclasses
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hotswap.api import catalog, device_tables
from hotswap.api.catalog import AcceleratorKind, DeviceType, get_device_type
from hotswap.api.device_tables import TPU_FAMILIES
from hotswap.api.errors import InvalidInputError

# name: (family, topology, hosts per slice, chips per host, GKE accelerator, machine type)
KNOWN_SHAPES = {
    "v4-8": ("v4", "2x2x1", 1, 4, "tpu-v4-podslice", "ct4p-hightpu-4t"),
    "v4-16": ("v4", "2x2x2", 2, 4, "tpu-v4-podslice", "ct4p-hightpu-4t"),
    "v4-128": ("v4", "4x4x4", 16, 4, "tpu-v4-podslice", "ct4p-hightpu-4t"),
    "v4-4096": ("v4", "8x16x16", 512, 4, "tpu-v4-podslice", "ct4p-hightpu-4t"),
    "v5litepod-8": ("v5litepod", "2x4", 2, 4, "tpu-v5-lite-podslice", "ct5lp-hightpu-4t"),
    "v5litepod-16": ("v5litepod", "4x4", 4, 4, "tpu-v5-lite-podslice", "ct5lp-hightpu-4t"),
    "v5litepod-256": ("v5litepod", "16x16", 64, 4, "tpu-v5-lite-podslice", "ct5lp-hightpu-4t"),
    "v5p-8": ("v5p", "2x2x1", 1, 4, "tpu-v5p-slice", "ct5p-hightpu-4t"),
    "v5p-16": ("v5p", "2x2x2", 2, 4, "tpu-v5p-slice", "ct5p-hightpu-4t"),
    "v5p-128": ("v5p", "4x4x4", 16, 4, "tpu-v5p-slice", "ct5p-hightpu-4t"),
    "v5p-1024": ("v5p", "8x8x8", 128, 4, "tpu-v5p-slice", "ct5p-hightpu-4t"),
    "v5p-17920": ("v5p", "16x20x28", 2240, 4, "tpu-v5p-slice", "ct5p-hightpu-4t"),
    "v6e-1": ("v6e", "1x1", 1, 1, "tpu-v6e-slice", "ct6e-standard-1t"),
    "v6e-4": ("v6e", "2x2", 1, 4, "tpu-v6e-slice", "ct6e-standard-4t"),
    "v6e-8": ("v6e", "2x4", 2, 4, "tpu-v6e-slice", "ct6e-standard-4t"),
    "v6e-16": ("v6e", "4x4", 4, 4, "tpu-v6e-slice", "ct6e-standard-4t"),
    "v6e-256": ("v6e", "16x16", 64, 4, "tpu-v6e-slice", "ct6e-standard-4t"),
    "tpu7x-2": ("tpu7x", "1x1x1", 1, 1, "tpu7x", "tpu7x-standard-1t"),
    "tpu7x-8": ("tpu7x", "2x2x1", 1, 4, "tpu7x", "tpu7x-standard-4t"),
    "tpu7x-128": ("tpu7x", "4x4x4", 16, 4, "tpu7x", "tpu7x-standard-4t"),
    "tpu7x-16384": ("tpu7x", "16x16x32", 2048, 4, "tpu7x", "tpu7x-standard-4t"),
    "l4-1": ("l4", "1x1", 1, 1, "nvidia-l4", "g2-standard-12"),
    "l4-8": ("l4", "1x8", 1, 8, "nvidia-l4", "g2-standard-96"),
    "a100-40gb-8": ("a100-40gb", "1x8", 1, 8, "nvidia-tesla-a100", "a2-highgpu-8g"),
    "h100-80gb-8": ("h100-80gb", "1x8", 1, 8, "nvidia-h100-80gb", "a3-highgpu-8g"),
    "h100-mega-80gb-8": ("h100-mega-80gb", "1x8", 1, 8, "nvidia-h100-mega-80gb", "a3-megagpu-8g"),
    "h200-141gb-8": ("h200-141gb", "1x8", 1, 8, "nvidia-h200-141gb", "a3-ultragpu-8g"),
    "b200-8": ("b200", "1x8", 1, 8, "nvidia-b200", "a4-highgpu-8g"),
    "gb200-4": ("gb200", "1x4", 1, 4, "nvidia-gb200", "a4x-highgpu-4g"),
    "gb200-4-nolssd": ("gb200", "1x4", 1, 4, "nvidia-gb200", "a4x-highgpu-4g-nolssd"),
}

# TensorCores per chip: the number in a TPU size name counts cores, so chips = number / this.
CORES_PER_CHIP = {"v4": 2, "v5p": 2, "tpu7x": 2, "v5litepod": 1, "v6e": 1}

ALL = list(catalog.device_types().values())


@pytest.mark.parametrize("name", sorted(KNOWN_SHAPES))
def test_known_shapes(name: str) -> None:
    family, topology, hosts, chips, accelerator, machine = KNOWN_SHAPES[name]
    entry = get_device_type(name)
    assert entry.name == name
    assert entry.family == family
    assert entry.topology == topology
    assert entry.hosts_per_slice == hosts
    assert entry.chips_per_host == chips
    assert entry.chips_per_slice == hosts * chips
    assert entry.gke_accelerator == accelerator
    assert entry.machine_type == machine
    assert entry.multi_host is (hosts > 1)


def test_design_doc_facts() -> None:
    """The shapes our design doc states, checked one by one."""
    v4_8 = get_device_type("v4-8")
    assert (v4_8.hosts_per_slice, v4_8.chips_per_host) == (1, 4)
    assert get_device_type("v4-16").hosts_per_slice == 2
    assert get_device_type("v5litepod-16").hosts_per_slice == 4
    assert get_device_type("v5p-16").hosts_per_slice == 2
    assert get_device_type("v5p-16").chips_per_slice == 8  # 16 TensorCores, 2 per chip
    assert get_device_type("v6e-4").hosts_per_slice == 1
    assert get_device_type("v6e-16").chips_per_slice == 16
    assert get_device_type("h100-80gb-8").chips_per_host == 8


@pytest.mark.parametrize("entry", ALL, ids=lambda e: e.name)
def test_entry_invariants(entry: DeviceType) -> None:
    assert entry.hosts_per_slice >= 1
    assert entry.chips_per_host >= 1
    assert entry.chips_per_slice == entry.hosts_per_slice * entry.chips_per_host
    assert entry.multi_host is (entry.hosts_per_slice > 1)
    assert entry.name.startswith(f"{entry.family}-")
    assert entry.name == entry.name.strip().lower()
    assert re.fullmatch(r"\d+(x\d+)+", entry.topology)
    assert get_device_type(entry.name) is entry
    if entry.kind is AcceleratorKind.TPU:
        assert entry.node_label_key == "cloud.google.com/gke-tpu-accelerator"
        assert entry.topology_label_key == "cloud.google.com/gke-tpu-topology"
        assert entry.resource_name == "google.com/tpu"
        # The topology is the chip grid, and the name counts cores (v4, v5p, tpu7x) or chips.
        size = int(entry.name.rsplit("-", 1)[1])
        assert size == entry.chips_per_slice * CORES_PER_CHIP[entry.family]
        assert math.prod(int(s) for s in entry.topology.split("x")) == entry.chips_per_slice
        assert entry.chips_per_host == (1 if entry.chips_per_slice == 1 else 4)
        assert entry.machine_type.endswith(f"-{entry.chips_per_host}t")
    else:
        assert entry.kind is AcceleratorKind.GPU
        assert entry.node_label_key == "cloud.google.com/gke-accelerator"
        assert entry.topology_label_key is None
        assert entry.resource_name == "nvidia.com/gpu"
        assert entry.gke_accelerator.startswith("nvidia-")
        assert entry.hosts_per_slice == 1  # a GPU slice is one VM
        assert entry.topology == f"1x{entry.chips_per_host}"


def test_names_unique_ordered_and_consistent_with_mapping() -> None:
    names = catalog.device_type_names()
    assert len(names) == len(set(names))
    assert tuple(catalog.device_types()) == names
    assert all(catalog.device_types()[n].name == n for n in names)
    # Family by family, and by size within a family.
    families = [catalog.device_types()[n].family for n in names]
    assert list(dict.fromkeys(families)) == list(catalog.families())
    runs = [f for i, f in enumerate(families) if i == 0 or families[i - 1] != f]
    assert runs == list(catalog.families())  # each family's names are contiguous
    for family in catalog.families():
        sizes = [
            int(n.split("-")[-1])
            for n in names
            if catalog.device_types()[n].family == family and n.split("-")[-1].isdigit()
        ]
        assert sizes == sorted(sizes)
    assert catalog.families()[:5] == ("v4", "v5litepod", "v5p", "v6e", "tpu7x")


def test_family_name_counts() -> None:
    by_family: dict[str, int] = {}
    for entry in ALL:
        by_family[entry.family] = by_family.get(entry.family, 0) + 1
    assert by_family == {
        "v4": 68,
        "v5litepod": 6,
        "v5p": 127,
        "v6e": 8,
        "tpu7x": 131,
        "l4": 4,
        "a100-40gb": 4,
        "h100-80gb": 1,
        "h100-mega-80gb": 1,
        "h200-141gb": 1,
        "b200": 1,
        "gb200": 2,
    }


def test_topology_counts_match_xpk() -> None:
    """xpk enumerates 800 v4, 414 v5p and 432 tpu7x multi-chip topologies."""
    topologies = {f.name: f.topologies for f in TPU_FAMILIES}
    assert len(topologies["v4"]) == 800
    assert len(topologies["v5p"]) == 414
    assert len(topologies["tpu7x"]) == 1 + 432  # plus the one-chip 1x1x1
    assert "8x4x4" in topologies["v4"]  # v4 takes every orientation
    assert "8x4x4" not in topologies["v5p"]  # v5p and tpu7x only ascending sides
    for family in TPU_FAMILIES:
        assert len(set(family.topologies)) == len(family.topologies)
        assert family.default_topologies <= set(family.topologies)


def test_spelled_out_topologies() -> None:
    # A shape a size name means resolves to that same entry.
    assert get_device_type("v6e-4x4") is get_device_type("v6e-16")
    assert get_device_type("v5p-2x2x1") is get_device_type("v5p-8")
    assert get_device_type("tpu7x-4x4x4") is get_device_type("tpu7x-128")
    # A shape of the same size but another orientation keeps its own name.
    other = get_device_type("v5p-4x8x16")
    assert other.name == "v5p-4x8x16"
    assert other.topology == "4x8x16"
    assert other.chips_per_slice == 512
    assert get_device_type("v5p-1024").topology == "8x8x8"
    rotated = get_device_type("v4-8x4x4")
    assert (rotated.name, rotated.hosts_per_slice) == ("v4-8x4x4", 32)
    assert get_device_type("v4-256").topology == "4x4x8"
    # A size with no default shape means xpk's first topology of that size.
    assert get_device_type("v4-384").topology == "4x4x12"
    assert get_device_type("v4-12x4x4").name == "v4-12x4x4"
    accepted = catalog.accepted_device_type_names()
    assert set(catalog.device_type_names()) <= accepted
    assert len(accepted) > 2000
    for name in accepted:
        entry = get_device_type(name)
        assert get_device_type(entry.name) is entry


@pytest.mark.parametrize(
    ("spelled", "name"),
    [
        ("V6E-16", "v6e-16"),
        (" v6e-16 ", "v6e-16"),
        ("v6E-16\n", "v6e-16"),
        ("H100-80GB-8", "h100-80gb-8"),
        ("V5P-4X4X4", "v5p-128"),
        ("Gb200-4-NoLSSD", "gb200-4-nolssd"),
    ],
)
def test_case_and_blank_tolerant(spelled: str, name: str) -> None:
    assert get_device_type(spelled).name == name


def _error(name: str) -> str:
    with pytest.raises(InvalidInputError) as caught:
        get_device_type(name)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("unknown device type ")
    assert caught.value.exit_code == 2
    return message


@pytest.mark.parametrize(
    ("wrong", "suggested"),
    [
        ("v6e-17", ["v6e-16", "v6e-32"]),
        ("h100-80gb-7", ["h100-80gb-8"]),
        ("v5p-17", ["v5p-16", "v5p-32"]),
        ("v5e-16", ["v5litepod-16"]),
        ("v7x-8", ["tpu7x-8"]),
        ("h100-8", ["h100-80gb-8"]),
        ("v5p-8x4x4", ["v5p-4x4x8"]),
        ("v6e-3x3", ["v6e-2x4", "v6e-4x4"]),
        ("v6e", ["v6e-1", "v6e-4", "v6e-8"]),
        ("v5litpod-16", ["v5litepod-16"]),
    ],
)
def test_suggestions(wrong: str, suggested: list[str]) -> None:
    message = _error(wrong)
    assert f"did you mean {', '.join(suggested)}?" in message
    assert repr(wrong) in message


def test_v6e_17_suggests_v6e_16_first() -> None:
    assert "did you mean v6e-16" in _error("v6e-17")


@pytest.mark.parametrize("garbage", ["qwerty", "", "   ", "-", "x" * 200, "🙂"])
def test_garbage_gets_one_line_listing_families(garbage: str) -> None:
    message = _error(garbage)
    for family in catalog.families():
        assert family in message
    assert len(message) < 400 + len(garbage)


def test_catalog_is_read_only() -> None:
    with pytest.raises(TypeError):
        catalog.device_types()["v6e-16"] = ALL[0]  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        get_device_type("v6e-16").hosts_per_slice = 2  # type: ignore[misc]


def test_accelerator_kind_values() -> None:
    assert AcceleratorKind("tpu") is AcceleratorKind.TPU
    assert AcceleratorKind.GPU == "gpu"


def test_api_layer_imports_nothing_else_from_hotswap() -> None:
    def imported(module: object) -> set[str]:
        source = Path(module.__file__).read_text()  # type: ignore[attr-defined]
        return set(re.findall(r"^\s*(?:from|import)\s+(hotswap[\w.]*)", source, re.MULTILINE))

    assert imported(catalog) <= {"hotswap.api.errors", "hotswap.api.device_tables"}
    assert imported(device_tables) == set()


def test_import_is_cheap() -> None:
    """The CLI must start fast; importing the catalog stays well below its budget."""
    src = Path(catalog.__file__).parents[2]
    code = (
        "import time, dataclasses, enum, re, difflib\n"
        "t = time.perf_counter()\n"
        "import hotswap.api.catalog\n"
        "print(time.perf_counter() - t)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": str(src)},
    )
    assert float(out.stdout) < 0.1
