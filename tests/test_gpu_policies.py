"""The pure decisions of real-accelerator support, table-driven: hang detection
(hotswap.core.hang), GPU health (hotswap.core.gpu_health), what a hang does to a workload
(the core), which GPUs a cluster takes (backends/local/gpu/claims.py), and the worker contract's
local ranks and devices (hotswap.api.worker)."""

from __future__ import annotations

import subprocess

import pytest
from builders import World, spec
from hypothesis import given, settings
from hypothesis import strategies as st

from hotswap.api import worker as contract
from hotswap.api.membership import Membership
from hotswap.api.catalog import device_type_names, device_types, get_device_type
from hotswap.api.errors import ConflictError, InvalidInputError
from hotswap.backends.local.gpu.backing import Backing, gpus_per_host
from hotswap.backends.local.gpu.claims import GpuSelection, choose_pool
from hotswap.backends.local.gpu.nvml import GpuInfo
from hotswap.core import events as ev
from hotswap.core.gpu_health import GpuReading, XidClass, XidFilter, reading_problems
from hotswap.core.hang import FIRST_SAVE_ALLOWANCE_S, FLOOR_S, HangLimits, RankProgress, judge, next_deadline

# ---------------------------------------------------------------------- hang detection


def rank(steps: int = 10, last_at: float | None = 100.0, interval: float = 0.1, saving: float | None = None,
         longest_save: float | None = None, label: str = "s/0", save_ended: float | None = None,
         leaving: bool = False) -> RankProgress:
    return RankProgress(
        label, steps, steps if steps else None, last_at if steps else None, interval, saving, longest_save, save_ended,
        leaving,
    )


F = FLOOR_S
HANG_CASES = [
    # (id, ranks, watched_since, now, limit, hung?, timeout)
    ("no step yet: a slow first step is never a hang", [rank(steps=0)], 0.0, 10_000.0, None, False, None),
    ("fast steps: the floor, not yet", [rank(interval=0.1)], 0.0, 100.0 + F - 0.1, None, False, None),
    ("fast steps: the floor, past it", [rank(interval=0.1)], 0.0, 100.0 + F + 0.1, None, True, F),
    ("an 8 s pause with 0.1 s steps is no hang", [rank(interval=0.1)], 0.0, 108.0, None, False, None),
    ("slow steps: 5 x the longest interval", [rank(interval=20.0)], 0.0, 199.0, None, False, None),
    ("slow steps: past 5 x the longest interval", [rank(interval=20.0)], 0.0, 200.5, None, True, 100.0),
    ("the limit sets the timeout below the derived one", [rank(interval=20.0)], 0.0, 108.5, 8.0, True, 8.0),
    ("a limit under the floor wins", [rank(interval=0.1)], 0.0, 102.5, 2.0, True, 2.0),
    ("a limit above the floor sets it: not yet", [rank(interval=0.1)], 0.0, 100.0 + 2 * F - 0.5, 2 * F, False, None),
    ("a limit above the floor sets it: past it", [rank(interval=0.1)], 0.0, 100.0 + 2 * F + 0.5, 2 * F, True, 2 * F),
    ("a limit is kept with slower steps", [rank(interval=50.0)], 0.0, 100.0 + 2 * F + 0.5, 2 * F, True, 2 * F),
    ("limit 0: no hang detection", [rank(interval=0.1)], 0.0, 10_000.0, 0.0, False, None),
    ("a rank that recorded its stop is leaving, however long", [rank(leaving=True)], 0.0, 100_000.0, None, False, None),
    ("and with a limit too", [rank(leaving=True)], 0.0, 100_000.0, 2.0, False, None),
    ("a leaving rank does not hide a stalled one", [rank(leaving=True), rank(last_at=90.0, label="s/1")], 0.0, 90.0 + F + 1, None, True, F),
    ("an unwatched stretch is not counted", [rank(interval=0.1)], 200.0, 200.0 + F - 1, None, False, None),
    ("counted from when the watch began", [rank(interval=0.1)], 200.0, 200.0 + F + 0.5, None, True, F),
    ("a first save in progress gets the first-save allowance", [rank(saving=101.0)], 0.0, 650.0, None, False, None),
    ("a first save past it", [rank(saving=101.0)], 0.0, 702.0, None, True, 600.0),
    ("a save 5 x the longest one is allowed", [rank(saving=101.0, longest_save=20.0)], 0.0, 200.0, None, False, None),
    ("a save past 5 x the longest one", [rank(saving=101.0, longest_save=20.0)], 0.0, 201.5, None, True, 100.0),
    ("a save that ended (a step since) counts no more", [rank(saving=99.0, longest_save=6.0)], 0.0, 100.0 + F + 0.5, None, True, F),
    ("the next step is due a timeout after a save ended", [rank(longest_save=20.0, save_ended=121.0)], 0.0, 121.0 + F - 0.5, None, False, None),
    ("and overdue after it", [rank(longest_save=20.0, save_ended=121.0)], 0.0, 121.0 + F + 0.5, None, True, F),
    ("one stalled rank among stepping ones", [rank(last_at=200.0), rank(last_at=195.0, label="s/1")], 0.0, 195.0 + F + 0.5, None, True, F),
]


@pytest.mark.parametrize(("ranks", "watched", "now", "limit", "hung", "timeout"),
                         [c[1:] for c in HANG_CASES], ids=[c[0] for c in HANG_CASES])
def test_hang_judgement(ranks: list[RankProgress], watched: float, now: float, limit: float | None, hung: bool,
                        timeout: float | None) -> None:
    limits = HangLimits(limit_s=limit)
    found = judge(ranks, watched, now, limits)
    assert (found is not None) == hung
    if found is not None:
        assert found.timeout_s == pytest.approx(timeout)
        assert found.label in {r.label for r in ranks} and found.label in found.reason
        # The deadline the watcher sleeps until is the moment the judgement turns.
        deadline = next_deadline(ranks, watched, limits)
        assert deadline is not None and deadline < now
        assert judge(ranks, watched, deadline - 1e-6, limits) is None


def test_the_most_overdue_rank_is_named() -> None:
    found = judge([rank(last_at=100.0, label="a/0"), rank(last_at=90.0, label="b/0")], 0.0, 200.0, HangLimits())
    assert found is not None and found.label == "b/0" and "step 10" in found.reason


def test_the_hang_limit_is_part_of_the_spec() -> None:
    assert spec("w").hang_timeout_s is None and spec("w", hang_timeout_s=0).hang_timeout_s == 0
    assert not HangLimits(spec("w", hang_timeout_s=0).hang_timeout_s).enabled
    with pytest.raises(InvalidInputError, match="--hang-timeout -1: give seconds up to 604800, or 0"):
        spec("w", hang_timeout_s=-1)


@settings(max_examples=60, deadline=None)
@given(interval=st.floats(0.0, 1000.0), limit=st.one_of(st.none(), st.floats(0.5, 1000.0)))
def test_the_step_timeout_is_the_limit_or_derived_and_floored(interval: float, limit: float | None) -> None:
    timeout = HangLimits(limit_s=limit).step_timeout(interval)
    if limit is not None:
        assert timeout == limit  # --hang-timeout sets it, above or below what the steps would give
    else:
        assert timeout >= FLOOR_S and timeout >= 5 * interval
        assert timeout == FLOOR_S or timeout == pytest.approx(5 * interval)


@settings(max_examples=80, deadline=None)
@given(
    interval=st.floats(0.0, 100.0), stalled=st.floats(0.0, 1e6), limit=st.one_of(st.none(), st.floats(0.5, 1000.0)),
    saving=st.booleans(),
)
def test_a_leaving_rank_is_never_hung_and_a_silent_one_always_is_in_the_end(
    interval: float, stalled: float, limit: float | None, saving: bool
) -> None:
    limits = HangLimits(limit_s=limit)
    save_at = 100.0 if saving else None
    leaving = rank(interval=interval, saving=save_at, leaving=True)
    assert judge([leaving], 0.0, 100.0 + stalled, limits) is None
    assert next_deadline([leaving], 0.0, limits) is None
    silent = rank(interval=interval, saving=save_at)
    deadline = next_deadline([silent], 0.0, limits)
    assert deadline is not None and deadline <= 100.0 + max(limits.step_timeout(interval), FIRST_SAVE_ALLOWANCE_S)
    assert judge([silent], 0.0, deadline + 1e-3, limits) is not None


# ---------------------------------------------------------------------- what a hang does


def test_a_hang_restarts_the_workload_charged_then_fails_it_when_restarts_are_used_up() -> None:
    world = World()
    world.step(ev.WorkloadCreated(spec("job", max_restarts=1)))
    assert world.step(ev.WorkloadHung("job", 1, "rank np-0/0: nothing for 9.0s")) == ["restart job np-0 charged"]
    job = world.workload("job")
    assert job.restarts == 1 and job.attempt == 2 and "hung: rank np-0/0" in job.status_message
    assert world.step(ev.WorkloadHung("job", 1, "late report of the old attempt")) == []  # stale attempt
    assert world.step(ev.WorkloadHung("job", 2, "again")) == ["fail job"]
    assert world.state("job").startswith("FAILED") and "max restarts (1) is used up" in world.workload("job").status_message


def test_a_node_failure_names_its_reason_in_the_workload_status() -> None:
    world = World()
    world.step(ev.WorkloadCreated(spec("job")))
    node = world.snapshot.slices[world.workload("job").slices[0]].nodes[0]
    world.step(ev.NodeFailed(node, "GPU 0 (GPU-x): XID 79 (GPU has fallen off the bus)"))
    assert "XID 79" in world.workload("job").status_message


# ---------------------------------------------------------------------- GPU health

XID_CASES = [
    # (id, disable, enable, xid, class)
    ("application XID 13", "", "", 13, XidClass.APPLICATION),
    ("application XID 31", "", "", 31, XidClass.APPLICATION),
    ("application XID 43", "", "", 43, XidClass.APPLICATION),
    ("application XID 45", "", "", 45, XidClass.APPLICATION),
    ("application XID 68", "", "", 68, XidClass.APPLICATION),
    ("application XID 109", "", "", 109, XidClass.APPLICATION),
    ("XID 79 fallen off the bus", "", "", 79, XidClass.HARDWARE),
    ("XID 48 double-bit ECC", "", "", 48, XidClass.HARDWARE),
    ("an XID nobody named", "", "", 4242, XidClass.HARDWARE),
    ("DP_DISABLE_HEALTHCHECKS=79", "79", "", 79, XidClass.IGNORED),
    ("DP_DISABLE_HEALTHCHECKS=all", "all", "", 79, XidClass.IGNORED),
    ("DP_DISABLE_HEALTHCHECKS=xids", "xids", "", 48, XidClass.IGNORED),
    ("all disabled but 79 enabled", "all", "79", 79, XidClass.HARDWARE),
    ("enabling an application XID takes the GPU out", "", "31", 31, XidClass.HARDWARE),
    ("malformed entries are ignored", "x, 79 ,", "", 79, XidClass.IGNORED),
]


@pytest.mark.parametrize(("disable", "enable", "xid", "expected"), [c[1:] for c in XID_CASES], ids=[c[0] for c in XID_CASES])
def test_xids_are_classified_as_the_device_plugin_does(disable: str, enable: str, xid: int, expected: XidClass) -> None:
    assert XidFilter.parse(disable, enable).classify(xid) is expected


READING_CASES = [
    ("healthy", GpuReading("g", ecc_uncorrected=2), 2, []),
    ("ECC count not known yet", GpuReading("g", ecc_uncorrected=2), None, []),
    ("new uncorrectable ECC errors", GpuReading("g", ecc_uncorrected=5), 2, ["3 new uncorrectable ECC error(s)"]),
    ("lost", GpuReading("g", reachable=False, problem="GPU is lost"), 0, ["lost or unreachable (GPU is lost)"]),
    ("retirement pending", GpuReading("g", retirement_pending=True), None, ["a page retirement is pending"]),
    ("remap pending and failed", GpuReading("g", remap_pending=True, remap_failed=True), None,
     ["a row remapping is pending", "a row remapping failed"]),
]


@pytest.mark.parametrize(("reading", "baseline", "expected"), [c[1:] for c in READING_CASES], ids=[c[0] for c in READING_CASES])
def test_health_readings(reading: GpuReading, baseline: int | None, expected: list[str]) -> None:
    problems = reading_problems(reading, baseline)
    assert len(problems) == len(expected)
    assert all(problem.startswith(start) for problem, start in zip(problems, expected))


# ---------------------------------------------------------------------- which GPUs

MACHINE = [GpuInfo(i, f"GPU-{i}", "H100") for i in range(4)]

POOL_CASES = [
    # (id, --gpus, held by others, own, per slice, num_slices, indices chosen, slices)
    ("all, one per slice", "all", {}, (), 1, None, [0, 1, 2, 3], 4),
    ("all, two per slice", "all", {}, (), 2, None, [0, 1, 2, 3], 2),
    ("all, but the others' are skipped", "all", {"GPU-0": "other"}, (), 1, None, [1, 2, 3], 3),
    ("all, as many as the slices need", "all", {}, (), 1, 2, [0, 1], 2),
    ("a count", "2", {}, (), 1, None, [0, 1], 2),
    ("a count with the slice count", "2", {}, (), 2, 1, [0, 1], 1),
    ("named by index", "device=3,1", {}, (), 1, None, [3, 1], 2),
    ("named as a plain list", "0,2", {}, (), 2, None, [0, 2], 1),
    ("named by UUID", "device=gpu-2", {}, (), 1, 1, [2], 1),
    ("a re-run keeps the cluster's own GPUs first", None, {}, ("GPU-3",), 1, 2, [3, 0], 2),
]


@pytest.mark.parametrize(("text", "held", "own", "per_slice", "slices", "indices", "count"),
                         [c[1:] for c in POOL_CASES], ids=[c[0] for c in POOL_CASES])
def test_gpus_a_cluster_takes(text: str | None, held: dict, own: tuple, per_slice: int, slices: int | None,
                              indices: list[int], count: int) -> None:
    selection = GpuSelection.parse(text) if text is not None else None
    pool, num_slices = choose_pool(selection, MACHINE, held, own, per_slice, slices)
    assert [g.index for g in pool] == indices and num_slices == count


BAD_POOLS = [
    # (id, --gpus, held, per slice, num_slices, error type, words in the message)
    ("an index out of range", "device=7", {}, 1, None, InvalidInputError, "no GPU 7 on this machine (it has GPUs 0-3"),
    ("a duplicate", "device=1,1", {}, 1, None, InvalidInputError, "names GPU 1 (GPU-1) twice"),
    ("held by another cluster", "device=2", {"GPU-2": "other"}, 1, None, ConflictError, "held by local cluster other"),
    ("more than exist", "8", {}, 1, None, ConflictError, "8 GPU(s) needed; 4 of this machine's 4 are free"),
    ("more than are free", "all", {"GPU-0": "a", "GPU-1": "b"}, 1, 3, ConflictError, "held by a, b"),
    ("not whole slices", "3", {}, 2, None, InvalidInputError, "3 GPU(s) do not make whole slices of 2"),
    ("count and slices disagree", "2", {}, 1, 3, InvalidInputError, "3 slice(s) of 1 need 3"),
    ("none free at all", "all", {g.uuid: "x" for g in MACHINE}, 1, None, ConflictError, "0 of this machine's 4 are free"),
]


@pytest.mark.parametrize(("text", "held", "per_slice", "slices", "error", "words"),
                         [c[1:] for c in BAD_POOLS], ids=[c[0] for c in BAD_POOLS])
def test_bad_gpu_requests_are_one_line(text: str, held: dict, per_slice: int, slices: int | None, error: type,
                                       words: str) -> None:
    with pytest.raises(error) as raised:
        choose_pool(GpuSelection.parse(text), MACHINE, held, (), per_slice, slices)
    assert words in str(raised.value) and "\n" not in str(raised.value)


@pytest.mark.parametrize("text", ["0", "-1", "", "two", "device=", "1,,2"])
def test_unreadable_gpu_selections(text: str) -> None:
    with pytest.raises(InvalidInputError, match="--gpus"):
        GpuSelection.parse(text)


def test_tpu_types_cannot_be_backed_and_local_gpu_types_exist_only_locally() -> None:
    with pytest.raises(InvalidInputError, match="v6e-4 is a TPU type"):
        gpus_per_host(get_device_type("v6e-4"))
    assert gpus_per_host(get_device_type("h100-80gb-8")) == 8
    local = get_device_type("local-gpu-2")
    assert (local.local_only, local.chips_per_slice, local.hosts_per_slice) == (True, 2, 1)
    assert "local-gpu-2" not in device_type_names() and "local-gpu-2" not in device_types()  # not an xpk name
    with pytest.raises(InvalidInputError, match="local-gpu-K takes 1 to 16"):
        get_device_type("local-gpu-17")


def test_slices_that_stay_keep_their_gpus_and_new_ones_take_the_rest() -> None:
    backing = Backing(1, {"a": (MACHINE[2],)})
    grown = backing.reassigned(["b", "c"], [], MACHINE[:3], hosts=1)
    assert {n: [g.index for g in gpus] for n, gpus in grown.slices.items()} == {"a": [2], "b": [0], "c": [1]}
    shrunk = grown.reassigned([], ["b"], MACHINE[:3], hosts=1)
    assert set(shrunk.slices) == {"a", "c"} and shrunk.node_gpus()["c-0"] == (MACHINE[1],)
    with pytest.raises(ConflictError, match="GPU 2 .* backs slice a, which stays"):
        backing.reassigned(["b"], [], MACHINE[:2], hosts=1)
    assert Backing.of({"gpus": grown.to_settings()}) == grown and Backing.of({}) is None


# ---------------------------------------------------------------------- the worker contract


@settings(max_examples=25, deadline=None)
@given(replica=st.integers(0, 7), host=st.integers(0, 3), hosts=st.integers(1, 4), local=st.integers(0, 7),
       per_host=st.integers(1, 8))
def test_ranks_with_local_processes_match_in_python_and_the_shell(replica: int, host: int, hosts: int, local: int,
                                                                  per_host: int) -> None:
    local = min(local, per_host - 1)
    env = {
        contract.JOB_INDEX: str(replica), contract.JOB_COMPLETION_INDEX: str(host),
        contract.HOTSWAP_HOSTS_PER_SLICE: str(hosts), contract.LOCAL_RANK: str(local),
        contract.LOCAL_WORLD_SIZE: str(per_host),
    }
    script = contract.derived_shell_exports() + f'echo "${contract.RANK}"'
    shell = int(subprocess.run(["/bin/sh", "-c", script], env=env, capture_output=True, text=True, check=True).stdout)
    assert shell == contract.global_rank(replica, host, hosts, local, per_host) == (replica * hosts + host) * per_host + local


def test_ranks_are_contiguous_per_host_and_membership_carries_processes_per_host() -> None:
    membership = Membership(3, ("a", "b"), 1, "127.0.0.1", 1234, local_world_size=4)
    ranks = [membership.rank_of(s, 0, local) for s in ("a", "b") for local in range(4)]
    assert ranks == list(range(membership.world_size)) == list(range(8))
    assert Membership.from_json(membership.to_json()) == membership
    legacy = '{"generation": 1, "slices": ["a"], "hosts_per_slice": 1, "master_addr": "x", "master_port": 1}'
    assert Membership.from_json(legacy).local_world_size == 1


@pytest.mark.parametrize(
    ("environ", "gpus", "emulated", "problem"),
    [
        ({}, (), False, None),  # outside hotswap
        ({contract.CUDA_VISIBLE_DEVICES: ""}, (), True, None),  # an emulated slice
        ({contract.CUDA_VISIBLE_DEVICES: "2,3", contract.LOCAL_RANK: "1"}, ("2", "3"), False, None),
        ({contract.CUDA_VISIBLE_DEVICES: "2", contract.LOCAL_RANK: "1"}, ("2",), False, "LOCAL_RANK 1 has no GPU of its own"),
    ],
)
def test_the_worker_env_says_which_gpus_are_the_workers(environ: dict, gpus: tuple, emulated: bool, problem: str | None) -> None:
    env = contract.WorkerEnv.from_environ(environ)
    assert env.gpus == gpus and env.emulated is emulated
    assert (env.accelerator_problem() or "").startswith(problem or "")
    assert bool(env.accelerator_problem()) == bool(problem)


@pytest.mark.parametrize(
    ("environ", "cuda_devices", "backend"),
    [
        ({contract.CUDA_VISIBLE_DEVICES: ""}, 8, "gloo"),  # emulated on a GPU machine: never NCCL
        ({contract.CUDA_VISIBLE_DEVICES: "0"}, 1, "nccl"),
        ({contract.CUDA_VISIBLE_DEVICES: "4,5", contract.LOCAL_RANK: "1"}, 2, "nccl"),
        ({}, 0, "gloo"),
        ({}, 1, "nccl"),  # outside hotswap with a GPU: its own
        ({contract.LOCAL_RANK: "1"}, 1, "gloo"),  # a second rank never shares the first one's GPU
    ],
)
def test_the_collective_backend_follows_the_contract(environ: dict, cuda_devices: int, backend: str) -> None:
    pytest.importorskip("torch")
    from hotswap.train.torch.distributed import choose_backend

    assert choose_backend(contract.WorkerEnv.from_environ(environ), lambda: cuda_devices) == backend
