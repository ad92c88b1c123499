"""What the CLI asks of a local cluster's controller: one typed, versioned record per kind of
request, written by the CLI's commands (``commands/``) and parsed once, where the controller
takes the row (:func:`parse`).

A request is a row of the cluster's database (``tables.py``): its kind, a :class:`RequestKind`,
and its payload, the record's JSON (``to_payload``). That JSON is exactly the object earlier
releases wrote, plus ``"version"`` (:data:`REQUEST_VERSION`); a row without one is version 0,
which has the same shape, so a request an earlier release queued is served as it asked (one of
a later version is refused: its shape may mean something this release would misread). A record
checks its own values when it is made: in the CLI, before anything is queued, and in the
controller, when a row is parsed. A row that is not a request (written by something other than
this CLI) is refused with a one-line :class:`~hotswap.backends.local.protocol.ProtocolError`.

:func:`dispatch` with a :class:`RequestHandler` is the one place a request's type is switched
on, as :func:`hotswap.core.actions.dispatch` is for actions: a new kind of request is one record
here and one handler method (and the command that asks for it).

The CLI's commands import this module only when they make a request: reads (``workload list``)
do not pay for building these classes.
"""

from __future__ import annotations

import dataclasses
import enum
import typing
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar

from hotswap.api.errors import HotswapError
from hotswap.api.launch import Launch
from hotswap.api.limits import MAX_ARGUMENT_LENGTH, check_text
from hotswap.api.names import validate_workload_name
from hotswap.api.runs import is_run_id
from hotswap.backends.local.gpu.nvml import GpuInfo
from hotswap.backends.local.protocol import MAX_LOCAL_SLICES, MAX_NODES_PER_REQUEST, MAX_WARM_WORKERS, ProtocolError

if TYPE_CHECKING:  # pydantic loads only where a spec is parsed: the controller, `workload create`
    from hotswap.api.spec import WorkloadSpec

REQUEST_VERSION = 1  # the payloads' shape; version 0 (no "version" key) is the same shape
VERSION_KEY = "version"


class RequestKind(enum.StrEnum):
    """The kinds of requests, as a row's ``kind`` holds them; each is one record below."""

    CREATE = "create"
    DELETE = "delete"
    NODE = "node"
    RESIZE = "resize"
    SHUTDOWN = "shutdown"


class NodeOperation(enum.StrEnum):
    """A fault or a repair of a node (``hotswap node fail|drain|cordon|uncordon``)."""

    FAIL = "fail"
    DRAIN = "drain"
    CORDON = "cordon"
    UNCORDON = "uncordon"


# ---------------------------------------------------------------------- the records


@dataclasses.dataclass(frozen=True)
class CreateWorkload:
    """``workload create``: ``{"spec": the WorkloadSpec as JSON, "launch": the launch record}``."""

    kind: ClassVar[RequestKind] = RequestKind.CREATE
    spec: WorkloadSpec
    launch: Launch

    def __post_init__(self) -> None:
        _check_launch(self.launch)

    def to_payload(self) -> dict[str, Any]:
        return _versioned({"spec": self.spec.model_dump(mode="json"), "launch": self.launch.to_dict()})

    @classmethod
    def from_payload(cls, payload: Mapping[str, Any]) -> CreateWorkload:
        spec, launch = payload["spec"], payload["launch"]
        if not isinstance(spec, dict):
            raise ValueError("spec is not an object")
        if not isinstance(launch, dict):
            raise ValueError("launch is not an object")
        parsed = Launch.from_dict(launch)
        _check_launch(parsed)  # before the spec, whose refusal is worded as the CLI's
        return cls(_workload_spec(spec), parsed)


@dataclasses.dataclass(frozen=True)
class DeleteWorkload:
    """``workload delete``: ``{"workload": name}``."""

    kind: ClassVar[RequestKind] = RequestKind.DELETE
    workload: str

    def __post_init__(self) -> None:
        validate_workload_name(self.workload)

    def to_payload(self) -> dict[str, Any]:
        return _versioned({"workload": self.workload})

    @classmethod
    def from_payload(cls, payload: Mapping[str, Any]) -> DeleteWorkload:
        return cls(payload["workload"])


@dataclasses.dataclass(frozen=True)
class ChangeNodes:
    """``node fail|drain|cordon|uncordon``: ``{"op": a NodeOperation, "nodes": [node names]}``."""

    kind: ClassVar[RequestKind] = RequestKind.NODE
    operation: NodeOperation
    nodes: tuple[str, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "operation", NodeOperation(self.operation))  # a name given as text
        if not isinstance(self.nodes, tuple) or not 1 <= len(self.nodes) <= MAX_NODES_PER_REQUEST:
            raise ValueError("nodes is not a list of node names")
        for node in self.nodes:
            if not isinstance(node, str):
                raise ValueError("nodes is not a list of node names")
            check_text("a node name", node, MAX_ARGUMENT_LENGTH)

    def to_payload(self) -> dict[str, Any]:
        return _versioned({"op": self.operation.value, "nodes": list(self.nodes)})

    @classmethod
    def from_payload(cls, payload: Mapping[str, Any]) -> ChangeNodes:
        operation, nodes = NodeOperation(payload["op"]), payload["nodes"]
        if not isinstance(nodes, list):
            raise ValueError("nodes is not a list of node names")
        return cls(operation, tuple(nodes))


@dataclasses.dataclass(frozen=True)
class ResizeCluster:
    """``cluster create`` of a new cluster or again (a resize): ``{"num_slices": N}`` and the
    settings it changes, each only when given: ``warm_workers`` (with ``warm_preload``, what the
    spares import), ``hotswap``, ``zygote``, and ``gpus`` (the GPUs the cluster may take)."""

    kind: ClassVar[RequestKind] = RequestKind.RESIZE
    num_slices: int
    warm_workers: int | None = None
    warm_preload: tuple[str, ...] | None = None
    hotswap: bool | None = None
    zygote: bool | None = None
    gpus: tuple[GpuInfo, ...] | None = None

    def __post_init__(self) -> None:
        _integer(self.num_slices, "num_slices", 1, MAX_LOCAL_SLICES)
        if self.warm_workers is not None:
            _integer(self.warm_workers, "warm_workers", 0, MAX_WARM_WORKERS)
        if self.warm_preload is not None and not all(isinstance(m, str) for m in self.warm_preload):
            raise ValueError("warm_preload is not a list of module names")
        for name in ("hotswap", "zygote"):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} is not true or false")

    def to_payload(self) -> dict[str, Any]:
        given = {
            "num_slices": self.num_slices,
            "warm_workers": self.warm_workers,
            "warm_preload": None if self.warm_preload is None else list(self.warm_preload),
            "hotswap": self.hotswap,
            "zygote": self.zygote,
            "gpus": None if self.gpus is None else [g.to_json() for g in self.gpus],
        }
        return _versioned({key: value for key, value in given.items() if value is not None})

    @classmethod
    def from_payload(cls, payload: Mapping[str, Any]) -> ResizeCluster:
        # A key given as null is refused (as earlier releases did), except the two lists'.
        for key, problem in (
            ("warm_workers", f"warm_workers must be an integer from 0 to {MAX_WARM_WORKERS}"),
            ("hotswap", "hotswap is not true or false"),
            ("zygote", "zygote is not true or false"),
        ):
            if key in payload and payload[key] is None:
                raise ValueError(problem)
        preload, gpus = payload.get("warm_preload"), payload.get("gpus")
        if preload is not None and not isinstance(preload, list):
            raise ValueError("warm_preload is not a list of module names")
        return cls(
            num_slices=payload["num_slices"],
            warm_workers=payload.get("warm_workers"),
            warm_preload=None if preload is None else tuple(preload),
            hotswap=payload.get("hotswap"),
            zygote=payload.get("zygote"),
            gpus=None if gpus is None else _gpus(gpus),
        )


@dataclasses.dataclass(frozen=True)
class Shutdown:
    """``cluster delete``: ``{}``; stop every worker, then the controller."""

    kind: ClassVar[RequestKind] = RequestKind.SHUTDOWN

    def to_payload(self) -> dict[str, Any]:
        return _versioned({})

    @classmethod
    def from_payload(cls, payload: Mapping[str, Any]) -> Shutdown:
        return cls()


LocalRequest = CreateWorkload | DeleteWorkload | ChangeNodes | ResizeCluster | Shutdown
REQUEST_TYPES: tuple[type[LocalRequest], ...] = typing.get_args(LocalRequest)
_BY_KIND: dict[RequestKind, type[LocalRequest]] = {record.kind: record for record in REQUEST_TYPES}


# ---------------------------------------------------------------------- dispatch

_T_co = TypeVar("_T_co", covariant=True)


class RequestHandler(Protocol[_T_co]):
    """What the controller does for each kind of request (see :func:`dispatch`)."""

    def on_create(self, request: CreateWorkload) -> _T_co: ...
    def on_delete(self, request: DeleteWorkload) -> _T_co: ...
    def on_node(self, request: ChangeNodes) -> _T_co: ...
    def on_resize(self, request: ResizeCluster) -> _T_co: ...
    def on_shutdown(self, request: Shutdown) -> _T_co: ...


HANDLER_METHODS: dict[type, str] = {
    CreateWorkload: "on_create",
    DeleteWorkload: "on_delete",
    ChangeNodes: "on_node",
    ResizeCluster: "on_resize",
    Shutdown: "on_shutdown",
}


def dispatch(request: LocalRequest, handler: RequestHandler[_T_co]) -> _T_co:
    """Call the handler's method for ``request``'s type."""
    return getattr(handler, HANDLER_METHODS[type(request)])(request)


# ---------------------------------------------------------------------- parsing a row


def parse(kind: str, payload: Mapping[str, Any] | None) -> LocalRequest:
    """The request a row holds; ProtocolError, with the one-line reason, for a row that holds
    none (a workload spec the controller refuses says why in the spec's own words)."""
    try:
        record = _BY_KIND[RequestKind(kind)]
    except ValueError:
        raise ProtocolError(f"unknown request kind {str(kind)[:40]!r}") from None
    if payload is None:
        raise ProtocolError("its payload is not a JSON object")
    try:
        _check_version(payload.get(VERSION_KEY, 0))
        return record.from_payload(payload)
    except ProtocolError:
        raise
    except (KeyError, TypeError, ValueError, HotswapError) as problem:
        reason = f"no {problem} field" if isinstance(problem, KeyError) else str(problem)
        raise ProtocolError(f"malformed {record.kind.value} request: {str(reason)[:200]}") from None


def _versioned(payload: dict[str, Any]) -> dict[str, Any]:
    return {**payload, VERSION_KEY: REQUEST_VERSION}


def _check_version(version: Any) -> None:
    if isinstance(version, bool) or not isinstance(version, int) or not 0 <= version <= REQUEST_VERSION:
        raise ValueError(f"version {str(version)[:20]} is not one this controller reads (0 to {REQUEST_VERSION})")


def _workload_spec(fields: dict[str, Any]) -> WorkloadSpec:
    """The spec of a create request, refused in its own words (``refused: --num-slices: ...``)."""
    from hotswap.api.spec import workload_spec

    try:
        return workload_spec(**fields)
    except HotswapError as problem:
        raise ProtocolError(str(problem)) from None


def _check_launch(launch: Launch) -> None:
    """What a worker's process can be started with: environments and paths without a NUL, a
    run with a run's id."""
    _strings(launch.environ, "the environment")
    _strings(launch.earlier_user_env or {}, "the user's environment (an earlier release's record)")
    for key, path in (("cwd", launch.cwd), ("checkpoint_dir", launch.checkpoint_dir)):
        if "\0" in path:
            raise ValueError(f"{key} is not a path")
    run = launch.run
    if run is not None:
        if not is_run_id(run.id):
            raise ValueError("run is not a run")
        if run.resume_from is not None and "\0" in run.resume_from:
            raise ValueError("the run's resume_from is not a path")


def _strings(value: Mapping[str, Any], what: str) -> None:
    """A JSON object of strings with no NUL (which no process environment can hold)."""
    for key, item in value.items():
        if not isinstance(item, str) or "\0" in key or "\0" in item or "=" in key or not key:
            raise ValueError(f"{what} holds a variable that no environment can hold: {key[:40]!r}")


def _integer(value: Any, what: str, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{what} must be an integer from {low} to {high}")


def _gpus(value: Any) -> tuple[GpuInfo, ...]:
    fields = {"index": int, "uuid": str}
    if not isinstance(value, list) or not all(
        isinstance(g, dict) and all(isinstance(g.get(k), t) and not isinstance(g.get(k), bool) for k, t in fields.items())
        for g in value
    ):
        raise ValueError("gpus is not a list of GPUs (index, uuid)")
    return tuple(GpuInfo.from_json(g) for g in value)
