"""A Kubernetes cluster's options, as ``cluster create --backend kubernetes`` records them.

They live in the cluster record's ``settings`` dict (see :mod:`hotswap.store.state`); the
in-cluster controller gets the same dict from its Deployment (``HOTSWAP_KUBERNETES_SETTINGS``).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from hotswap.api.errors import InvalidInputError
from hotswap.backends.kubernetes import labels
from hotswap.backends.kubernetes.checkpoint_volume import parse_checkpoint_volume

# A qualified label key: an optional DNS-subdomain prefix and a name (Kubernetes' rules).
_LABEL_KEY = re.compile(
    r"^(?:[a-z0-9](?:[-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")


@dataclasses.dataclass(frozen=True)
class KubeSettings:
    context: str | None = None  # kubeconfig context; None: the current one (or in-cluster)
    namespace: str = labels.DEFAULT_NAMESPACE
    kueue: bool = False
    cluster_queue: str = labels.DEFAULT_CLUSTER_QUEUE
    local_queue: str = labels.DEFAULT_LOCAL_QUEUE
    node_pool_label: str = labels.NODE_POOL_LABEL
    accelerator_label: str = labels.TPU_ACCELERATOR_LABEL
    topology_label: str = labels.TPU_TOPOLOGY_LABEL
    gpu_accelerator_label: str = labels.GPU_ACCELERATOR_LABEL
    checkpoint_volume: str | None = None  # default for workloads: pvc:<claim> or gcsfuse:<bucket>
    # Node condition types that mark a node Failed while True: what a node health checker (a node
    # problem detector with GPU checks, say) reports, e.g. ("GcmXidErrorsProblem",).
    failure_conditions: tuple[str, ...] = ()

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> KubeSettings:
        """Validated settings from CLI options or a stored record (unknown keys are an error)."""
        known = {field.name for field in dataclasses.fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            flags = ", ".join("--" + key.replace("_", "-") for key in unknown)
            raise InvalidInputError(f"{flags}: not an option of --backend kubernetes")
        values = {key: value for key, value in options.items() if value is not None}
        conditions = values.get("failure_conditions")
        if isinstance(conditions, str):
            values["failure_conditions"] = tuple(c.strip() for c in conditions.split(",") if c.strip())
        elif conditions is not None:
            values["failure_conditions"] = tuple(conditions)
        settings = cls(**values)
        settings.validate()
        return settings

    def validate(self) -> None:
        if not _DNS_LABEL.fullmatch(self.namespace):
            raise InvalidInputError(f"--namespace {self.namespace!r} is not a valid namespace name (a DNS-1123 label)")
        for flag, value in (("--cluster-queue", self.cluster_queue), ("--local-queue", self.local_queue)):
            if not _DNS_SUBDOMAIN.fullmatch(value):
                raise InvalidInputError(f"{flag} {value!r} is not a valid Kueue object name (a DNS-1123 subdomain)")
        for flag, value in (
            ("--node-pool-label", self.node_pool_label),
            ("--accelerator-label", self.accelerator_label),
            ("--topology-label", self.topology_label),
            ("--gpu-accelerator-label", self.gpu_accelerator_label),
        ):
            if not _LABEL_KEY.fullmatch(value):
                raise InvalidInputError(f"{flag} {value!r} is not a valid label key (e.g. cloud.google.com/gke-nodepool)")
        if self.checkpoint_volume is not None:
            parse_checkpoint_volume(self.checkpoint_volume)
        for condition in self.failure_conditions:
            if not _LABEL_KEY.fullmatch(condition):
                raise InvalidInputError(f"--failure-conditions: {condition!r} is not a valid node condition type")

    def to_dict(self) -> dict[str, Any]:
        values = dataclasses.asdict(self)
        values["failure_conditions"] = list(self.failure_conditions)
        return values
