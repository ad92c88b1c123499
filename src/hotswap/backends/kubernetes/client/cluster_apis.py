"""What the cluster serves and has installed: API discovery and the versions of JobSet and
Kueue (their controllers' images, JobSet's CRD schema)."""

from __future__ import annotations

from hotswap.api.errors import HotswapError, NotFoundError
from hotswap.backends.kubernetes import versions
from hotswap.backends.kubernetes.client.calls import ApiCalls, client_module
from hotswap.backends.kubernetes.client.connection import install_hint


class ClusterApis(ApiCalls):
    def served_apis(self) -> set[str]:
        """Every ``group/version`` the server serves (API discovery, allowed to every user)."""
        answer = self._call("discover the cluster's APIs", client_module().ApisApi(self.api_client).get_api_versions)
        return {v["groupVersion"] for g in answer.get("groups", []) for v in g.get("versions", [])}

    def require_apis(self, *apis: str) -> None:
        """A one-line error naming what to install when one of ``apis`` is not served."""
        served = self.served_apis()
        for api in apis:
            if api not in served:
                raise NotFoundError(f"the API {api} is not installed on this cluster; {install_hint(api)}")

    def installed(self, component: versions.Component) -> versions.Installed:
        """What the API tells about an installed component: served, its controller's image tag,
        its CRD's schema (each read only where the caller may)."""
        served = f"{component.group}/{component.api_version}" in self.served_apis()
        if not served:
            return versions.Installed(component, served=False)
        unreadable: list[str] = []
        image_version = schema_version = None
        schema_read = False
        try:
            namespace, name = component.deployment
            deployment = self._call(f"read Deployment {namespace}/{name}", client_module().AppsV1Api(self.api_client).read_namespaced_deployment, name, namespace)
            images = [c.get("image", "") for c in ((deployment.get("spec") or {}).get("template") or {}).get("spec", {}).get("containers") or []]
            image_version = next((v for v in map(versions.from_image, images) if v is not None), None)
        except HotswapError as error:
            unreadable.append(f"its controller's Deployment: {error.message}")
        if component is versions.JOBSET:
            try:
                crd = self._call(f"read CRD {component.crd}", client_module().ApiextensionsV1Api(self.api_client).read_custom_resource_definition, component.crd)
                schema_version, schema_read = versions.from_jobset_crd(crd), True
            except HotswapError as error:
                unreadable.append(f"its CRD: {error.message}")
        return versions.Installed(component, True, image_version, schema_version, schema_read, tuple(unreadable))

    def check_versions(self, kueue: bool) -> list[versions.Installed]:
        """The installed JobSet (and Kueue): a one-line error naming the exact upgrade when one
        is missing or too old."""
        found = [self.installed(versions.JOBSET)] + ([self.installed(versions.KUEUE)] if kueue else [])
        for installed in found:
            problem = installed.problem()
            if problem is not None:
                raise NotFoundError(problem)
        return found
