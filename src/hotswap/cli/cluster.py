"""``hotswap cluster create|delete|describe|list|cacheimage``."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from hotswap.api.errors import InvalidInputError
from hotswap.cli.output import Format, document, note, table

if TYPE_CHECKING:
    from hotswap.backends.views import SliceView

app = typer.Typer(help="Create, resize, inspect and delete clusters of slices.", no_args_is_help=True)


@app.command("create")
def create(
    cluster: str = typer.Option(..., "--cluster", help="Cluster name (DNS-1035 label)."),
    device_type: str | None = typer.Option(None, "--device-type", "--tpu-type", help="Slice type, xpk's names (v6e-16, h100-80gb-8, ...)."),
    num_slices: int | None = typer.Option(None, "--num-slices", help="Number of slices; re-run with another number to resize."),
    backend: str = typer.Option("local", "--backend", help="local (processes on this machine) or kubernetes."),
    force: bool = typer.Option(False, "--force", help="Shrink without asking (xpk's: skip confirmation prompts)."),
    output: Format = typer.Option(Format.TABLE, "--output", "-o", help="table, json or yaml."),
    context: str | None = typer.Option(None, "--context", help="Kubernetes: kubeconfig context (default: the current one)."),
    namespace: str | None = typer.Option(None, "--namespace", help="Kubernetes: namespace of the workloads (default: default)."),
    kueue: bool = typer.Option(False, "--kueue", help="Kubernetes: admit through Kueue (creates its ResourceFlavor, ClusterQueue, LocalQueue)."),
    cluster_queue: str | None = typer.Option(None, "--cluster-queue", help="Kubernetes with --kueue: ClusterQueue name (default: cluster-queue)."),
    local_queue: str | None = typer.Option(None, "--local-queue", help="Kubernetes with --kueue: LocalQueue name (default: multislice-queue)."),
    node_pool_label: str | None = typer.Option(None, "--node-pool-label", help="Kubernetes: node label naming a node pool (default: cloud.google.com/gke-nodepool)."),
    accelerator_label: str | None = typer.Option(None, "--accelerator-label", help="Kubernetes: TPU accelerator node label (default: cloud.google.com/gke-tpu-accelerator)."),
    topology_label: str | None = typer.Option(None, "--topology-label", help="Kubernetes: TPU topology node label (default: cloud.google.com/gke-tpu-topology)."),
    gpu_accelerator_label: str | None = typer.Option(None, "--gpu-accelerator-label", help="Kubernetes: GPU accelerator node label (default: cloud.google.com/gke-accelerator)."),
    checkpoint_volume: str | None = typer.Option(None, "--checkpoint-volume", help="Kubernetes: default checkpoint volume of workloads, pvc:<claim> or gcsfuse:<bucket>."),
    warm_workers: str | None = typer.Option(None, "--warm-workers", help="Local: spare workers kept with PyTorch imported, for sub-second restarts: a count, or auto (a new cluster's default: one per host of two slices, within a quarter of the free memory)."),
    custom_tpu_nodepool_arguments: str | None = typer.Option(None, "--custom-tpu-nodepool-arguments", help="xpk's: refused, hotswap creates no node pools (see README)."),
    cluster_cpu_machine_type: str | None = typer.Option(None, "--cluster-cpu-machine-type", help="xpk's: refused, hotswap creates no node pools (see README)."),
    gpus: str | None = typer.Option(None, "--gpus", help="Local: back the slices by this machine's GPUs: all, a count (2), or device=0,1 (NVML indices or UUIDs); each slice takes the device type's GPUs per host (local-gpu-K: K)."),
) -> None:
    """Create a cluster and start its controller; re-run with another --num-slices to resize it.

    With --backend kubernetes: check that JobSet (and Kueue) are installed, find the slices among
    the nodes, create the PriorityClasses (and Kueue queues), and record how to reach it.
    """
    from hotswap.backends.requests import ClusterRequest
    from hotswap.cli.backends import named
    from hotswap.cli.prompts import confirmation

    request = ClusterRequest(
        cluster=cluster,
        device_type=device_type,
        num_slices=num_slices,
        force=force,
        context=context,
        namespace=namespace,
        kueue=kueue,
        cluster_queue=cluster_queue,
        local_queue=local_queue,
        node_pool_label=node_pool_label,
        accelerator_label=accelerator_label,
        topology_label=topology_label,
        gpu_accelerator_label=gpu_accelerator_label,
        checkpoint_volume=checkpoint_volume,
        warm_workers=warm_workers,
        gpus=gpus,
        custom_tpu_nodepool_arguments=custom_tpu_nodepool_arguments,
        cluster_cpu_machine_type=cluster_cpu_machine_type,
    )
    summary = named(backend).create_cluster(request, confirmation(force))
    if output is not Format.TABLE:
        document(summary, output)
        return
    note(
        f"cluster {summary['name']} ({summary['backend']}): {summary['num_slices']} x {summary['device_type']}"
        f" ({summary['hosts_per_slice']} host(s) x {summary['chips_per_host']} chips per slice"
        + (", backed by GPUs " + ", ".join(_gpu_list(s) for s in summary["slices"]) if summary.get("backing") == "gpu" else "")
        + ")"
        + (f", controller pid {summary['controller_pid']}" if summary.get("controller_pid") else "")
    )


@app.command("cacheimage")
def cacheimage(
    cluster: str = typer.Option(..., "--cluster", help="Cluster name."),
    docker_image: str = typer.Option(..., "--docker-image", help="Image to pull onto every node of the cluster's slices."),
    output: Format = typer.Option(Format.TABLE, "--output", "-o", help="table, json or yaml."),
) -> None:
    """Pull an image onto the cluster's nodes ahead of time (Kubernetes: a DaemonSet, as xpk), so workloads start faster."""
    from hotswap.api.limits import check_text
    from hotswap.cli.backends import for_cluster

    image = check_text("--docker-image", docker_image)
    if not image.strip():
        raise InvalidInputError("--docker-image must not be empty")
    done = for_cluster(cluster).cache_image(cluster, image)
    if output is not Format.TABLE:
        document(done, output)
        return
    note(done["message"])


def _gpu_list(slice_: SliceView) -> str:
    return "+".join(str(g["index"]) for g in slice_.get("gpus") or [])


@app.command("delete")
def delete(
    cluster: str = typer.Option(..., "--cluster", help="Cluster name."),
    force: bool = typer.Option(False, "--force", help="Delete without asking, even with workloads still running or queued."),
) -> None:
    """Stop every worker gracefully, then the controller, and remove the cluster (checkpoints stay).

    Asks first when it would stop workloads that have not finished (listing them)."""
    from hotswap.cli.backends import for_deletion
    from hotswap.cli.prompts import confirmation

    for_deletion(cluster).delete_cluster(cluster, confirmation(force))
    note(f"cluster {cluster} deleted")


@app.command("describe")
def describe(
    cluster: str = typer.Option(..., "--cluster", help="Cluster name."),
    output: Format = typer.Option(Format.TABLE, "--output", "-o", help="table, json or yaml."),
) -> None:
    """Slices, their nodes, and which workload holds each slice."""
    from hotswap.cli.backends import for_cluster

    summary = for_cluster(cluster).describe_cluster(cluster)
    if output is not Format.TABLE:
        document(summary, output)
        return
    backed = summary.get("backing") == "gpu"
    print(
        f"Cluster {summary['name']} ({summary['backend']}): {summary['num_slices']} x {summary['device_type']},"
        f" {summary['hosts_per_slice']} host(s) x {summary['chips_per_host']} chips per slice"
        + (", GPU-backed" if backed else (", emulated" if summary.get("backing") else ""))
        + f"; controller {('pid ' + str(summary['controller_pid'])) if summary.get('controller_pid') else 'not running'}"
        + (f"; state in {summary['state_dir']}" if summary.get("state_dir") else "")
    )
    if backed and summary.get("gpu_health"):
        print(f"{summary['gpu_health']['message']} ({summary['gpu_health']['time']})")
    rows = []
    for item in summary["slices"]:
        states = ", ".join(
            f"{n['name']}={n['state']}" + (f" ({n['reason']})" if n.get("reason") else "") for n in item["nodes"]
        )
        row = [item["name"], "yes" if item["healthy"] else "no", item["workload"] or "<free>", states]
        if backed:
            row.insert(1, ", ".join(f"{g['index']} {g['uuid']}" for g in item["gpus"]))
        rows.append(row)
    table(["Slice", *(["GPUs (index UUID)"] if backed else []), "Healthy", "Workload", "Nodes"], rows)


@app.command("list")
def list_(output: Format = typer.Option(Format.TABLE, "--output", "-o", help="table, json or yaml.")) -> None:
    """Every cluster on this machine, of every backend."""
    import dataclasses

    from hotswap.store import registry

    rows = [dataclasses.asdict(summary) for summary in registry.summaries()]
    if output is not Format.TABLE:
        document(rows, output)
        return
    table(
        ["Cluster", "Backend", "Device Type", "Slices", "Workloads", "Running", "Queued", "Controller"],
        [
            [r["name"], r["backend"], r["device_type"], r["num_slices"], r["workloads"], r["running"], r["queued"],
             f"pid {r['controller_pid']}" if r["controller_pid"] else "stopped"]
            for r in rows
        ],
    )
