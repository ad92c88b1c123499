"""The CLI with --backend kubernetes: dry runs need nothing but the CLI; the rest talks to an
HTTP-level fake API server through a kubeconfig, as a user's CLI talks to GKE."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from hotswap.backends.kubernetes import labels

FIXTURES = Path(__file__).resolve().parent / "k8s_fixtures"


def environment(home: Path, env: dict[str, str] | None) -> dict[str, str]:
    return {"HOTSWAP_HOME": str(home), "KUBECONFIG": str(home / "no-kubeconfig"), **(env or {})}


def hotswap_process(home: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The CLI as a separate process, as a user runs it."""
    environ = {**os.environ, **environment(home, env)}
    environ.pop("KUBERNETES_SERVICE_HOST", None)
    return subprocess.run([sys.executable, "-m", "hotswap", *args], capture_output=True, text=True, env=environ, timeout=120)


def hotswap(home: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The CLI in this process (what ``hotswap.cli.app.main`` does), to keep the tests fast."""
    from hotswap.api.errors import HotswapError
    from hotswap.cli.app import app

    saved = {key: os.environ.get(key) for key in (*environment(home, env), "KUBERNETES_SERVICE_HOST")}
    os.environ.update(environment(home, env))
    os.environ.pop("KUBERNETES_SERVICE_HOST", None)
    out, err = io.StringIO(), io.StringIO()
    code = 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                app(args=list(args), prog_name="hotswap")
            except SystemExit as exit_:
                code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
            except HotswapError as error:
                print(f"error: {error}", file=sys.stderr)
                code = error.exit_code
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    return subprocess.CompletedProcess(list(args), code, out.getvalue(), err.getvalue())


DRY_RUN = ("workload", "create", "--backend", "kubernetes", "--cluster", "any", "--workload", "w", "--command", "python3 train.py",
           "--device-type", "v6e-16", "--num-slices", "2", "--dry-run")


def test_dry_run_prints_only_the_jobset_and_needs_no_server_or_record(tmp_path: Path) -> None:
    result = hotswap_process(tmp_path, *DRY_RUN)
    assert result.returncode == 0, result.stderr
    documents = list(yaml.safe_load_all(result.stdout))
    assert len(documents) == 1
    jobset = documents[0]
    assert jobset["kind"] == "JobSet" and jobset["spec"]["replicatedJobs"][0]["replicas"] == 2
    assert jobset["metadata"]["labels"][labels.CLUSTER_LABEL] == "any"
    assert not (tmp_path / "clusters").exists()  # nothing recorded
    as_json = hotswap(tmp_path, *DRY_RUN, "--output", "json")
    assert _without_run(json.loads(as_json.stdout)) == _without_run(jobset)  # each create is a new run


def _without_run(jobset: dict) -> dict:
    """A rendered JobSet less its run id (a new one each time)."""
    text = json.dumps(jobset).replace(jobset["metadata"]["labels"][labels.RUN_ID_LABEL], "RUN")
    return json.loads(text)


@pytest.mark.parametrize("extra", [(), ("--min-slices", "1", "--checkpoint-volume", "pvc:ckpt"), ("--device-type", "h100-80gb-8")])
def test_dry_run_output_applies_against_the_pinned_crd_schemas(tmp_path: Path, extra: tuple[str, ...]) -> None:
    """What --dry-run prints is what a JobSet v0.12.0 API server accepts (its CRD's schema) and
    its Job and pod templates are valid Kubernetes 1.30 objects."""
    from test_kubernetes_render import job_of, pod_of, validate_core, validate_crd

    result = hotswap(tmp_path, *DRY_RUN, *extra, "--output", "yaml")
    assert result.returncode == 0, result.stderr
    jobset = yaml.safe_load(result.stdout)
    validate_crd(jobset, "jobset.x-k8s.io_jobsets.yaml")
    validate_core(job_of(jobset))
    validate_core(pod_of(jobset))


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (("--checkpoint-volume", "nfs:share"), "--checkpoint-volume 'nfs:share': use pvc:<claim-name> or gcsfuse:<bucket-name>"),
        (("--priority", "urgent"), "unknown priority 'urgent'"),
        (("--device-type", "v6e-17"), "did you mean v6e-16"),
    ],
)
def test_bad_input_is_one_line_on_stderr(tmp_path: Path, extra: tuple[str, ...], message: str) -> None:
    result = hotswap(tmp_path, *DRY_RUN, *extra)
    assert result.returncode != 0 and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0]


def test_kubernetes_flags_are_refused_by_the_local_backend(tmp_path: Path) -> None:
    result = hotswap(tmp_path, "cluster", "create", "--cluster", "c", "--device-type", "v6e-4", "--num-slices", "1", "--context", "gke")
    assert result.returncode == 2 and result.stderr.strip() == "error: --context: only for --backend kubernetes"
    assert not (tmp_path / "clusters" / "c").exists()
    volume = hotswap(tmp_path, "workload", "create", "--backend", "local", "--cluster", "c", "--workload", "w", "--command", "x",
                     "--device-type", "v6e-4", "--dry-run", "--checkpoint-volume", "pvc:x")
    assert volume.returncode == 2 and "only for --backend kubernetes" in volume.stderr


class ClusterApi:
    """State behind the fake API server: nodes from the recording, JobSets as applied."""

    def __init__(self) -> None:
        self.nodes = yaml.safe_load((FIXTURES / "gke_v6e16_nodes.yaml").read_text())
        self.jobsets: dict[str, dict[str, Any]] = {}
        self.applied: list[str] = []
        self.pods: list[dict[str, Any]] = []
        self.logs: dict[str, str] = {}  # pod name -> its log; a pod without one answers 400
        self.objects: dict[str, dict[str, Any]] = {}  # the workers' access and records, by path, as applied
        self.default_account = {"metadata": {"name": "default", "annotations": {"iam.gke.io/gcp-service-account": "ckpt@p.iam.gserviceaccount.com"}},
                                "imagePullSecrets": [{"name": "registry"}]}

    def route(self, method: str, path: str, query: dict[str, list[str]], body: Any) -> tuple[int, Any]:
        from test_kubernetes_client import APIS, status

        jobsets = "/apis/jobset.x-k8s.io/v1alpha2/namespaces/default/jobsets"
        if path.rstrip("/") == "/apis":
            return 200, APIS
        if path == "/api/v1/nodes":
            return 200, self.nodes
        if path == "/api/v1/namespaces/default/events":
            return 200, {"items": []}
        if path == "/api/v1/namespaces/default/pods":
            wanted = dict(part.split("=", 1) for part in (query.get("labelSelector") or [""])[0].split(",") if "=" in part)
            items = [p for p in self.pods if all(p["metadata"]["labels"].get(k) == v for k, v in wanted.items())]
            return 200, {"kind": "PodList", "items": items}
        if path.startswith("/api/v1/namespaces/default/pods/") and path.endswith("/log"):
            pod = path.split("/")[-2]
            if pod not in self.logs:
                return status(400, "BadRequest", f'container "worker" in pod "{pod}" is waiting to start: ContainerCreating')
            return 200, self.logs[pod]
        if path.startswith("/apis/scheduling.k8s.io/v1/priorityclasses/"):
            self.applied.append(path.rsplit("/", 1)[1])
            return 200, body
        if path == "/api/v1/namespaces/default/serviceaccounts/default":
            return 200, self.default_account
        if path == "/apis/coordination.k8s.io/v1/namespaces/default/leases":
            return 200, {"kind": "LeaseList", "items": [o for p, o in self.objects.items() if "/leases/" in p]}
        if method == "PATCH" and any(kind in path for kind in ("/serviceaccounts/", "/roles/", "/rolebindings/", "/leases/")):
            self.objects[path] = body
            return 200, body
        config_maps = "/api/v1/namespaces/default/configmaps"
        if path.startswith(config_maps):  # the cluster's record of failed runs (failed_runs.py)
            name = body["metadata"]["name"] if method == "POST" else path.rsplit("/", 1)[1]
            held = self.objects.get(f"{config_maps}/{name}")
            if method == "POST":
                self.objects[f"{config_maps}/{name}"] = body
                return 201, body
            if held is None:
                return status(404, "NotFound", f'configmaps "{name}" not found', name, "configmaps")
            if method == "PATCH":
                held["data"] = {**held.get("data", {}), **body["data"]}
            return 200, held
        if path == jobsets:
            return 200, {"kind": "JobSetList", "items": list(self.jobsets.values())}
        if path.startswith(jobsets + "/"):
            name = path.rsplit("/", 1)[1]
            if method == "PATCH":
                obj = {**body, "metadata": {**body["metadata"], "uid": "u1", "creationTimestamp": "2026-01-06T09:00:00Z"}}
                self.jobsets[name] = obj
                return 200, obj
            if method == "DELETE" and name in self.jobsets:
                self.pods = [p for p in self.pods if p["metadata"]["labels"].get(labels.JOBSET_NAME_LABEL) != name]
                return 200, self.jobsets.pop(name)
            if name in self.jobsets:
                return 200, self.jobsets[name]
            return status(404, "NotFound", f'jobsets.jobset.x-k8s.io "{name}" not found', name, "jobsets")
        return 404, "404 page not found"


def test_cluster_and_workload_commands_against_a_fake_api_server(tmp_path: Path) -> None:
    from test_kubernetes_client import FakeApiServer, write_kubeconfig

    state = ClusterApi()
    server = FakeApiServer(state.route)
    try:
        env = {"KUBECONFIG": str(write_kubeconfig(tmp_path / "kubeconfig", server.url))}
        created = hotswap(tmp_path, "cluster", "create", "--backend", "kubernetes", "--cluster", "trillium", "--context", "fake", "--output", "json", env=env)
        assert created.returncode == 0, created.stderr
        summary = json.loads(created.stdout)
        assert (summary["device_type"], summary["num_slices"], summary["hosts_per_slice"]) == ("v6e-16", 3, 4)
        assert state.applied == ["very-low", "low", "medium", "high", "very-high"]

        submitted = hotswap(tmp_path, "workload", "create", "--cluster", "trillium", "--workload", "high", "--priority", "high",
                            "--num-slices", "2", "--command", "python3 train.py", env=env)
        assert submitted.returncode == 0, submitted.stderr
        assert "workload high created: QUEUED" in submitted.stderr
        # A new run; without a checkpoint volume nothing is saved, so nothing is resumed.
        run_id = state.jobsets["high"]["metadata"]["labels"][labels.RUN_ID_LABEL]
        assert f"; run {run_id} starts fresh" in submitted.stderr
        queued = hotswap(tmp_path, "workload", "logs", "--cluster", "trillium", "--workload", "high", env=env)
        assert queued.returncode == 3 and "it is QUEUED and has not started yet" in queued.stderr
        assert state.jobsets["high"]["metadata"]["namespace"] == "default"
        # Its pods may write their replicas' records and nothing else (issue 35 item 3), as the
        # namespace's default ServiceAccount's Workload Identity and pull secrets.
        objects = {(o["kind"], o["metadata"]["name"]): o for o in state.objects.values()}
        assert set(objects) == {("ServiceAccount", "hotswap-worker-high"), ("Role", "hotswap-worker-high"),
                                ("RoleBinding", "hotswap-worker-high"), ("Lease", "high-report-0"), ("Lease", "high-report-1")}
        assert objects[("Role", "hotswap-worker-high")]["rules"] == [{
            "apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": ["high-report-0", "high-report-1"],
            "verbs": ["get", "update"]}]
        assert all(o["metadata"]["ownerReferences"][0]["uid"] == "u1" for o in objects.values())
        # The heartbeat interval of a 3-slice cluster (issue 35: it grows with the cluster's slices).
        assert {objects[("Lease", f"high-report-{r}")]["metadata"]["annotations"]["hotswap.dev/report-interval-s"] for r in (0, 1)} == {"10"}
        account = objects[("ServiceAccount", "hotswap-worker-high")]
        assert account["metadata"]["annotations"] == state.default_account["metadata"]["annotations"]
        assert account["imagePullSecrets"] == [{"name": "registry"}]
        pod_spec = state.jobsets["high"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
        assert pod_spec["serviceAccountName"] == "hotswap-worker-high"

        again = hotswap(tmp_path, "workload", "create", "--cluster", "trillium", "--workload", "high", "--command", "x", env=env)
        assert again.returncode == 4 and again.stderr.strip() == "error: a workload named high already exists in namespace default"
        too_big = hotswap(tmp_path, "workload", "create", "--cluster", "trillium", "--workload", "big", "--num-slices", "4", "--command", "x", env=env)
        # Exit 5 (capacity) in the local backend's words (tests/test_local_backend.py): one table of codes.
        assert too_big.returncode == 5, too_big.stderr
        assert too_big.stderr.strip() == (
            "error: workload big rejected: it needs 4 slice(s) of v6e-16 and the cluster has only 3; it could never run"
        )

        listed = hotswap(tmp_path, "workload", "list", "--cluster", "trillium", "--output", "json", env=env)
        assert listed.returncode == 0, listed.stderr
        (row,) = json.loads(listed.stdout)
        assert {k: row[k] for k in ("name", "priority", "status", "num_slices", "slices", "restarts", "preemptions")} == {
            "name": "high", "priority": "high", "status": "QUEUED", "num_slices": 2, "slices": [], "restarts": 0, "preemptions": 0,
        }
        assert {"status_message", "status_time", "created_time"} <= set(row)

        described = hotswap(tmp_path, "workload", "describe", "--cluster", "trillium", "--workload", "high", env=env)
        assert described.returncode == 0, described.stderr
        assert "Workload high on cluster trillium: QUEUED" in described.stdout
        assert f"run {run_id}: starts fresh" in described.stdout
        nodes = hotswap(tmp_path, "node", "list", "--cluster", "trillium", "--output", "json", env=env)
        assert nodes.returncode == 0, nodes.stderr
        assert {n["slice"] for n in json.loads(nodes.stdout)} == {"tpu-v6e-np-0", "tpu-v6e-np-1", "tpu-v6e-np-2"}
        fail = hotswap(tmp_path, "node", "fail", "--cluster", "trillium", "--slice", "tpu-v6e-np-0", env=env)
        assert fail.returncode == 2 and "local backend only" in fail.stderr

        manifests = hotswap(tmp_path, "controller", "manifests", "--cluster", "trillium", "--image", "registry.example/hotswap:0.1", env=env)
        assert manifests.returncode == 0, manifests.stderr
        documents = list(yaml.safe_load_all(manifests.stdout))
        assert [d["kind"] for d in documents][-1] == "Deployment"
        kubernetes_validate = pytest.importorskip("kubernetes_validate")
        for document in documents:
            kubernetes_validate.validate(document, "1.30.0", strict=True)
    finally:
        server.close()


def test_cluster_create_says_what_to_install_when_jobset_is_missing(tmp_path: Path) -> None:
    from test_kubernetes_client import FakeApiServer, write_kubeconfig

    server = FakeApiServer(lambda method, path, query, body: (200, {"kind": "APIGroupList", "groups": []}))
    try:
        env = {"KUBECONFIG": str(write_kubeconfig(tmp_path / "kubeconfig", server.url))}
        result = hotswap(tmp_path, "cluster", "create", "--backend", "kubernetes", "--cluster", "c", env=env)
        assert result.returncode == 3
        assert result.stderr.strip().startswith("error: the API jobset.x-k8s.io/v1alpha2 is not installed on this cluster; install JobSet")
        assert len(result.stderr.strip().splitlines()) == 1
        assert not (tmp_path / "clusters" / "c").exists()  # a rejected command records nothing
    finally:
        server.close()


def _pod(workload: str, replica: int, host: int, attempt: int = 1) -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"{workload}-slice-job-{replica}-{host}-a{attempt}",
            "labels": {labels.JOBSET_NAME_LABEL: workload, labels.JOB_INDEX_LABEL: str(replica)},
            "annotations": {labels.JOB_COMPLETION_INDEX_ANNOTATION: str(host), labels.ATTEMPT_ANNOTATION: str(attempt)},
        },
        "spec": {}, "status": {"phase": "Running"},
    }


def test_a_deleted_workloads_logs_stay_readable_and_describe_shows_its_own_checkpoint_volume(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`workload delete` keeps each worker's log tail in the cluster's record; `workload logs`
    of the deleted workload prints it and says so; a re-created name (a new run) shows its own
    logs; `cluster delete` removes the archive with the record."""
    from test_kubernetes_client import FakeApiServer, write_kubeconfig

    from hotswap.backends.kubernetes import log_archive

    monkeypatch.setattr(log_archive, "TAIL_BYTES", 64)
    state = ClusterApi()
    server = FakeApiServer(state.route)
    try:
        env = {"KUBECONFIG": str(write_kubeconfig(tmp_path / "kubeconfig", server.url))}
        assert hotswap(tmp_path, "cluster", "create", "--backend", "kubernetes", "--cluster", "trillium", "--context", "fake", env=env).returncode == 0
        created = hotswap(tmp_path, "workload", "create", "--cluster", "trillium", "--workload", "job", "--num-slices", "2",
                          "--checkpoint-volume", "pvc:ckpt", "--command", "python3 train.py", env=env)
        assert created.returncode == 0, created.stderr
        run_id = state.jobsets["job"]["metadata"]["labels"][labels.RUN_ID_LABEL]
        # The cluster has no default volume: the checkpoints are where the workload's own volume put them.
        described = json.loads(hotswap(tmp_path, "workload", "describe", "--cluster", "trillium", "--workload", "job", "-o", "json", env=env).stdout)
        assert described["checkpoint_dir"] == f"{labels.CHECKPOINT_MOUNT}/trillium/job/{run_id}"

        state.pods = [_pod("job", r, h) for r in range(2) for h in range(4)] + [_pod("job", 0, 0, attempt=0)]
        state.logs = {p["metadata"]["name"]: f"step 1 of {p['metadata']['name']}\n" for p in state.pods}
        state.logs[_pod("job", 1, 0)["metadata"]["name"]] = "x" * 100 + "\nlast line\n"  # longer than the tail kept
        del state.logs[_pod("job", 1, 3)["metadata"]["name"]]  # its container never started
        deleted = hotswap(tmp_path, "workload", "delete", "--cluster", "trillium", "--workload", "job", env=env)
        assert deleted.returncode == 0, deleted.stderr
        assert "job" not in state.jobsets and not state.pods

        first = hotswap_process(tmp_path, "workload", "logs", "--cluster", "trillium", "--workload", "job", env=env)
        assert first.returncode == 0, first.stderr
        assert first.stdout == "step 1 of job-slice-job-0-0-a1\n"  # the newest attempt's pod
        assert f"workload job was deleted: this is the log of replica 0 host 0 of run {run_id}, kept at its deletion" in first.stderr
        long = hotswap_process(tmp_path, "workload", "logs", "--cluster", "trillium", "--workload", "job", "--slice", "1", env=env)
        assert long.stdout.endswith("\nlast line\n") and len(long.stdout) == 64
        never = hotswap_process(tmp_path, "workload", "logs", "--cluster", "trillium", "--workload", "job", "--slice", "1", "--host", "3", env=env)
        assert never.returncode == 3 and "no log of replica 1 host 3 was kept" in never.stderr and "ContainerCreating" in never.stderr

        again = hotswap(tmp_path, "workload", "create", "--cluster", "trillium", "--workload", "job", "--command", "python3 train.py", env=env)
        assert again.returncode == 0, again.stderr
        state.pods = [_pod("job", 0, 0)]
        state.logs = {state.pods[0]["metadata"]["name"]: "the new run\n"}
        live = hotswap_process(tmp_path, "workload", "logs", "--cluster", "trillium", "--workload", "job", env=env)
        assert live.stdout == "the new run\n" and "was deleted" not in live.stderr

        archive = tmp_path / "clusters" / "trillium" / "logs" / "job" / run_id
        assert (archive / "index.json").is_file() and oct((archive / "index.json").stat().st_mode & 0o777) == "0o600"
        assert hotswap(tmp_path, "cluster", "delete", "--cluster", "trillium", env=env).returncode == 0
        assert not archive.exists()
    finally:
        server.close()


def test_a_deleted_failed_run_is_never_resumed_by_the_next_run(tmp_path: Path) -> None:
    """A JobSet that ended Failed (its pods saved on SIGTERM as they went: signal=resume), then
    `workload delete`: the next `workload create` of the name tells its pods that run failed
    (HOTSWAP_FAILED_RUNS), so their `auto` choice never resumes it; a run deleted while it
    ran is still a migration (nothing is named)."""
    from test_kubernetes_client import FakeApiServer, write_kubeconfig

    from hotswap.api import worker as contract

    state = ClusterApi()
    server = FakeApiServer(state.route)

    def env_of(name: str) -> dict[str, str]:
        [container] = state.jobsets[name]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"]
        return {e["name"]: e.get("value") for e in container["env"]}

    try:
        env = {"KUBECONFIG": str(write_kubeconfig(tmp_path / "kubeconfig", server.url))}
        assert hotswap(tmp_path, "cluster", "create", "--backend", "kubernetes", "--cluster", "trillium", "--context", "fake", env=env).returncode == 0
        create = ("workload", "create", "--cluster", "trillium", "--workload", "job", "--checkpoint-volume", "pvc:ckpt", "--command", "python3 train.py")
        assert hotswap(tmp_path, *create, env=env).returncode == 0
        failed_run = state.jobsets["job"]["metadata"]["labels"][labels.RUN_ID_LABEL]
        state.jobsets["job"]["status"] = {"conditions": [{"type": "Failed", "status": "True", "message": "jobset failed"}]}
        assert hotswap(tmp_path, "workload", "delete", "--cluster", "trillium", "--workload", "job", env=env).returncode == 0

        assert hotswap(tmp_path, *create, env=env).returncode == 0
        second = env_of("job")
        assert second[contract.HOTSWAP_RESUME_FROM] == "auto" and second[contract.HOTSWAP_FAILED_RUNS] == failed_run
        # Deleted while it ran: a migration the next run resumes; the failed one is still named.
        assert hotswap(tmp_path, "workload", "delete", "--cluster", "trillium", "--workload", "job", env=env).returncode == 0
        assert hotswap(tmp_path, *create, env=env).returncode == 0
        assert env_of("job")[contract.HOTSWAP_FAILED_RUNS] == failed_run
        # --fresh resumes nothing: nothing to name.
        assert hotswap(tmp_path, "workload", "delete", "--cluster", "trillium", "--workload", "job", env=env).returncode == 0
        assert hotswap(tmp_path, *create, "--fresh", env=env).returncode == 0
        assert contract.HOTSWAP_FAILED_RUNS not in env_of("job")
    finally:
        server.close()
