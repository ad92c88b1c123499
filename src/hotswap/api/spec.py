"""The workload spec: every field of the ``workload create`` contract, validated once.

A spec is immutable. Backends and the core read it; nothing rewrites it. Validation errors are
raised as :class:`~hotswap.api.errors.InvalidInputError` with one line a user can act on (see
:func:`workload_spec`).
"""

from __future__ import annotations

import dataclasses
import enum
import re
from typing import Annotated, Any

import pydantic

from hotswap.api.errors import InvalidInputError
from hotswap.api.limits import (
    MAX_COMMAND_LENGTH,
    MAX_ENV_TOTAL_LENGTH,
    MAX_ENV_VALUE_LENGTH,
    MAX_ENV_VARIABLES,
    MAX_GRACE_PERIOD_S,
    MAX_HANG_TIMEOUT_S,
    MAX_IMAGE_LENGTH,
    MAX_PATH_LENGTH,
    MAX_RESTARTS,
    MAX_SLICES,
    check_text,
)
from hotswap.api.names import MAX_WORKLOAD_NAME_LENGTH, validate_workload_name
from hotswap.api.priority import DEFAULT_PRIORITY, Priority
from hotswap.api.worker import DEFAULT_GRACE_PERIOD_S


class RestartStrategy(str, enum.Enum):
    """JobSet's restart strategies.

    ``Recreate`` starts the new workers at once; ``BlockingRecreate`` starts them only after
    every worker of the previous attempt has exited (no two generations ever overlap).
    """

    RECREATE = "Recreate"
    BLOCKING_RECREATE = "BlockingRecreate"

    @classmethod
    def parse(cls, value: str | RestartStrategy) -> RestartStrategy:
        if isinstance(value, RestartStrategy):
            return value
        for strategy in cls:
            if strategy.value.lower() == str(value).strip().lower():
                return strategy
        raise InvalidInputError(
            f"unknown restart strategy {value!r}; use Recreate or BlockingRecreate"
        )

    def __str__(self) -> str:
        return self.value


_RANGE = re.compile(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?")


@dataclasses.dataclass(frozen=True, slots=True)
class ExitCodes:
    """A set of process exit codes (0-255) written as ``42,127-255``.

    Exit codes are what a container runtime reports: a worker killed by signal N exits with
    128+N, so the default set (xpk's) treats kills and crashes of the runtime as
    infrastructure failures that deserve a restart, and other non-zero codes as user errors.
    """

    ranges: tuple[tuple[int, int], ...]

    @classmethod
    def parse(cls, text: str | ExitCodes) -> ExitCodes:
        if isinstance(text, ExitCodes):
            return text
        text = str(text).strip()
        if text.lower() in ("", "none"):
            return cls(())
        ranges: list[tuple[int, int]] = []
        for part in text.split(","):
            match = _RANGE.fullmatch(part)
            if not match:
                raise InvalidInputError(
                    f"bad exit code list {text!r}: {part.strip()!r} is not a code or a range"
                    " like 127-255"
                )
            low = int(match.group(1))
            high = int(match.group(2)) if match.group(2) else low
            if not 0 <= low <= high <= 255:
                raise InvalidInputError(
                    f"bad exit code list {text!r}: {part.strip()!r} must lie within 0-255,"
                    " low end first"
                )
            if low == 0:
                raise InvalidInputError(
                    f"bad exit code list {text!r}: exit code 0 means success and cannot"
                    " trigger a restart"
                )
            ranges.append((low, high))
        return cls(_merge(ranges))

    def __contains__(self, code: object) -> bool:
        return isinstance(code, int) and any(low <= code <= high for low, high in self.ranges)

    def __str__(self) -> str:
        return ",".join(str(low) if low == high else f"{low}-{high}" for low, high in self.ranges)


def _merge(ranges: list[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    merged: list[tuple[int, int]] = []
    for low, high in sorted(ranges):
        if merged and low <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], high))
        else:
            merged.append((low, high))
    return tuple(merged)


DEFAULT_RESTART_EXIT_CODES = ExitCodes.parse("42,127-255")

ExitCodesField = Annotated[
    ExitCodes,
    pydantic.BeforeValidator(ExitCodes.parse),
    pydantic.PlainSerializer(str, return_type=str),
]
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_CONTAINER_NAME = re.compile(r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?")


class WorkloadSpec(pydantic.BaseModel):
    """What a user asked for with ``hotswap workload create``."""

    # defer_build: build the validator on first use, not at import (the CLI must start fast).
    model_config = pydantic.ConfigDict(frozen=True, extra="forbid", defer_build=True)

    name: str
    command: str
    device_type: str
    num_slices: int = pydantic.Field(default=1, ge=1, le=MAX_SLICES)
    min_slices: int | None = pydantic.Field(default=None, ge=1, le=MAX_SLICES)
    priority: Annotated[Priority, pydantic.PlainSerializer(lambda p: p.label, return_type=str)] = DEFAULT_PRIORITY
    max_restarts: int = pydantic.Field(default=0, ge=0, le=MAX_RESTARTS)
    restart_strategy: RestartStrategy = RestartStrategy.RECREATE
    restart_on_exit_codes: ExitCodesField = DEFAULT_RESTART_EXIT_CODES
    termination_grace_period_s: float = pydantic.Field(
        default=DEFAULT_GRACE_PERIOD_S, ge=0, le=MAX_GRACE_PERIOD_S, allow_inf_nan=False
    )
    # Hang detection (hotswap.core.hang): the seconds a running workload may go without
    # completing a step before it counts as hung, whatever its step times; None: derived from
    # its step times (at least core.hang.FLOOR_S); 0: no hang detection.
    hang_timeout_s: float | None = None
    checkpoint_dir: str | None = None
    env: dict[str, str] = pydantic.Field(default_factory=dict)
    docker_image: str | None = None
    base_docker_image: str | None = None
    script_dir: str | None = None
    # xpk's --docker-name: the workers' container name on Kubernetes (a DNS-1123 label).
    docker_name: str | None = None
    # xpk's --debug-dump-gcs: where the workers' XLA dumps are copied when they end (a gs://
    # path on Kubernetes, a directory of this machine locally); XLA_FLAGS gets --xla_dump_to.
    debug_dump_gcs: str | None = None

    @pydantic.field_validator("name")
    @classmethod
    def _valid_name(cls, value: str) -> str:
        return validate_workload_name(value)

    @pydantic.field_validator("command")
    @classmethod
    def _non_empty_command(cls, value: str) -> str:
        if not value.strip():
            raise InvalidInputError("--command must not be empty")
        return check_text("--command", value, MAX_COMMAND_LENGTH)

    @pydantic.field_validator("docker_name")
    @classmethod
    def _container_name(cls, value: str | None) -> str | None:
        if value is not None and not _CONTAINER_NAME.fullmatch(value):
            raise InvalidInputError(
                f"--docker-name {value!r}: a container name is lower-case letters, digits and '-',"
                " starting and ending with a letter or digit, at most 63 characters"
            )
        return value

    @pydantic.field_validator("checkpoint_dir", "script_dir", "docker_image", "base_docker_image", "debug_dump_gcs")
    @classmethod
    def _printable(cls, value: str | None, info: pydantic.ValidationInfo) -> str | None:
        if value is None:
            return None
        flag = _flag(info.field_name or "")
        if not value.strip():
            raise InvalidInputError(f"{flag} must not be empty")
        limit = MAX_PATH_LENGTH if info.field_name in ("checkpoint_dir", "script_dir", "debug_dump_gcs") else MAX_IMAGE_LENGTH
        return check_text(flag, value, limit)

    @pydantic.field_validator("device_type")
    @classmethod
    def _known_device_type(cls, value: str) -> str:
        from hotswap.api.catalog import get_device_type

        return get_device_type(value).name

    @pydantic.field_validator("hang_timeout_s")
    @classmethod
    def _valid_hang_timeout(cls, value: float | None) -> float | None:
        if value is not None and not 0 <= value <= MAX_HANG_TIMEOUT_S:
            raise InvalidInputError(
                f"--hang-timeout {value:g}: give seconds up to {MAX_HANG_TIMEOUT_S:g}, or 0 to turn hang detection off"
            )
        return value

    @pydantic.field_validator("priority", mode="before")
    @classmethod
    def _parse_priority(cls, value: Any) -> Priority:
        return Priority.parse(value)

    @pydantic.field_validator("restart_strategy", mode="before")
    @classmethod
    def _parse_strategy(cls, value: Any) -> RestartStrategy:
        return RestartStrategy.parse(value)

    @pydantic.field_validator("env")
    @classmethod
    def _valid_env(cls, value: dict[str, str]) -> dict[str, str]:
        if len(value) > MAX_ENV_VARIABLES:
            raise InvalidInputError(f"{len(value)} environment variables; the limit is {MAX_ENV_VARIABLES}")
        total = 0
        for key, text in value.items():
            if not _ENV_NAME.fullmatch(key):
                check_text("an environment variable name", key, 256)
                raise InvalidInputError(
                    f"bad environment variable name {key[:80]!r}: use letters, digits and '_',"
                    " not starting with a digit"
                )
            check_text(f"--env {key}", text, MAX_ENV_VALUE_LENGTH)
            total += len(key) + len(text) + 2
        if total > MAX_ENV_TOTAL_LENGTH:
            raise InvalidInputError(
                f"the environment variables take {total} characters; the limit is {MAX_ENV_TOTAL_LENGTH}"
            )
        return value

    @pydantic.model_validator(mode="after")
    def _consistent(self) -> WorkloadSpec:
        if self.min_slices is not None and self.min_slices > self.num_slices:
            raise InvalidInputError(
                f"--min-slices {self.min_slices} is larger than --num-slices {self.num_slices}"
            )
        if self.docker_image and (self.base_docker_image or self.script_dir):
            raise InvalidInputError(
                "use either --docker-image or --base-docker-image/--script-dir, not both"
            )
        return self

    @property
    def elastic(self) -> bool:
        """True when the workload may run on fewer slices than it asked for."""
        return self.min_slices is not None and self.min_slices < self.num_slices

    @property
    def floor_slices(self) -> int:
        """The fewest slices the workload can run on."""
        return self.min_slices if self.min_slices is not None else self.num_slices


def workload_spec(**fields: Any) -> WorkloadSpec:
    """Build a :class:`WorkloadSpec`, turning pydantic's report into one actionable line."""
    try:
        return WorkloadSpec(**fields)
    except InvalidInputError:
        raise
    except pydantic.ValidationError as error:
        raise InvalidInputError(_one_line(error)) from None


def _one_line(error: pydantic.ValidationError) -> str:
    first = error.errors()[0]
    cause = first.get("ctx", {}).get("error")
    if isinstance(cause, InvalidInputError):
        return cause.message
    location = first.get("loc", ())
    flag = _flag(str(location[0])) if location else "the workload spec"
    return f"{flag}: {first.get('msg', 'invalid value')}"


# The flag of each field whose name differs from it (the rest are "--" + the field's name).
_FLAGS = {"termination_grace_period_s": "--termination-grace-period", "name": "--workload"}


def _flag(field: str) -> str:
    return _FLAGS.get(field) or "--" + field.replace("_", "-")


__all__ = [
    "DEFAULT_GRACE_PERIOD_S",
    "DEFAULT_RESTART_EXIT_CODES",
    "ExitCodes",
    "MAX_WORKLOAD_NAME_LENGTH",
    "RestartStrategy",
    "WorkloadSpec",
    "workload_spec",
]
