"""The garbage collector (kubernetes/kubernetes ``pkg/controller/garbagecollector``):
``attemptToDeleteItem`` deletes a dependent whose owners are all gone (background propagation),
and ``processDeletingDependentsItem`` finishes a foreground deletion, deleting the owner's
dependents and removing its ``foregroundDeletion`` finalizer once they are gone."""

from __future__ import annotations

from k8s_fixtures.world.store import FOREGROUND, Obj, Resource, Store


class GarbageCollector:
    def __init__(self, store: Store, kinds: tuple[Resource, ...]) -> None:
        self.store = store
        self.kinds = kinds  # owners and dependents it looks at (JobSets, Jobs, Pods, ...)

    def step(self) -> None:
        live = {obj["metadata"]["uid"]: obj for kind in self.kinds for obj in self.store.items(kind)}
        for kind in self.kinds:
            for obj in list(self.store.items(kind)):
                owners = [o for o in obj["metadata"].get("ownerReferences") or [] if o.get("uid")]
                if owners and not any(o["uid"] in live for o in owners) and "deletionTimestamp" not in obj["metadata"]:
                    self._delete(kind, obj)
        for kind in self.kinds:
            for owner in list(self.store.items(kind)):
                meta = owner["metadata"]
                if FOREGROUND not in (meta.get("finalizers") or []):
                    continue
                dependents = self._dependents(meta["uid"])
                for dep_kind, dependent in dependents:
                    if "deletionTimestamp" not in dependent["metadata"]:
                        self._delete(dep_kind, dependent)
                if not dependents:
                    meta["finalizers"] = [f for f in meta["finalizers"] if f != FOREGROUND]
                    if not meta["finalizers"]:
                        self.store.remove(kind, owner)
                    else:
                        self.store.write(kind, owner)

    def _dependents(self, uid: str) -> list[tuple[Resource, Obj]]:
        return [
            (kind, obj)
            for kind in self.kinds
            for obj in self.store.items(kind)
            if any(o.get("uid") == uid for o in obj["metadata"].get("ownerReferences") or [])
        ]

    def _delete(self, kind: Resource, obj: Obj) -> None:
        meta = obj["metadata"]
        self.store.delete(kind, meta.get("namespace", ""), meta["name"])
