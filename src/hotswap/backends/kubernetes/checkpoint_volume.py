"""Where a Kubernetes workload's checkpoints persist across pods: ``--checkpoint-volume``
(a PersistentVolumeClaim or a GCS bucket through gcsfuse) and the directory on it.

It stands apart from rendering because the cluster's settings validate their default volume with
it, and rendering reads the settings.
"""

from __future__ import annotations

import dataclasses
import re

from hotswap.api.errors import InvalidInputError
from hotswap.api.spec import WorkloadSpec
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
    """``--checkpoint-dir`` as given, else a directory keyed by cluster and workload on the
    checkpoint volume (so re-creating a workload of the same name resumes it), else none."""
    if spec.checkpoint_dir:
        return spec.checkpoint_dir
    if volume is not None:
        return f"{labels.CHECKPOINT_MOUNT}/{cluster}/{spec.name}"
    return None
