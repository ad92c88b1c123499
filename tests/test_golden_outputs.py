"""Golden outputs: what the CLI prints and what a worker's environment holds, byte for byte,
compared with files in tests/golden/ written by an earlier version.

It goes through stable surfaces only (the CLI's argv, ``hotswap.cli.app.run``, a worker's
``os.environ``), so code can move underneath without touching it; what it proves is that the
user-visible bytes did not change. Parts that vary per run (temp paths, run ids, timestamps,
pids, ports, measured seconds) are replaced by placeholders in :func:`normalise`.

Regenerate after an intended change: ``HOTSWAP_REGENERATE_GOLDEN=1 pytest tests/test_golden_outputs.py``,
then review the diff of tests/golden/ like any other change.
"""

from __future__ import annotations

import contextlib
import difflib
import io
import json
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

GOLDEN = Path(__file__).resolve().parent / "golden"
NODES = Path(__file__).resolve().parent / "k8s_fixtures" / "gke_v6e16_nodes.yaml"
REGENERATE = os.environ.get("HOTSWAP_REGENERATE_GOLDEN") == "1"
PYTHON = sys.executable

_RUN_ID = re.compile(r"\b\d{8}-\d{6}-[0-9a-f]{6}\b")  # new_run's id: UTC time and 3 random bytes
_ISO_TIME = re.compile(r"\b\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z")
_JSON_PID = re.compile(r'("(?:pid|controller_pid)": )\d+')
_JSON_EPOCH = re.compile(r'("created_time": )\d+\.\d+')  # seconds since the epoch (cluster records)
_TEXT_PID = re.compile(r"\b(controller pid|pid) \d+")
_JSON_NUMBER = re.compile(r"(: )-?\d+(?:\.\d+)?(?:e-?\d+)?")


def normalise(text: str, tmp: Path, *, pid_column: bool = False) -> str:
    """``text`` less what differs from run to run, each part replaced by a named placeholder:

    - the test's temp directory -> ``<TMP>``, this interpreter's path -> ``<PYTHON>``;
    - run ids (``20260101-120000-abcdef``) -> ``<RUN_ID>``; ISO times -> ``<TIME>``;
    - pids (JSON ``pid``/``controller_pid``, text ``pid N``) -> ``<PID>``; a JSON ``created_time``
      in epoch seconds -> ``<EPOCH>``;
    - every number inside a JSON ``"goodput": {...}`` or ``"progress": {...}`` block (measured
      times, the workers' records) -> ``<SECONDS>`` and the text
      ``goodput ...`` line's tail -> ``<MEASURED>`` (measured wall-clock shares);
    - a ``MASTER_PORT`` value (a free port per attempt) -> ``<PORT>``.

    ``pid_column``: the text holds a Workers table with a PID column, whose width follows the
    pids' digits, so runs of spaces there are collapsed to two (cell contents still compared)
    and the PID cells become ``<PID>``.
    """
    text = text.replace(str(tmp), "<TMP>").replace(PYTHON, "<PYTHON>")
    text = _RUN_ID.sub("<RUN_ID>", text)
    text = _ISO_TIME.sub("<TIME>", text)
    text = _JSON_PID.sub(r"\1<PID>", text)
    text = _JSON_EPOCH.sub(r"\1<EPOCH>", text)
    text = _TEXT_PID.sub(r"\1 <PID>", text)
    text = re.sub(r'("MASTER_PORT": )"\d+"', r'\1"<PORT>"', text)
    text = re.sub(r"(?m)^(\s*goodput ).*$", r"\1<MEASURED>", text)
    lines, block_indent = [], None
    for line in text.split("\n"):
        if block_indent is None and re.fullmatch(r'\s*"(goodput|progress)": \{', line):
            block_indent = line[: len(line) - len(line.lstrip())]
        elif block_indent is not None:
            if line in (block_indent + "}", block_indent + "},"):
                block_indent = None
            else:
                line = _JSON_NUMBER.sub(r"\1<SECONDS>", line)
                line = re.sub(r"^(\s*)-?\d+(?:\.\d+)?(,?)$", r"\1<SECONDS>\2", line)  # a list's number
        lines.append(line)
    text = "\n".join(lines)
    if pid_column:
        text = re.sub(r"(?m)(\S)  +", r"\1  ", text)
        text = re.sub(r"(?m)^(\d+  \d+  \d+  \S+  )\d+  ", r"\1<PID>  ", text)  # Workers: attempt replica host slice PID
    return text


def check_golden(name: str, text: str) -> None:
    """Compare ``text`` with tests/golden/``name`` (or rewrite it with HOTSWAP_REGENERATE_GOLDEN=1)."""
    path = GOLDEN / name
    if REGENERATE:
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(text)
        return
    if not path.exists():
        pytest.fail(f"no golden file {path}; write it with HOTSWAP_REGENERATE_GOLDEN=1")
    expected = path.read_text()
    if text != expected:
        diff = difflib.unified_diff(
            expected.splitlines(keepends=True), text.splitlines(keepends=True), f"golden/{name}", "now"
        )
        pytest.fail(f"output differs from tests/golden/{name} (HOTSWAP_REGENERATE_GOLDEN=1 rewrites it):\n" + "".join(diff))


def section(title: str, code: int, stdout: str, stderr: str) -> str:
    """One command's result in a golden file: its argv, exit code, stdout and stderr."""
    return f"### {title}\n### exit {code}\n### stdout\n{stdout}### stderr\n{stderr}### end\n\n"


# ---------------------------------------------------------------- Kubernetes: rendered objects


def cli_in_process(home: Path, *args: str, kubeconfig: Path | None = None) -> tuple[int, str, str]:
    """The CLI in this process (``hotswap.cli.app.run``, what ``python -m hotswap`` calls), to
    keep the renders fast; HOTSWAP_HOME and KUBECONFIG set for the call only."""
    from hotswap.cli.app import run

    patch = {"HOTSWAP_HOME": str(home), "KUBECONFIG": str(kubeconfig or home / "no-kubeconfig")}
    saved = {key: os.environ.get(key) for key in (*patch, "KUBERNETES_SERVICE_HOST")}
    os.environ.update(patch)
    os.environ.pop("KUBERNETES_SERVICE_HOST", None)
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = run(list(args))
            except SystemExit as exit_:
                code = exit_.code if isinstance(exit_.code, int) else 0
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    return code, out.getvalue(), err.getvalue()


_COMMON = ("workload", "create", "--backend", "kubernetes", "--cluster", "gold", "--command", "python3 train.py --steps 10", "--dry-run")
KUBERNETES_WORKLOADS: dict[str, tuple[str, ...]] = {
    "tpu_multislice": ("--workload", "tpu", "--device-type", "v6e-16", "--num-slices", "2"),
    "elastic_min_slices": ("--workload", "elastic", "--device-type", "v6e-16", "--num-slices", "3", "--min-slices", "2", "--priority", "high"),
    "gpu": ("--workload", "gpu", "--device-type", "h100-80gb-8", "--num-slices", "2", "--docker-image", "registry.example/train:1"),
    "blocking_recreate": (
        "--workload", "blocking", "--device-type", "v6e-16", "--num-slices", "2", "--restart-strategy", "BlockingRecreate",
        "--max-restarts", "3", "--restart-on-exit-codes", "42,137,200-210", "--termination-grace-period", "45",
        "--hang-timeout", "600", "--env", "LEARNING_RATE=0.1", "--checkpoint-volume", "pvc:checkpoints",
        "--docker-name", "trainer", "--priority", "very-high",
    ),
    "json_output": ("--workload", "asjson", "--device-type", "v6e-16", "--num-slices", "1", "--output", "json"),
}


@pytest.mark.parametrize("case", sorted(KUBERNETES_WORKLOADS))
def test_kubernetes_dry_run_renders_the_same_objects(case: str, tmp_path: Path) -> None:
    code, stdout, stderr = cli_in_process(tmp_path, *_COMMON, *KUBERNETES_WORKLOADS[case])
    assert code == 0, stderr
    check_golden(f"kubernetes_{case}.txt", normalise(section(" ".join(KUBERNETES_WORKLOADS[case]), code, stdout, stderr), tmp_path))


class _RecordingApiServer:
    """A catch-all API server: the recorded GKE v6e-16 nodes, both CRD groups served, every
    apply answered with its own body and kept, so the objects ``cluster create`` writes can be
    compared."""

    def __init__(self) -> None:
        nodes = yaml.safe_load(NODES.read_text())
        groups = [
            {"name": "jobset.x-k8s.io", "versions": [{"groupVersion": "jobset.x-k8s.io/v1alpha2", "version": "v1alpha2"}]},
            {"name": "batch", "versions": [{"groupVersion": "batch/v1", "version": "v1"}]},
            {"name": "kueue.x-k8s.io", "versions": [{"groupVersion": "kueue.x-k8s.io/v1beta2", "version": "v1beta2"}]},
        ]
        self.applied: list[dict[str, Any]] = []
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _serve(self) -> None:
                path, _, query = self.path.partition("?")
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length)) if length else None
                if path.rstrip("/") == "/apis":
                    status, answer = 200, {"kind": "APIGroupList", "groups": groups}
                elif path == "/api/v1/nodes":
                    status, answer = 200, nodes
                elif self.command in ("PATCH", "POST", "PUT"):
                    recorder.applied.append({"method": self.command, "path": path, "query": query, "body": body})
                    status, answer = 200, body
                else:
                    status, answer = 404, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": "not found", "reason": "NotFound", "code": 404}
                raw = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _serve

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def kubeconfig(self, path: Path) -> Path:
        server = f"http://127.0.0.1:{self.server.server_address[1]}"
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": server}}],
            "users": [{"name": "me", "user": {"token": "t0ken"}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "me"}}],
        }))
        return path

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_kubernetes_kueue_cluster_objects_workload_and_controller_manifests(tmp_path: Path) -> None:
    """``cluster create --kueue`` (the PriorityClasses and Kueue objects it applies, its JSON),
    a workload's JobSet on that cluster (queue label), and ``controller manifests``."""
    server = _RecordingApiServer()
    try:
        kubeconfig = server.kubeconfig(tmp_path / "kubeconfig")
        runs = [
            ("cluster", "create", "--backend", "kubernetes", "--cluster", "gold", "--context", "fake", "--kueue", "--output", "json"),
            ("workload", "create", "--cluster", "gold", "--workload", "queued", "--num-slices", "2", "--command", "python3 train.py", "--dry-run"),
            ("controller", "manifests", "--cluster", "gold", "--image", "registry.example/hotswap:0.1"),
        ]
        text = ""
        for args in runs:
            code, stdout, stderr = cli_in_process(tmp_path, *args, kubeconfig=kubeconfig)
            assert code == 0, stderr
            text += section(" ".join(args), code, stdout, stderr)
            if args[0] == "cluster":
                text += "### objects applied\n" + json.dumps(server.applied, indent=2, sort_keys=True) + "\n### end\n\n"
    finally:
        server.close()
    check_golden("kubernetes_kueue_cluster.txt", normalise(text, tmp_path))


# ---------------------------------------------------------------- local: environment and outputs

# Each worker writes its whole environment as JSON, named by workload, replica and host.
DUMP_ENV = (
    "import json, os\n"
    "name = '-'.join(os.environ[k] for k in ('HOTSWAP_WORKLOAD', 'JOB_INDEX', 'JOB_COMPLETION_INDEX'))\n"
    "with open(os.path.join(os.environ['DUMP'], name + '.json'), 'w') as f:\n"
    "    json.dump(dict(os.environ), f, indent=2, sort_keys=True)\n"
)


def base_environment(home: Path) -> dict[str, str]:
    """A small, fixed environment for the CLI (so what the workers add is all that differs;
    a fixed locale, so Python's locale coercion adds nothing)."""
    keep = {key: os.environ[key] for key in ("PATH", "PYTHONPATH", "HOME", "TMPDIR", "VIRTUAL_ENV") if key in os.environ}
    return {**keep, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "HOTSWAP_HOME": str(home)}


def cli_process(environ: dict[str, str], cwd: Path, *args: str) -> tuple[int, str, str]:
    result = subprocess.run([PYTHON, "-m", "hotswap", *args], capture_output=True, text=True, env=environ, cwd=cwd, timeout=120)
    return result.returncode, result.stdout, result.stderr


@pytest.fixture
def local_cluster(tmp_path: Path) -> Iterator[tuple[Path, dict[str, str]]]:
    environ = base_environment(tmp_path / "state")
    yield tmp_path, environ
    cli_process(environ, tmp_path, "cluster", "delete", "--cluster", "gold", "--force")
    _kill_leftovers(tmp_path)


def _kill_leftovers(tmp: Path) -> None:
    """Kill what survived deletion: only processes whose command line names this test's directory."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if str(tmp) in (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                os.kill(int(entry.name), signal.SIGKILL)


def test_local_worker_environment_and_cli_outputs(local_cluster: tuple[Path, dict[str, str]]) -> None:
    """A local v5p-16 cluster (2 hosts per slice): a plain and an elastic workload whose workers
    dump their environment; then the CLI's JSON and text views of them."""
    tmp, environ = local_cluster
    dump = tmp / "dump"
    dump.mkdir()
    (tmp / "dump_env.py").write_text(DUMP_ENV)
    command = f"{PYTHON} {tmp / 'dump_env.py'}"
    runs: list[tuple[str, ...]] = [
        ("cluster", "create", "--cluster", "gold", "--device-type", "v5p-16", "--num-slices", "4", "--output", "json"),
        ("workload", "create", "--cluster", "gold", "--workload", "preview", "--num-slices", "2", "--command", command,
         "--env", "A=1", "--dry-run", "--output", "json"),
        ("workload", "create", "--cluster", "gold", "--workload", "plain", "--num-slices", "2", "--command", command,
         "--env", f"DUMP={dump}", "--wait", "--until", "finished", "--timeout", "60"),
        ("workload", "create", "--cluster", "gold", "--workload", "elastic", "--num-slices", "2", "--min-slices", "1",
         "--command", command, "--env", f"DUMP={dump}", "--wait", "--until", "finished", "--timeout", "60", "--output", "json"),
        ("workload", "list", "--cluster", "gold"),
        ("workload", "list", "--cluster", "gold", "--output", "json"),
        ("workload", "describe", "--cluster", "gold", "--workload", "plain"),
        ("workload", "describe", "--cluster", "gold", "--workload", "elastic", "--output", "json"),
        ("cluster", "describe", "--cluster", "gold"),
        ("cluster", "describe", "--cluster", "gold", "--output", "json"),
        ("cluster", "list"),
        ("cluster", "list", "--output", "json"),
    ]
    outputs = ""
    for args in runs:
        # No warm spares and no zygote (a new cluster's default keeps them as this machine's free
        # memory allows): the outputs and the workers' environments must not depend on it.
        spares = {"HOTSWAP_WARM_WORKERS": "0", "HOTSWAP_ZYGOTE": "0"} if args[:2] == ("cluster", "create") else {}
        code, stdout, stderr = cli_process({**environ, **spares}, tmp, *args)
        assert code == 0, f"{args}: {stderr}"
        table_with_pids = args[:2] == ("workload", "describe") and "--output" not in args
        if "--wait" in args:
            # The progress lines depend on when the wait first looks (QUEUED or RUNNING or done);
            # the last line, the outcome, does not.
            stderr = stderr.splitlines(keepends=True)[-1]
        outputs += normalise(section(" ".join(args), code, stdout, stderr), tmp, pid_column=table_with_pids)
    check_golden("local_cli_outputs.txt", outputs)

    # What hotswap adds to (or changes in) the environment it was started with, and every
    # HOTSWAP_* variable (HOTSWAP_HOME is passed through unchanged), per worker.
    environments = ""
    for path in sorted(dump.iterdir()):
        worker = json.loads(path.read_text())
        added = {key: value for key, value in sorted(worker.items()) if environ.get(key) != value or key.startswith("HOTSWAP_")}
        environments += f"### worker {path.stem} (workload-replica-host)\n{json.dumps(added, indent=2)}\n\n"
    assert len(list(dump.iterdir())) == 8  # 2 workloads x 2 slices x 2 hosts
    check_golden("local_worker_environment.txt", normalise(environments, tmp))
