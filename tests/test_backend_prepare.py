"""A backend answers for what it cannot do, with its own reason, and prepares its own create
(issue 32, item 3); one record holds each fact the user gave (the spec), and what a backend
derived for a run is the launch's, while launch records of earlier releases still reach the
workers with the same meaning.

In this process: the backends' preparation and refusals, the local launcher on literal records,
the local protocol's check of request payloads, and the CLI's sources (no backend's words)."""

from __future__ import annotations

import ast
import json
import os
from pathlib import Path
from typing import Any

import pytest

from hotswap.api import worker as contract
from hotswap.api.errors import InvalidInputError
from hotswap.api.launch import Launch
from hotswap.api.spec import workload_spec
from hotswap.backends.features import Feature, require
from hotswap.backends.kubernetes.backend import KubernetesBackend
from hotswap.backends.local.backend import LocalBackend
from hotswap.backends.local.controller.enactment import Launcher, WorkerPlan
from hotswap.backends.local.requests import parse as parse_request
from hotswap.backends.local.tables import LocalStore
from hotswap.backends.requests import ClusterRequest, WorkloadRequest
from hotswap.core.model import Node, Slice, Snapshot
from hotswap.core.workload import Workload
from hotswap.store.codec import workload_to_json
from hotswap.store.paths import ClusterPaths
from hotswap.store.state import ClusterRecord

SRC = Path(__file__).resolve().parents[1] / "src" / "hotswap"
RUN_ID = "20260101-000000-aaaaaa"


def request(**given: Any) -> WorkloadRequest:
    """A ``workload create`` request with the CLI's defaults, ``given`` over them."""
    defaults: dict[str, Any] = dict(
        workload="w", cluster="c", command="python3 train.py", num_slices=1, device_type="v6e-4", priority="medium",
        max_restarts=0, restart_strategy="Recreate", restart_on_exit_codes="42,127-255", min_slices=None,
        termination_grace_period_s=30.0, hang_timeout_s=None, checkpoint_dir=None, resume_from=None, fresh=False,
        user_env={}, docker_image=None, base_docker_image=None, script_dir=None, docker_name=None, debug_dump_gcs=None,
        checkpoint_volume=None, dry_run=True, backend=None,
    )
    return WorkloadRequest(**{**defaults, **given})


LOCAL_RECORD = ClusterRecord("c", "local", "v6e-4", 0.0)
KUBE_RECORD = ClusterRecord("c", "kubernetes", "v6e-16", 0.0, {"checkpoint_volume": "pvc:shared"})


# ------------------------------------------------------------------ what each backend lacks


@pytest.mark.parametrize(
    ("backend", "asked", "message"),
    [
        (LocalBackend, ClusterRequest("c", "v4-8", 1, custom_tpu_nodepool_arguments="x"),
         "--custom-tpu-nodepool-arguments: the local backend has no node pools (its slices are processes of this machine)"),
        (KubernetesBackend, ClusterRequest("c", cluster_cpu_machine_type="n2", custom_tpu_nodepool_arguments="x"),
         "--custom-tpu-nodepool-arguments: hotswap creates no node pools; create them with gcloud or xpk, then run"
         " `hotswap cluster create --backend kubernetes` to find their slices"),
        (LocalBackend, ClusterRequest("c", "v6e-4", 1, context="gke", kueue=True, checkpoint_volume="pvc:x", warm_workers="0"),
         "--context, --kueue, --checkpoint-volume: only for --backend kubernetes"),
        (KubernetesBackend, ClusterRequest("c", "local-gpu-1", gpus="all"),
         "local-gpu-1 is a local-only device type (GPUs of this machine); use it with --backend local"),
        (KubernetesBackend, ClusterRequest("c", "v6e-16", warm_workers=0, gpus="all"), "--gpus, --warm-workers: not an option of --backend kubernetes"),
    ],
)
def test_cluster_create_refuses_what_the_backend_cannot_do_in_its_words(backend: type, asked: ClusterRequest, message: str) -> None:
    with pytest.raises(InvalidInputError) as refused:
        backend().create_cluster(asked, lambda _: pytest.fail("asked to confirm"))  # refused before anything is looked at
    assert refused.value.message == message


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"checkpoint_volume": "pvc:x"}, "--checkpoint-volume is only for --backend kubernetes (use --checkpoint-dir)"),
        ({"docker_name": "jax"}, "--docker-name names the workers' container on Kubernetes; the local backend runs processes, not containers"),
        ({"debug_dump_gcs": "gs://b/x"}, "--debug-dump-gcs gs://b/x: the local backend copies XLA dumps to a directory of this machine; give a path"),
        ({"debug_dump_gcs": " "}, "--debug-dump-gcs must not be empty"),
        ({"script_dir": "/no/such/dir"}, "--script-dir /no/such/dir: no such directory"),
        ({"fresh": True, "resume_from": RUN_ID}, "--fresh and --resume-from contradict each other: give one"),
    ],
)
def test_the_local_backend_prepares_with_its_own_one_line_errors(given: dict, message: str) -> None:
    with pytest.raises(InvalidInputError) as refused:
        LocalBackend().prepare_workload(request(**given), LOCAL_RECORD)
    assert refused.value.message == message


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"debug_dump_gcs": "/tmp/dumps"}, "--debug-dump-gcs /tmp/dumps: on Kubernetes give a gs://bucket[/path] for the pods to copy to"),
        ({"checkpoint_volume": "nfs:x"}, "--checkpoint-volume 'nfs:x': use pvc:<claim-name> or gcsfuse:<bucket-name>"),
        ({"device_type": None}, "--device-type is needed when there is no cluster record to take it from"),
    ],
)
def test_the_kubernetes_backend_prepares_with_its_own_one_line_errors(given: dict, message: str) -> None:
    with pytest.raises(InvalidInputError) as refused:
        KubernetesBackend().prepare_workload(request(**given), None)
    assert refused.value.message == message


def test_a_request_asks_for_features_and_the_first_lacking_one_is_refused() -> None:
    assert request(docker_name="n", checkpoint_volume="pvc:x").features() == {
        Feature.CHECKPOINT_VOLUMES: "--checkpoint-volume", Feature.CONTAINER_NAMES: "--docker-name",
    }
    assert ClusterRequest("c", "v6e-17").features() == {}  # an unknown type asks nothing: its lookup says why
    assert ClusterRequest("c", warm_workers=0).features() == {Feature.MACHINE_PROCESSES: "--warm-workers"}
    lacking = {Feature.CONTAINER_NAMES: "second", Feature.NODE_POOLS: "first: {asked}"}
    with pytest.raises(InvalidInputError, match="^first: --x$"):
        require(lacking, {Feature.CONTAINER_NAMES: "--y", Feature.NODE_POOLS: "--x"})
    require(lacking, {Feature.CHECKPOINT_VOLUMES: "--z"})  # asked, not lacking: nothing said


@pytest.mark.parametrize("backend", [LocalBackend, KubernetesBackend])
def test_each_reason_is_one_line_that_says_what_asked(backend: type) -> None:
    for feature, reason in backend.unsupported_features.items():
        assert isinstance(feature, Feature) and "\n" not in reason
        assert "{asked}" in reason or reason.startswith("--"), f"{feature}: the reason names no flag"


def test_the_cli_holds_no_backends_rules_or_words() -> None:
    """No error or note the CLI raises or prints names a backend: a backend's refusals and notes
    are its own (cli/backends.py, the factory, is the one place a backend is named)."""
    found = []
    for path in sorted((SRC / "cli").glob("*.py")):
        if path.name == "backends.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
            if not (name.endswith("Error") or name == "note"):
                continue
            for text in (n.value for arg in node.args for n in ast.walk(arg) if isinstance(n, ast.Constant)):
                if isinstance(text, str) and ("local backend" in text.lower() or "kubernetes" in text.lower()):
                    found.append(f"{path.name}:{node.lineno}: {text}")
    assert not found


# ------------------------------------------------------------------ what each backend prepares


def test_the_local_backend_prepares_paths_of_this_machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOTSWAP_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "code").mkdir()
    prepared = LocalBackend().prepare_workload(
        request(script_dir="code", checkpoint_dir="ck", debug_dump_gcs="dumps", user_env={"U": "1"}, base_docker_image="img:1"),
        LOCAL_RECORD,
    )
    run = prepared.launch.run
    assert run is not None and prepared.launch.checkpoint_dir == str(tmp_path / "ck" / run.id)
    assert prepared.launch.cwd == str(tmp_path / "code") and prepared.launch.environ == dict(os.environ)
    # The user's facts are the spec's, as given; the launch holds only what the backend derived.
    assert (prepared.spec.env, prepared.spec.checkpoint_dir, prepared.spec.script_dir) == ({"U": "1"}, "ck", "code")
    assert prepared.spec.debug_dump_gcs == str(tmp_path / "dumps")  # a directory of this machine
    assert "user_env" not in prepared.launch.to_dict() and prepared.launch.earlier_user_env is None
    assert prepared.dry_run_cluster == "c"
    assert prepared.notes == (
        "image img:1 recorded, not used: the local backend runs the command on this machine (it is used on Kubernetes)",
    )
    unrecorded = LocalBackend().prepare_workload(request(), None)
    assert unrecorded.dry_run_cluster is None and unrecorded.notes == ()
    assert unrecorded.launch.cwd == str(tmp_path)
    assert unrecorded.launch.checkpoint_dir == str(ClusterPaths.of("c").checkpoint_dir("w") / unrecorded.launch.run.id)


def test_the_kubernetes_backend_prepares_paths_of_the_pods(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOTSWAP_HOME", str(tmp_path))
    backend = KubernetesBackend()
    default = backend.prepare_workload(request(device_type="v6e-16", docker_image="img:1"), KUBE_RECORD)
    run = default.launch.run
    assert run is not None and default.launch == Launch(
        environ={}, cwd="", checkpoint_dir=f"/checkpoints/c/w/{run.id}", run=run, checkpoint_volume="pvc:shared"
    )
    assert default.notes == () and default.dry_run_cluster == "c"
    own = backend.prepare_workload(request(checkpoint_volume="gcsfuse:bucket", checkpoint_dir="/data/ck"), None)
    assert own.launch.checkpoint_volume == "gcsfuse:bucket" and own.launch.checkpoint_dir == f"/data/ck/{own.launch.run.id}"
    assert own.dry_run_cluster == "c"  # a JobSet carries its cluster's name, recorded or not
    nowhere = backend.prepare_workload(request(debug_dump_gcs="gs://b/d"), None)
    assert nowhere.launch.checkpoint_dir == "" and nowhere.launch.checkpoint_volume is None
    assert nowhere.spec.debug_dump_gcs == "gs://b/d"
    # The JobSet gives the pods the directory the launch says.
    rendered = backend.dry_run("c", own.spec, own.launch)
    env = {e["name"]: e.get("value") for e in rendered["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env[contract.HOTSWAP_CHECKPOINT_DIR] == own.launch.checkpoint_dir


# ------------------------------------------------------------------ one record per fact, and earlier records


SLICES = ("s0",)


def _launch_of(tmp_path: Path, spec_fields: dict[str, Any], launch_json: str) -> dict[str, str]:
    """The environment the local launcher gives replica 0 host 0 of a workload whose spec has
    ``spec_fields`` and whose stored launch record is ``launch_json``, exactly as stored."""
    paths = ClusterPaths("c", tmp_path / "c")
    spec = workload_spec(name="w", command="python t.py", device_type="v6e-4", **spec_fields)
    workload = Workload(spec=spec, seq=1, created_at=1.0, attempt=1, slices=SLICES)
    snapshot = Snapshot.build(0.0, [Slice("s0", "v6e-4", ("s0-0",), 0)], [Node("s0-0", "s0", 0)], [workload])
    with LocalStore.open(paths.database, create=True) as store:
        store.init_cluster(ClusterRecord("c", "local", "v6e-4", 0.0))
        store.launches.add("w", workload_to_json(workload), Launch.from_json(launch_json))
        stored = store.connection.execute("SELECT launch FROM workloads WHERE name = 'w'").fetchone()[0]
        assert stored == launch_json  # read and written again: unchanged
        [launch] = Launcher(store, paths).launches(workload, WorkerPlan(start=SLICES, slices=SLICES, indexes=(0,), attempt=1), snapshot)
    return launch.env


def test_a_launch_record_of_an_earlier_release_reaches_the_workers_with_the_same_meaning(tmp_path: Path) -> None:
    """Today's format kept the user's variables in the launch (``user_env``): the spec's, the
    dump directory the local backend derived, and the variables an earlier demo gave its workers
    (in no spec). Read back, the workers get each of them, over the creator's environment."""
    record = {
        "checkpoint_dir": str(tmp_path / "ck" / RUN_ID), "cwd": "/w",
        "environ": {"PATH": "/bin", "U": "the creator's"},
        "run": {"id": RUN_ID, "mode": "auto", "resume_from": "", "resumed_from": None},
        "user_env": {"U": "2", "OMP_NUM_THREADS": "1", contract.HOTSWAP_DEBUG_DUMP_TO: "/dumps"},
    }
    env = _launch_of(tmp_path, {"env": {"U": "2"}, "debug_dump_gcs": "/dumps"}, json.dumps(record, sort_keys=True))
    assert (env["PATH"], env["U"], env["OMP_NUM_THREADS"], env[contract.HOTSWAP_DEBUG_DUMP_TO]) == ("/bin", "2", "1", "/dumps")
    assert env[contract.HOTSWAP_CHECKPOINT_DIR] == record["checkpoint_dir"] and env[contract.HOTSWAP_RUN_ID] == RUN_ID


def test_the_users_variables_come_from_the_spec(tmp_path: Path) -> None:
    launch = Launch(environ={"PATH": "/bin", "U": "the creator's"}, cwd="/w", checkpoint_dir=str(tmp_path / "ck"))
    env = _launch_of(tmp_path, {"env": {"U": "2"}, "debug_dump_gcs": "/dumps"}, launch.to_json())
    assert (env["PATH"], env["U"], env[contract.HOTSWAP_DEBUG_DUMP_TO]) == ("/bin", "2", "/dumps")
    plain = _launch_of(tmp_path / "plain", {}, launch.to_json())
    assert plain["U"] == "the creator's" and contract.HOTSWAP_DEBUG_DUMP_TO not in plain


def test_the_controller_accepts_create_payloads_of_this_and_earlier_releases() -> None:
    spec = workload_spec(name="w", command="x", device_type="v6e-4").model_dump(mode="json")
    launch = {"environ": {"A": "1"}, "cwd": "/w", "checkpoint_dir": "/c/x", "run": {"id": RUN_ID, "mode": "auto"}}
    assert parse_request("create", {"spec": spec, "launch": launch}).launch.earlier_user_env is None
    earlier = parse_request("create", {"spec": spec, "launch": {**launch, "user_env": {"U": "2"}}})  # an earlier release's
    assert earlier.launch.earlier_user_env == {"U": "2"}
    with pytest.raises(ValueError, match="the user's environment"):
        parse_request("create", {"spec": spec, "launch": {**launch, "user_env": {"U": "a\0b"}}})

