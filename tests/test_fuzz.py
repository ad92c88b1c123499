"""Fuzzing where input enters (issue 13): the CLI's parser (its real entry point, in-process),
the env-file reader, the controller's socket and the request rows it reads. Whatever comes in:
no traceback, an exit code from the documented set, one line on stderr when it fails, the
controller alive (the same process throughout), and the cluster's state unchanged by anything
refused.

``HOTSWAP_FUZZ_EXAMPLES`` sets the examples of each test (default 150)."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import pytest
from hardening_helpers import STATE_TABLES, TRACEBACK, cli, controllers, digest, state_home
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from local_helpers import query, wait_until

from hotswap.api.envfile import parse_env_file, parse_env_pairs, read_env_file
from hotswap.api.errors import InvalidInputError
from hotswap.api.limits import check_text
from hotswap.backends.local import protocol
from hotswap.backends.local.commands import client
from hotswap.backends.local.requests import RequestKind
from hotswap.store.paths import ClusterPaths
from hotswap.backends.local.tables import LocalStore

EXAMPLES = int(os.environ.get("HOTSWAP_FUZZ_EXAMPLES", "150"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large],
)
SAFE_COMMAND = "sleep 3600"  # a valid command the fuzzer may submit: it never ends by itself


class Cluster:
    """A cluster "c" (2 x v6e-4, two workloads) under a private HOTSWAP_HOME, with helpers to
    tell a refusal that changed nothing from a success that may change things later."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.home = root / "state"
        self.paths = ClusterPaths("c", self.home / "clusters" / "c")
        self.known = ""

    def start(self) -> None:
        assert cli("cluster", "create", "--cluster", "c", "--device-type", "v6e-4", "--num-slices", "2").code == 0
        for name in ("a", "b"):
            assert cli("workload", "create", "--cluster", "c", "--workload", name, "--command", SAFE_COMMAND).code == 0
        self.controller = controllers(self.paths.root)
        assert len(self.controller) == 1
        self.settle()

    def state(self) -> str:
        return digest(self.paths.database, STATE_TABLES)

    def busy(self) -> bool:
        return bool(
            query(self.home, "c", "SELECT count(*) FROM requests WHERE status = 'pending'")[0][0]
            or query(self.home, "c", "SELECT count(*) FROM workers WHERE state IN ('starting', 'stopping')")[0][0]
        )

    def settle(self) -> str:
        """Wait until nothing is in flight (requests served, workers started or stopped) and
        return the state then."""
        if not self.busy() and self.state() == self.known:
            return self.known

        def quiet() -> str | None:
            if self.busy():
                return None
            first = self.state()
            time.sleep(0.2)
            return first if self.state() == first and not self.busy() else None

        self.known = wait_until(quiet, timeout=60, what="the cluster to settle")
        return self.known

    def alive(self) -> None:
        assert controllers(self.paths.root) == self.controller, "the controller crashed or was replaced"
        assert client.ping(self.paths, timeout=10) == self.controller[0]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    fuzzed = Cluster(tmp_path_factory.mktemp("fuzz"))
    with state_home(fuzzed.home):
        fuzzed.start()
        yield fuzzed


# ---------------------------------------------------------------------- the CLI

# Free text: anything, biased toward what breaks parsers (controls, NUL, surrogates, huge).
nasty = st.one_of(
    st.text(max_size=40),
    st.sampled_from(["", " ", "-", "--", "\x00", "a\nb", "\udcff", "\u202e", "nan", "inf", "-inf", "1e999",
                     "9" * 5000, "-1", "0", "2147483648", "²", "٣", "x" * 5000, "c-np-0-0", "a", "c"]),
)
names = st.sampled_from(["c", "d", "ghost", "a", "b", "Bad_Name", "x" * 64, "", "-x"]) | nasty
numbers = st.one_of(st.integers(-(10**30), 10**30).map(str), st.sampled_from(["1", "2", "0", "-1", "1.5", "inf", "nan", "1e309"]), nasty)
# Never an arbitrary valid command or path: what the fuzzer gets accepted must be harmless.
commands = st.sampled_from([SAFE_COMMAND, "", "  "]) | st.text(min_size=1, max_size=20).map(lambda t: t + "\x07")
checkpoint_dirs = st.sampled_from(["", "\x00", "/dev/null/x", "x" * 5000, "a\nb"])

FLAGS: dict[tuple[str, ...], dict[str, st.SearchStrategy[str]]] = {
    ("workload", "create"): {
        "--workload": names, "--cluster": names, "--command": commands, "--num-slices": numbers,
        "--device-type": st.sampled_from(["v6e-4", "v5p-16", "", "v6e-99999999"]) | nasty,
        "--priority": st.sampled_from(["low", "high", "750", "urgent"]) | nasty, "--max-restarts": numbers,
        "--restart-strategy": st.sampled_from(["Recreate", "BlockingRecreate", "Never"]) | nasty,
        "--restart-on-exit-codes": st.sampled_from(["42,127-255", "0", "1-x", "300"]) | nasty,
        "--min-slices": numbers, "--termination-grace-period": numbers, "--checkpoint-dir": checkpoint_dirs,
        "--env": nasty.map(lambda t: f"K={t}") | nasty, "--env-file": st.sampled_from(["/nonexistent", "/dev/null"]) | nasty,
        "--docker-image": nasty, "--dry-run": st.just(""), "--output": st.sampled_from(["json", "yaml", "xml"]),
    },
    ("workload", "delete"): {"--workload": names, "--cluster": names},
    ("workload", "describe"): {"--workload": names, "--cluster": names, "--output": st.sampled_from(["json", "table", "x"])},
    ("workload", "list"): {"--cluster": names, "--filter-by-status": st.sampled_from(["RUNNING", "done"]) | nasty,
                           "--filter-by-job": nasty, "--output": st.sampled_from(["json", "yaml", "x"])},
    ("workload", "logs"): {"--workload": names, "--cluster": names, "--slice": nasty, "--host": numbers},
    ("cluster", "create"): {"--cluster": st.sampled_from(["c", "d"]) | nasty, "--device-type": st.sampled_from(["v6e-4", "v5p-16", ""]) | nasty,
                            "--num-slices": numbers, "--backend": st.sampled_from(["local", "x"]) | nasty,
                            "--warm-workers": numbers, "--namespace": nasty},
    ("cluster", "describe"): {"--cluster": names, "--output": st.sampled_from(["json", "x"])},
    ("cluster", "delete"): {"--cluster": st.sampled_from(["ghost", "Bad", ""]) | nasty.filter(lambda n: n not in ("c", "d"))},
    ("cluster", "list"): {"--output": st.sampled_from(["json", "yaml", "x"])},
    ("node", "list"): {"--cluster": names, "--output": st.sampled_from(["json", "x"])},
    **{("node", verb): {"--cluster": names, "--node": st.sampled_from(["c-np-0-0", "c-np-1-0", "ghost"]) | nasty,
                        "--slice": st.sampled_from(["c-np-0", "c-np-1", "ghost"]) | nasty}
       for verb in ("fail", "drain", "cordon", "uncordon")},
}
READ_ONLY = {("workload", "describe"), ("workload", "list"), ("workload", "logs"), ("cluster", "describe"),
             ("cluster", "list"), ("node", "list")}


@st.composite
def command_lines(draw: st.DrawFn) -> tuple[tuple[str, ...], list[str]]:
    command = draw(st.sampled_from(sorted(FLAGS)))
    flags = FLAGS[command]
    argv = list(command)
    for flag in draw(st.lists(st.sampled_from(sorted(flags) + ["--bogus", "-o", "--help"]), max_size=8)):
        argv.append(flag)
        if flag in flags and flag != "--dry-run":
            argv.append(draw(flags[flag]))
    if draw(st.booleans()):
        argv.insert(draw(st.integers(0, len(argv))), draw(nasty))  # a stray word anywhere
    return command, argv


# Valid command lines, which a draw then spoils in one place (or not): these reach the
# controller, where refusals (a duplicate name, an unknown node) happen after the request
# is queued.
VALID: dict[tuple[str, ...], list[tuple[str, st.SearchStrategy[str]]]] = {
    ("workload", "create"): [("--cluster", st.just("c")), ("--workload", st.sampled_from(["w1", "w2", "w3", "a"])),
                             ("--command", st.just(SAFE_COMMAND)), ("--priority", st.sampled_from(["low", "high"])),
                             ("--termination-grace-period", st.sampled_from(["0", "5"]))],
    ("workload", "delete"): [("--cluster", st.just("c")), ("--workload", st.sampled_from(["w1", "w2", "w3", "ghost"]))],
    ("workload", "describe"): [("--cluster", st.just("c")), ("--workload", st.sampled_from(["a", "b", "w1"]))],
    ("workload", "logs"): [("--cluster", st.just("c")), ("--workload", st.sampled_from(["a", "b"])),
                           ("--slice", st.sampled_from(["0", "1", "c-np-0"])), ("--host", st.sampled_from(["0", "1"]))],
    ("node", "cordon"): [("--cluster", st.just("c")), ("--node", st.sampled_from(["c-np-0-0", "c-np-1-0"]))],
    ("node", "uncordon"): [("--cluster", st.just("c")), ("--slice", st.sampled_from(["c-np-0", "c-np-1"]))],
    ("node", "fail"): [("--cluster", st.just("c")), ("--node", st.sampled_from(["c-np-0-0", "c-np-1-0"]))],
    ("cluster", "create"): [("--cluster", st.just("c")), ("--device-type", st.just("v6e-4")),
                            ("--num-slices", st.sampled_from(["1", "2", "3"]))],
}


@st.composite
def nearly_valid_lines(draw: st.DrawFn) -> tuple[tuple[str, ...], list[str]]:
    command = draw(st.sampled_from(sorted(VALID)))
    argv = list(command)
    spoiled = draw(st.integers(-1, len(VALID[command]) - 1))  # -1: leave it valid
    for index, (flag, value) in enumerate(VALID[command]):
        argv += [flag, draw(FLAGS[command].get(flag, nasty) if index == spoiled else value)]
    return command, argv


@FUZZ
@given(command_lines() | nearly_valid_lines())
def test_the_cli_never_shows_a_traceback_and_refusals_change_nothing(cluster: Cluster, line) -> None:
    command, argv = line
    if any(arg in ("c", "d") for arg in argv) and command == ("cluster", "delete"):
        return  # the fuzzer deletes no cluster it needs
    before = cluster.settle()
    result = cli(*argv)
    event(f"{' '.join(command)}: exit {result.code}")
    assert TRACEBACK not in result.err and TRACEBACK not in result.out
    if result.code != 0:
        assert result.one_line_error or "--help" in argv or result.err == "", result
        assert cluster.state() == before, f"refused, yet the state changed: {argv}"
    cluster.alive()


# ---------------------------------------------------------------------- the env-file reader


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("env") / "fuzzed.env"


@settings(max_examples=EXAMPLES * 5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=2000) | st.text(max_size=500).map(lambda t: t.encode("utf-8", "surrogatepass")))
def test_the_env_file_reader_returns_clean_variables_or_one_line(scratch: Path, data: bytes) -> None:
    scratch.write_bytes(data)
    try:
        values = read_env_file(scratch, {"HOME": "/home/me", "BAD": "x\x00y"})
    except InvalidInputError as error:
        assert "\n" not in str(error) and str(error).startswith(f"--env-file {scratch}")
        return
    for name, value in values.items():
        assert check_text("a name", name) == name and check_text("a value", value, 10**6) == value


@settings(max_examples=EXAMPLES * 5, deadline=None)
@given(st.lists(st.text(max_size=50), max_size=5), st.text(max_size=200))
def test_env_flags_and_text_return_clean_variables_or_one_line(pairs: list[str], text: str) -> None:
    for parse in (lambda: parse_env_pairs(pairs), lambda: parse_env_file(text, {})):
        try:
            values = parse()
        except InvalidInputError as error:
            assert "\n" not in str(error)
            continue
        assert all("\x00" not in k + v and "\n" not in k + v for k, v in values.items())


# ---------------------------------------------------------------------- the controller's socket

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
socket_lines = st.one_of(
    st.binary(max_size=300),
    json_values.map(lambda v: json.dumps(v).encode()),
    st.dictionaries(st.sampled_from(["ping", "wait", "pong", "id"]), json_values, max_size=3).map(lambda d: json.dumps(d).encode()),
    st.integers(0, 3).map(lambda n: b"[" * (1000 * n)),
)


@FUZZ
@given(st.lists(socket_lines, min_size=1, max_size=6), st.booleans())
def test_the_controller_survives_any_bytes_on_its_socket(cluster: Cluster, lines: list[bytes], newline_last: bool) -> None:
    before = digest(cluster.paths.database)  # the socket can change nothing at all
    stream = b"\n".join(lines) + (b"\n" if newline_last else b"")
    with socket.socket(socket.AF_UNIX) as connection, cluster.paths.socket_address() as address:
        connection.settimeout(10)
        connection.connect(address)
        try:
            connection.sendall(stream)
            connection.shutdown(socket.SHUT_WR)
            reader = protocol.LineReader(max_line=1 << 20)
            while chunk := connection.recv(65536):
                for answer in reader.feed(chunk):
                    assert isinstance(answer, dict) and set(answer) & {"error", "pong", "status"}, answer
        except (ConnectionResetError, BrokenPipeError, socket.timeout):
            pass  # cut off after an over-long line, or it waits for a request: both are fine
    cluster.alive()
    assert digest(cluster.paths.database) == before


# ---------------------------------------------------------------------- request rows


payloads = st.one_of(
    st.dictionaries(st.text(max_size=10), json_values, max_size=4),
    st.fixed_dictionaries({"op": st.sampled_from(["fail", "explode"]) | st.text(max_size=5), "nodes": json_values}),
    st.fixed_dictionaries({"workload": json_values}),
    st.fixed_dictionaries({"num_slices": json_values, "warm_workers": json_values}),
    st.fixed_dictionaries({"spec": json_values, "launch": json_values}),
    st.fixed_dictionaries({"spec": st.fixed_dictionaries({"name": st.just("z"), "command": nasty, "device_type": nasty}),
                           "launch": st.fixed_dictionaries({"environ": json_values, "user_env": st.just({}),
                                                            "cwd": st.just("/"), "checkpoint_dir": nasty})}),
)


@FUZZ
@given(st.sampled_from([k.value for k in RequestKind if k is not RequestKind.SHUTDOWN] + ["reboot", ""]), payloads)
def test_a_malformed_request_row_is_refused_and_changes_nothing(cluster: Cluster, kind: str, payload: dict) -> None:
    before = cluster.settle()
    with LocalStore.open(cluster.paths.database) as store:
        request_id = store.requests.submit(kind, payload, time.time())

    def served() -> tuple[str, str] | None:
        client.ping(cluster.paths)  # a connection wakes the controller, which then serves the row
        row = query(cluster.home, "c", "SELECT status, message FROM requests WHERE id = ?", (request_id,))[0]
        return None if row["status"] == "pending" else (row["status"], row["message"])

    status, message = wait_until(served, timeout=60, what="the request served")
    assert "\n" not in message
    if status == "rejected":
        assert cluster.state() == before, (kind, payload, message)
    cluster.alive()
