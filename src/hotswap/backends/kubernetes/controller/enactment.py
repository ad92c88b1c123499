"""The controller's writes for one round's operations: an
:class:`~hotswap.backends.kubernetes.operations.OperationHandler` over the client, one method
per kind of operation (:func:`~hotswap.backends.kubernetes.operations.dispatch`).

It also keeps what the round's later operations depend on: the JobSets whose record was refused
(nothing else of theirs is written this round) and the pods whose release failed (only those
are recreated, :class:`~hotswap.backends.kubernetes.operations.RecreateGatedPod`).
"""

from __future__ import annotations

from typing import Any

from hotswap.api.errors import HotswapError
from hotswap.backends.kubernetes import labels
from hotswap.backends.kubernetes import operations as ops
from hotswap.backends.kubernetes.client import KubeClient


class Enactment:
    """Applies the operations of one round (``jobset_uids``: JobSet name -> its uid, which its
    Events name; ``now``: the round's time)."""

    def __init__(self, client: KubeClient, jobset_uids: dict[str, str], now: float) -> None:
        self.client = client
        self.involved = {name: {"metadata": {"uid": uid}} for name, uid in jobset_uids.items()}
        self.now = now
        self.refused: set[str] = set()  # JobSets whose record was refused: their decision is not committed
        self.unreleased: set[str] = set()  # pods whose release failed this round

    def on_patch_jobset(self, op: ops.PatchJobSet) -> None:
        patch: dict[str, Any] = {}
        if op.suspend is not None:
            patch["spec"] = {"suspend": op.suspend}
        if op.annotations:
            patch["metadata"] = {"annotations": op.annotations}
        try:
            self.client.patch_jobset(op.jobset, patch, op.resource_version)
        except HotswapError:
            self.refused.add(op.jobset)
            raise

    def on_delete_job(self, op: ops.DeleteJob) -> None:
        self.client.delete_job(op.name, op.uid)

    def on_touch_job(self, op: ops.TouchJob) -> None:
        self.client.patch_job(op.name, {"metadata": {"annotations": {labels.TOUCHED_ANNOTATION: op.stamp}}})

    def on_delete_pod(self, op: ops.DeletePod) -> None:
        self.client.delete_pod(op.pod, op.uid or None, force=op.force)

    def on_place_pod(self, op: ops.PlacePod) -> None:
        spec: dict[str, Any] = {"schedulingGates": [{"name": g} for g in op.gates]}
        if op.node_selector:
            spec["nodeSelector"] = op.node_selector
        try:
            self.client.patch_pod(op.pod, {"metadata": {"annotations": op.annotations}, "spec": spec})
        except HotswapError:
            self.unreleased.add(op.pod)
            raise

    def on_recreate_gated_pod(self, op: ops.RecreateGatedPod) -> None:
        if op.pod not in self.unreleased:
            return  # released after all
        if self.client.delete_pod(op.pod, op.uid):
            self._event(op.jobset, "PodStalled", op.message, True)

    def on_annotate_pod(self, op: ops.AnnotatePod) -> None:
        self.client.patch_pod(op.pod, {"metadata": {"annotations": op.annotations}})

    def on_deactivate_kueue_workload(self, op: ops.DeactivateKueueWorkload) -> None:
        self.client.deactivate_kueue_workload(op.workload)

    def on_record_event(self, op: ops.RecordEvent) -> None:
        self._event(op.jobset, op.reason, op.message, op.warning)

    def _event(self, jobset: str, reason: str, message: str, warning: bool) -> None:
        self.client.record_event(self.involved.get(jobset), jobset, reason, message, warning, self.now)
