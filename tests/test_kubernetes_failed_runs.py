"""Issue 34: a run that FAILED is never resumed automatically, whichever machine creates the
workload again. The cluster holds the record (ConfigMap ``hotswap-failed-runs-<cluster>``,
backends/kubernetes/failed_runs.py), written by the controller (as its own ServiceAccount,
with the Role ``hotswap controller manifests`` renders) or by ``workload delete``; each
"machine" here is a fresh HOTSWAP_HOME (its own registry and log archive)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from k8s_fixtures.scenario import make_world, run_until, running
from k8s_fixtures.world.rbac import CLUSTER_ROLE_BINDINGS, CLUSTER_ROLES, ROLE_BINDINGS, ROLES, SERVICE_ACCOUNTS, token_of
from k8s_fixtures.world.apiserver import add_condition
from k8s_fixtures.world.store import CONFIG_MAPS, JOBSETS
from test_kubernetes_cli import hotswap

from hotswap.api import worker as contract
from hotswap.backends.kubernetes import labels
from hotswap.backends.kubernetes.controller.loop import KubeController
from hotswap.backends.kubernetes.render.controller import render_controller_manifests
from hotswap.backends.kubernetes.settings import KubeSettings

CLUSTER = "trillium"
CREATE = ("workload", "create", "--cluster", CLUSTER, "--workload", "job", "--device-type", "v6e-16", "--checkpoint-volume", "pvc:ckpt",
          "--command", "python3 train.py")
RECORD = labels.FAILED_RUNS_RECORD_PREFIX + CLUSTER


def _machine(tmp_path: Path, world: Any, name: str) -> tuple[Path, dict[str, str]]:
    """A machine of its own (HOTSWAP_HOME) that knows the cluster (``cluster create``)."""
    home = tmp_path / name
    env = {"KUBECONFIG": world.kubeconfig}
    created = hotswap(home, "cluster", "create", "--backend", "kubernetes", "--cluster", CLUSTER, "--context", "world", env=env)
    assert created.returncode == 0, created.stderr
    return home, env


def _controller_as_its_service_account(world: Any, earlier_role: bool = False) -> KubeController:
    """The controller with exactly the RBAC ``hotswap controller manifests`` gives it
    (``earlier_role``: without the ConfigMap rules, as an earlier release rendered it)."""
    settings = KubeSettings(namespace=world.namespace)
    kinds = {"ServiceAccount": SERVICE_ACCOUNTS, "ClusterRole": CLUSTER_ROLES, "ClusterRoleBinding": CLUSTER_ROLE_BINDINGS,
             "Role": ROLES, "RoleBinding": ROLE_BINDINGS}
    for obj in render_controller_manifests(CLUSTER, settings, "hotswap:test"):
        if obj["kind"] == "Role" and earlier_role:
            obj["rules"] = [rule for rule in obj["rules"] if "configmaps" not in rule["resources"]]
        if obj["kind"] in kinds:
            world.store.create(kinds[obj["kind"]], obj)
    client = world.client(settings)
    configuration = client.api_client.configuration
    configuration.refresh_api_key_hook = None  # the kubeconfig's loader would put the admin's token back
    configuration.api_key["BearerToken"] = f"Bearer {token_of(world.namespace, labels.CONTROLLER_NAME)}"
    client.sleep = lambda _: None
    logs: list[str] = []
    controller = KubeController(client, CLUSTER, clock=lambda: world.clock.now, log=logs.append)
    controller.logs = logs  # type: ignore[attr-defined]
    return controller


def _worker_env(world: Any) -> dict[str, str]:
    [container] = world.jobset("job")["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e.get("value") for e in container["env"]}


def _recorded(world: Any) -> dict[str, dict[str, Any]]:
    config_map = world.store.get(CONFIG_MAPS, world.namespace, RECORD) or {}
    return {key: json.loads(value) for key, value in (config_map.get("data") or {}).items()}


def test_a_run_failed_on_one_machine_is_not_resumed_by_a_create_from_another(tmp_path: Path) -> None:
    """Machine A creates; the workers exit 1 (not a restart code): the controller fails the run
    and, as its ServiceAccount, records it. The JobSet is deleted with kubectl (no archive on
    any machine). Machine B's create tells its pods that run failed, so `auto` never resumes
    it (its SIGTERM save is marked `resume`)."""
    world = make_world()
    try:
        controller = _controller_as_its_service_account(world)
        home_a, env = _machine(tmp_path, world, "machine-a")
        assert hotswap(home_a, *CREATE, env=env).returncode == 0
        failed_run = world.jobset("job")["metadata"]["labels"][labels.RUN_ID_LABEL]
        run_until(world, controller, lambda: running(world, "job") == 4)
        world.exit(world.running("job"), 1)
        run_until(world, controller, lambda: world.state("job")["phase"] == "FAILED" and bool(_recorded(world)), limit_s=120)
        [(key, value)] = _recorded(world).items()
        assert key == f"job.{failed_run}" and value["workload"] == "job" and value["run_id"] == failed_run
        assert "exit code 1" in value["why"]
        assert not [line for line in controller.logs if "forbidden" in line.lower()]
        world.advance(60, controller)  # later rounds write nothing more
        assert len(_recorded(world)) == 1

        world.client().delete_jobset("job")  # kubectl delete jobset job: no hotswap delete anywhere
        run_until(world, controller, lambda: world.store.get(JOBSETS, world.namespace, "job") is None and not world.pods_of("job", live=False))
        home_b, env_b = _machine(tmp_path, world, "machine-b")
        assert not (home_b / "clusters" / CLUSTER / "logs").exists()  # B archived nothing
        created = hotswap(home_b, *CREATE, env=env_b)
        assert created.returncode == 0, created.stderr
        told = _worker_env(world)
        assert told[contract.HOTSWAP_RESUME_FROM] == "auto" and told[contract.HOTSWAP_FAILED_RUNS] == failed_run
    finally:
        world.close()


def test_workload_delete_records_a_failed_run_for_every_machine_without_a_controller(tmp_path: Path) -> None:
    """No controller saw the failure (JobSet's own Failed condition): machine A's `workload
    delete` writes the record before the JobSet goes; machine B's create names the run. Writing
    it again (a second failed run, recorded twice) adds only what is new."""
    world = make_world()
    try:
        home_a, env = _machine(tmp_path, world, "machine-a")
        failed: list[str] = []
        for _ in range(2):
            assert hotswap(home_a, *CREATE, env=env).returncode == 0
            failed.append(world.jobset("job")["metadata"]["labels"][labels.RUN_ID_LABEL])
            with world.store.lock:  # JobSet's controller gave up on it (its own failure policy)
                jobset = world.store.peek(JOBSETS, world.namespace, "job")
                add_condition(jobset, "Failed", "True", "FailedJobs", "jobset failed", world.clock)
                world.store.write(JOBSETS, jobset)
            assert hotswap(home_a, "workload", "delete", "--cluster", CLUSTER, "--workload", "job", env=env).returncode == 0
            world.settle()
        assert sorted(_recorded(world)) == [f"job.{run}" for run in sorted(failed)]
        assert world.store.get(CONFIG_MAPS, world.namespace, RECORD)["metadata"].get("ownerReferences") is None  # outlives the JobSets

        home_b, env_b = _machine(tmp_path, world, "machine-b")
        assert hotswap(home_b, *CREATE, env=env_b).returncode == 0
        assert _worker_env(world)[contract.HOTSWAP_FAILED_RUNS] == ",".join(sorted(failed))
    finally:
        world.close()


def test_a_controller_with_an_earlier_role_says_so_once_and_goes_on(tmp_path: Path) -> None:
    """Its Role cannot read or write the record: one warning naming the fix, and the failure is
    still judged and acted on (the workload FAILED, its pods gone); nothing is recorded."""
    world = make_world()
    try:
        controller = _controller_as_its_service_account(world, earlier_role=True)
        home, env = _machine(tmp_path, world, "machine-a")
        assert hotswap(home, *CREATE, env=env).returncode == 0
        run_until(world, controller, lambda: running(world, "job") == 4)
        world.exit(world.running("job"), 1)
        run_until(world, controller, lambda: world.state("job")["phase"] == "FAILED" and not world.pods_of("job"), limit_s=120)
        world.advance(60, controller)
        warnings = [line for line in controller.logs if "configmaps" in line]
        assert len(warnings) == 1 and "apply `hotswap controller manifests` again" in warnings[0], controller.logs
        assert _recorded(world) == {}
    finally:
        world.close()
