"""Names of clusters, workloads, slices and nodes.

They become Kubernetes object names later (JobSet, Job, Pod, PriorityClass), so they are
DNS-1035 labels: lower-case letters, digits and '-', starting with a letter, ending with a
letter or digit. Workload names are kept to 40 characters, as xpk does, because JobSet derives
child Job and Pod names (``<jobset>-<replicated-job>-<index>-<pod-index>-<hash>``) from them and
those must still fit in 63 characters.
"""

from __future__ import annotations

import re

from hotswap.api.errors import InvalidInputError

DNS1035_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
MAX_LABEL_LENGTH = 63
MAX_WORKLOAD_NAME_LENGTH = 40
MAX_CLUSTER_NAME_LENGTH = 40


def validate_name(kind: str, value: str, max_length: int = MAX_LABEL_LENGTH) -> str:
    """Return ``value`` if it is a valid DNS-1035 label of at most ``max_length`` characters."""
    if not isinstance(value, str) or not value:
        raise InvalidInputError(f"{kind} name must not be empty")
    if len(value) > max_length:
        shown = value if len(value) <= 80 else value[:77] + "..."
        raise InvalidInputError(
            f"{kind} name {shown!r} is {len(value)} characters long; the limit is {max_length}"
        )
    if not DNS1035_LABEL.fullmatch(value):
        raise InvalidInputError(
            f"{kind} name {value!r} is not a DNS-1035 label: use lower-case letters, digits and"
            " '-', start with a letter and end with a letter or digit"
        )
    return value


def validate_workload_name(value: str) -> str:
    return validate_name("workload", value, MAX_WORKLOAD_NAME_LENGTH)


def validate_cluster_name(value: str) -> str:
    return validate_name("cluster", value, MAX_CLUSTER_NAME_LENGTH)
