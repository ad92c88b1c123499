"""The world's API server: Kubernetes' REST paths over HTTP, on :mod:`.store`.

The controller under test talks to it with the official client through a kubeconfig, exactly
as to GKE, so what is tested is the real request and response plumbing. It serves discovery,
list/get/watch, create, replace, JSON merge patch and server-side apply, delete with
propagation and grace, the Eviction subresource, and the status subresource. Objects of
custom resources are pruned and validated against their CRD's structural schema, as the API
server does (apiextensions-apiserver ``pkg/apiserver/schema/pruning/algorithm.go``,
``Prune``; ``pkg/apiserver/validation``). Admission (webhooks, plugins) is a list of hooks the
world's components register.

Every request is recorded; :attr:`ApiServer.faults` answers chosen requests with an error (403,
409, 500, a missing API) or drops the connection (an unreachable server).
"""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

import yaml

from k8s_fixtures.world.rbac import authorize
from k8s_fixtures.world.store import CRDS, EVENTS, LEASES, PODS, ApiError, Obj, Resource, Store, merge_patch, not_found

Admission = Callable[[str, Resource, Obj, Obj | None], None]  # (operation, resource, new, old) -> raise ApiError


@dataclasses.dataclass
class Fault:
    """Answer matching requests with an error instead (``status`` 0: drop the connection)."""

    method: str | None
    path: str  # a prefix of the request path
    status: int
    reason: str = "InternalError"
    message: str = "injected fault"
    times: int | None = None  # None: until removed
    watch: bool | None = None  # only watch requests (True), only others (False), both (None)
    as_event: bool = False  # a watch answers 200 and streams one ERROR event with this status

    def matches(self, method: str, path: str, watching: bool) -> bool:
        if self.times is not None and self.times <= 0:
            return False
        if self.watch is not None and self.watch != watching:
            return False
        return (self.method is None or self.method == method) and path.startswith(self.path)


@dataclasses.dataclass
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    content_type: str | None
    body: Any
    status: int = 0

    @property
    def write(self) -> bool:
        return self.method in ("POST", "PUT", "PATCH", "DELETE")


class ApiServer:
    def __init__(self, store: Store, schemas: dict[str, dict[str, Any]] | None = None) -> None:
        self.store = store
        self.schemas = schemas or {}  # "group/version/plural" -> openAPIV3Schema
        self.admission: list[Admission] = []
        # Run after each accepted write of a client, before it is answered: what the cluster's
        # controllers do in reaction lands before that client's next request (see World.interleave).
        self.after_write: list[Callable[[Request], None]] = []
        # Run before a client's write is applied: what another controller writes between that
        # client's read and its write (its resourceVersion precondition then fails: 409).
        self.before_write: list[Callable[[Request], None]] = []
        self.faults: list[Fault] = []
        self.requests: list[Request] = []
        self.watch_timeout_cap_s = 2.0  # real seconds a watch stays open at most (tests stay fast)
        self.closing = False
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _serve(self) -> None:
                server._handle(self)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _serve

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.http.daemon_threads = True
        self.thread = threading.Thread(target=self.http.serve_forever, kwargs={"poll_interval": 0.05}, name="world-apiserver", daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http.server_address[1]}"

    def close(self) -> None:
        self.closing = True
        with self.store.lock:
            self.store.changed.notify_all()
        self.http.shutdown()
        self.http.server_close()

    # ------------------------------------------------------------------ recording

    def writes(self, since: int = 0, leases: bool = False) -> list[Request]:
        """Write calls from request number ``since`` on (Lease renewals excluded unless asked)."""
        return [r for r in self.requests[since:] if r.write and (leases or "/leases" not in r.path)]

    # ------------------------------------------------------------------ HTTP

    def _handle(self, handler: BaseHTTPRequestHandler) -> None:
        url = urlparse(handler.path)
        length = int(handler.headers.get("Content-Length") or 0)
        raw = handler.rfile.read(length) if length else b""
        content_type = (handler.headers.get("Content-Type") or "").split(";")[0] or None
        body: Any = None
        if raw:
            body = yaml.safe_load(raw) if content_type == "application/apply-patch+yaml" else json.loads(raw)
        query = parse_qs(url.query)
        request = Request(handler.command, url.path, query, content_type, body)
        self.requests.append(request)
        watching = query.get("watch") == ["true"]
        fault = next((f for f in self.faults if f.matches(handler.command, url.path, watching)), None)
        if fault is not None:
            if fault.times is not None:
                fault.times -= 1
            request.status = fault.status
            if fault.status == 0:
                handler.close_connection = True
                handler.connection.close()  # the client sees the connection drop: unreachable
                return
            if fault.as_event and watching:
                handler.send_response(200)
                handler.send_header("Content-Type", "application/json")
                handler.end_headers()
                handler.close_connection = True
                error = ApiError(fault.status, fault.reason, fault.message).status()
                self._send(handler, [{"type": "ERROR", "object": error}])
                return
            if fault.status == 404 and fault.reason == "NoSuchApi":
                self._reply(handler, 404, "404 page not found\n")
                return
            self._reply(handler, fault.status, ApiError(fault.status, fault.reason, fault.message).status())
            return
        try:
            if watching:
                request.status = 200
                self._watch(handler, url.path, query)
                return
            self._authorize(handler.headers.get("Authorization"), handler.command, url.path, watching)
            if request.write:
                for hook in list(self.before_write):
                    hook(request)
            status, answer = self._route(handler.command, url.path, query, body, content_type)
            if request.write and status < 300 and "/leases" not in url.path and "/events" not in url.path:
                for hook in self.after_write:
                    hook(request)
        except ApiError as error:
            status, answer = error.code, error.status()
        except _NoSuchPath:
            status, answer = 404, "404 page not found\n"
        request.status = status
        self._reply(handler, status, answer)

    @staticmethod
    def _reply(handler: BaseHTTPRequestHandler, status: int, answer: Any, lines: bool = False) -> None:
        """One answer: text, a JSON document, or (``lines``) JSON lines (a finished watch)."""
        if lines:
            payload, content_type = "".join(json.dumps(event) + "\n" for event in answer).encode(), "application/json"
        elif isinstance(answer, str):
            payload, content_type = answer.encode(), "text/plain"
        else:
            payload, content_type = json.dumps(answer).encode(), "application/json"
        handler.send_response(status)
        handler.send_header("Content-Type", content_type)
        handler.send_header("Content-Length", str(len(payload)))
        handler.end_headers()
        handler.wfile.write(payload)

    # ------------------------------------------------------------------ routing

    def _parse(self, path: str) -> tuple[Resource, str | None, str | None, str | None]:
        """(resource, namespace, name, subresource) of a REST path."""
        parts = [p for p in path.split("/") if p]
        if parts[:1] == ["api"] and len(parts) >= 2:
            group_version, rest = parts[1], parts[2:]
        elif parts[:1] == ["apis"] and len(parts) >= 3:
            group_version, rest = f"{parts[1]}/{parts[2]}", parts[3:]
        else:
            raise _NoSuchPath
        namespace = None
        if len(rest) >= 2 and rest[0] == "namespaces" and len(rest) > 2:
            namespace, rest = rest[1], rest[2:]
        if not rest:
            raise _NoSuchPath
        resource = self.store.resource(group_version, rest[0])
        if resource is None:
            raise _NoSuchPath  # an API that is not installed answers a bare 404 page
        name = rest[1] if len(rest) > 1 else None
        subresource = rest[2] if len(rest) > 2 else None
        return resource, namespace, name, subresource

    def _route(self, method: str, path: str, query: dict[str, list[str]], body: Any, content_type: str | None) -> tuple[int, Any]:
        if path.rstrip("/") == "/api":
            return 200, {"kind": "APIVersions", "versions": ["v1"]}
        if path.rstrip("/") == "/apis":
            return 200, self._discovery()
        resource, namespace, name, subresource = self._parse(path)
        ns = namespace or ""
        first = lambda key: (query.get(key) or [None])[0]  # noqa: E731
        if method == "GET" and name is None:
            items = self.store.list(resource, namespace, first("labelSelector"), first("fieldSelector"))
            return 200, {"kind": f"{resource.kind}List", "apiVersion": resource.group_version,
                         "metadata": {"resourceVersion": str(self.store.revision)}, "items": items}
        if method == "GET":
            found = self.store.get(resource, ns, name)
            if found is None:
                raise not_found(resource, name)
            return 200, found
        if method == "POST" and subresource == "eviction" and resource is PODS:
            return 201, self.evict(ns, name)
        if method == "POST":
            obj = dict(body)
            obj.setdefault("metadata", {})
            if resource.namespaced:
                obj["metadata"]["namespace"] = ns
            self._admit("CREATE", resource, obj, None)
            return 201, self.store.create(resource, obj)
        if method == "PUT":
            return 200, self._update(resource, ns, name, lambda _: body, subresource, check_version=True)
        if method == "PATCH":
            if content_type == "application/apply-patch+yaml":
                return 200, self._apply(resource, ns, name, body)
            if content_type != "application/merge-patch+json":
                raise ApiError(415, "UnsupportedMediaType", f"the world serves merge and apply patches, not {content_type}")
            return 200, self._update(resource, ns, name, lambda current: merge_patch(current, body), subresource,
                                     check_version="resourceVersion" in ((body or {}).get("metadata") or {}))
        if method == "DELETE":
            options = body or {}
            propagation = first("propagationPolicy") or options.get("propagationPolicy")
            grace = first("gracePeriodSeconds") or options.get("gracePeriodSeconds")
            if propagation is None and resource.group == "batch":
                propagation = "Orphan"  # batch/v1 Jobs default to orphaning (pkg/registry/batch/job/strategy.go, DefaultGarbageCollectionPolicy)
            before = self.store.get(resource, ns, name)
            wanted_uid = (options.get("preconditions") or {}).get("uid")
            if before is not None and wanted_uid and wanted_uid != before["metadata"].get("uid"):
                # apiserver pkg/storage/interfaces.go, Preconditions.Check, answered as a 409
                # Conflict by the registry (pkg/registry/generic/registry/store.go, Delete).
                group = f".{resource.group}" if resource.group else ""
                raise ApiError(409, "Conflict", f'Operation cannot be fulfilled on {resource.plural}{group} "{name}": Precondition failed: '
                               f'UID in precondition: {wanted_uid}, UID in object meta: {before["metadata"].get("uid")}', name, resource.plural)
            remaining = self.store.delete(resource, ns, name, propagation, None if grace is None else int(grace))
            return 200, remaining or before  # the object, as the API server answers a delete
        raise ApiError(405, "MethodNotAllowed", f"{method} is not supported here")

    def _authorize(self, authorization: str | None, method: str, path: str, watching: bool) -> None:
        if not authorization or path.rstrip("/") in ("/api", "/apis"):
            return
        resource, namespace, name, _ = self._parse(path)
        authorize(self.store, authorization, method, resource, namespace, name, watching)

    def _discovery(self) -> dict[str, Any]:
        groups: dict[str, list[str]] = {}
        for resource in self.store.resources.values():
            if resource.group:
                versions = groups.setdefault(resource.group, [])
                if resource.version not in versions:
                    versions.append(resource.version)
        return {
            "kind": "APIGroupList",
            "apiVersion": "v1",
            "groups": [
                {"name": group, "versions": [{"groupVersion": f"{group}/{v}", "version": v} for v in versions],
                 "preferredVersion": {"groupVersion": f"{group}/{versions[-1]}", "version": versions[-1]}}
                for group, versions in sorted(groups.items())
            ],
        }

    # ------------------------------------------------------------------ writes with admission

    def _admit(self, operation: str, resource: Resource, obj: Obj, old: Obj | None) -> None:
        schema = self.schemas.get(f"{resource.group_version}/{resource.plural}")
        if schema is not None:
            prune(obj, schema)
        for hook in self.admission:
            hook(operation, resource, obj, old)
        if schema is not None:
            validate(obj, schema, resource)

    def _update(self, resource: Resource, ns: str, name: str, change: Callable[[Obj], Obj], subresource: str | None, check_version: bool) -> Obj:
        with self.store.lock:
            current = self.store.get(resource, ns, name)
            if current is None:
                raise not_found(resource, name)
            new = change(current)
            new.setdefault("metadata", {})
            new["metadata"]["name"] = name
            if resource.namespaced:
                new["metadata"]["namespace"] = ns
            if subresource == "status":
                new = {**current, "status": new.get("status")}  # the status subresource writes status only
            elif subresource is None and "status" in current:
                new["status"] = current["status"]  # and the main resource never does (CRDs with status)
            if not check_version:
                new["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
            self._admit("UPDATE", resource, new, current)
            return self.store.replace(resource, new, check_version=True)

    def _apply(self, resource: Resource, ns: str, name: str, body: Obj) -> Obj:
        """Server-side apply, as the world needs it: create, or merge the applied fields in."""
        with self.store.lock:
            if self.store.get(resource, ns, name) is None:
                obj = json.loads(json.dumps(body))
                if resource.namespaced:
                    obj["metadata"]["namespace"] = ns
                self._admit("CREATE", resource, obj, None)
                return self.store.create(resource, obj)
            return self._update(resource, ns, name, lambda current: merge_patch(current, body), None, check_version=False)

    def evict(self, ns: str, name: str) -> Obj:
        """The Eviction subresource (pkg/registry/core/pod/storage/eviction.go, ``Create``): the
        pod gets the DisruptionTarget condition (reason EvictionByEvictionAPI), then a graceful
        delete. PodDisruptionBudgets are not modelled."""
        with self.store.lock:
            pod = self.store.peek(PODS, ns, name)
            if pod is None:
                raise not_found(PODS, name)
            add_condition(pod, "DisruptionTarget", "True", "EvictionByEvictionAPI", "Eviction API: evicting", self.store.clock)
            self.store.write(PODS, pod)
            self.store.delete(PODS, ns, name)
            return {"kind": "Status", "apiVersion": "v1", "status": "Success"}

    # ------------------------------------------------------------------ watches

    def _watch(self, handler: BaseHTTPRequestHandler, path: str, query: dict[str, list[str]]) -> None:
        resource, namespace, _, _ = self._parse(path)
        first = lambda key: (query.get(key) or [None])[0]  # noqa: E731
        labels = first("labelSelector")
        version = first("resourceVersion")
        timeout = min(float(first("timeoutSeconds") or self.watch_timeout_cap_s), self.watch_timeout_cap_s)
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.end_headers()
        handler.close_connection = True
        store = self.store
        with store.lock:
            if version in (None, "", "0"):
                lines = [{"type": "ADDED", "object": obj} for obj in store.list(resource, namespace, labels)]
                revision = store.revision
            else:
                events = store.events_since(resource, int(version), namespace, labels)
                if events is None:
                    gone = ApiError(410, "Expired", f"too old resource version: {version} ({store.compacted})").status()
                    lines, revision = [{"type": "ERROR", "object": gone}], None
                else:
                    lines = [{"type": e.type, "object": e.obj} for e in events]
                    revision = events[-1].revision if events else int(version)
        try:
            self._send(handler, lines)
            if revision is None:
                return
            deadline = threading.Event()
            timer = threading.Timer(timeout, lambda: (deadline.set(), self._wake()))
            timer.start()
            try:
                while not deadline.is_set() and not self.closing:
                    with store.lock:
                        events = store.events_since(resource, revision, namespace, labels)
                        if events is None:
                            gone = ApiError(410, "Expired", "too old resource version").status()
                            self._send(handler, [{"type": "ERROR", "object": gone}])
                            return
                        if not events:
                            store.changed.wait()
                            continue
                    revision = events[-1].revision
                    self._send(handler, [{"type": e.type, "object": e.obj} for e in events])
            finally:
                timer.cancel()
        except (BrokenPipeError, ConnectionResetError):
            return

    def _wake(self) -> None:
        with self.store.lock:
            self.store.changed.notify_all()

    @staticmethod
    def _send(handler: BaseHTTPRequestHandler, events: list[dict[str, Any]]) -> None:
        for event in events:
            handler.wfile.write((json.dumps(event) + "\n").encode())
        handler.wfile.flush()


class _NoSuchPath(Exception):
    pass


# ---------------------------------------------------------------------- pod conditions


def add_condition(obj: Obj, type_: str, status: str, reason: str, message: str, clock: Any) -> None:
    """pkg/api/v1/pod/util.go, ``UpdatePodCondition``: a new condition, or the reason and message
    of one already there; lastTransitionTime moves only when the status changes."""
    conditions = obj.setdefault("status", {}).setdefault("conditions", [])
    found = next((c for c in conditions if c["type"] == type_), None)
    if found is None:
        conditions.append({"type": type_, "status": status, "reason": reason, "message": message, "lastTransitionTime": clock.iso()})
    elif found.get("status") != status:
        found.update(status=status, reason=reason, message=message, lastTransitionTime=clock.iso())
    elif found.get("reason") != reason:
        found.update(reason=reason, message=message)


def gate_condition(pod: Obj, clock: Any) -> None:
    """pkg/registry/core/pod/strategy.go, ``applySchedulingGatedCondition`` (PrepareForCreate): a
    pod created with scheduling gates gets PodScheduled=False, reason SchedulingGated, at once."""
    if (pod.get("spec") or {}).get("schedulingGates"):
        add_condition(pod, "PodScheduled", "False", "SchedulingGated", "Scheduling is blocked due to non-empty scheduling gates", clock)


# ---------------------------------------------------------------------- CRD schemas


def load_crd_schemas(crds: list[Obj]) -> dict[str, dict[str, Any]]:
    """``group/version/plural`` -> openAPIV3Schema of every served version of the CRDs."""
    schemas = {}
    for crd in crds:
        spec = crd["spec"]
        for version in spec["versions"]:
            if version.get("served"):
                schemas[f"{spec['group']}/{version['name']}/{spec['names']['plural']}"] = version["schema"]["openAPIV3Schema"]
    return schemas


def prune(obj: Any, schema: dict[str, Any]) -> None:
    """Drop fields the structural schema does not know (what a server of an older CRD does to a
    field it lacks, silently)."""
    if isinstance(obj, dict) and schema.get("type") == "object" and not schema.get("x-kubernetes-preserve-unknown-fields"):
        properties = schema.get("properties")
        additional = schema.get("additionalProperties")
        if properties is not None:
            for key in list(obj):
                if key in properties:
                    prune(obj[key], properties[key])
                elif key not in ("apiVersion", "kind", "metadata"):
                    del obj[key]
        elif isinstance(additional, dict):
            for value in obj.values():
                prune(value, additional)
    elif isinstance(obj, list) and isinstance(schema.get("items"), dict):
        for item in obj:
            prune(item, schema["items"])


def validate(obj: Obj, schema: dict[str, Any], resource: Resource) -> None:
    import jsonschema

    try:
        _validator(schema).validate(obj)
    except jsonschema.ValidationError as error:
        where = ".".join(str(p) for p in error.absolute_path)
        raise ApiError(422, "Invalid", f'{resource.kind}.{resource.group} "{obj["metadata"].get("name")}" is invalid: {where}: {error.message}') from None


_VALIDATORS: dict[int, Any] = {}


def _validator(schema: dict[str, Any]) -> Any:
    """One validator per schema object (the schemas live as long as the test session)."""
    import jsonschema

    if id(schema) not in _VALIDATORS:
        _VALIDATORS[id(schema)] = jsonschema.Draft7Validator(schema)
    return _VALIDATORS[id(schema)]


__all__ = ["ApiServer", "Fault", "Request", "add_condition", "gate_condition", "load_crd_schemas", "CRDS", "EVENTS", "LEASES"]
