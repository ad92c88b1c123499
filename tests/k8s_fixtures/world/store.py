"""The API server's storage: typed objects by (resource, namespace, name), resource versions, a
watch history, label and field selectors, and deletion with finalizers and propagation.

What it keeps from the real API server (kubernetes/kubernetes staging/src/k8s.io/apiserver):

- every write bumps one cluster-wide ``resourceVersion`` (etcd's revision), and each object
  carries the revision of its last write (``storage/etcd3/store.go``);
- an update carrying a ``metadata.resourceVersion`` that is not the stored one is a 409 Conflict
  (``registry/generic/registry/store.go``, ``Update``: optimistic concurrency);
- deletion: an object with finalizers only gets a ``deletionTimestamp`` and goes when the last
  finalizer is removed; ``propagationPolicy: Foreground`` adds the ``foregroundDeletion``
  finalizer that the garbage collector removes once the dependents are gone
  (``registry/generic/registry/store.go``, ``Delete`` / ``updateForGracefulDeletionAndFinalizers``);
- a pod that is bound to a node is deleted gracefully: it gets ``deletionTimestamp`` and stays
  until the kubelet confirms its containers stopped; an unbound pod or a grace period of 0 goes
  at once (``pkg/registry/core/pod/strategy.go``, ``CheckGracefulDelete``);
- watches replay the history after a resource version; one older than the compacted history
  is answered with a 410 Gone ``ERROR`` event (``storage/cacher/watch_cache.go``,
  ``getAllEventsSinceLocked``: "too old resource version").

Times come from the world's virtual clock, never from the machine's.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import threading
from collections.abc import Callable, Iterable
from typing import Any

from hotswap.api.times import iso_utc, parse_iso_utc

Obj = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Resource:
    group: str  # "" for the core group
    version: str
    plural: str
    kind: str
    namespaced: bool

    @property
    def group_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


def _res(group: str, version: str, plural: str, kind: str, namespaced: bool = True) -> Resource:
    return Resource(group, version, plural, kind, namespaced)


NODES = _res("", "v1", "nodes", "Node", namespaced=False)
PODS = _res("", "v1", "pods", "Pod")
EVENTS = _res("", "v1", "events", "Event")
SERVICES = _res("", "v1", "services", "Service")
CONFIG_MAPS = _res("", "v1", "configmaps", "ConfigMap")
JOBS = _res("batch", "v1", "jobs", "Job")
LEASES = _res("coordination.k8s.io", "v1", "leases", "Lease")
PRIORITY_CLASSES = _res("scheduling.k8s.io", "v1", "priorityclasses", "PriorityClass", namespaced=False)
DEPLOYMENTS = _res("apps", "v1", "deployments", "Deployment")
CRDS = _res("apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition", namespaced=False)
JOBSETS = _res("jobset.x-k8s.io", "v1alpha2", "jobsets", "JobSet")
KUEUE_WORKLOADS = _res("kueue.x-k8s.io", "v1beta2", "workloads", "Workload")
LOCAL_QUEUES = _res("kueue.x-k8s.io", "v1beta2", "localqueues", "LocalQueue")
CLUSTER_QUEUES = _res("kueue.x-k8s.io", "v1beta2", "clusterqueues", "ClusterQueue", namespaced=False)
RESOURCE_FLAVORS = _res("kueue.x-k8s.io", "v1beta2", "resourceflavors", "ResourceFlavor", namespaced=False)

BUILTIN = (NODES, PODS, EVENTS, SERVICES, CONFIG_MAPS, JOBS, LEASES, PRIORITY_CLASSES, DEPLOYMENTS, CRDS)
JOBSET_RESOURCES = (JOBSETS,)
KUEUE_RESOURCES = (KUEUE_WORKLOADS, LOCAL_QUEUES, CLUSTER_QUEUES, RESOURCE_FLAVORS)

FOREGROUND = "foregroundDeletion"


class ApiError(Exception):
    """An error the API server answers with a Status object."""

    def __init__(self, code: int, reason: str, message: str, name: str | None = None, kind: str | None = None) -> None:
        super().__init__(message)
        self.code, self.reason, self.message, self.name, self.kind = code, reason, message, name, kind

    def status(self) -> Obj:
        body: Obj = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": self.message, "reason": self.reason, "code": self.code}
        if self.name is not None:
            body["details"] = {"name": self.name, "kind": self.kind}
        return body


def not_found(resource: Resource, name: str) -> ApiError:
    group = f".{resource.group}" if resource.group else ""
    return ApiError(404, "NotFound", f'{resource.plural}{group} "{name}" not found', name, resource.plural)


class Clock:
    """The world's virtual clock (Unix seconds)."""

    def __init__(self, start: float = 1_767_600_000.0) -> None:
        self.now = start

    def iso(self, t: float | None = None) -> str:
        return iso_utc(self.now if t is None else t)

    def micro(self, t: float | None = None) -> str:
        return iso_utc(self.now if t is None else t, 6)


def parse_time(text: str | None) -> float | None:
    return parse_iso_utc(text) if text else None


# ---------------------------------------------------------------------- selectors


def _parse_label_selector(text: str) -> list[tuple[str, str, str | None]]:
    """``a=b,c!=d,e,!f`` as (key, operator, value) requirements (apimachinery's
    ``labels.Parse``, the subset hotswap and the controllers here use)."""
    requirements: list[tuple[str, str, str | None]] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        if "!=" in part:
            key, value = part.split("!=", 1)
            requirements.append((key.strip(), "!=", value.strip()))
        elif "==" in part or "=" in part:
            key, value = part.replace("==", "=").split("=", 1)
            requirements.append((key.strip(), "=", value.strip()))
        elif part.startswith("!"):
            requirements.append((part[1:].strip(), "!", None))
        else:
            requirements.append((part, "exists", None))
    return requirements


def matches_labels(obj: Obj, selector: str | None) -> bool:
    if not selector:
        return True
    labels = (obj.get("metadata") or {}).get("labels") or {}
    for key, op, value in _parse_label_selector(selector):
        if op == "=" and labels.get(key) != value:
            return False
        if op == "!=" and labels.get(key) == value:
            return False
        if op == "exists" and key not in labels:
            return False
        if op == "!" and key in labels:
            return False
    return True


def _field(obj: Obj, path: str) -> str:
    node: Any = obj
    for part in path.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return "" if node is None else str(node)


def matches_fields(obj: Obj, selector: str | None) -> bool:
    """Field selectors (``spec.nodeName=x``, ``status.phase!=Failed``): pods support these
    fields (pkg/registry/core/pod/strategy.go, ``ToSelectableFields``)."""
    if not selector:
        return True
    for part in filter(None, selector.split(",")):
        if "!=" in part:
            path, value = part.split("!=", 1)
            if _field(obj, path) == value:
                return False
        else:
            path, value = part.replace("==", "=").split("=", 1)
            if _field(obj, path) != value:
                return False
    return True


# ---------------------------------------------------------------------- merge patch


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch (``application/merge-patch+json``)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


# ---------------------------------------------------------------------- the store


@dataclasses.dataclass
class WatchEvent:
    revision: int
    resource: Resource
    type: str  # ADDED, MODIFIED, DELETED
    obj: Obj


class Store:
    """Objects as the API server holds them. All access goes through one re-entrant lock: the
    HTTP server answers on its own threads while the world's controllers run on the test's."""

    def __init__(self, clock: Clock, resources: Iterable[Resource]) -> None:
        self.clock = clock
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)
        self.resources: dict[tuple[str, str], Resource] = {}
        self.objects: dict[tuple[Resource, str, str], Obj] = {}
        # Indexes kept by every recorded change (as the API server's watch cache and the
        # informers' indexers do), so that the world's controllers stay linear at 10,000 pods:
        # each kind's objects, their keys in name order, the objects each owner UID owns, the
        # pods bound to each node.
        self._kinds: dict[Resource, dict[tuple[str, str], Obj]] = {}
        self._ordered: dict[Resource, list[tuple[str, str]]] = {}
        self._owned: dict[str, dict[tuple[Resource, str, str], Obj]] = {}
        self._owners_of: dict[tuple[Resource, str, str], tuple[str, ...]] = {}
        self._on_node: dict[str, dict[tuple[str, str], Obj]] = {}
        self._node_of: dict[tuple[str, str], str] = {}
        self._labelled: dict[tuple[Resource, str, str], dict[tuple[str, str], Obj]] = {}
        self._labels_of: dict[tuple[Resource, str, str], tuple[tuple[str, str], ...]] = {}
        self.revision = 1000
        self.history: list[WatchEvent] = []
        self.compacted = 0  # revisions at or below this are no longer replayable
        self._uids = itertools.count(1)
        self.on_change: list[Callable[[WatchEvent], None]] = []
        for resource in resources:
            self.serve(resource)

    def serve(self, resource: Resource) -> None:
        self.resources[(resource.group_version, resource.plural)] = resource

    def unserve(self, resource: Resource) -> None:
        self.resources.pop((resource.group_version, resource.plural), None)

    def resource(self, group_version: str, plural: str) -> Resource | None:
        return self.resources.get((group_version, plural))

    # ------------------------------------------------------------------ reads

    def get(self, resource: Resource, namespace: str, name: str) -> Obj | None:
        with self.lock:
            found = self.objects.get((resource, namespace if resource.namespaced else "", name))
            return copy.deepcopy(found) if found is not None else None

    def peek(self, resource: Resource, namespace: str, name: str) -> Obj | None:
        """The stored object itself (the world's controllers edit it through :meth:`write`)."""
        return self.objects.get((resource, namespace if resource.namespaced else "", name))

    def list(
        self, resource: Resource, namespace: str | None = None, labels: str | None = None, fields: str | None = None
    ) -> list[Obj]:
        with self.lock:
            return [copy.deepcopy(obj) for obj in self.items(resource, namespace) if matches_labels(obj, labels) and matches_fields(obj, fields)]

    def items(self, resource: Resource, namespace: str | None = None) -> list[Obj]:
        """Stored objects of a kind, in name order, for the world's controllers (not copies)."""
        with self.lock:
            kind = self._kinds.get(resource) or {}
            order = self._ordered.get(resource)
            if order is None:
                order = self._ordered[resource] = sorted(kind)
            return [kind[key] for key in order if namespace is None or key[0] == namespace]

    def owned_by(self, resource: Resource, uid: str) -> list[Obj]:
        """Stored objects of a kind with an owner reference to ``uid``, in name order."""
        with self.lock:
            found = [(key, obj) for key, obj in (self._owned.get(uid) or {}).items() if key[0] == resource]
            return [obj for _, obj in sorted(found, key=lambda item: item[0][1:])]

    def labelled(self, resource: Resource, key: str, value: str) -> list[Obj]:
        """Stored objects of a kind whose label ``key`` is ``value``, in name order."""
        with self.lock:
            return [obj for _, obj in sorted((self._labelled.get((resource, key, value)) or {}).items())]

    def pods_on(self, node: str) -> list[Obj]:
        """Stored pods bound to ``node`` (``spec.nodeName``), in name order."""
        with self.lock:
            return [obj for _, obj in sorted((self._on_node.get(node) or {}).items())]

    def _index(self, resource: Resource, type_: str, obj: Obj) -> None:
        meta = obj["metadata"]
        key = (meta.get("namespace", "") if resource.namespaced else "", meta["name"])
        kind = self._kinds.setdefault(resource, {})
        full = (resource, *key)
        for uid in self._owners_of.pop(full, ()):
            self._owned[uid].pop(full, None)
        for label in self._labels_of.pop(full, ()):
            self._labelled[(resource, *label)].pop(key, None)
        node = self._node_of.pop(key, None) if resource is PODS else None
        if node is not None:
            self._on_node[node].pop(key, None)
        if type_ == "DELETED":
            if kind.pop(key, None) is not None:
                self._ordered.pop(resource, None)
            return
        if key not in kind:
            self._ordered.pop(resource, None)
        kind[key] = obj
        owners = tuple(o["uid"] for o in meta.get("ownerReferences") or [] if o.get("uid"))
        if owners:
            self._owners_of[full] = owners
            for uid in owners:
                self._owned.setdefault(uid, {})[full] = obj
        labels = tuple((meta.get("labels") or {}).items())
        if labels:
            self._labels_of[full] = labels
            for label in labels:
                self._labelled.setdefault((resource, *label), {})[key] = obj
        node = (obj.get("spec") or {}).get("nodeName") if resource is PODS else None
        if node:
            self._node_of[key] = node
            self._on_node.setdefault(node, {})[key] = obj

    # ------------------------------------------------------------------ writes

    def _record(self, resource: Resource, type_: str, obj: Obj) -> None:
        self.revision += 1
        self._index(resource, type_, obj)
        if type_ != "DELETED":
            obj["metadata"]["resourceVersion"] = str(self.revision)
        event = WatchEvent(self.revision, resource, type_, copy.deepcopy(obj))
        self.history.append(event)
        for listener in self.on_change:
            listener(event)
        self.changed.notify_all()

    def create(self, resource: Resource, obj: Obj) -> Obj:
        with self.lock:
            meta = obj.setdefault("metadata", {})
            if not meta.get("name") and meta.get("generateName"):
                meta["name"] = f"{meta['generateName']}{next(self._uids):05x}"
            namespace = meta.get("namespace", "") if resource.namespaced else ""
            key = (resource, namespace, meta["name"])
            if key in self.objects:
                group = f".{resource.group}" if resource.group else ""
                raise ApiError(409, "AlreadyExists", f'{resource.plural}{group} "{meta["name"]}" already exists', meta["name"], resource.plural)
            meta.setdefault("uid", f"{resource.plural[:3]}-{next(self._uids):06d}")
            meta.setdefault("creationTimestamp", self.clock.iso())
            meta.pop("resourceVersion", None)
            obj.setdefault("apiVersion", resource.group_version)
            obj.setdefault("kind", resource.kind)
            self.objects[key] = obj
            self._record(resource, "ADDED", obj)
            return copy.deepcopy(obj)

    def replace(self, resource: Resource, obj: Obj, check_version: bool = True) -> Obj:
        """A PUT: the whole object, refused with 409 when its resourceVersion is stale."""
        with self.lock:
            meta = obj["metadata"]
            namespace = meta.get("namespace", "") if resource.namespaced else ""
            key = (resource, namespace, meta["name"])
            current = self.objects.get(key)
            if current is None:
                raise not_found(resource, meta["name"])
            wanted = meta.get("resourceVersion")
            if check_version and wanted and wanted != current["metadata"]["resourceVersion"]:
                group = f".{resource.group}" if resource.group else ""
                raise ApiError(
                    409, "Conflict",
                    f'Operation cannot be fulfilled on {resource.plural}{group} "{meta["name"]}": the object has been'
                    " modified; please apply your changes to the latest version and try again",
                    meta["name"], resource.plural,
                )
            for kept in ("uid", "creationTimestamp", "deletionTimestamp"):
                if kept in current["metadata"]:
                    meta[kept] = current["metadata"][kept]
            self.objects[key] = obj
            self._record(resource, "MODIFIED", obj)
            return copy.deepcopy(obj)

    def write(self, resource: Resource, obj: Obj) -> None:
        """Record a change a world controller made to a stored object in place (its own
        update call: a new resourceVersion and a MODIFIED event)."""
        with self.lock:
            self._record(resource, "MODIFIED", obj)

    def delete(self, resource: Resource, namespace: str, name: str, propagation: str | None = None, grace: int | None = None) -> Obj | None:
        """Delete as the API server does; returns the object as it is now (None: gone)."""
        with self.lock:
            key = (resource, namespace if resource.namespaced else "", name)
            obj = self.objects.get(key)
            if obj is None:
                raise not_found(resource, name)
            meta = obj["metadata"]
            finalizers = list(meta.get("finalizers") or [])
            if propagation == "Foreground" and FOREGROUND not in finalizers:
                finalizers.append(FOREGROUND)
            elif propagation == "Orphan":
                self._orphan(meta["uid"])
            graceful = resource is PODS and (obj.get("spec") or {}).get("nodeName") and grace != 0 and (obj.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
            if finalizers or graceful:
                first = "deletionTimestamp" not in meta
                if finalizers:
                    meta["finalizers"] = finalizers
                period = 0
                if resource is PODS:
                    period = grace if grace is not None else int((obj.get("spec") or {}).get("terminationGracePeriodSeconds", 30))
                    meta.setdefault("deletionGracePeriodSeconds", period)
                # The time the object is to be gone by: now plus its grace period
                # (pkg/registry/rest/delete.go, ``BeforeDelete``).
                meta.setdefault("deletionTimestamp", self.clock.iso(self.clock.now + period))
                if first or propagation == "Foreground":
                    self._record(resource, "MODIFIED", obj)
                return copy.deepcopy(obj)
            del self.objects[key]
            self._record(resource, "DELETED", obj)
            return None

    def remove(self, resource: Resource, obj: Obj) -> None:
        """The last step of a deletion (kubelet confirmed, last finalizer removed)."""
        with self.lock:
            meta = obj["metadata"]
            key = (resource, meta.get("namespace", "") if resource.namespaced else "", meta["name"])
            if self.objects.get(key) is obj:
                del self.objects[key]
                self._record(resource, "DELETED", obj)

    def _orphan(self, owner_uid: str) -> None:
        for (resource, _, _), obj in list(self.objects.items()):
            owners = obj["metadata"].get("ownerReferences") or []
            kept = [o for o in owners if o.get("uid") != owner_uid]
            if len(kept) != len(owners):
                obj["metadata"]["ownerReferences"] = kept
                self._record(resource, "MODIFIED", obj)

    # ------------------------------------------------------------------ watches

    def events_since(self, resource: Resource, revision: int, namespace: str | None, labels: str | None) -> list[WatchEvent] | None:
        """Events after ``revision`` (None: it was compacted away, the watcher must re-list)."""
        with self.lock:
            if revision < self.compacted:
                return None
            return [
                e for e in self.history
                if e.revision > revision and e.resource == resource
                and (namespace is None or e.obj["metadata"].get("namespace") == namespace)
                and matches_labels(e.obj, labels)
            ]

    def compact(self) -> None:
        """Forget the watch history up to now (etcd compaction): older watches get 410 Gone."""
        with self.lock:
            self.compacted = self.revision
            self.history.clear()
