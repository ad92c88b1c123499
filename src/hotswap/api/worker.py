"""The contract between a backend and the worker processes it starts.

Backends (local supervisor, Kubernetes JobSet pods) set the environment variables below; the
training SDK (``hotswap.train``) and any user script read them. The names follow JobSet,
torch.distributed and MEGASCALE, so existing training scripts work unchanged.

Elastic workloads also get a *membership file* (:mod:`hotswap.api.membership`). Runs, start
causes and the resume rule are :mod:`hotswap.api.runs`; what a worker prints and the goodput
events it records are :mod:`hotswap.api.worker_output`.

A worker that stops because it was asked to (SIGTERM: preemption, drain, deletion) saves its
state and exits with :data:`CHECKPOINTED_EXIT_CODE`, the code a SIGTERM-killed process reports
anyway (128 + 15). It is in the default restart codes, so it never counts as success or as a
user error anywhere (locally, or to a Kubernetes Job).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from hotswap.api.runs import START_CAUSES

# JobSet / Indexed Job (on Kubernetes from pod labels via the downward API).
JOBSET_NAME = "JOBSET_NAME"  # the workload's JobSet (the workload's name)
REPLICATED_JOB_NAME = "REPLICATED_JOB_NAME"  # the replicated job of the workers: "slice"
JOB_INDEX = "JOB_INDEX"  # slice replica index, 0..num_slices-1
JOB_COMPLETION_INDEX = "JOB_COMPLETION_INDEX"  # host index within the slice
# Multislice (MEGASCALE) and torch.distributed.
MEGASCALE_NUM_SLICES = "MEGASCALE_NUM_SLICES"  # slices the workload runs on now
MEGASCALE_SLICE_ID = "MEGASCALE_SLICE_ID"  # this slice's index among them: JOB_INDEX
MASTER_ADDR = "MASTER_ADDR"  # where rank 0 serves the rendezvous (torch.distributed's meaning)
MASTER_PORT = "MASTER_PORT"  # its port (a fresh one for every membership generation)
RANK = "RANK"  # this process's global rank: replica-major, then host, then local rank
WORLD_SIZE = "WORLD_SIZE"  # processes in the job: slices x hosts per slice x processes per host
LOCAL_RANK = "LOCAL_RANK"  # this process's index among its host's processes (torchrun's meaning)
LOCAL_WORLD_SIZE = "LOCAL_WORLD_SIZE"  # processes on this host: one per GPU of a GPU-backed slice, else 1
# The GPUs this worker may use (CUDA's own variable): the physical indices of its host's GPUs on a
# GPU-backed slice, in NVML (PCI bus) order, and *set and empty* on an emulated slice, so that
# neither CUDA nor the SDK ever puts an emulated worker on a GPU. Local rank i uses the i-th.
CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"
CUDA_DEVICE_ORDER = "CUDA_DEVICE_ORDER"  # PCI_BUS_ID with CUDA_VISIBLE_DEVICES: indices mean NVML's
PCI_BUS_ORDER = "PCI_BUS_ID"
# GKE's names for a TPU host's place in its slice (its TPU webhook sets them on multi-host TPU
# Jobs; libtpu and JAX's GKE cluster detection read them), set on TPU device types only. JAX
# takes a process for a GKE TPU worker only where libtpu finds TPU chips, so on an emulated
# slice they mislead nothing; hotswap's JAX SDK also never lets JAX detect a cluster.
TPU_WORKER_ID = "TPU_WORKER_ID"  # the host's index in its slice: JOB_COMPLETION_INDEX
TPU_WORKER_HOSTNAMES = "TPU_WORKER_HOSTNAMES"  # the slice's hosts, comma-separated, by TPU_WORKER_ID
# hotswap.
HOTSWAP_CLUSTER = "HOTSWAP_CLUSTER"  # the cluster the workload runs on
HOTSWAP_WORKLOAD = "HOTSWAP_WORKLOAD"  # the workload's name
HOTSWAP_CHECKPOINT_DIR = "HOTSWAP_CHECKPOINT_DIR"  # this run's own directory: <checkpoint root>/<run id>
HOTSWAP_RUN_ID = "HOTSWAP_RUN_ID"  # this run (one `workload create`); restarts within it keep it
# Where this run's state comes from while its own directory holds no checkpoint: a checkpoint
# directory (another run's, or --resume-from's), runs.RESUME_AUTO (the worker looks for a
# migration checkpoint its predecessor left next to its own directory; Kubernetes, where only
# pods see the volume), or empty/unset (a fresh start).
HOTSWAP_RESUME_FROM = "HOTSWAP_RESUME_FROM"
# With HOTSWAP_RESUME_FROM=auto: earlier runs of the workload the backend saw end FAILED (their
# ids, comma-separated), never resumed automatically. Kubernetes sets it from the cluster's
# record (backends/kubernetes/failed_runs.py) and the CLI's log archive; the local controller
# writes each such run's outcome file instead.
HOTSWAP_FAILED_RUNS = "HOTSWAP_FAILED_RUNS"
# Why this worker generation started (runs.START_CAUSES); what its `restored` line says happened.
HOTSWAP_START_CAUSE = "HOTSWAP_START_CAUSE"
HOTSWAP_RESTART_COUNT = "HOTSWAP_RESTART_COUNT"  # restarts of any cause so far (attempt - 1)
HOTSWAP_ATTEMPT = "HOTSWAP_ATTEMPT"  # worker generation, bumped at every (re)start
HOTSWAP_SLICE = "HOTSWAP_SLICE"  # name of the slice this worker runs on
HOTSWAP_HOSTS_PER_SLICE = "HOTSWAP_HOSTS_PER_SLICE"  # hosts (workers) of each slice
HOTSWAP_MEMBERSHIP_FILE = "HOTSWAP_MEMBERSHIP_FILE"  # elastic workloads only
# Elastic workloads on Kubernetes: the host of the JAX coordination service the backend runs for
# every generation (each generation's on its membership's master_port). Set: a JAX worker
# connects there and never starts a service itself; unset: the generation's rank 0 starts one.
HOTSWAP_JAX_COORDINATOR = "HOTSWAP_JAX_COORDINATOR"
HOTSWAP_EVENTS_FILE = "HOTSWAP_EVENTS_FILE"  # JSON lines of goodput events, one file per worker
# Kubernetes: where each replica's first process (host 0, local rank 0) writes its replica's
# record for the controller (goodput, MTTR, hangs): `in-cluster` (the Leases of the pod's
# namespace, on the API server it reaches) or a Leases collection URL; unset: no record
HOTSWAP_REPORT_LEASES = "HOTSWAP_REPORT_LEASES"
HOTSWAP_TERMINATION_GRACE_S = "HOTSWAP_TERMINATION_GRACE_S"  # seconds from SIGTERM to SIGKILL: the time to save
# Set only in a worker that a warm spare runs (backends/local/workers/warm.py, which runs by path and
# spells it out): when the spare took the assignment, in Unix seconds: the restart's "spawn".
HOTSWAP_HANDED_OVER_AT = "HOTSWAP_HANDED_OVER_AT"
# Set by the user (`workload create --env HOTSWAP_ALLOW_FRESH_START=1`), never by a backend: a
# worker that finds no usable checkpoint but damaged ones it set aside may start from step 0.
# Without it, it exits with CHECKPOINTS_UNUSABLE_EXIT_CODE instead of silently losing the steps.
HOTSWAP_ALLOW_FRESH_START = "HOTSWAP_ALLOW_FRESH_START"
_TRUE = ("1", "true", "yes", "on")

CHECKPOINTED_EXIT_CODE = 143
# The worker cannot go on for a reason outside the training code (a non-elastic group lost a
# peer, no membership came, the rendezvous failed): restart it. It is in xpk's default restart
# codes, and hotswap's. The worker saves what it holds first.
RESTART_EXIT_CODE = 42
# The job's checkpoints cannot be used: a refused checkpoint directory (another user's, or
# writable by others), only damaged checkpoints and no HOTSWAP_ALLOW_FRESH_START, or the final
# checkpoint, after the last step, could not be written (the steps would be lost). A workload
# error, not an infrastructure one: it is outside the default restart codes (sysexits' EX_DATAERR),
# so the workload fails with it instead of restarting into the same refusal.
CHECKPOINTS_UNUSABLE_EXIT_CODE = 65

REPLICATED_JOB = "slice"  # the replicated job of a hotswap JobSet's workers
COORDINATOR_JOB = "coordinator"  # an elastic JobSet's replicated job running the JAX coordination service

# Contract defaults: what a worker assumes when a variable is missing, and what backends set.
DEFAULT_GRACE_PERIOD_S = 30.0  # SIGTERM -> SIGKILL, as Kubernetes' terminationGracePeriodSeconds
DEFAULT_MASTER_ADDR = "127.0.0.1"
DEFAULT_MASTER_PORT = 29500  # torch.distributed's customary port

# -- Values derived from the indices. The formulas are data so that a backend that cannot
# compute them itself (a Kubernetes pod gets only the indices from the downward API) can have a
# shell compute them with exactly the same arithmetic (:func:`derived_shell_exports`).
# Each formula is a sum of products of environment variables and integer constants.
_Term = tuple[str | int, ...]
DERIVED: dict[str, tuple[_Term, ...]] = {
    # Process l of host h of replica r: ranks are contiguous per host, hosts contiguous per slice,
    # replica-major (torchrun's: node_rank * nproc_per_node + local_rank, with node_rank = the
    # host's place r * hosts + h): ((r * hosts + h) * local_world_size) + l.
    RANK: (
        (JOB_INDEX, HOTSWAP_HOSTS_PER_SLICE, LOCAL_WORLD_SIZE),
        (JOB_COMPLETION_INDEX, LOCAL_WORLD_SIZE),
        (LOCAL_RANK,),
    ),
    HOTSWAP_ATTEMPT: ((HOTSWAP_RESTART_COUNT,), (1,)),
}


# What an unset index counts as, in Python and in the shell alike (as :class:`WorkerEnv` reads it).
_UNSET = {HOTSWAP_HOSTS_PER_SLICE: 1, LOCAL_WORLD_SIZE: 1}


def _evaluate(formula: tuple[_Term, ...], values: Mapping[str, int]) -> int:
    total = 0
    for term in formula:
        product = 1
        for factor in term:
            product *= factor if isinstance(factor, int) else int(values.get(factor, _UNSET.get(factor, 0)))
        total += product
    return total


def derived_values(values: Mapping[str, int]) -> dict[str, int]:
    """RANK and HOTSWAP_ATTEMPT from the indices they are computed from (LOCAL_RANK and
    LOCAL_WORLD_SIZE count too: unset, they mean one process per host)."""
    return {name: _evaluate(formula, values) for name, formula in DERIVED.items()}


def derived_shell_exports() -> str:
    """A POSIX shell line that exports the derived values from the indices in the environment
    (the Kubernetes prelude), with the same formulas and the same values for unset indices."""

    def factor(item: str | int) -> str:
        return str(item) if isinstance(item, int) else f"${{{item}:-{_UNSET.get(item, 0)}}}"

    assignments = [
        f'{name}="$(({" + ".join(" * ".join(factor(f) for f in term) for term in formula)}))"'
        for name, formula in DERIVED.items()
    ]
    return "export " + " ".join(assignments) + "\n"


def global_rank(replica: int, host: int, hosts_per_slice: int, local_rank: int = 0, local_world_size: int = 1) -> int:
    """The rank of process ``local_rank`` of host ``host`` of replica ``replica`` (the RANK
    formula above)."""
    values = {
        JOB_INDEX: replica,
        HOTSWAP_HOSTS_PER_SLICE: hosts_per_slice,
        JOB_COMPLETION_INDEX: host,
        LOCAL_RANK: local_rank,
        LOCAL_WORLD_SIZE: local_world_size,
    }
    return derived_values(values)[RANK]


def world_size(num_replicas: int, hosts_per_slice: int, local_world_size: int = 1) -> int:
    return num_replicas * hosts_per_slice * local_world_size


def visible_devices(indices: Sequence[int]) -> str:
    """The CUDA_VISIBLE_DEVICES value of a host whose GPUs are ``indices`` (empty: emulated)."""
    return ",".join(str(index) for index in indices)


def replica_index(slices: tuple[str, ...] | list[str], slice_name: str) -> int:
    """The index of ``slice_name`` in a list of slices where replica i runs on ``slices[i]`` (a
    membership generation's). Which replica index each worker starts as is the core's
    assignment (``Workload.replica_map``): after an elastic shrink, survivors keep theirs and a
    joiner takes a parked one."""
    return list(slices).index(slice_name)


def coordinator_host(jobset: str, replica: int | str = 0, host: int = 0, job: str = REPLICATED_JOB) -> str:
    """The stable DNS name of one JobSet pod through the JobSet's headless service (named after
    the JobSet): ``<jobset>-<replicated job>-<job index>-<pod index>.<jobset>`` (jobset
    api/jobset/v1alpha2/jobset_types.go, ``Network.EnableDNSHostnames``: on by default; the
    subdomain defaults to the JobSet's name)."""
    return f"{jobset}-{job}-{replica}-{host}.{jobset}"


def coordination_service_host(jobset: str) -> str:
    """HOTSWAP_JAX_COORDINATOR of an elastic JobSet: its coordinator pod's DNS name."""
    return coordinator_host(jobset, 0, 0, COORDINATOR_JOB)


def slice_hostnames(jobset: str, replica: int | str, hosts_per_slice: int) -> str:
    """TPU_WORKER_HOSTNAMES of a JobSet pod on replica ``replica`` (GKE's value: every host of
    the slice by its pod's DNS name, in host order)."""
    return ",".join(coordinator_host(jobset, replica, host) for host in range(hosts_per_slice))


@dataclasses.dataclass(frozen=True)
class WorkerEnv:
    """Where this worker stands, read from the environment (missing values get defaults that
    describe a single-process run, so a script also works outside hotswap)."""

    workload: str = "local"
    cluster: str = ""
    rank: int = 0
    world_size: int = 1
    slice_index: int = 0
    num_slices: int = 1
    host_index: int = 0
    hosts_per_slice: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    # CUDA_VISIBLE_DEVICES as set: None when unset (outside hotswap, or a Kubernetes pod, whose
    # GPUs are its container's), "" on an emulated slice, the host's GPUs on a backed one.
    visible_devices: str | None = None
    slice_name: str = ""
    master_addr: str = DEFAULT_MASTER_ADDR
    master_port: int = DEFAULT_MASTER_PORT
    attempt: int = 1
    restart_count: int = 0
    checkpoint_dir: str | None = None
    run_id: str | None = None
    resume_from: str | None = None  # HOTSWAP_RESUME_FROM: a directory, runs.RESUME_AUTO, or None
    failed_runs: tuple[str, ...] = ()  # HOTSWAP_FAILED_RUNS
    start_cause: str | None = None  # HOTSWAP_START_CAUSE (START_CAUSES), None when not told
    membership_file: str | None = None
    events_file: str | None = None
    grace_period_s: float = DEFAULT_GRACE_PERIOD_S
    allow_fresh_start: bool = False  # HOTSWAP_ALLOW_FRESH_START

    @classmethod
    def from_environ(cls, env: Mapping[str, str]) -> WorkerEnv:
        """Read from ``env`` (``os.environ`` in a worker; this module stays free of I/O because
        the pure core imports its constants)."""

        def number(name: str, default: int) -> int:
            value = env.get(name)
            return int(value) if value not in (None, "") else default

        return cls(
            workload=env.get(HOTSWAP_WORKLOAD) or env.get(JOBSET_NAME) or "local",
            cluster=env.get(HOTSWAP_CLUSTER, ""),
            rank=number(RANK, 0),
            world_size=number(WORLD_SIZE, 1),
            slice_index=number(MEGASCALE_SLICE_ID, number(JOB_INDEX, 0)),
            num_slices=number(MEGASCALE_NUM_SLICES, 1),
            host_index=number(JOB_COMPLETION_INDEX, 0),
            hosts_per_slice=number(HOTSWAP_HOSTS_PER_SLICE, 1),
            local_rank=number(LOCAL_RANK, 0),
            local_world_size=number(LOCAL_WORLD_SIZE, 1),
            visible_devices=env.get(CUDA_VISIBLE_DEVICES),
            slice_name=env.get(HOTSWAP_SLICE, ""),
            master_addr=env.get(MASTER_ADDR, DEFAULT_MASTER_ADDR),
            master_port=number(MASTER_PORT, DEFAULT_MASTER_PORT),
            attempt=number(HOTSWAP_ATTEMPT, 1),
            restart_count=number(HOTSWAP_RESTART_COUNT, 0),
            checkpoint_dir=env.get(HOTSWAP_CHECKPOINT_DIR) or None,
            run_id=env.get(HOTSWAP_RUN_ID) or None,
            resume_from=env.get(HOTSWAP_RESUME_FROM) or None,
            failed_runs=tuple(run for run in env.get(HOTSWAP_FAILED_RUNS, "").split(",") if run.strip()),
            start_cause=env.get(HOTSWAP_START_CAUSE) if env.get(HOTSWAP_START_CAUSE) in START_CAUSES else None,
            membership_file=env.get(HOTSWAP_MEMBERSHIP_FILE) or None,
            events_file=env.get(HOTSWAP_EVENTS_FILE) or None,
            grace_period_s=float(env.get(HOTSWAP_TERMINATION_GRACE_S) or DEFAULT_GRACE_PERIOD_S),
            allow_fresh_start=env.get(HOTSWAP_ALLOW_FRESH_START, "").strip().lower() in _TRUE,
        )

    @property
    def gpus(self) -> tuple[str, ...]:
        """The GPUs this worker's host may use (CUDA_VISIBLE_DEVICES' entries); empty when it
        is emulated or when the variable is unset."""
        return tuple(d.strip() for d in (self.visible_devices or "").split(",") if d.strip())

    @property
    def emulated(self) -> bool:
        """Set and empty CUDA_VISIBLE_DEVICES: the slice has no GPU for this worker."""
        return self.visible_devices is not None and not self.gpus

    def accelerator_problem(self) -> str | None:
        """Why this worker cannot have a GPU of its own, when it is on a GPU-backed slice: never
        two ranks on one GPU (local rank i takes the i-th visible GPU)."""
        if self.gpus and not 0 <= self.local_rank < len(self.gpus):
            return (
                f"LOCAL_RANK {self.local_rank} has no GPU of its own: CUDA_VISIBLE_DEVICES="
                f"{self.visible_devices} lists {len(self.gpus)}"
            )
        return None


# --debug-dump-gcs (xpk's): XLA writes its HLO dumps where --xla_dump_to says; they are copied
# to the workload's location when the worker ends. In a container the dump directory is xpk's
# /tmp/xla_dump/; locally each worker gets its own under its worker directory, and the shim
# (which imports nothing of hotswap and spells this name itself) copies it to
# $HOTSWAP_DEBUG_DUMP_TO/<workload>/attempt-<N>/replica-<R>-host-<H>.
XLA_FLAGS = "XLA_FLAGS"  # XLA's own flags: --xla_dump_to is added for --debug-dump-gcs
XLA_DUMP_FLAG = "--xla_dump_to"
CONTAINER_XLA_DUMP_DIR = "/tmp/xla_dump/"
HOTSWAP_DEBUG_DUMP_TO = "HOTSWAP_DEBUG_DUMP_TO"  # where a --debug-dump-gcs workload's XLA dumps are copied when a worker ends (local backend)


def with_xla_dump(flags: str | None, directory: str) -> str:
    """``XLA_FLAGS`` with ``--xla_dump_to=directory`` added to the user's own flags (a dump
    location the user gave already wins: XLA reads the last one, so ours goes first)."""
    return " ".join(part for part in (f"{XLA_DUMP_FLAG}={directory}", flags or "") if part)
