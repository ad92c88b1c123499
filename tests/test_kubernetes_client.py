"""The I/O layer against an HTTP-level fake API server: request and response plumbing only
(server-side apply requests, list and watch decoding, error translation, the Lease)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest
import yaml

pytest.importorskip("kubernetes")

from k8s_fixtures.world.apiserver import ApiServer  # noqa: E402

from hotswap.api.errors import ConflictError, InvalidInputError, NotFoundError  # noqa: E402
from hotswap.api.spec import workload_spec  # noqa: E402
from hotswap.backends.kubernetes import labels  # noqa: E402
from hotswap.backends.kubernetes.client import ForbiddenError, KubeClient, UnreachableError  # noqa: E402
from hotswap.backends.kubernetes.render import render_jobset, render_priority_classes  # noqa: E402
from hotswap.backends.kubernetes.settings import KubeSettings  # noqa: E402
from hotswap.backends.kubernetes.controller.leader import LeaderElector  # noqa: E402

FIXTURES = Path(__file__).resolve().parent / "k8s_fixtures"
Reply = tuple[int, Any]  # (status, JSON body | str body | list of watch events)


class FakeApiServer:
    """Answers requests from a routing function and records every request it gets."""

    def __init__(self, route: Callable[[str, str, dict[str, list[str]], Any], Reply]) -> None:
        self.route = route
        self.requests: list[dict[str, Any]] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _serve(self) -> None:
                url = urlparse(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                body = json.loads(raw) if raw else None
                query = parse_qs(url.query)
                fake.requests.append(
                    {"method": self.command, "path": url.path, "query": query, "content_type": self.headers.get("Content-Type"), "body": body}
                )
                status, answer = fake.route(self.command, url.path, query, body)
                ApiServer._reply(self, status, answer, lines=isinstance(answer, list) and query.get("watch") == ["true"])

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _serve

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def status(code: int, reason: str, message: str, name: str | None = None, kind: str | None = None) -> Reply:
    details = {"name": name, "kind": kind} if name else None
    body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message, "reason": reason, "code": code}
    if details:
        body["details"] = details
    return code, body


def write_kubeconfig(path: Path, server: str) -> Path:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "fake", "cluster": {"server": server}}],
        "users": [{"name": "me", "user": {"token": "t0ken"}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "me"}}],
        "current-context": "fake",
    }
    path.write_text(yaml.safe_dump(config))
    return path


NODES = yaml.safe_load((FIXTURES / "gke_v6e16_nodes.yaml").read_text())
APIS = {
    "kind": "APIGroupList",
    "groups": [
        {"name": "jobset.x-k8s.io", "versions": [{"groupVersion": "jobset.x-k8s.io/v1alpha2", "version": "v1alpha2"}]},
        {"name": "batch", "versions": [{"groupVersion": "batch/v1", "version": "v1"}]},
    ],
}


@pytest.fixture
def api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[Callable[..., Reply]], tuple[FakeApiServer, KubeClient]]]:
    servers: list[FakeApiServer] = []

    def start(route: Callable[..., Reply], settings: KubeSettings | None = None) -> tuple[FakeApiServer, KubeClient]:
        server = FakeApiServer(route)
        servers.append(server)
        monkeypatch.setenv("KUBECONFIG", str(write_kubeconfig(tmp_path / "kubeconfig", server.url)))
        return server, KubeClient.connect(settings or KubeSettings())

    yield start
    for server in servers:
        server.close()


def test_apply_is_a_server_side_apply_by_the_hotswap_field_manager(api) -> None:
    server, client = api(lambda method, path, query, body: (200, body))
    spec = workload_spec(name="w", command="python3 train.py", device_type="v6e-16", num_slices=2)
    manifest = render_jobset(spec, "c", KubeSettings())
    answer = client.apply(manifest)
    assert answer == manifest
    request = server.requests[-1]
    assert request["method"] == "PATCH"
    assert request["path"] == "/apis/jobset.x-k8s.io/v1alpha2/namespaces/default/jobsets/w"
    assert request["content_type"] == "application/apply-patch+yaml"
    assert request["query"] == {"fieldManager": ["hotswap"], "force": ["true"]}
    assert request["body"] == manifest
    client.apply(render_priority_classes()[3])
    assert server.requests[-1]["path"] == "/apis/scheduling.k8s.io/v1/priorityclasses/high"
    client.patch_jobset("w", {"spec": {"suspend": True}})
    assert server.requests[-1]["content_type"] == "application/merge-patch+json"
    assert server.requests[-1]["body"] == {"spec": {"suspend": True}}


def test_lists_decode_to_plain_dicts_with_selectors(api) -> None:
    def route(method: str, path: str, query: dict[str, list[str]], body: Any) -> Reply:
        if path == "/api/v1/nodes":
            return 200, NODES
        if path.endswith("/jobsets"):
            return 200, {"kind": "JobSetList", "items": [{"metadata": {"name": "w"}, "spec": {}}]}
        if path.rstrip("/") == "/apis":
            return 200, APIS
        return 404, "404 page not found"

    server, client = api(route)
    nodes = client.list_nodes()
    assert isinstance(nodes[0], dict) and nodes[0]["metadata"]["labels"][labels.NODE_POOL_LABEL] == "tpu-v6e-np-0"
    assert len(nodes) == 13
    assert client.list_jobsets("c") == [{"metadata": {"name": "w"}, "spec": {}}]
    assert server.requests[-1]["query"]["labelSelector"] == ["app.kubernetes.io/managed-by=hotswap,hotswap.dev/cluster=c"]
    assert "jobset.x-k8s.io/v1alpha2" in client.served_apis()
    with pytest.raises(NotFoundError, match=r"kueue.x-k8s.io/v1beta2 is not installed.*install Kueue v0.19.2: kubectl apply --server-side -f https://github.com/kubernetes-sigs/kueue/releases/download/v0.19.2/manifests.yaml"):
        client.require_apis(labels.JOBSET_API_VERSION, labels.KUEUE_API_VERSION)


def test_watch_events_wake_the_controller(api) -> None:
    events = [{"type": "ADDED", "object": NODES["items"][0]}, {"type": "MODIFIED", "object": NODES["items"][1]}]
    server, client = api(lambda method, path, query, body: (200, events))
    changed, stop = threading.Event(), threading.Event()
    thread = threading.Thread(target=client.watch, args=("nodes", "c", changed, stop, 5), daemon=True)
    thread.start()
    assert changed.wait(10)
    stop.set()
    thread.join(10)
    assert server.requests[0]["query"]["watch"] == ["true"] and server.requests[0]["path"] == "/api/v1/nodes"


def test_api_errors_become_one_actionable_line(api) -> None:
    replies: dict[str, Reply] = {}
    server, client = api(lambda method, path, query, body: replies[path])
    jobsets = "/apis/jobset.x-k8s.io/v1alpha2/namespaces/default/jobsets"

    replies[jobsets] = status(403, "Forbidden", 'jobsets.jobset.x-k8s.io is forbidden: User "me" cannot list resource "jobsets" in API group "jobset.x-k8s.io" in the namespace "default"')
    with pytest.raises(ForbiddenError) as forbidden:
        client.list_jobsets("c")
    message = str(forbidden.value)
    assert "\n" not in message and 'cannot list resource "jobsets"' in message and "ask a cluster admin" in message

    replies[jobsets] = (404, "404 page not found\n")  # no such resource type: the CRD is missing
    with pytest.raises(NotFoundError) as missing:
        client.list_jobsets("c")
    assert "jobset.x-k8s.io/v1alpha2 is not installed" in str(missing.value) and "kubectl apply --server-side" in str(missing.value)

    replies[jobsets + "/w"] = status(404, "NotFound", 'jobsets.jobset.x-k8s.io "w" not found', "w", "jobsets")
    assert client.get_jobset("w") is None  # an object that is not there is an answer, not an error

    lease = "/apis/coordination.k8s.io/v1/namespaces/default/leases/hotswap-controller"
    replies[lease] = status(409, "Conflict", 'Operation cannot be fulfilled on leases.coordination.k8s.io "hotswap-controller": the object has been modified')
    with pytest.raises(ConflictError, match="run the command again"):
        client.replace_lease("hotswap-controller", {"metadata": {"name": "hotswap-controller"}})

    replies[jobsets + "/w"] = status(422, "Invalid", 'JobSet.jobset.x-k8s.io "w" is invalid: spec.replicatedJobs: Invalid value')
    with pytest.raises(InvalidInputError, match="rejected it"):
        client.apply(render_jobset(workload_spec(name="w", command="x", device_type="v6e-4"), "c", KubeSettings()))


def test_unreachable_server_is_one_line(api, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    server, _ = api(lambda *args: (200, {}))
    server.close()
    client = KubeClient.connect(KubeSettings())
    client.api_client.configuration.retries = 0
    with pytest.raises(UnreachableError) as unreachable:
        client.list_nodes()
    assert "\n" not in str(unreachable.value) and "check the context" in str(unreachable.value)


def test_missing_kubeconfig_and_unknown_context(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, api) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "nope"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(NotFoundError, match="no kubeconfig"):
        KubeClient.connect(KubeSettings())
    api(lambda *args: (200, {}))
    with pytest.raises(NotFoundError, match=r"no usable kubeconfig context 'prod'.*contexts: fake"):
        KubeClient.connect(KubeSettings(context="prod"))


def test_leader_election_against_the_api(api) -> None:
    stored: dict[str, Any] = {}
    path = "/apis/coordination.k8s.io/v1/namespaces/default/leases/hotswap-controller"

    def route(method: str, request_path: str, query: dict[str, list[str]], body: Any) -> Reply:
        if method == "GET":
            return (200, stored["lease"]) if "lease" in stored else status(404, "NotFound", "leases not found", "hotswap-controller", "leases")
        if method == "POST":
            stored["lease"] = {**body, "metadata": {**body["metadata"], "resourceVersion": "1"}}
            return 201, stored["lease"]
        if body["metadata"].get("resourceVersion") != stored["lease"]["metadata"]["resourceVersion"]:
            return status(409, "Conflict", "the object has been modified")
        version = str(int(stored["lease"]["metadata"]["resourceVersion"]) + 1)
        stored["lease"] = {**body, "metadata": {**body["metadata"], "resourceVersion": version}}
        return 200, stored["lease"]

    server, client = api(route)
    clock = [1000.0]
    a = LeaderElector(client, "a", clock=lambda: clock[0], local_clock=lambda: clock[0], log=lambda line: None)
    b = LeaderElector(client, "b", clock=lambda: clock[0], local_clock=lambda: clock[0], log=lambda line: None)
    assert a.tick() is True and server.requests[-1]["method"] == "POST"
    assert b.tick() is False  # a holds it
    clock[0] += 5
    assert a.tick() is True and stored["lease"]["spec"]["holderIdentity"] == "a"
    clock[0] += 30  # a stopped renewing; b has not seen its last renewal yet: that starts its wait
    assert b.tick() is False
    clock[0] += 16  # unchanged for a lease duration, on b's own clock
    assert b.tick() is True and stored["lease"]["spec"]["holderIdentity"] == "b"
    assert stored["lease"]["spec"]["leaseTransitions"] == 1
    assert stored["lease"]["metadata"]["resourceVersion"] == "3"
    b.release()
    assert stored["lease"]["spec"].get("holderIdentity") is None
    assert path in {r["path"] for r in server.requests}
