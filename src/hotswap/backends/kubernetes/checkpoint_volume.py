"""Where a Kubernetes workload's checkpoints persist across pods: ``--checkpoint-volume``
(a PersistentVolumeClaim or a GCS bucket through gcsfuse) and the directory on it.

It stands apart from rendering because the cluster's settings validate their default volume with
it, and rendering reads the settings.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from hotswap.api.errors import InvalidInputError
from hotswap.api.spec import WorkloadSpec
from hotswap.api.runs import RESUME_AUTO, is_run_id
from hotswap.api.launch import RUN_FRESH, RUN_FROM, Run
from hotswap.backends.kubernetes import labels

_CLAIM = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_BUCKET = re.compile(r"^[a-z0-9][-a-z0-9_.]{1,220}[a-z0-9]$")


@dataclasses.dataclass(frozen=True)
class CheckpointVolume:
    """Where checkpoints persist across pods: a PersistentVolumeClaim or a GCS bucket (gcsfuse)."""

    kind: str  # "pvc" or "gcsfuse"
    source: str  # claim name or bucket name

    VOLUME_NAME = "hotswap-checkpoints"


def parse_checkpoint_volume(text: str) -> CheckpointVolume:
    kind, sep, source = text.partition(":")
    kind = kind.strip().lower()
    source = source.strip()
    if not sep or kind not in ("pvc", "gcsfuse") or not source:
        raise InvalidInputError(
            f"--checkpoint-volume {text!r}: use pvc:<claim-name> or gcsfuse:<bucket-name>"
        )
    pattern = _CLAIM if kind == "pvc" else _BUCKET
    if not pattern.fullmatch(source):
        what = "PersistentVolumeClaim name" if kind == "pvc" else "GCS bucket name"
        raise InvalidInputError(f"--checkpoint-volume {text!r}: {source!r} is not a valid {what}")
    return CheckpointVolume(kind, source)


def checkpoint_dir(spec: WorkloadSpec, cluster: str, volume: CheckpointVolume | None) -> str | None:
    """The checkpoint root: ``--checkpoint-dir`` as given, else a directory keyed by cluster and
    workload on the checkpoint volume, else none. Each run writes in ``<root>/<run id>``; a
    workload created again under its name finds its predecessors' runs there."""
    if spec.checkpoint_dir:
        return spec.checkpoint_dir
    if volume is not None:
        return f"{labels.CHECKPOINT_MOUNT}/{cluster}/{spec.name}"
    return None


def run_directory(root: str, run: Run) -> str:
    """A run's checkpoint directory in the pod: ``<root>/<run id>``."""
    return f"{root}/{run.id}"


def resume_value(run: Run, root: str) -> str:
    """HOTSWAP_RESUME_FROM of a run whose checkpoint root (in the pod) is ``root``: only the
    pods see the volume, so an automatic choice is the workers' (``auto``); a run id names a
    directory next to the run's own; any other value is a path in the pod."""
    if run.mode == RUN_FRESH:
        return ""
    if run.mode == RUN_FROM:
        source = str(run.source)
        return f"{root}/{source}" if is_run_id(source) else source
    return RESUME_AUTO


def resumed_from(run: Run, root: str | None) -> dict[str, Any] | None:
    """What the run resumes from, for people (``workload describe``), as the local backend says it."""
    value = resume_value(run, root) if root else ""
    if not value:
        return None
    if value == RESUME_AUTO:
        return {"run": None, "path": root, "kind": "auto"}
    name = value.rstrip("/").rsplit("/", 1)[-1]
    return {"run": name if is_run_id(name) else None, "path": value, "kind": "explicit"}
