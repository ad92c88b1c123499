"""The requests the CLI makes of a local cluster's controller, as typed, versioned records
(``backends/local/requests.py``): the exact rows earlier releases queued read back, a record
read and written again says the same, a row that is no request is refused in one line, and
nothing outside the records' module branches on a request's type."""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

import pytest

from hotswap.api.errors import HotswapError
from hotswap.api.launch import Launch, Run
from hotswap.api.spec import workload_spec
from hotswap.backends.local import requests as rq
from hotswap.backends.local.controller.round_inputs import RequestRounds
from hotswap.backends.local.gpu.nvml import GpuInfo
from hotswap.backends.local.protocol import ProtocolError

SRC = Path(__file__).resolve().parents[1] / "src" / "hotswap"

# Rows exactly as the previous release wrote them (captured from its `cluster create`, resize,
# `node drain`, `workload create|delete` and `cluster delete`).
CREATE_ROW = (
    '{"launch": {"checkpoint_dir": "/tmp/capture/state/checkpoints/c/w/20261128-032243-704262", "cwd": "/tmp/capture",'
    ' "environ": {"HOME": "/tmp/capture", "HOTSWAP_HOME": "/tmp/capture/state", "LC_CTYPE": "C.UTF-8", "PATH":'
    ' "/usr/bin:/bin", "PYTHONPATH": "/work/wt-daemon/src"}, "run": {"id": "20261128-032243-704262", "mode": "auto",'
    ' "resume_from": "", "resumed_from": null}, "user_env": {"A": "1"}}, "spec": {"base_docker_image": null,'
    ' "checkpoint_dir": null, "command": "sleep 1000", "debug_dump_gcs": null, "device_type": "v6e-4", "docker_image":'
    ' null, "docker_name": null, "env": {"A": "1"}, "hang_timeout_s": null, "max_restarts": 2, "min_slices": null, "name":'
    ' "w", "num_slices": 1, "priority": "medium", "restart_on_exit_codes": "42,127-255", "restart_strategy": "Recreate",'
    ' "script_dir": null, "termination_grace_period_s": 30.0}}'
)
OLD_ROWS = [
    ("create", CREATE_ROW),
    ("delete", '{"workload": "w"}'),
    ("node", '{"nodes": ["c-np-1-0"], "op": "drain"}'),
    ("resize", '{"hotswap": false, "num_slices": 2, "warm_preload": ["json"], "warm_workers": 1, "zygote": false}'),
    ("resize", '{"num_slices": 3}'),
    (
        "resize",
        '{"gpus": [{"index": 0, "memory_bytes": 80, "name": "Fake H100", "uuid": "GPU-aaaa"}, {"index": 1, "memory_bytes":'
        ' 80, "name": "Fake H100", "uuid": "GPU-bbbb"}], "num_slices": 2, "warm_workers": 2, "zygote": true}',
    ),
    ("shutdown", "{}"),
]


@pytest.mark.parametrize(("kind", "row"), OLD_ROWS)
def test_a_row_of_the_previous_release_reads_back_and_is_written_again_as_it_was(kind: str, row: str) -> None:
    payload = json.loads(row)
    request = rq.parse(kind, payload)
    assert request.kind == kind
    assert request.to_payload() == {**payload, "version": rq.REQUEST_VERSION}  # the same keys and values, versioned
    assert rq.parse(kind, request.to_payload()) == request


def test_the_rows_of_the_previous_release_read_as_what_they_asked() -> None:
    create = rq.parse("create", json.loads(CREATE_ROW))
    assert isinstance(create, rq.CreateWorkload)
    assert (create.spec.name, create.spec.max_restarts, create.spec.num_slices) == ("w", 2, 1)
    assert create.launch.earlier_user_env == {"A": "1"} and create.launch.run == Run("20261128-032243-704262", resume_from="", resumed_from=None)
    assert rq.parse("node", {"nodes": ["c-np-1-0"], "op": "drain"}) == rq.ChangeNodes(rq.NodeOperation.DRAIN, ("c-np-1-0",))
    resize = rq.parse("resize", json.loads(OLD_ROWS[3][1]))
    assert resize == rq.ResizeCluster(2, warm_workers=1, warm_preload=("json",), hotswap=False, zygote=False)
    gpus = rq.parse("resize", json.loads(OLD_ROWS[5][1]))
    assert isinstance(gpus, rq.ResizeCluster) and gpus.gpus == (
        GpuInfo(0, "GPU-aaaa", "Fake H100", 80), GpuInfo(1, "GPU-bbbb", "Fake H100", 80),
    )
    assert rq.parse("resize", {"num_slices": 3}) == rq.ResizeCluster(3)


def test_the_kinds_are_the_records_kinds_and_each_has_a_handler() -> None:
    assert [record.kind for record in rq.REQUEST_TYPES] == list(rq.RequestKind)
    assert set(rq.HANDLER_METHODS) == set(rq.REQUEST_TYPES)
    for handler in (rq.RequestHandler, RequestRounds):
        assert all(callable(getattr(handler, method, None)) for method in rq.HANDLER_METHODS.values()), handler


def test_dispatch_calls_the_method_of_the_requests_type() -> None:
    class Names:
        def __getattr__(self, method: str) -> Any:
            return lambda request: (method, request)

    shutdown = rq.Shutdown()
    assert rq.dispatch(shutdown, Names()) == ("on_shutdown", shutdown)  # type: ignore[arg-type]
    assert rq.dispatch(rq.DeleteWorkload("w"), Names())[0] == "on_delete"  # type: ignore[arg-type]


SPEC = {"name": "w", "command": "true", "device_type": "v6e-4"}
LAUNCH = {"environ": {}, "cwd": "/", "user_env": {}, "checkpoint_dir": "/tmp/c"}


@pytest.mark.parametrize(
    ("kind", "payload", "reason"),
    [
        ("reboot", {}, "unknown request kind 'reboot'"),
        ("node", None, "its payload is not a JSON object"),
        ("delete", {}, "malformed delete request: no 'workload' field"),
        ("node", {"op": "explode", "nodes": ["n"]}, "malformed node request: 'explode' is not a valid NodeOperation"),
        ("node", {"op": "fail", "nodes": "n"}, "malformed node request: nodes is not a list of node names"),
        ("node", {"op": "fail", "nodes": []}, "malformed node request: nodes is not a list of node names"),
        ("resize", {"num_slices": 0}, "malformed resize request: num_slices must be an integer from 1 to 1024"),
        ("resize", {"num_slices": 1, "warm_workers": None}, "malformed resize request: warm_workers must be an integer from 0 to 64"),
        ("resize", {"num_slices": 1, "hotswap": None}, "malformed resize request: hotswap is not true or false"),
        ("resize", {"num_slices": 1, "zygote": 1}, "malformed resize request: zygote is not true or false"),
        ("resize", {"num_slices": 1, "gpus": [{"index": True, "uuid": "u"}]}, "malformed resize request: gpus is not a list of GPUs"),
        ("create", {"spec": [], "launch": LAUNCH}, "malformed create request: spec is not an object"),
        ("create", {"spec": SPEC, "launch": {**LAUNCH, "environ": {"A": "\0"}}}, "malformed create request: the environment holds"),
        ("create", {"spec": SPEC, "launch": {**LAUNCH, "run": {"id": "nope"}}}, "malformed create request: run is not a run"),
        ("create", {"spec": {**SPEC, "num_slices": 0}, "launch": LAUNCH}, "--num-slices: "),  # in the spec's own words
        ("delete", {"workload": "w", "version": 2}, "malformed delete request: version 2 is not one this controller reads"),
        ("delete", {"workload": "w", "version": "1"}, "malformed delete request: version 1 is not one"),
    ],
)
def test_a_row_that_is_no_request_is_refused_in_one_line(kind: str, payload: dict[str, Any] | None, reason: str) -> None:
    with pytest.raises(ProtocolError) as refused:
        rq.parse(kind, payload)
    assert str(refused.value).startswith(reason) and "\n" not in str(refused.value)


def test_a_record_checks_its_values_when_it_is_made_before_anything_is_queued() -> None:
    spec = workload_spec(**SPEC)
    with pytest.raises(ValueError, match="the environment holds"):
        rq.CreateWorkload(spec, Launch({"A": "\0"}, "/", "/tmp/c"))
    with pytest.raises(ValueError, match="run is not a run"):
        rq.CreateWorkload(spec, Launch({}, "/", "/tmp/c", Run("not a run id")))
    with pytest.raises(HotswapError):
        rq.DeleteWorkload("Not A Name")
    with pytest.raises(ValueError):
        rq.ChangeNodes("reboot", ("n",))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="num_slices"):
        rq.ResizeCluster(rq.MAX_LOCAL_SLICES + 1)
    assert rq.ChangeNodes("fail", ("n",)).operation is rq.NodeOperation.FAIL  # type: ignore[arg-type]


def _imports_requests(tree: ast.Module) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "hotswap.backends.local.requests":
            return True
        if isinstance(node, ast.ImportFrom) and node.module == "hotswap.backends.local" and any(a.name == "requests" for a in node.names):
            return True
    return False


def test_no_branching_on_request_types_outside_the_requests_module() -> None:
    """Serving a request goes through ``requests.dispatch``, so a new kind of request is a
    missing handler method, not a forgotten branch: no ``isinstance`` or ``match`` on a record,
    no comparison with a :class:`RequestKind`, anywhere else."""
    records = {cls.__name__ for cls in rq.REQUEST_TYPES}
    found = []
    for path in sorted(SRC.rglob("*.py")):
        if path == SRC / "backends" / "local" / "requests.py":
            continue
        tree = ast.parse(path.read_text(), str(path))
        if not _imports_requests(tree):
            continue
        for node in ast.walk(tree):
            names: set[str] = set()
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "isinstance":
                names = {n.id if isinstance(n, ast.Name) else getattr(n, "attr", "") for n in ast.walk(node.args[1])}
            elif isinstance(node, ast.MatchClass):
                names = {n.id if isinstance(n, ast.Name) else getattr(n, "attr", "") for n in ast.walk(node.cls)}
            elif isinstance(node, ast.Compare):
                kinds = [n for n in ast.walk(node) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)]
                names = {"RequestKind"} & {n.value.id for n in kinds if isinstance(n.value, ast.Name)}
            if names & (records | {"RequestKind"}):
                found.append(f"{path.relative_to(SRC)}:{node.lineno}")
    assert not found, f"branching on request types outside backends/local/requests.py: {found}"
