"""``hotswap node list|fail|drain|cordon|uncordon``: faults and repairs, by node or slice."""

from __future__ import annotations

import typer

from hotswap.cli.output import Format, document, note, table

app = typer.Typer(help="Inspect nodes; inject faults (fail, drain, cordon) and repair (uncordon).", no_args_is_help=True)

NODE = typer.Option(None, "--node", help="One node (see `hotswap node list`).")
SLICE = typer.Option(None, "--slice", help="Every node of one slice.")
CLUSTER = typer.Option(..., "--cluster", help="Cluster name.")


@app.command("list")
def list_(
    cluster: str = CLUSTER,
    output: Format = typer.Option(Format.TABLE, "--output", "-o", help="table, json or yaml."),
) -> None:
    """Nodes with their slice, GPUs (GPU-backed clusters), state (Ready, Cordoned, Failed), why, and workload."""
    from hotswap.cli.backends import for_cluster

    rows = for_cluster(cluster).list_nodes(cluster)
    if output is not Format.TABLE:
        document(rows, output)
        return
    backed = any(r.get("gpus") for r in rows)
    table(
        ["Node", "Slice", "Host", *(["GPUs (index UUID)"] if backed else []), "State", "Reason", "Workload"],
        [
            [
                r["name"], r["slice"], r["host"],
                *([", ".join(f"{g['index']} {g['uuid']}" for g in r.get("gpus") or [])] if backed else []),
                r["state"], r.get("reason") or "", r["workload"] or "<none>",
            ]
            for r in rows
        ],
    )


def _operate(operation: str, cluster: str, node: str | None, slice_: str | None, done: str) -> None:
    from hotswap.cli.backends import for_cluster

    targets = for_cluster(cluster).node_operation(cluster, operation, node, slice_)
    note(f"{', '.join(targets)} {done}")


@app.command("fail")
def fail(cluster: str = CLUSTER, node: str | None = NODE, slice_: str | None = SLICE) -> None:
    """Fail hardware: SIGKILL the workers on it; the node stays Failed until uncordoned."""
    _operate("fail", cluster, node, slice_, "failed")


@app.command("drain")
def drain(cluster: str = CLUSTER, node: str | None = NODE, slice_: str | None = SLICE) -> None:
    """Cordon and evict gracefully (SIGTERM, checkpoint, then SIGKILL after the grace period)."""
    _operate("drain", cluster, node, slice_, "drained")


@app.command("cordon")
def cordon(cluster: str = CLUSTER, node: str | None = NODE, slice_: str | None = SLICE) -> None:
    """Take out of service: running workloads move off it (hotswap)."""
    _operate("cordon", cluster, node, slice_, "cordoned")


@app.command("uncordon")
def uncordon(cluster: str = CLUSTER, node: str | None = NODE, slice_: str | None = SLICE) -> None:
    """Repair: Ready again; queued work is admitted onto it."""
    _operate("uncordon", cluster, node, slice_, "uncordoned (Ready)")
