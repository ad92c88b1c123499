"""Discovery: recorded GKE Node objects -> slices (node pools), device types, node states."""

from __future__ import annotations

import copy

from k8s_fixtures.world import load_nodes, set_ready

from hotswap.api.cluster import NodeState
from hotswap.backends.kubernetes.discovery import device_type_of, discover, node_state
from hotswap.backends.kubernetes.settings import KubeSettings

SETTINGS = KubeSettings()


def test_multi_host_tpu_node_pools_are_slices_and_system_pools_are_ignored() -> None:
    nodes = load_nodes()
    found = discover(nodes, SETTINGS)
    assert [s.name for s in found.slices] == ["tpu-v6e-np-0", "tpu-v6e-np-1", "tpu-v6e-np-2"]
    assert found.slices_by_type() == {"v6e-16": 3}
    first = found.slices[0]
    assert len(first.nodes) == 4 and first.pin == {"cloud.google.com/gke-nodepool": "tpu-v6e-np-0"}
    assert [found.nodes[n].host for n in first.nodes] == [0, 1, 2, 3]
    assert found.ignored == ("gke-hotswap-default-pool-8f2a1c3e-x7k2",)
    assert all(n.state is NodeState.READY for n in found.nodes.values())


def test_node_states_from_conditions_cordon_and_taints() -> None:
    node = load_nodes()[0]
    assert node_state(node) is NodeState.READY
    broken = copy.deepcopy(node)
    set_ready(broken, False)
    assert node_state(broken) is NodeState.FAILED
    false_ready = copy.deepcopy(node)
    next(c for c in false_ready["status"]["conditions"] if c["type"] == "Ready")["status"] = "False"
    assert node_state(false_ready) is NodeState.FAILED
    no_conditions = copy.deepcopy(node)
    no_conditions["status"]["conditions"] = []
    assert node_state(no_conditions) is NodeState.FAILED
    cordoned = copy.deepcopy(node)
    cordoned["spec"]["unschedulable"] = True
    assert node_state(cordoned) is NodeState.CORDONED
    maintenance = copy.deepcopy(node)
    maintenance["spec"]["taints"].append({"key": "cloud.google.com/impending-node-termination", "effect": "NoSchedule"})
    assert node_state(maintenance) is NodeState.CORDONED
    # GKE's own TPU taint only says who may run there.
    assert node["spec"]["taints"] == [{"effect": "NoSchedule", "key": "google.com/tpu", "value": "present"}]
    both = copy.deepcopy(cordoned)
    set_ready(both, False)
    assert node_state(both) is NodeState.FAILED  # a machine that is gone is Failed, cordoned or not


def test_a_pool_missing_a_host_is_unhealthy_until_whole() -> None:
    nodes = [n for n in load_nodes() if n["metadata"]["name"] != "gke-tpu-e-np-1-bn5d"]
    found = discover(nodes, SETTINGS)
    pool = next(s for s in found.slices if s.name == "tpu-v6e-np-1")
    assert len(pool.nodes) == 4 and not found.healthy("tpu-v6e-np-1")
    placeholder = found.nodes[pool.nodes[-1]]
    assert placeholder.placeholder and placeholder.state is NodeState.FAILED


def test_single_host_tpus_and_gpus_are_one_node_per_slice() -> None:
    found = discover(load_nodes("gke_single_host_nodes.yaml"), SETTINGS)
    by_name = {s.name: s for s in found.slices}
    tpu = by_name["gke-tpu-v6e4-pool-2b91-q8zt"]
    assert tpu.device_type == "v6e-4" and tpu.pin == {"kubernetes.io/hostname": "gke-tpu-v6e4-pool-2b91-q8zt"}
    gpu = by_name["gke-hotswap-a3-pool-6d0f2a91-m4cz"]
    assert gpu.device_type == "h100-80gb-8" and gpu.node_pool == "a3-pool"


def test_configurable_label_keys_and_unknown_shapes() -> None:
    node = copy.deepcopy(load_nodes()[0])
    labels = node["metadata"]["labels"]
    labels["example.com/accel"] = labels.pop("cloud.google.com/gke-tpu-accelerator")
    labels["example.com/topo"] = labels.pop("cloud.google.com/gke-tpu-topology")
    assert device_type_of(node, SETTINGS) is None
    custom = KubeSettings(accelerator_label="example.com/accel", topology_label="example.com/topo")
    assert device_type_of(node, custom).name == "v6e-16"
    labels["example.com/topo"] = "3x7"
    assert device_type_of(node, custom) is None
