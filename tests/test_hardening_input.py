"""Input is validated where it enters (issue 13): flags, env files and numbers that once
crashed or bricked a cluster are one-line errors that change nothing, and the inputs users
rightly give (a BOM, CRLF line ends) are accepted. The CLI runs in-process through its real
entry point; the cluster's controller is a real daemon."""

from __future__ import annotations

import codecs
import os
from pathlib import Path

import pytest
from hardening_helpers import cli, digest, state_home
from local_helpers import live_workers, wait_until, workloads, write_sleeper

from hotswap.api.envfile import parse_env_file, read_env_file
from hotswap.api.errors import InvalidInputError
from hotswap.api.limits import MAX_ENV_FILE_BYTES


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    """One cluster "c" (1 x v6e-4) with a workload "existing" running on it."""
    root = tmp_path_factory.mktemp("input")
    with state_home(root / "state") as home:
        assert cli("cluster", "create", "--cluster", "c", "--device-type", "v6e-4", "--num-slices", "1").code == 0
        assert cli("workload", "create", "--cluster", "c", "--workload", "existing", "--command", write_sleeper(root)).code == 0
        # Settled: the phase, and the worker's start recorded (a later write would change the digest).
        wait_until(
            lambda: workloads(home, "c")["existing"]["phase"] == "RUNNING"
            and [(w["state"], bool(w["pid"])) for w in live_workers(home, "c", "existing")] == [("running", True)],
            what="running, its worker's start recorded",
        )
        yield home


def refused(home: Path, *args: str, message: str) -> None:
    """``hotswap ARGS`` fails with one line naming ``message`` and leaves the database as it was."""
    before = digest(home / "clusters" / "c" / "state.db")
    result = cli(*args)
    assert result.one_line_error and message in result.err, result
    assert result.code == 2 and result.out == ""
    assert digest(home / "clusters" / "c" / "state.db") == before


def create(*flags: str) -> tuple[str, ...]:
    return ("workload", "create", "--cluster", "c", "--workload", "new", "--command", "true", *flags)


def test_a_nul_byte_in_an_env_file_is_refused(cluster: Path, tmp_path: Path) -> None:
    """Once accepted, it crashed the controller each time it re-adopted the worker."""
    env_file = tmp_path / "nul.env"
    env_file.write_bytes(b"GOOD=1\nBAD=a\x00b\n")
    refused(cluster, *create("--env-file", str(env_file)), message="line 2 contains the control character '\\x00'")


@pytest.mark.parametrize("value", ["inf", "1e9", "nan", "-1", "2147483648"])
def test_the_grace_period_is_bounded_and_its_error_names_the_flag(cluster: Path, value: str) -> None:
    """inf (or anything past ~24.9 days) crash-looped the controller in select()."""
    refused(cluster, *create("--termination-grace-period", value), message="--termination-grace-period:")


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--max-restarts", str(10**30)), "--max-restarts"),
        (("--num-slices", str(10**30)), "--num-slices"),
        (("--min-slices", "0"), "--min-slices"),
        (("--command", "echo a\nrm -rf /"), "put a multi-line command in a script"),
        (("--env", "A=x\x1by"), "--env A contains the control character"),
        (("--env", "\udcff=1"), "not UTF-8"),
        (("--checkpoint-dir", "/tmp/x\x07"), "--checkpoint-dir contains"),
        (("--device-type", ""), "--device-type must not be empty"),
        (("--device-type", "v6e-" + "9" * 5000), "unknown device type"),  # once a ValueError
        (("--docker-image", ""), "--docker-image must not be empty"),
    ],
)
def test_bad_values_are_one_line_and_change_nothing(cluster: Path, flags: tuple[str, ...], message: str) -> None:
    refused(cluster, *create(*flags), message=message)


def test_an_uncreatable_checkpoint_dir_is_refused_before_anything_is_queued(cluster: Path, tmp_path: Path) -> None:
    """It once blocked every scheduling decision of the cluster."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    refused(cluster, *create("--checkpoint-dir", str(blocker / "ckpt")), message=f"{blocker} is not a directory")


def test_a_checkpoint_dir_others_can_write_or_own_is_refused(cluster: Path, tmp_path: Path) -> None:
    """A job restores what its checkpoint directory holds: nobody else may be able to put it there."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    refused(cluster, *create("--checkpoint-dir", str(shared)), message="can be written by other users")
    if os.geteuid() == 0:
        theirs = tmp_path / "theirs"
        theirs.mkdir(mode=0o700)
        os.chown(theirs, 65534, 65534)
        refused(cluster, *create("--checkpoint-dir", str(theirs)), message="not to you")
    # What a run resumes from is restored into it just the same.
    refused(cluster, *create("--resume-from", str(shared)), message="can be written by other users")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("workload", "create", "--cluster", "c"), "Missing option '--workload'"),
        (("workload", "list", "--wrong"), "No such option: --wrong"),
        # kubectl's and xpk's users are told the flag that does it (issue 34, item 8)
        (("workload", "list", "--cluster", "c", "--json"), "No such option: --json; use -o json (--output json)"),
        (("node", "list", "--cluster", "c", "--yaml"), "No such option: --yaml; use -o yaml (--output yaml)"),
        (("workload", "create", "--cluster", "c", "--workload", "x", "--command", "t", "--num-slices", "x"), "'--num-slices'"),
        (("workload", "list", "--cluster", "c", "--output", "xml"), "'--output'"),
        (("nonsense",), "No such command"),
    ],
)
def test_usage_errors_are_one_line_not_a_box(cluster: Path, args: tuple[str, ...], message: str) -> None:
    result = cli(*args)
    assert result.one_line_error and message in result.err and "--help" in result.err, result
    assert not any(box in result.err for box in "╭│╰")


def test_an_env_file_with_a_byte_order_mark_and_crlf_line_ends_is_read(tmp_path: Path) -> None:
    env_file = tmp_path / "windows.env"
    env_file.write_bytes(codecs.BOM_UTF8 + b"FIRST=1\r\n# comment\r\nSECOND=two words\r\n")
    assert read_env_file(env_file, {}) == {"FIRST": "1", "SECOND": "two words"}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"A=1\nB=\xff\n", "line 2: not UTF-8"),
        (b"A=1\n\x00B=1\n", "line 2 contains the control character"),
        (b"A=x\x0cy\n", "line 1 contains the control character '\\x0c'"),
        (b"A=" + b"x" * MAX_ENV_FILE_BYTES, "larger than"),
        (b"1A=1\n", "not a valid variable name"),
    ],
)
def test_a_malformed_env_file_is_one_line(tmp_path: Path, data: bytes, message: str) -> None:
    env_file = tmp_path / "bad.env"
    env_file.write_bytes(data)
    with pytest.raises(InvalidInputError) as caught:
        read_env_file(env_file, {})
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_a_variable_copied_from_the_shell_is_checked_too() -> None:
    assert parse_env_file("HOME\nMISSING\n", {"HOME": "/home/me"}) == {"HOME": "/home/me"}
    with pytest.raises(InvalidInputError, match="line 1 .*\\$CERT of this shell"):
        parse_env_file("CERT\n", {"CERT": "a\nb"})


@pytest.mark.parametrize("flags", [("--days", "inf"), ("--days", "nan"), ("--nodes", str(10**9)), ("--repair-minutes", "1e400")])
def test_the_simulator_refuses_what_would_run_forever(flags: tuple[str, str]) -> None:
    result = cli("simulate", "--json", *flags)
    assert result.one_line_error and result.code == 2 and flags[0] in result.err, result
