"""Rendering: every object the Kubernetes backend renders is valid against the real schemas (the
JobSet v0.12.0 and Kueue v0.19.2 CRDs kept in k8s_fixtures/crds, core objects with
kubernetes-validate), and seed 000's two JobSets render as the golden files."""

from __future__ import annotations

import copy
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml
from k8s_fixtures.world import load_crd

from hotswap.api import worker as contract
from hotswap.api.errors import InvalidInputError
from hotswap.api.spec import WorkloadSpec, workload_spec
from hotswap.backends.kubernetes import labels
from hotswap.backends.kubernetes.checkpoint_volume import parse_checkpoint_volume
from hotswap.backends.kubernetes.render import (
    render_controller_manifests,
    render_jobset,
    render_kueue,
    render_priority_classes,
)
from hotswap.backends.kubernetes.render.container import container_command
from hotswap.backends.kubernetes.settings import KubeSettings

FIXTURES = Path(__file__).resolve().parent / "k8s_fixtures"
KUBERNETES_VERSION = "1.30.0"  # the oldest version whose gated pods may gain node selectors
SEED_COMMAND = (
    "python3 MaxText/train.py MaxText/configs/base.yml model_name=llama2-7b run_name={level}-run steps=300"
    " base_output_directory=gs://my-output-bucket dataset_path=gs://max-datasets-rogue max_target_length=4096"
    " dataset_type=synthetic enable_checkpointing=False"
)
_VALIDATORS: dict[tuple[str, str], Any] = {}


def validate_crd(obj: dict[str, Any], filename: str) -> None:
    """Against the CRD of the pinned version (the copy in k8s_fixtures/crds: it never skips)."""
    import jsonschema

    version = obj["apiVersion"].rpartition("/")[2]
    if (filename, version) not in _VALIDATORS:
        crd = load_crd(filename)
        schema = next(v["schema"]["openAPIV3Schema"] for v in crd["spec"]["versions"] if v["name"] == version)
        _VALIDATORS[(filename, version)] = jsonschema.Draft7Validator(schema)
    _VALIDATORS[(filename, version)].validate(obj)


def validate_core(obj: dict[str, Any]) -> None:
    import kubernetes_validate

    kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


def seed_spec(level: str) -> WorkloadSpec:
    return workload_spec(
        name=f"{level}-jax-trillium",
        command=SEED_COMMAND.format(level=level),
        device_type="v6e-16",
        num_slices=2 if level == "high" else 1,
        priority=level,
        max_restarts=10,
        restart_strategy="BlockingRecreate",
        docker_image="us-docker.pkg.dev/my-project/maxtext/runner:latest",
    )


SPECS = {
    "seed-high": seed_spec("high"),
    "seed-low": seed_spec("low"),
    "single-host-elastic-env": workload_spec(
        name="small", command="cd /app && python train.py", device_type="v6e-4", num_slices=3, min_slices=2,
        priority="very-low", env={"FOO": "bar"}, termination_grace_period_s=90.5,
        restart_on_exit_codes="1-255",
    ),
    "gpu": workload_spec(name="gpt", command="torchrun train.py", device_type="h100-80gb-8", num_slices=4, priority="very-high"),
    "v5p": workload_spec(name="p", command="python3 -m train", device_type="v5p-128", checkpoint_dir="gs://b/ckpt"),
}
SETTINGS = {
    "default": KubeSettings(),
    "kueue": KubeSettings(kueue=True, namespace="ml", local_queue="team-a"),
}


def pod_of(jobset: dict[str, Any], index: int = 0) -> dict[str, Any]:
    template = jobset["spec"]["replicatedJobs"][index]["template"]["spec"]["template"]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", **copy.deepcopy(template["metadata"])}, "spec": copy.deepcopy(template["spec"])}


def job_of(jobset: dict[str, Any], index: int = 0) -> dict[str, Any]:
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j"}, "spec": copy.deepcopy(jobset["spec"]["replicatedJobs"][index]["template"]["spec"])}


@pytest.mark.parametrize("settings", SETTINGS.values(), ids=SETTINGS)
@pytest.mark.parametrize("spec", SPECS.values(), ids=SPECS)
def test_jobset_is_valid_against_the_jobset_crd_and_core_schemas(spec: WorkloadSpec, settings: KubeSettings) -> None:
    volume = parse_checkpoint_volume("pvc:checkpoints") if spec.elastic else None
    jobset = render_jobset(spec, "c", settings, volume)
    validate_crd(jobset, "jobset.x-k8s.io_jobsets.yaml")
    for index in range(len(jobset["spec"]["replicatedJobs"])):  # the slices' and an elastic one's coordinator
        validate_core(job_of(jobset, index))  # the Job template: podFailurePolicy, Indexed completion
        validate_core(pod_of(jobset, index))  # the pod: env, volumes, gates, node selector, lifecycle


def test_jobset_crd_schema_rejects_what_jobset_would_reject() -> None:
    """The validation has teeth: a wrong restart strategy, a rule without a name, an unknown
    success operator fail."""
    import jsonschema
    import kubernetes_validate

    jobset = render_jobset(SPECS["single-host-elastic-env"], "c", KubeSettings())
    broken = copy.deepcopy(jobset)
    broken["spec"]["failurePolicy"]["restartStrategy"] = "Sometimes"
    with pytest.raises(jsonschema.ValidationError):
        validate_crd(broken, "jobset.x-k8s.io_jobsets.yaml")
    broken = copy.deepcopy(jobset)
    broken["spec"]["failurePolicy"]["rules"] = [{"action": "FailJobSet"}]
    with pytest.raises(jsonschema.ValidationError):
        validate_crd(broken, "jobset.x-k8s.io_jobsets.yaml")
    broken = copy.deepcopy(jobset)
    broken["spec"]["successPolicy"] = {"operator": "Most", "targetReplicatedJobs": [contract.REPLICATED_JOB]}
    with pytest.raises(jsonschema.ValidationError):
        validate_crd(broken, "jobset.x-k8s.io_jobsets.yaml")
    pod = pod_of(jobset)
    pod["spec"]["hostnetwork"] = True  # a misspelt field: strict validation catches it
    with pytest.raises(kubernetes_validate.ValidationError):
        validate_core(pod)


@pytest.mark.parametrize("level", ["high", "low"])
def test_seed_000_jobsets_render_as_the_golden_files(level: str) -> None:
    golden = yaml.safe_load((FIXTURES / "golden" / f"seed000_{level}.yaml").read_text())
    assert render_jobset(seed_spec(level), "trillium", KubeSettings()) == golden


def _contains(big: Any, small: Any, path: str = "") -> list[str]:
    """Where ``small`` is not a part of ``big`` (dicts by key, lists item by item)."""
    if isinstance(small, dict):
        if not isinstance(big, dict):
            return [path]
        return [m for key, value in small.items() for m in (_contains(big[key], value, f"{path}.{key}") if key in big else [f"{path}.{key}"])]
    if isinstance(small, list):
        if not isinstance(big, list) or len(big) < len(small):
            return [path]
        return [m for i, item in enumerate(small) for m in _contains(big[i], item, f"{path}[{i}]")]
    return [] if big == small else [path]


EXCLUSIVE_TOPOLOGY = "alpha.jobset.sigs.k8s.io/exclusive-topology"


@pytest.mark.parametrize("kueue", [False, True], ids=["hotswap-admits", "kueue"])
def test_golden_renders_carry_everything_seed_000_asks_for(kueue: bool) -> None:
    """Every field of the published JobSets is in the render, except deliberate changes: xpk's
    PriorityClass names, the container's name, the /bin/sh prelude before the command (it
    computes RANK and execs the same argv), JobSet's exclusive placement, which hotswap's
    pinning of every pod to a whole healthy slice replaces, and backoffLimit: one per host, so
    that a kubelet's rejection (no exit code) is hotswapped, not a Job failure (see render/jobset.py)."""
    seeds = {doc["metadata"]["name"]: doc for doc in yaml.safe_load_all((FIXTURES / "seed000_jobsets.yaml").read_text())}
    for level in ("high", "low"):
        seed = copy.deepcopy(seeds[f"{level}-jax-trillium"])
        rendered = render_jobset(seed_spec(level), "trillium", KubeSettings(kueue=kueue))
        pod = seed["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
        assert seed["spec"]["replicatedJobs"][0]["template"]["spec"].pop("backoffLimit") == 0
        assert rendered["spec"]["replicatedJobs"][0]["template"]["spec"]["backoffLimit"] == 4  # v6e-16: 4 hosts
        assert pod.pop("priorityClassName") == f"{level}-priority-job"
        container = pod["containers"][0]
        assert container.pop("name") == "jax-program"
        seed_argv = container.pop("command")
        assert seed["metadata"].pop("annotations") == {EXCLUSIVE_TOPOLOGY: "cloud.google.com/gke-nodepool"}
        assert EXCLUSIVE_TOPOLOGY not in rendered["metadata"]["annotations"]
        assert _contains(rendered, seed) == []
        ours = rendered["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
        assert ours["priorityClassName"] == level
        assert ours["containers"][0]["command"][-len(seed_argv):] == seed_argv


def test_exits_and_disruptions_are_the_controllers_to_judge() -> None:
    """No exit and no disruption fails a Job (so JobSet neither fails nor restarts the JobSet
    for a collateral exit): every pod failure is ignored by the Job and judged by the
    controller; JobSet's policy keeps only maxRestarts and the restart strategy."""
    spec = workload_spec(name="w", command="x", device_type="v6e-16", restart_on_exit_codes="42", max_restarts=7, restart_strategy="BlockingRecreate")
    jobset = render_jobset(spec, "c", KubeSettings())
    assert jobset["spec"]["failurePolicy"] == {"maxRestarts": 7, "restartStrategy": "BlockingRecreate"}
    job = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]
    assert job["backoffLimit"] == 4  # only a kubelet's rejection (no exit code) counts: one per host, hotswapped meanwhile
    assert job["podFailurePolicy"]["rules"] == [
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
        {"action": "Ignore", "onExitCodes": {"containerName": "worker", "operator": "NotIn", "values": [0]}},
    ]
    assert "successPolicy" not in jobset["spec"]  # JobSet's default: every replica's Job completes
    elastic = render_jobset(SPECS["single-host-elastic-env"], "c", KubeSettings())
    # Never Any: JobSet would complete an elastic JobSet when its first replica finishes and
    # delete the others mid-checkpoint. A scaled-down one is completed by the controller. All of
    # the slices only: its coordinator (the JAX coordination service) never exits by itself.
    assert elastic["spec"]["successPolicy"] == {"operator": "All", "targetReplicatedJobs": ["slice"]}


def test_an_elastic_jobset_runs_the_jax_coordination_service_on_no_slice() -> None:
    """An elastic JobSet has a ``coordinator`` replicated job: one CPU-only pod, kept off every
    accelerator node, serving every generation from the membership file; the workers are told
    its stable DNS name, so that the loss of slice 0's node leaves the service running. Its
    failures are the Job's to replace and never count against maxRestarts."""
    spec = SPECS["single-host-elastic-env"]
    settings = KubeSettings()
    jobset = render_jobset(spec, "c", settings)
    slices, coordinator = jobset["spec"]["replicatedJobs"]
    assert (slices["name"], coordinator["name"], coordinator["replicas"]) == ("slice", "coordinator", 1)
    job = coordinator["template"]["spec"]
    assert (job["parallelism"], job["completions"], job["completionMode"]) == (1, 1, "Indexed")
    assert all(rule["action"] == "Ignore" for rule in job["podFailurePolicy"]["rules"])
    pod = job["template"]["spec"]
    (container,) = pod["containers"]
    assert container["command"] == [
        "python3", "-m", "hotswap.train.jax.coordinator", "--every-generation", "/etc/hotswap/membership.json", "100"
    ]
    assert "resources" not in container and "nodeSelector" not in pod
    # No accelerator taint tolerated; evicted from a node that stopped answering after 30 s.
    assert pod["tolerations"] == [
        {"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 30}
        for key in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")
    ]
    assert "schedulingGates" not in pod  # nothing for the controller to place
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [{"matchExpressions": [
        {"key": label, "operator": "DoesNotExist"} for label in sorted({settings.accelerator_label, settings.gpu_accelerator_label})
    ]}]
    assert pod["volumes"] == [v for v in pod_of(jobset)["spec"]["volumes"] if v["name"] == "hotswap-membership"]
    assert jobset["spec"]["failurePolicy"]["rules"] == [
        {"name": "coordinator", "action": "RestartJobSetAndIgnoreMaxRestarts", "targetReplicatedJobs": ["coordinator"]}
    ]
    env = {e["name"]: e.get("value") for e in pod_of(jobset)["spec"]["containers"][0]["env"]}
    assert env[contract.HOTSWAP_JAX_COORDINATOR] == "small-coordinator-0-0.small"
    rigid = render_jobset(SPECS["seed-high"], "c", settings)
    assert [j["name"] for j in rigid["spec"]["replicatedJobs"]] == ["slice"]
    assert contract.HOTSWAP_JAX_COORDINATOR not in {e["name"] for e in pod_of(rigid)["spec"]["containers"][0]["env"]}


def test_worker_environment_follows_the_contract() -> None:
    spec = SPECS["single-host-elastic-env"]
    jobset = render_jobset(spec, "c", KubeSettings(), parse_checkpoint_volume("gcsfuse:my-ckpts"))
    pod = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in pod["spec"]["containers"][0]["env"]}
    assert env[contract.JOB_INDEX] == {"fieldRef": {"fieldPath": "metadata.labels['jobset.sigs.k8s.io/job-index']"}}
    assert env[contract.MEGASCALE_SLICE_ID] == env[contract.JOB_INDEX]
    assert env[contract.JOB_COMPLETION_INDEX]["fieldRef"]["fieldPath"] == "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    assert env[contract.HOTSWAP_RESTART_COUNT]["fieldRef"]["fieldPath"] == "metadata.annotations['hotswap.dev/restart-count']"
    assert env[contract.MASTER_ADDR] == "small-slice-0-0.small"
    assert (env[contract.WORLD_SIZE], env[contract.MEGASCALE_NUM_SLICES], env[contract.HOTSWAP_HOSTS_PER_SLICE]) == ("3", "3", "1")
    assert env[contract.HOTSWAP_CHECKPOINT_DIR] == "/checkpoints/c/small"
    assert env[contract.HOTSWAP_TERMINATION_GRACE_S] == "90.5"
    assert env["FOO"] == "bar"
    assert env[contract.HOTSWAP_MEMBERSHIP_FILE] == "/etc/hotswap/membership.json"
    assert pod["metadata"]["annotations"] == {"gke-gcsfuse/volumes": "true"}
    assert pod["spec"]["terminationGracePeriodSeconds"] == 91



def run_prelude(argv: list[str], environ: dict[str, str]) -> str:
    import subprocess

    shell, flag, script, *rest = argv
    probe = script.replace('exec "$@"', 'echo "$RANK $HOTSWAP_ATTEMPT $*"')
    if probe == script:
        probe = script.rsplit("\n", 1)[0] + '\necho "$RANK $HOTSWAP_ATTEMPT"'
    return subprocess.run([shell, flag, probe, *rest], env=environ, capture_output=True, text=True, check=True).stdout.strip()


def test_command_prelude_computes_rank_and_execs_simple_commands() -> None:
    argv = container_command("python3 train.py --lr 'a b'")
    env = {"JOB_INDEX": "1", "JOB_COMPLETION_INDEX": "2", "HOTSWAP_HOSTS_PER_SLICE": "4", "HOTSWAP_RESTART_COUNT": "3", "PATH": "/usr/bin:/bin"}
    assert run_prelude(argv, env) == "6 4 python3 train.py --lr a b"
    assert argv[-4:] == shlex.split("python3 train.py --lr 'a b'")
    # A command that needs a shell runs in it; a preStop hook passes SIGTERM on (see render/container.py).
    shell_argv = container_command("cd /app && python train.py")
    assert shell_argv[2].endswith("cd /app && python train.py")
    assert run_prelude(shell_argv, {**env, "HOTSWAP_RESTART_COUNT": ""}) == "6 1"
    jobset = render_jobset(SPECS["single-host-elastic-env"], "c", KubeSettings())
    container = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]
    assert container["lifecycle"]["preStop"]["exec"]["command"][-1].startswith("kill -TERM -1")
    assert "lifecycle" not in render_jobset(SPECS["gpu"], "c", KubeSettings())["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]


def test_kueue_and_placement_modes() -> None:
    managed = render_jobset(SPECS["seed-high"], "c", KubeSettings())
    pod = managed["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert pod["schedulingGates"] == [{"name": labels.PLACEMENT_GATE}] and managed["spec"]["suspend"] is True
    assert EXCLUSIVE_TOPOLOGY not in managed["metadata"]["annotations"]
    kueue = render_jobset(SPECS["seed-high"], "c", SETTINGS["kueue"])
    assert kueue["metadata"]["labels"][labels.QUEUE_NAME_LABEL] == "team-a"
    assert kueue["metadata"]["namespace"] == "ml"
    # Under Kueue too every pod waits for the controller to place it on a whole healthy slice.
    assert kueue["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["schedulingGates"] == [{"name": labels.PLACEMENT_GATE}]
    assert kueue["spec"] == {**managed["spec"], "replicatedJobs": kueue["spec"]["replicatedJobs"]}
    gpu = render_jobset(SPECS["gpu"], "c", KubeSettings())["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert gpu["nodeSelector"] == {"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"}
    assert gpu["containers"][0]["resources"] == {"limits": {"nvidia.com/gpu": 8}}
    assert "hostNetwork" not in gpu


def test_bad_checkpoint_volumes_and_script_dir_are_one_line_errors() -> None:
    for text in ("nfs:x", "pvc:", "pvc:Bad_Name", "gcsfuse:UPPER"):
        with pytest.raises(InvalidInputError, match="--checkpoint-volume"):
            parse_checkpoint_volume(text)
    spec = workload_spec(name="w", command="x", device_type="v6e-4", base_docker_image="python:3.11", script_dir=".")
    with pytest.raises(InvalidInputError, match="--script-dir"):
        render_jobset(spec, "c", KubeSettings())


def test_priority_classes_are_xpks() -> None:
    classes = render_priority_classes()
    assert [(c["metadata"]["name"], c["value"]) for c in classes] == [
        ("very-low", 100), ("low", 250), ("medium", 500), ("high", 750), ("very-high", 1000)
    ]
    for obj in classes:
        validate_core(obj)


def test_kueue_objects_are_valid_against_the_kueue_crds() -> None:
    settings = KubeSettings(kueue=True, namespace="ml")
    objects = render_kueue(settings, {"v6e-16": 3, "v6e-4": 2, "h100-80gb-8": 4})
    files = {"ResourceFlavor": "kueue.x-k8s.io_resourceflavors.yaml", "ClusterQueue": "kueue.x-k8s.io_clusterqueues.yaml", "LocalQueue": "kueue.x-k8s.io_localqueues.yaml"}
    for obj in objects:
        validate_crd(obj, files[obj["kind"]])
    queue = next(o for o in objects if o["kind"] == "ClusterQueue")
    quotas = {f["name"]: f["resources"][0]["nominalQuota"] for g in queue["spec"]["resourceGroups"] for f in g["flavors"]}
    assert quotas == {"v6e-16": 48, "v6e-4": 8, "h100-80gb-8": 32}


def test_controller_manifests_are_valid_and_least_privilege() -> None:
    documents = render_controller_manifests("c", KubeSettings(namespace="ml", kueue=True, context="gke_p_z_c"), "registry.example/hotswap:0.1.0")
    for obj in documents:
        validate_core(obj)
    kinds = [d["kind"] for d in documents]
    assert kinds == ["ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "Deployment"]
    cluster_role = documents[1]
    # Cluster-wide it only reads: nodes, and pods (other owners' pods occupy slices).
    assert cluster_role["rules"] == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
    ]
    verbs = {v for d in documents if d["kind"].endswith("Role") for rule in d["rules"] for v in rule["verbs"]}
    assert "*" not in verbs and "deletecollection" not in verbs and "escalate" not in verbs
    deployment = documents[-1]
    env = {e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    import json

    assert json.loads(env["HOTSWAP_KUBERNETES_SETTINGS"])["context"] is None  # in-cluster: the pod's account
    assert deployment["spec"]["replicas"] == 1 and deployment["spec"]["strategy"]["type"] == "Recreate"
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["command"][-3:] == ["--metrics-address", "0.0.0.0:8080", "--expose-metrics"]  # scraped in the cluster
    assert container["ports"] == [{"name": "metrics", "containerPort": 8080, "protocol": "TCP"}]
    role = next(d for d in documents if d["kind"] == "Role")
    assert {"apiGroups": ["kueue.x-k8s.io"], "resources": ["workloads"], "verbs": ["get", "list", "watch", "patch"]} in role["rules"]


def test_a_local_only_device_type_is_refused_in_one_line() -> None:
    spec = workload_spec(name="w", command="python train.py", device_type="local-gpu-1", docker_image="img")
    with pytest.raises(InvalidInputError, match="^--device-type local-gpu-1 is a shape of the local backend only"):
        render_jobset(spec, "c", KubeSettings())


def test_the_rendered_controller_deployment_passes_the_controllers_own_metrics_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """The Deployment's controller serves metrics on every interface of its pod, for the
    cluster's Prometheus: its command says so with --expose-metrics (issue 24's rule), and the
    real ``controller run`` accepts it as rendered, without leaning on the in-cluster variable."""
    from typer.testing import CliRunner

    import hotswap.cli.backends as cli_backends
    from hotswap.cli.controller import IN_CLUSTER_SETTINGS, app

    documents = render_controller_manifests("c", KubeSettings(namespace="ml"), "registry.example/hotswap:0.1.0")
    (deployment,) = [d for d in documents if d["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    command = container["command"]
    assert command[:3] == ["hotswap", "controller", "run"] and "--expose-metrics" in command
    started: list[str | None] = []
    monkeypatch.delenv(IN_CLUSTER_SETTINGS, raising=False)
    monkeypatch.setattr(cli_backends, "for_controller", lambda cluster, in_cluster: cli_backends.named("kubernetes"))
    monkeypatch.setattr(cli_backends, "run_controller", lambda backend, cluster, settings, address: started.append(address))
    result = CliRunner().invoke(app, command[2:])
    assert result.exit_code == 0, result.output
    assert started == [command[command.index("--metrics-address") + 1]]
