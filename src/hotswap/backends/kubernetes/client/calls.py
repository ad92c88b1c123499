"""One connection to an API server, in one namespace, and the single way every part of
:class:`~hotswap.backends.kubernetes.client.KubeClient` calls it (:meth:`ApiCalls._call`)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from hotswap.backends.kubernetes import labels
from hotswap.backends.kubernetes.client.connection import api_error
from hotswap.backends.kubernetes.settings import KubeSettings

# A 403 is retried quietly after these pauses before it is called a permission problem: a
# restarted kube-apiserver answers 403 for a moment, until its RBAC authorizer's caches have
# synced (plugin/pkg/auth/authorizer/rbac: the informers start empty). A refused request
# changed nothing, so a write is as safe to retry as a read.
FORBIDDEN_RETRY_S = (0.5, 1.5)

APPLY = "application/apply-patch+yaml"
MERGE = "application/merge-patch+json"


class ApiCalls:
    """The typed APIs hotswap uses over one ``api_client``, and the one call path: answers
    decoded into plain data, every error translated into one line. :attr:`writes` counts the
    write calls of reconciles (Lease renewals not included)."""

    def __init__(self, api_client: Any, settings: KubeSettings) -> None:
        from kubernetes import client

        self.api_client = api_client
        self.settings = settings
        self.namespace = settings.namespace
        self.core = client.CoreV1Api(api_client)
        self.batch = client.BatchV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.scheduling = client.SchedulingV1Api(api_client)
        self.coordination = client.CoordinationV1Api(api_client)
        self.writes = 0
        self.sleep: Callable[[float], None] = time.sleep

    @property
    def host(self) -> str:
        return str(self.api_client.configuration.host)

    def _call(
        self, doing: str, function: Callable[..., Any], *args: Any, missing_api: str | None = None, write: bool = False, **kwargs: Any
    ) -> Any:
        """Call the API and decode its JSON answer into plain data; errors become one line."""
        from kubernetes.client.exceptions import ApiException

        if write:
            self.writes += 1
        pauses = iter(FORBIDDEN_RETRY_S)
        while True:
            try:
                response = function(*args, _preload_content=False, **kwargs)
                break
            except ApiException as error:
                pause = next(pauses, None) if error.status == 403 else None
                if pause is None:
                    raise api_error(error, doing, missing_api) from None
                self.sleep(pause)
            except OSError as error:
                raise api_error(error, doing) from None
            except Exception as error:  # urllib3's MaxRetryError and friends: no route to the server
                if type(error).__module__.startswith("urllib3"):
                    raise api_error(error, doing) from None
                raise
        data = response.data
        return json.loads(data) if data else {}

    def _jobset_selector(self, cluster: str) -> str:
        return f"{labels.MANAGED_BY_LABEL}={labels.MANAGED_BY},{labels.CLUSTER_LABEL}={cluster}"


def client_module() -> Any:
    from kubernetes import client

    return client
