"""The worker contract's one home (hotswap.api.worker): formulas, shell rendering, dispatch."""

from __future__ import annotations

import subprocess

from hypothesis import given, settings
from hypothesis import strategies as st

from hotswap.api import worker as contract
from hotswap.api.membership import Membership
from hotswap.api.times import iso_utc, parse_iso_utc
from hotswap.core import actions as act


def _shell_values(env: dict[str, str]) -> tuple[int, int]:
    script = contract.derived_shell_exports() + f'echo "${contract.RANK} ${contract.HOTSWAP_ATTEMPT}"'
    out = subprocess.run(["/bin/sh", "-c", script], env=env, capture_output=True, text=True, check=True).stdout
    rank, attempt = out.split()
    return int(rank), int(attempt)


@settings(max_examples=25, deadline=None)
@given(
    replica=st.integers(0, 63),
    host=st.integers(0, 15),
    hosts=st.integers(1, 16),
    restarts=st.integers(0, 1000),
)
def test_the_shell_prelude_computes_what_python_computes(replica: int, host: int, hosts: int, restarts: int) -> None:
    env = {
        contract.JOB_INDEX: str(replica),
        contract.JOB_COMPLETION_INDEX: str(host),
        contract.HOTSWAP_HOSTS_PER_SLICE: str(hosts),
        contract.HOTSWAP_RESTART_COUNT: str(restarts),
    }
    expected = contract.derived_values({k: int(v) for k, v in env.items()})
    assert _shell_values(env) == (expected[contract.RANK], expected[contract.HOTSWAP_ATTEMPT])
    assert expected[contract.RANK] == contract.global_rank(replica, host, hosts)


def test_unset_indices_mean_a_single_process_run_in_both() -> None:
    assert _shell_values({}) == (0, 1)
    assert contract.derived_values({}) == {contract.RANK: 0, contract.HOTSWAP_ATTEMPT: 1}
    env = contract.WorkerEnv.from_environ({})
    assert (env.rank, env.attempt, env.hosts_per_slice) == (0, 1, 1)


def test_ranks_are_contiguous_per_slice_and_match_membership() -> None:
    slices = ("a", "b", "c")
    membership = Membership(1, slices, 2, "127.0.0.1", 1234)
    ranks = [membership.rank_of(s, h) for s in slices for h in range(2)]
    assert ranks == list(range(contract.world_size(3, 2)))
    assert contract.replica_index(slices, "c") == 2
    assert membership.rank_of("z", 0) is None


def test_coordinator_is_replica_zero_host_zero_of_the_replicated_job() -> None:
    assert contract.coordinator_host("train") == f"train-{contract.REPLICATED_JOB}-0-0.train"


def test_every_action_type_has_one_handler_method() -> None:
    assert set(act.ACTION_TYPES) == set(act.HANDLER_METHODS)
    assert set(act.HANDLER_METHODS.values()) == {
        name for name in vars(act.ActionHandler) if name.startswith("on_")
    }

    class Echo:
        def __getattr__(self, name: str):  # every on_* method answers its own name
            return lambda action: (name, action)

    action = act.Fail("w", "boom")
    assert act.dispatch(action, Echo()) == ("on_fail", action)


def test_iso_utc_round_trips() -> None:
    t = 1_700_000_000.123456
    assert iso_utc(t) == "2023-11-14T22:13:20Z"
    assert iso_utc(t, 2) == "2023-11-14T22:13:20.12Z"
    assert abs(parse_iso_utc(iso_utc(t, 6)) - t) < 1e-6
