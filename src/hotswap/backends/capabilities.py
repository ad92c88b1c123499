"""What a backend can do and how it treats what the user gives: each backend says so in its
``capabilities``, so the CLI asks the backend rather than checking which backend it is."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Capabilities:
    # Slices are processes of this machine: local-only device types (its GPUs) fit, and there
    # are no node pools to provision.
    workers_on_this_machine: bool
    # Paths given to ``workload create`` are of this machine: --script-dir must exist here and
    # --checkpoint-dir is made absolute here (elsewhere they are paths inside the workers).
    local_paths: bool
    # --debug-dump-gcs names a directory of this machine, handed to the workers in their
    # environment; otherwise it is a gs:// path the workers' pods copy their dumps to.
    debug_dumps_to_directory: bool
    # Workers run in containers: --docker-name names theirs and --docker-image is used (else
    # the image is only recorded).
    runs_containers: bool
    # ``workload create --checkpoint-volume`` (pvc:<claim> or gcsfuse:<bucket>).
    checkpoint_volumes: bool
    # A dry run with no record of the cluster still renders for the named cluster (a JobSet
    # carries its cluster's name); otherwise it shows no cluster.
    dry_run_names_unrecorded_cluster: bool
    # Seconds between the dashboard's looks at the cluster, unless --interval says otherwise.
    dashboard_interval_s: float
    # ``controller run`` serves Prometheus metrics unless told not to (else only when asked).
    metrics_by_default: bool
