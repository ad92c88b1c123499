"""Pinned versions: one place says which JobSet and Kueue hotswap supports
(``backends/kubernetes/versions.py``), and ``cluster create`` checks the installed ones through
the API (controller image tag, CRD schema, served API versions) and says exactly what to
upgrade."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from k8s_fixtures.scenario import make_world
from k8s_fixtures.world import jobset_crd
from k8s_fixtures.world.apiserver import Fault
from k8s_fixtures.world.store import KUEUE_RESOURCES
from test_kubernetes_cli import hotswap

from hotswap.backends.kubernetes import versions
from hotswap.backends.kubernetes.labels import JOBSET_API_VERSION, KUEUE_API_VERSION

UPGRADE_JOBSET = "kubectl apply --server-side -f https://github.com/kubernetes-sigs/jobset/releases/download/v0.12.0/manifests.yaml"


def test_the_pinned_versions_are_stated_once_and_match_the_tests_schemas() -> None:
    assert (versions.JOBSET.supported, versions.KUEUE.supported) == ("v0.12.0", "v0.19.2")
    assert f"{versions.JOBSET.group}/{versions.JOBSET.api_version}" == JOBSET_API_VERSION
    assert f"{versions.KUEUE.group}/{versions.KUEUE.api_version}" == KUEUE_API_VERSION
    readme = (Path(__file__).resolve().parent / "k8s_fixtures" / "crds" / "README.md").read_text()
    assert "v0.12.0" in readme and "v0.19.2" in readme
    assert versions.JOBSET.install() == UPGRADE_JOBSET


@pytest.mark.parametrize(("release", "expected"), [("v0.12.0", (0, 12, 0)), ("v0.11.1", (0, 11, 0)), ("v0.10.1", (0, 10, 0)), ("v0.9.1", None)])
def test_a_jobset_release_is_recognised_by_its_crd(release: str, expected: tuple[int, int, int] | None) -> None:
    assert versions.from_jobset_crd(jobset_crd(release)) == expected


def test_image_tags() -> None:
    assert versions.from_image("registry.k8s.io/jobset/jobset:v0.12.0") == (0, 12, 0)
    assert versions.from_image("us-central1-docker.pkg.dev/k8s-staging-images/kueue/kueue:v0.19.2-rc.1") == (0, 19, 2)
    assert versions.from_image("registry.k8s.io/jobset/jobset@sha256:abcdef") is None


def create(tmp_path: Path, world, *extra: str):
    env = {"KUBECONFIG": world.kubeconfig}
    return hotswap(tmp_path, "cluster", "create", "--backend", "kubernetes", "--cluster", "trillium", "--output", "json", *extra, env=env)


def test_cluster_create_accepts_the_pinned_versions_and_reports_them(tmp_path: Path) -> None:
    world = make_world(kueue=True)
    try:
        result = create(tmp_path, world, "--kueue")
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout)["installed"] == ["JobSet v0.12.0; supported v0.12.0", "Kueue v0.19.2; supported v0.19.2"]
    finally:
        world.close()


@pytest.mark.parametrize("release", ["v0.10.1", "v0.8.1"])
def test_cluster_create_refuses_an_old_jobset_and_names_the_upgrade(tmp_path: Path, release: str) -> None:
    world = make_world(jobset_version=release)
    try:
        result = create(tmp_path, world)
        assert result.returncode != 0 and result.stdout == ""
        (line,) = result.stderr.strip().splitlines()
        assert f"JobSet {release} is installed; hotswap needs JobSet >= v0.11.0" in line
        assert "jobset#1077" in line and line.endswith(UPGRADE_JOBSET)
        assert not (tmp_path / "clusters" / "trillium").exists()  # a refused command records nothing
    finally:
        world.close()


def test_without_the_controllers_deployment_the_crd_tells(tmp_path: Path) -> None:
    """The user may not read the jobset-system namespace: the CRD's schema is the evidence."""
    world = make_world(jobset_version="v0.9.1")
    try:
        world.api.faults.append(Fault("GET", "/apis/apps/v1/namespaces/jobset-system", 403, reason="Forbidden", message="deployments.apps is forbidden"))
        result = create(tmp_path, world)
        assert result.returncode != 0
        assert "JobSet on this cluster is older than v0.10" in result.stderr and UPGRADE_JOBSET in result.stderr
    finally:
        world.close()


def test_when_nothing_can_be_read_it_says_so(tmp_path: Path) -> None:
    world = make_world()
    try:
        world.api.faults.append(Fault("GET", "/apis/apps/v1/namespaces/jobset-system", 403, reason="Forbidden", message="deployments.apps is forbidden"))
        world.api.faults.append(Fault("GET", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", 403, reason="Forbidden", message="customresourcedefinitions is forbidden"))
        result = create(tmp_path, world)
        assert result.returncode == 0, result.stderr
        (note,) = json.loads(result.stdout)["installed"]
        assert note.startswith("JobSet version unknown; supported v0.12.0 (could not read its controller's Deployment")
    finally:
        world.close()


def test_cluster_create_says_which_kueue_to_install(tmp_path: Path) -> None:
    world = make_world(kueue=True)
    try:
        for resource in KUEUE_RESOURCES:
            world.store.unserve(resource)  # Kueue older than v0.15 serves no v1beta2
        result = create(tmp_path, world, "--kueue")
        assert result.returncode != 0
        assert result.stderr.strip() == (
            "error: the API kueue.x-k8s.io/v1beta2 is not installed on this cluster; install Kueue v0.19.2:"
            " kubectl apply --server-side -f https://github.com/kubernetes-sigs/kueue/releases/download/v0.19.2/manifests.yaml"
        )
    finally:
        world.close()


def test_an_old_jobset_server_silently_prunes_fields_it_does_not_know() -> None:
    """Why the version matters (issue 12, item 2): a JobSet v0.9 API server drops
    ``onJobFailureMessagePatterns`` without a word, so a rule meant for disruptions would
    match every failure. The world prunes as the API server does."""
    world = make_world(jobset_version="v0.9.1")
    try:
        rule = {"name": "disruptions", "action": "RestartJobSetAndIgnoreMaxRestarts", "onJobFailureReasons": ["PodFailurePolicy"],
                "onJobFailureMessagePatterns": ["has condition DisruptionTarget"]}
        jobset = {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": "old", "namespace": "default"},
                  "spec": {"failurePolicy": {"maxRestarts": 1, "rules": [rule]},
                           "replicatedJobs": [{"name": "slice", "replicas": 1, "template": {"spec": {"template": {"spec": {"containers": [{"name": "c", "image": "x"}]}}}}}]}}
        stored = world.apply(jobset)
        assert stored["spec"]["failurePolicy"]["rules"][0] == {k: v for k, v in rule.items() if k != "onJobFailureMessagePatterns"}
    finally:
        world.close()
