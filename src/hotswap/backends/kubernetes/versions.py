"""The JobSet and Kueue versions hotswap supports (the one place that says so), and how the
installed ones are recognised through the API (pure: the evidence is read by the client).

Evidence, best first:

1. the controller's image tag (``registry.k8s.io/jobset/jobset:v0.12.0``) on its Deployment in
   the namespace the release manifests install it to;
2. the CRD's schema: fields and enum values appear in known releases, and the API server
   prunes what its CRD lacks, silently (so a rule with ``onJobFailureMessagePatterns`` on a
   v0.9 server would lose its pattern and match every failure);
3. the API versions the server serves (Kueue v0.20 serves only ``v1beta2``).

A version below the minimum is refused with the exact upgrade command; one that cannot be read
(no permission to read CRDs or the controller's Deployment) is reported, not guessed.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

Version = tuple[int, int, int]


@dataclasses.dataclass(frozen=True)
class Component:
    name: str
    group: str
    api_version: str  # the served version hotswap uses
    minimum: Version
    why_minimum: str
    supported: str  # the release hotswap is tested against (its CRDs are the tests' schemas)
    crd: str
    deployment: tuple[str, str]  # (namespace, name) of its controller in the release manifests
    image: str  # the controller image's repository
    manifests: str  # release manifest URL, {version} filled in

    def install(self, version: str | None = None) -> str:
        url = self.manifests.format(version=version or self.supported)
        return f"kubectl apply --server-side -f {url}"


JOBSET = Component(
    name="JobSet",
    group="jobset.x-k8s.io",
    api_version="v1alpha2",
    minimum=(0, 11, 0),
    why_minimum=(
        "from v0.11 every JobSet pod carries the jobset.sigs.k8s.io/priority label (jobset#1077), so"
        " other JobSets' priority-scoped exclusive placement sees hotswap's pods"
    ),
    supported="v0.12.0",
    crd="jobsets.jobset.x-k8s.io",
    deployment=("jobset-system", "jobset-controller-manager"),
    image="registry.k8s.io/jobset/jobset",
    manifests="https://github.com/kubernetes-sigs/jobset/releases/download/{version}/manifests.yaml",
)

KUEUE = Component(
    name="Kueue",
    group="kueue.x-k8s.io",
    api_version="v1beta2",
    minimum=(0, 15, 0),
    why_minimum="hotswap uses kueue.x-k8s.io/v1beta2, first served by v0.15 (v0.20 serves nothing else)",
    supported="v0.19.2",
    crd="workloads.kueue.x-k8s.io",
    deployment=("kueue-system", "kueue-controller-manager"),
    image="registry.k8s.io/kueue/kueue",
    manifests="https://github.com/kubernetes-sigs/kueue/releases/download/{version}/manifests.yaml",
)

# What each JobSet release added to its CRD (config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml):
# a server whose CRD has the field or enum value runs at least that release.
_JOBSET_MARKERS: tuple[tuple[Version, tuple[str, ...], str | None], ...] = (
    ((0, 12, 0), ("spec", "failurePolicy", "rules", "[]", "action"), "RestartJob"),
    ((0, 11, 0), ("spec", "failurePolicy", "restartStrategy"), "InPlaceRestart"),
    ((0, 10, 0), ("spec", "failurePolicy", "rules", "[]", "onJobFailureMessagePatterns"), None),
)

_TAG = re.compile(r":v?(\d+)\.(\d+)\.(\d+)")


def text(version: Version) -> str:
    return "v" + ".".join(str(part) for part in version)


def from_image(image: str) -> Version | None:
    """The release of a controller image ``.../jobset:v0.12.0`` (a digest-only image: None)."""
    match = _TAG.search(image.rsplit("/", 1)[-1])
    return (int(match.group(1)), int(match.group(2)), int(match.group(3))) if match else None


def _schema_node(schema: dict[str, Any], path: tuple[str, ...]) -> dict[str, Any] | None:
    node: dict[str, Any] | None = schema
    for part in path:
        if node is None:
            return None
        node = node.get("items") if part == "[]" else (node.get("properties") or {}).get(part)
    return node


def from_jobset_crd(crd: dict[str, Any]) -> Version | None:
    """The oldest JobSet release whose CRD has everything this one has (None: older than
    every marker, i.e. before v0.10)."""
    versions = (crd.get("spec") or {}).get("versions") or []
    served = next((v for v in versions if v.get("name") == JOBSET.api_version), None)
    schema = ((served or {}).get("schema") or {}).get("openAPIV3Schema") or {}
    for version, path, value in _JOBSET_MARKERS:
        node = _schema_node(schema, path)
        if node is not None and (value is None or value in (node.get("enum") or [])):
            return version
    return None


@dataclasses.dataclass(frozen=True)
class Installed:
    """What the API told about one component."""

    component: Component
    served: bool
    image_version: Version | None = None  # from the controller image's tag
    schema_version: Version | None = None  # a lower bound from the CRD's schema
    schema_read: bool = False
    unreadable: tuple[str, ...] = ()  # what could not be read, and why

    @property
    def version(self) -> Version | None:
        return self.image_version or self.schema_version

    def problem(self) -> str | None:
        """The one-line reason to refuse this installation, or None."""
        component = self.component
        upgrade = f"install {component.name} {component.supported}: {component.install()}"
        if not self.served:
            return f"the API {component.group}/{component.api_version} is not installed on this cluster; {upgrade}"
        found = self.image_version
        if found is None and self.schema_read and self.schema_version is None:
            return (
                f"{component.name} on this cluster is older than v0.10 (its CRD lacks fields hotswap needs);"
                f" hotswap needs {component.name} >= {text(component.minimum)} ({component.why_minimum}); {upgrade}"
            )
        if found is None:
            found = self.schema_version
        if found is not None and found < component.minimum:
            exact = text(found) if self.image_version else f"{text(found)} (by its CRD)"
            return (
                f"{component.name} {exact} is installed; hotswap needs {component.name} >= {text(component.minimum)}"
                f" ({component.why_minimum}); upgrade: {component.install()}"
            )
        return None

    def summary(self) -> str:
        """What ``cluster create`` reports about it."""
        component = self.component
        if self.image_version is not None:
            found = text(self.image_version)
        elif self.schema_version is not None:
            found = f">= {text(self.schema_version)} (by its CRD)"
        else:
            found = "version unknown"
        note = f"{component.name} {found}; supported {component.supported}"
        if self.unreadable:
            note += f" (could not read {', '.join(self.unreadable)})"
        return note
