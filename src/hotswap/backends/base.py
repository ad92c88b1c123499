"""What the CLI asks of a backend. The local backend and the Kubernetes backend both provide it,
so one CLI drives either; a cluster's record (in the state directory) says which one it uses.

Every method validates what the user gave before changing anything and raises
:class:`~hotswap.api.errors.HotswapError` subclasses with one actionable line. Returned data
follows the JSON contracts of DESIGN.md (``workload list`` rows, ``node list`` rows).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from hotswap.api.spec import WorkloadSpec


def launch_record(*, environ: dict[str, str], cwd: str, user_env: dict[str, str], checkpoint_dir: str) -> dict[str, Any]:
    """How to start a workload's workers, as ``workload create`` hands it to a backend: the
    creator's environment and directory, the user's variables, where checkpoints go (a backend
    may add keys of its own, such as ``checkpoint_volume``)."""
    return {"environ": environ, "cwd": cwd, "user_env": user_env, "checkpoint_dir": checkpoint_dir}


class Backend(Protocol):
    name: str

    def create_cluster(
        self,
        cluster: str,
        device_type: str | None,
        num_slices: int | None,
        force: bool,
        confirm: Callable[[str], bool],
        options: dict[str, Any],
    ) -> dict[str, Any]:
        """Create (or, re-run, resize/refresh) a cluster; ``options`` holds backend flags."""
        ...

    def delete_cluster(self, cluster: str) -> None: ...

    def describe_cluster(self, cluster: str) -> dict[str, Any]: ...

    def cache_image(self, cluster: str, image: str) -> dict[str, Any]:
        """``cluster cacheimage``: have ``image`` pulled on the cluster's nodes ahead of time;
        returns what was done (``message``, and the objects applied, if any)."""
        ...

    def create_workload(self, cluster: str, spec: WorkloadSpec, launch: dict[str, Any]) -> dict[str, Any]: ...

    def dry_run(self, cluster: str | None, spec: WorkloadSpec, launch: dict[str, Any]) -> Any:
        """What ``workload create`` would do, as a document to print; changes nothing."""
        ...

    def delete_workload(self, cluster: str, name: str) -> None: ...

    def workload_gone(self, cluster: str, name: str) -> bool:
        """Whether a deleted workload is wholly gone: no record left and none of its workers
        (or pods) still stopping (``workload delete --wait``)."""
        ...

    def list_workloads(self, cluster: str, status: str, job_filter: str | None) -> list[dict[str, Any]]: ...

    def describe_workload(self, cluster: str, name: str) -> dict[str, Any]: ...

    def logs(
        self, cluster: str, name: str, slice_: str | None, host: int, follow: bool, write: Callable[[bytes], None]
    ) -> None: ...

    def list_nodes(self, cluster: str) -> list[dict[str, Any]]: ...

    def node_operation(self, cluster: str, operation: str, node: str | None, slice_: str | None) -> list[str]: ...
