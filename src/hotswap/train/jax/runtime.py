"""The JAX processes of one membership generation (multi-controller JAX, ``jax.distributed``).

A JAX process joins exactly one group in its life: ``jax.distributed.initialize`` cannot be
called again with another process count, so a new generation means a new process
(:mod:`hotswap.train.jax.handoff`). :class:`JaxGroup` is the
:class:`~hotswap.train.protocols.Group` the neutral modules drive: ``form`` initialises the
distributed runtime (gloo collectives on CPU), ``agree_max`` is one small all-gather, and
``leave`` takes care of the one ordering JAX imposes: every process of the generation aborts the
moment the coordination service goes away (even one that has disconnected already), so rank 0,
which started it in a process of its own (:mod:`.coordinator`), waits for the others to leave,
leaves too and releases it: the service ends once nobody is connected to it.

Recoverability is switched on (``jax_enable_recoverability``): the loss of any process, rank
0's included (the service is not in it), then fails the collectives that need it (gloo errors at
once when a peer's sockets close) instead of making the coordination service end every process.
"""

from __future__ import annotations

import functools
import logging
import os
import subprocess
import tempfile
import threading
from collections.abc import Callable, Collection, Sequence
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils

from hotswap.api.worker import HOTSWAP_JAX_COORDINATOR
from hotswap.train.jax import coordinator
from hotswap.train.jax.compile_cache import write_every_process_cpu_entries
from hotswap.train.rendezvous import GroupSpec, RendezvousFailed, first_line, on_loopback

log = logging.getLogger("hotswap.train")

LEAVE_TIMEOUT_S = 15.0  # how long rank 0 waits for the others to leave before it does
_LEAVING_KEY = "hotswap/leaving"  # set by the first rank that leaves the generation

# Messages of errors that mean a peer died, hung or left: gloo's and NCCL's own, and the
# status codes pathwaysutils treats as a slice going down.
_PEER_FAILURE_MARKS = (
    "gloo",
    "nccl",
    "connection reset",
    "connection closed",
    "socket closed",
    "unavailable:",
    "deadline_exceeded",
    "data_loss",
    "coordination service",
)


def configure_runtime(compilation_cache: str | None, *, no_gpu: bool = False) -> None:
    """Settings that must be made before JAX creates its backends. JAX's own preemption
    service is off: it would take SIGTERM from hotswap's handler, and hotswap is what acts on
    it (every rank agrees at a step boundary, saves, exits with the contract's code).

    With ``compilation_cache`` (a directory), compiled programs persist across processes, so
    a process restarted into a new generation loads its step instead of compiling it again
    (unless the script configured JAX's cache itself); on the CPU every process writes its
    own entries (:mod:`.compile_cache`).

    ``no_gpu`` (a worker of an emulated slice: its GPUs are hidden): JAX runs on the CPU
    without first trying its CUDA plugin, which on a GPU host would log an error and a
    traceback before falling back (unless the user chose platforms: ``JAX_PLATFORMS``)."""
    if no_gpu and not os.environ.get("JAX_PLATFORMS") and not jax.config.jax_platforms:
        jax.config.update("jax_platforms", "cpu")
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.config.update("jax_enable_recoverability", True)
    jax.config.update("jax_enable_preemption_service", False)
    if compilation_cache and not jax.config.jax_compilation_cache_dir:
        jax.config.update("jax_compilation_cache_dir", compilation_cache)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    write_every_process_cpu_entries()  # ranks 1.. of a CPU job load their programs too


def cpu_only() -> bool:
    """Whether JAX in this process runs on the CPU alone (set before its backends exist)."""
    platforms = jax.config.jax_platforms or os.environ.get("JAX_PLATFORMS", "")
    return [name.strip() for name in platforms.split(",")] == ["cpu"]


def default_compilation_cache() -> str:
    """A per-user directory in the machine's temporary space (a container's, on Kubernetes:
    what a restarted process of the same pod finds again)."""
    return os.path.join(tempfile.gettempdir(), f"hotswap-jax-cache-{os.getuid()}")


def is_peer_failure(error: BaseException) -> bool:
    """Whether a JAX computation or collective failed because a peer was lost.

    JAX reports a lost peer as a runtime error whose message names the collective library or
    a gRPC status (a gloo failure reaches Python as a ``ValueError``)."""
    if isinstance(error, RendezvousFailed):
        return True
    if not isinstance(error, (jax.errors.JaxRuntimeError, ValueError, RuntimeError)):
        return False
    message = str(error).lower()
    return any(mark in message for mark in _PEER_FAILURE_MARKS)


def _keep_gloo_on(host: str) -> None:
    """JAX's CPU collectives (gloo) listen on the address this host's name resolves to (a LAN
    address on most machines), and JAX offers no setting for it; when every process meets at
    a loopback MASTER_ADDR (a local cluster) they listen on that address instead."""
    from jax._src.lib import _jax

    make = _jax.make_gloo_tcp_collectives
    if not isinstance(make, functools.partial):  # once per process
        _jax.make_gloo_tcp_collectives = functools.partial(make, hostname=host)


class JaxGroup:
    """``jax.distributed`` for one generation (see the module)."""

    def __init__(self, rendezvous_timeout_s: float, heartbeat_timeout_s: float = 100.0) -> None:
        self.rendezvous_timeout_s = rendezvous_timeout_s
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.spec: GroupSpec | None = None
        self.used = False  # this process has tried to form a group: only a new process can try again
        self.forming: GroupSpec | None = None  # the group being initialised (a call JAX cannot interrupt)
        self._owned = False
        self._left = False
        # A peer was lost and the job is not elastic: every member is gone or on its way out
        # for the restart, and a lost one never leaves (rank 0 does not wait for it).
        self.peers_lost = False
        self._coordinator: coordinator.Service | None = None  # rank 0: the service's process
        self._prepared: tuple[int, coordinator.Service] | None = None  # (port, service) of a generation to come
        self._preparing = threading.Lock()

    @property
    def rank(self) -> int:
        return self.spec.rank if self.spec else 0

    @property
    def world_size(self) -> int:
        return self.spec.world_size if self.spec else 1

    @property
    def planned_rank(self) -> int:
        """The rank in the group being formed, else in the group formed."""
        return self.forming.rank if self.forming else self.rank

    @staticmethod
    def is_peer_failure(error: BaseException) -> bool:
        return is_peer_failure(error)

    # Forming and leaving -------------------------------------------------------------------

    def form(self, spec: GroupSpec, interrupted: Callable[[], bool]) -> None:
        """Initialise ``jax.distributed`` for ``spec``. The call blocks until every member has
        connected; the process's watchdog restarts it when a newer generation makes the wait
        pointless (JAX offers no way to interrupt it)."""
        if self.used:
            raise RuntimeError("a JAX process forms one group in its life; a new generation needs a new process")
        self.used = True
        if spec.world_size == 1:
            self.spec = spec
            return
        if interrupted():
            raise RendezvousFailed(f"interrupted before forming generation {spec.generation}")
        self.forming = spec
        try:
            self._connect(spec)
        except Exception as error:
            coordinator.stop(self._coordinator)
            raise RendezvousFailed(f"generation {spec.generation}: {first_line(error)}") from error
        finally:
            self.forming = None
        self.spec, self._owned = spec, True

    def _connect(self, spec: GroupSpec) -> None:
        """What ``jax.distributed.initialize`` does, except that the coordination service runs
        in a process of its own (:mod:`.coordinator`), started by rank 0: the loss of rank 0
        then ends no other process."""
        from jax._src import distributed
        from jax._src.lib import _jax

        heartbeat = max(1, int(self.heartbeat_timeout_s))
        external = os.environ.get(HOTSWAP_JAX_COORDINATOR)  # the backend runs the service (Kubernetes)
        prepared, self._prepared = self._prepared, None
        if prepared is not None and (external or spec.rank != 0 or prepared[0] != spec.master_port):
            coordinator.stop(prepared[1])  # started for a generation that did not come
            prepared = None
        if spec.rank == 0 and not external:
            self._coordinator = prepared[1] if prepared else coordinator.start(spec.master_addr, spec.master_port, spec.world_size, heartbeat)
        address = f"{external or spec.master_addr}:{spec.master_port}"
        if not external and on_loopback(spec.master_addr):
            _keep_gloo_on(spec.master_addr)
        state = distributed.global_state
        state.client = _jax.get_distributed_runtime_client(
            address,
            spec.rank,
            init_timeout=max(1, int(self.rendezvous_timeout_s)),
            use_compression=True,
            heartbeat_timeout=heartbeat,
        )
        state.client.connect()
        state.coordinator_address, state.num_processes, state.process_id = address, spec.world_size, spec.rank

    def prepare_service(self, master_addr: str, port: int, processes: int) -> None:
        """Start the coordination service of the generation this process will be rank 0 of,
        on ``master_addr:port``, ahead of forming it (see :mod:`.coordinator`)."""
        if os.environ.get(HOTSWAP_JAX_COORDINATOR):  # the backend runs every generation's service
            return
        with self._preparing:  # the step loop and the watchdog both look for new generations
            if self._prepared is not None and self._prepared[0] == port:
                return
            if self._prepared is not None:
                coordinator.stop(self._prepared[1])
            self._prepared = (port, coordinator.start(master_addr, port, processes, max(1, int(self.heartbeat_timeout_s))))

    def prepared_service(self) -> tuple[int, int] | None:
        """(port, pid) of the service started ahead, for this process's next program."""
        return (self._prepared[0], self._prepared[1].pid) if self._prepared else None

    def adopt_service(self, prepared: tuple[int, int] | None) -> None:
        """Take over the service this process's previous program started ahead."""
        if prepared is not None:
            self._prepared = (prepared[0], coordinator.Adopted(prepared[1]))

    def stop_service(self) -> None:
        """Stop the coordination service this process started (rank 0), if any: only for a
        generation that never formed, or that every other member has left."""
        coordinator.stop(self._coordinator)

    def expect(self, spec: GroupSpec) -> None:
        """This rank's place in a group formed later (see ``GroupFormation.join_first``)."""
        self.spec, self._owned = spec, False

    def adopt_existing(self) -> bool:
        """Use the distributed runtime if the training script initialised it itself."""
        if not jax.distributed.is_initialized():
            return False
        self.spec = GroupSpec(0, jax.process_index(), jax.process_count(), "", 0)
        self.used = True
        return True

    def destroy(self, before_teardown: bool = False) -> None:
        """Leave the group, rank 0 after every other member (bounded wait). (JAX's client has
        no threads that need the interpreter after this: ``before_teardown`` changes nothing.)"""
        self.leave(range(self.world_size))

    def leave(self, wait_for: Collection[int]) -> None:
        """Leave the generation: disconnect from the coordination service. Rank 0 first waits
        (at most :data:`LEAVE_TIMEOUT_S`) until the ranks in ``wait_for`` have disconnected,
        then releases the service's process, which ends once no process is connected to it
        (a process aborts if the service goes away under it, see :mod:`.coordinator`)."""
        if self._left or not self._owned:
            self._left = True
            return
        self._left = True
        self._say_leaving()
        if self.rank == 0 and not self.peers_lost:  # the service serves those still leaving
            self._wait_for_others(wait_for)
        try:
            jax.distributed.shutdown()
        except Exception as error:  # the service is gone already: nothing left to leave
            log.debug("hotswap: leaving generation: %s", first_line(error))
        coordinator.release(self._coordinator)  # rank 0: it ends once nobody is connected

    def _wait_for_others(self, wait_for: Collection[int]) -> None:
        others = sorted(rank for rank in wait_for if rank != 0)
        client = _client()
        if not others or client is None:
            return
        # The coordination service answers once every listed process is connected no more
        # (a live one has not called it): exactly "the others have left".
        gone = threading.Event()

        def wait() -> None:
            try:
                client.get_live_nodes([0, *others])
            except Exception as error:
                log.debug("hotswap: waiting for the others to leave: %s", first_line(error))
            gone.set()

        threading.Thread(target=wait, name="hotswap-leave", daemon=True).start()
        if not gone.wait(LEAVE_TIMEOUT_S):
            log.warning("hotswap: ranks %s did not leave generation %d in time", others, self.spec.generation if self.spec else 0)

    def _say_leaving(self) -> None:
        """Tell the others, through the coordination service, that this generation is ending:
        a rank stuck in a collective with a rank that left learns it there (its watchdog asks)."""
        client = _client()
        try:
            client.key_value_set(_LEAVING_KEY, str(self.rank))
        except Exception:  # set already by another rank, or the service is gone
            pass

    def others_leaving(self) -> bool:
        """Whether a rank of this generation has started to leave it."""
        client = _client() if self._owned and not self._left else None
        if client is None:
            return False
        try:
            return client.key_value_try_get(_LEAVING_KEY) is not None
        except Exception:  # not set (NOT_FOUND is raised, not returned)
            return False

    # Collectives ---------------------------------------------------------------------------

    def agree_max(self, values: list[int]) -> list[int]:
        gathered = multihost_utils.process_allgather(np.asarray(values, dtype=np.int32))
        return [int(v) for v in np.max(gathered, axis=0)]

    def all_gather_ints(self, values: Sequence[int]) -> list[list[int]]:
        """Every rank's ``values``, by rank."""
        gathered = multihost_utils.process_allgather(np.asarray(values, dtype=np.int32))
        return [[int(v) for v in row] for row in np.asarray(gathered)]


def _client() -> Any:
    from jax._src import distributed  # the client jax.distributed keeps; no public accessor

    return distributed.global_state.client
