"""What a user may ask of a backend that not every backend does, and how a backend answers for
what it cannot do: each backend lists the features it lacks, each with its own reason in its own
words (``Backend.unsupported_features``, as SkyPilot's clouds do), and :func:`require` raises that
reason for the first one a request asks for. Nothing here names a backend.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

from hotswap.api.errors import InvalidInputError


class Feature(enum.Enum):
    """A feature a request may ask for, in the order a request's are checked."""

    # xpk's node-pool flags (--custom-tpu-nodepool-arguments, --cluster-cpu-machine-type): hotswap
    # provisions no node pools on any backend; each says why in its own words.
    NODE_POOLS = "node pools"
    # A device type of this machine's GPUs (local-gpu-K).
    MACHINE_DEVICE_TYPES = "device types of this machine"
    # A cluster reached through an API server: its context, namespace, Kueue queues, node label
    # keys and default checkpoint volume (cluster create's flags for them).
    API_SERVER_SETTINGS = "API server settings"
    # Slices run as processes of this machine: warm spare workers (--warm-workers), slices
    # backed by this machine's GPUs (--gpus).
    MACHINE_PROCESSES = "processes of this machine"
    # A volume mounted for a workload's checkpoints (workload create --checkpoint-volume).
    CHECKPOINT_VOLUMES = "checkpoint volumes"
    # The workers' container, named (--docker-name).
    CONTAINER_NAMES = "container names"


# Reasons are one line; ``{asked}`` in one stands for what asked for the feature (its flags, or
# the device type).
Reasons = Mapping[Feature, str]


def require(unsupported: Reasons, asked: Mapping[Feature, str]) -> None:
    """Raise the reason of the first feature ``asked`` for (in :class:`Feature` order) that is
    ``unsupported``; ``asked`` maps each feature to what asked for it (flags, a device type)."""
    for feature in Feature:
        if feature in asked and feature in unsupported:
            raise InvalidInputError(unsupported[feature].format(asked=asked[feature]))
