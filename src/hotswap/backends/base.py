"""What the CLI asks of a backend. The local backend and the Kubernetes backend both provide it,
so one CLI drives either; a cluster's record (in the state directory) says which one it uses.

Every method validates what the user gave before changing anything and raises
:class:`~hotswap.api.errors.HotswapError` subclasses with one actionable line. Returned data are
the typed views of :mod:`hotswap.backends.views` (the JSON contracts of DESIGN.md: ``workload
list`` rows, ``node list`` rows, ...). What a backend can do, and how it reads paths and
images, is its :class:`~hotswap.backends.capabilities.Capabilities`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from hotswap.api.launch import RUN_AUTO, RUN_FRESH, RUN_FROM, Launch, Run

if TYPE_CHECKING:  # pydantic loads only where specs are built or validated: reads stay fast
    from hotswap.api.spec import WorkloadSpec
    from hotswap.backends.capabilities import Capabilities
    from hotswap.backends.views import (
        CacheImageResult,
        ClusterCreated,
        ClusterDescription,
        NodeRow,
        WorkloadCreated,
        WorkloadDescription,
        WorkloadRow,
    )


def launch_record(
    *, environ: dict[str, str], cwd: str, user_env: dict[str, str], checkpoint_dir: str, run: Run | None = None
) -> Launch:
    """How to start a workload's workers, as ``workload create`` hands it to a backend: the
    creator's environment and directory, the user's variables, where this run's checkpoints go,
    the run (:func:`new_run`; a backend resolves what it resumes from). A backend may set
    entries of its own, such as ``checkpoint_volume`` (``dataclasses.replace``)."""
    return Launch(environ=environ, cwd=cwd, user_env=user_env, checkpoint_dir=checkpoint_dir, run=run)


def new_run(resume_from: str | None, fresh: bool) -> Run:
    """A new run of ``workload create``: its id, and what the user asked it to resume from
    (``--resume-from``: a run id or a directory; ``--fresh``: nothing; neither: a pending
    migration checkpoint of its predecessor, if any)."""
    import os
    import time

    from hotswap.api.limits import check_text

    run_id = time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + os.urandom(3).hex()  # api.runs.is_run_id
    if fresh:
        return Run(run_id, RUN_FRESH)
    if resume_from is not None:
        return Run(run_id, RUN_FROM, source=check_text("--resume-from", resume_from))
    return Run(run_id, RUN_AUTO)


class Backend(Protocol):
    name: str
    capabilities: Capabilities

    def create_cluster(
        self,
        cluster: str,
        device_type: str | None,
        num_slices: int | None,
        force: bool,
        confirm: Callable[[str], bool],
        options: dict[str, Any],
    ) -> ClusterCreated:
        """Create (or, re-run, resize/refresh) a cluster; ``options`` holds backend flags."""
        ...

    def delete_cluster(self, cluster: str, confirm: Callable[[str], bool]) -> None:
        """Delete a cluster; ``confirm`` is asked first when that stops unfinished work."""
        ...

    def describe_cluster(self, cluster: str) -> ClusterDescription: ...

    def cache_image(self, cluster: str, image: str) -> CacheImageResult:
        """``cluster cacheimage``: have ``image`` pulled on the cluster's nodes ahead of time;
        returns what was done (``message``, and the objects applied, if any)."""
        ...

    def create_workload(self, cluster: str, spec: WorkloadSpec, launch: Launch) -> WorkloadCreated: ...

    def dry_run(self, cluster: str | None, spec: WorkloadSpec, launch: Launch) -> Any:
        """What ``workload create`` would do, as a document to print; changes nothing. ``cluster``
        is None for a cluster with no record unless ``dry_run_names_unrecorded_cluster``."""
        ...

    def delete_workload(self, cluster: str, name: str) -> None: ...

    def workload_gone(self, cluster: str, name: str) -> bool:
        """Whether a deleted workload is wholly gone: no record left and none of its workers
        (or pods) still stopping (``workload delete --wait``)."""
        ...

    def list_workloads(self, cluster: str, status: str, job_filter: str | None) -> list[WorkloadRow]: ...

    def describe_workload(self, cluster: str, name: str) -> WorkloadDescription: ...

    def logs(
        self, cluster: str, name: str, slice_: str | None, host: int, follow: bool, write: Callable[[bytes], None]
    ) -> str | None:
        """Write one worker's log; return a note for stderr about where it came from, if any."""
        ...

    def list_nodes(self, cluster: str) -> list[NodeRow]: ...

    def node_operation(self, cluster: str, operation: str, node: str | None, slice_: str | None) -> list[str]: ...
