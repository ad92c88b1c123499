"""Reaching a Kubernetes API server, and what its errors mean: the kubeconfig (as kubectl finds
it) and one actionable line per API error (:func:`api_error`)."""

from __future__ import annotations

import json
import os
from typing import Any

from hotswap.api import errors
from hotswap.api.errors import ConflictError, HotswapError, InvalidInputError, NotFoundError, StateError
from hotswap.backends.kubernetes import versions
from hotswap.backends.kubernetes.settings import KubeSettings


class KubernetesError(HotswapError):
    """The API server refused or could not be reached; the message says what to do."""


class ForbiddenError(KubernetesError):
    exit_code = StateError.exit_code


class UnreachableError(KubernetesError):
    exit_code = errors.UnreachableError.exit_code


def _status_message(body: Any) -> tuple[str, dict[str, Any]]:
    """The message and details of a Kubernetes Status body, or the body's first line."""
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    if isinstance(body, str):
        try:
            status = json.loads(body)
        except ValueError:
            return (body.strip().splitlines() or [""])[0], {}
        if isinstance(status, dict):
            return str(status.get("message") or status.get("reason") or ""), status.get("details") or {}
    return "", {}


def api_error(error: Exception, doing: str, missing_api: str | None = None) -> HotswapError:
    """One line for an API error: what failed, the server's reason, and what to do about it."""
    from kubernetes.client.exceptions import ApiException

    if not isinstance(error, ApiException):
        return UnreachableError(
            f"cannot reach the Kubernetes API server while trying to {doing}: {_first_line(error)};"
            " check the context (--context, KUBECONFIG) and that the cluster is reachable"
        )
    message, details = _status_message(error.body)
    status = error.status
    if status == 0:
        return UnreachableError(f"cannot {doing}: {message or error.reason}")
    if status == 401:
        return ForbiddenError(
            f"cannot {doing}: the API server rejected your credentials ({message or 'Unauthorized'});"
            " refresh them (e.g. `gcloud container clusters get-credentials CLUSTER`)"
        )
    if status == 403:
        return ForbiddenError(
            f"cannot {doing}: forbidden: {message or 'permission denied'}; ask a cluster admin for"
            " that permission (the controller's own RBAC: `hotswap controller manifests`)"
        )
    if status == 404:
        if not details and missing_api is not None:
            # An unknown resource type answers a bare 404 page, not a Status about an object.
            return NotFoundError(f"cannot {doing}: the API {missing_api} is not installed on this cluster; {install_hint(missing_api)}")
        return NotFoundError(f"cannot {doing}: {message or 'not found'}")
    if status == 409:
        return ConflictError(
            f"cannot {doing}: conflict: {message or 'the object changed meanwhile'}; another writer"
            " changed it, run the command again"
        )
    if status == 422:
        return InvalidInputError(f"cannot {doing}: the API server rejected it: {message}")
    return KubernetesError(f"cannot {doing}: HTTP {status} {error.reason or ''}: {message}".rstrip(": "))


def install_hint(api: str) -> str:
    for component in (versions.JOBSET, versions.KUEUE):
        if api.startswith(component.group):
            return f"install {component.name} {component.supported}: {component.install()}"
    return "install the component that serves it"


def _first_line(error: Exception) -> str:
    text = str(error).strip() or type(error).__name__
    return text.splitlines()[0]


def load_api_client(settings: KubeSettings) -> Any:
    """An ApiClient configured as kubectl would be: ``--context`` (else the current context) of
    ``$KUBECONFIG`` (colon-separated files, merged) or ``~/.kube/config``; inside a pod with no
    kubeconfig, the pod's service account."""
    from kubernetes import client, config

    path = os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")
    have_file = any(os.path.exists(p) for p in path.split(os.pathsep) if p)
    if not have_file and settings.context is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
        try:
            configuration = client.Configuration()
            config.load_incluster_config(client_configuration=configuration)
        except config.ConfigException as error:
            raise UnreachableError(f"in-cluster configuration failed: {_first_line(error)}") from None
        return client.ApiClient(configuration)
    if not have_file:
        raise NotFoundError(
            f"no kubeconfig at {path}: set KUBECONFIG or fetch credentials"
            " (e.g. `gcloud container clusters get-credentials CLUSTER`)"
        )
    try:
        return config.new_client_from_config(config_file=path, context=settings.context, persist_config=False)
    except config.ConfigException as error:
        if settings.context is not None:
            try:
                contexts, _ = config.list_kube_config_contexts(config_file=path)
                names = ", ".join(c["name"] for c in contexts) or "none"
            except config.ConfigException:
                names = "none"
            raise NotFoundError(f"no usable kubeconfig context {settings.context!r} in {path} (contexts: {names})") from None
        raise InvalidInputError(f"kubeconfig {path} is not usable: {_first_line(error)}") from None
