"""``workload create`` as parse → prepare → create: the command's options become a
:class:`~hotswap.backends.requests.WorkloadRequest` (its variables read here, :func:`user_env_of`);
:func:`target_of` finds the cluster's record and backend; the backend prepares the request
(``Backend.prepare_workload``: the spec and the launch, with its own checks and words), then
creates the workload (or, with --dry-run, shows it).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from hotswap.api.errors import InvalidInputError

if TYPE_CHECKING:
    from hotswap.backends.base import Backend
    from hotswap.backends.requests import WorkloadRequest
    from hotswap.store.state import ClusterRecord


def user_env_of(pairs: list[str], env_file: Path | None) -> dict[str, str]:
    """The workers' variables: the --env-file's, then each --env NAME=value over them."""
    from hotswap.api.envfile import parse_env_pairs, read_env_file

    user_env: dict[str, str] = {}
    if env_file is not None:
        user_env.update(read_env_file(env_file, os.environ))
    user_env.update(parse_env_pairs(pairs))
    return user_env


@dataclass(frozen=True)
class Target:
    """Where the workload goes: the cluster's record (None for a dry run without one) and its backend."""

    record: ClusterRecord | None
    backend: Backend


def target_of(request: WorkloadRequest) -> Target:
    from hotswap.api.errors import NotFoundError
    from hotswap.cli.backends import named
    from hotswap.store import registry

    try:
        record = registry.record_of(request.cluster)
    except NotFoundError:
        if not (request.dry_run and request.backend):
            raise
        record = None  # a dry run for a backend needs no cluster record
    if record is not None and request.backend is not None and request.backend != record.backend:
        raise InvalidInputError(f"cluster {request.cluster} uses the {record.backend} backend, not {request.backend}")
    return Target(record, named(request.backend or record.backend))  # type: ignore[union-attr]
