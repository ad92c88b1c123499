"""The process group of one generation: rendezvous, the few collectives a run needs, teardown.

Each generation meets at its own ``master_addr:master_port`` through a fresh ``TCPStore``
hosted by its rank 0, so a re-formed group never meets a stale one. The rendezvous is a
polling loop on our side (never one long blocking call), so a SIGTERM or a newer membership
interrupts it. Collectives time out after ``collective_timeout_s``: a peer that died closes its
sockets and fails them at once; a peer that hangs fails them at the timeout.

Which collective backend and device a rank uses comes from the worker contract
(:func:`choose_backend`): NCCL on its own GPU on a GPU-backed slice, gloo on the CPU on an
emulated one, whatever ``torch.cuda.is_available()`` says on the machine.
"""

from __future__ import annotations

import gc
import logging
import os
import socket
import time
import weakref
from collections.abc import Callable, Iterable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from hotswap.api.worker import WorkerEnv
from hotswap.train.rendezvous import GroupSpec, RendezvousFailed, first_line, listen_host, on_loopback
from hotswap.train.torch.snapshot import join_tensors, split_tensors

log = logging.getLogger("hotswap.train")

BROADCAST_CHUNK_BYTES = 64 << 20  # each collective well inside the timeout, whatever the state size
_POLL_S = 0.02
_CONNECT_ATTEMPT_S = 2.0
# Gloo's worker threads free a finished collective's tensors after the caller has its result,
# and need the GIL for that. A process that leaves a group and exits at once can reach
# interpreter teardown first: the thread is then stopped mid-destructor and the process aborts
# ("terminate called without an active exception", found on 1 run in ~10). Handing the GIL
# over for a moment after leaving lets those threads finish while the interpreter still lives.
_GLOO_RELEASE_S = 0.1


def _import_before_a_group_exists() -> None:
    """``torch.distributed.nn.functional`` takes ``group.WORLD`` as its functions' default
    ``group`` when it is imported: imported later (torch._dynamo does so lazily, at a first
    optimizer step) it would hold this generation's group for the rest of the process, and
    :meth:`ProcessGroup.destroy` could never free it (its connections would stay open)."""
    import torch.distributed.nn.functional  # noqa: F401


def _wait_until_listening(host: str, port: int, check: Callable[[str], None]) -> None:
    """Return once something accepts connections at ``host:port`` (rank 0's store)."""
    while True:
        try:
            with socket.create_connection((host, port), timeout=_POLL_S * 10):
                return
        except OSError:
            check(f"connecting to {host}:{port}")
            time.sleep(_POLL_S)


def choose_backend(env: WorkerEnv, cuda_devices: Callable[[], int]) -> str:
    """NCCL for a rank with a GPU of its own, else gloo, decided by the worker contract.

    ``CUDA_VISIBLE_DEVICES`` set (hotswap's local workers): non-empty means a GPU-backed slice,
    and local rank i owns the i-th listed GPU; empty means an emulated slice, which must never
    touch a GPU even on a machine that has some. Unset (outside hotswap, or a Kubernetes pod,
    whose visible GPUs are its container's): NCCL only if this local rank has a GPU of its own,
    so two ranks never share one.
    """
    if env.visible_devices is not None:
        return "nccl" if env.gpus else "gloo"
    return "nccl" if env.local_rank < cuda_devices() else "gloo"


def is_peer_failure(error: BaseException) -> bool:
    """Whether a collective failed because a peer died, hung or left (not a bug in the step)."""
    if isinstance(error, (dist.DistError, RendezvousFailed)):
        return True
    # gloo reports a lost or stuck peer as a plain RuntimeError whose message names gloo.
    return type(error) is RuntimeError and "gloo" in str(error).lower()


class ProcessGroup:
    """torch.distributed's default group, formed and destroyed once per generation."""

    def __init__(
        self, backend: str | None, collective_timeout_s: float, rendezvous_timeout_s: float, env: WorkerEnv
    ) -> None:
        problem = env.accelerator_problem()
        if problem is not None:
            raise RuntimeError(f"hotswap: {problem}")
        self.backend = backend or choose_backend(env, torch.cuda.device_count)
        if self.backend == "nccl":
            if env.emulated:
                raise RuntimeError("hotswap: backend 'nccl' needs a GPU, and this worker's slice is emulated (no GPU)")
            torch.cuda.set_device(env.local_rank)
            # A peer that died or hangs must fail this rank's collective at the timeout (the SDK
            # then saves and re-forms or restarts) rather than hang it on the GPU, or tear the
            # process down without a save (NCCL's default on a timeout). The user's setting wins.
            os.environ.setdefault("TORCH_NCCL_BLOCKING_WAIT", "1")
            os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "2")
        self.collective_timeout_s = collective_timeout_s
        self.rendezvous_timeout_s = rendezvous_timeout_s
        self.spec: GroupSpec | None = None
        self._store: dist.Store | None = None
        self._owned = False
        self._before_destroy: list[weakref.WeakMethod[Callable[[], None]]] = []

    @property
    def rank(self) -> int:
        return self.spec.rank if self.spec else 0

    @property
    def world_size(self) -> int:
        return self.spec.world_size if self.spec else 1

    @staticmethod
    def is_peer_failure(error: BaseException) -> bool:
        """:func:`is_peer_failure`, for the framework-neutral modules that drive this group."""
        return is_peer_failure(error)

    @property
    def device(self) -> torch.device:
        if self.backend == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    # Forming and leaving -------------------------------------------------------------------

    def form(self, spec: GroupSpec, interrupted: Callable[[], bool]) -> None:
        deadline = time.monotonic() + self.rendezvous_timeout_s

        def check(what: str) -> None:
            if interrupted():
                raise RendezvousFailed(f"interrupted while {what}")
            if time.monotonic() >= deadline:
                raise RendezvousFailed(f"timed out after {self.rendezvous_timeout_s:g}s {what}")

        keep_on_loopback(spec.master_addr)
        _import_before_a_group_exists()
        store = self._connect(spec, check)
        try:
            store.add("hotswap/arrived", 1)
            while store.add("hotswap/arrived", 0) < spec.world_size:
                check(f"waiting for {spec.world_size} members of generation {spec.generation}")
                time.sleep(_POLL_S)
            dist.init_process_group(
                self.backend,
                store=store,
                rank=spec.rank,
                world_size=spec.world_size,
                timeout=timedelta(seconds=self.collective_timeout_s),
            )
        except RuntimeError as error:
            if not is_peer_failure(error):
                raise
            # a member (or the store's host, rank 0) went away mid-rendezvous
            raise RendezvousFailed(f"generation {spec.generation}: {first_line(error)}") from error
        self._store, self.spec, self._owned = store, spec, True

    def _connect(self, spec: GroupSpec, check: Callable[[str], None]) -> dist.Store:
        timeout = timedelta(seconds=self.collective_timeout_s)
        if spec.rank == 0:
            try:
                while True:
                    try:
                        listener = listen_on(spec.master_addr, spec.master_port)
                        break
                    except socket.gaierror:  # a pod's DNS name is published as the pod starts
                        check(f"resolving {spec.master_addr}")
                        time.sleep(_POLL_S * 10)
                return dist.TCPStore(
                    spec.master_addr,
                    spec.master_port,
                    spec.world_size,
                    True,
                    timeout,
                    wait_for_workers=False,
                    master_listen_fd=listener.detach(),  # the store owns (and closes) it
                )
            except (OSError, dist.DistError) as error:
                raise RendezvousFailed(
                    f"cannot host the rendezvous of generation {spec.generation} at "
                    f"{spec.master_addr}:{spec.master_port}: {first_line(error)}"
                ) from error
        # Wait for rank 0's store with a cheap probe first: TCPStore's own connect backs off by
        # up to seconds, which a joiner that is ready before the survivors move would pay.
        _wait_until_listening(spec.master_addr, spec.master_port, check)
        while True:
            try:
                store = dist.TCPStore(
                    spec.master_addr,
                    spec.master_port,
                    spec.world_size,
                    False,
                    timedelta(seconds=_CONNECT_ATTEMPT_S),
                )
            except dist.DistError:
                check(f"connecting to {spec.master_addr}:{spec.master_port}")
                continue
            store.set_timeout(timeout)
            return store

    def before_destroy(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (a bound method, held weakly) before the group is freed: what holds
        the group (a DDP) lets go of it, so that it is freed at once."""
        self._before_destroy.append(weakref.WeakMethod(callback))  # type: ignore[arg-type]

    def expect(self, spec: GroupSpec) -> None:
        """This rank's place in a group it will form later (``rank``/``world_size`` answer
        from it meanwhile); nothing is formed."""
        self._store, self.spec, self._owned = None, spec, False

    def adopt_existing(self) -> bool:
        """Use the default group if the training script initialised one itself (it stays the
        owner); False when it did not."""
        if not (dist.is_available() and dist.is_initialized()):
            return False
        self.spec = GroupSpec(0, dist.get_rank(), dist.get_world_size(), "", 0)
        self._owned = False
        return True

    def destroy(self, before_teardown: bool = False) -> None:
        """Leave the group; ``before_teardown``: the interpreter is about to be torn down.

        Gloo closes a group's connections only when the group object is freed (neither
        ``destroy_process_group`` nor the backend's ``shutdown``/``abort`` does, torch 2.13),
        and a peer still waiting on this rank learns that it left only then: otherwise at its
        collective timeout. So the group must be freed here; see GroupFormation.recover."""
        for callback in (ref() for ref in self._before_destroy):
            if callback is not None:
                callback()
        if self._owned and dist.is_initialized():
            world = weakref.ref(dist.group.WORLD)
            dist.destroy_process_group()
            if world() is not None:  # held by a reference cycle (freed now) or by the script
                gc.collect()
            if world() is not None:
                log.warning(
                    "hotswap: the process group left behind is still referenced (by the training script?): "
                    "its connections stay open, and peers notice that this rank left only at their timeout"
                )
            if before_teardown:
                time.sleep(_GLOO_RELEASE_S)  # see _GLOO_RELEASE_S
        self._store, self.spec, self._owned = None, None, False

    # Collectives ---------------------------------------------------------------------------

    def agree_max(self, values: list[int]) -> list[int]:
        tensor = torch.tensor(values, dtype=torch.int64, device=self.device)
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        return [int(v) for v in tensor.tolist()]

    def all_gather_object(self, obj: Any) -> list[Any]:
        gathered: list[Any] = [None] * self.world_size
        dist.all_gather_object(gathered, obj)
        return gathered

    def broadcast_object(self, obj: Any, src: int) -> Any:
        box = [obj]
        dist.broadcast_object_list(box, src=src, device=self.device)
        return box[0]

    def broadcast_tree(self, tree: Any, src: int) -> Any:
        """Send a state tree from ``src`` to every rank (no disk): its structure as one pickled
        object, its tensors' bytes through one reused buffer of at most
        :data:`BROADCAST_CHUNK_BYTES`. Receivers get freshly allocated tensors."""
        if self.rank == src:
            structure, tensors = split_tensors(tree)
            for tensor in tensors:
                if tensor.layout != torch.strided:
                    raise TypeError(f"cannot send a {tensor.layout} tensor to other replicas")
            tensors = [t.detach().contiguous() for t in tensors]
            header = (structure, [(tuple(t.shape), t.dtype, t.is_cuda) for t in tensors])
        else:
            header = None
        structure, layout = self.broadcast_object(header, src)
        if self.rank != src:
            tensors = [
                torch.empty(shape, dtype=dtype, device=self.device if on_gpu else "cpu")
                for shape, dtype, on_gpu in layout
            ]
        views = [t.reshape(-1).view(torch.uint8) for t in tensors]
        total = sum(view.numel() for view in views)
        chunk = torch.empty(min(total, BROADCAST_CHUNK_BYTES), dtype=torch.uint8, device=self.device)
        for start in range(0, total, BROADCAST_CHUNK_BYTES):
            piece = chunk[: min(total - start, BROADCAST_CHUNK_BYTES)]
            if self.rank == src:
                _copy_between(views, start, piece, into_piece=True)
            dist.broadcast(piece, src=src)
            if self.rank != src:
                _copy_between(views, start, piece, into_piece=False)
        return tree if self.rank == src else join_tensors(structure, tensors)

    def store_barrier(self, name: str, interrupted: Callable[[], bool]) -> None:
        """Wait until every rank reached ``name``, through the store rather than a collective: a
        joiner still building its model, or rank 0 reading a large checkpoint, may take longer
        than the collective timeout. Each name is used once per generation."""
        if self._store is None:  # a group the script formed itself: no store of ours
            return
        key = f"hotswap/barrier/{name}"
        deadline = time.monotonic() + self.rendezvous_timeout_s
        self._store.add(key, 1)
        while self._store.add(key, 0) < self.world_size:
            if interrupted() or time.monotonic() >= deadline:
                raise RendezvousFailed(
                    f"not every rank reached {name!r} of generation {self.spec.generation if self.spec else 0}"
                )
            time.sleep(_POLL_S)


def keep_on_loopback(master_addr: str) -> None:
    """Gloo listens on the address this host's name resolves to (a LAN address on most
    machines), NCCL's bootstrap on the first interface it finds that is not loopback; when
    every rank meets at a loopback MASTER_ADDR they all run here, so both are kept on the
    loopback interface (unless the user chose one with GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME)."""
    if on_loopback(master_addr):
        for variable in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
            if not os.environ.get(variable):
                os.environ[variable] = "lo"


def listen_on(address: str, port: int) -> socket.socket:
    """A listening socket for rank 0's store on ``address`` (MASTER_ADDR) only, as
    :func:`~hotswap.train.rendezvous.listen_host` says: left to itself, TCPStore listens on
    every interface, although its peers reach it at MASTER_ADDR."""
    host = listen_host(address)
    listener = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind((host, port))
        listener.listen(1024)
    except BaseException:
        listener.close()
        raise
    return listener


def _copy_between(views: list[torch.Tensor], start: int, piece: torch.Tensor, into_piece: bool) -> None:
    """Copy the bytes ``[start, start + len(piece))`` of the concatenated ``views`` into the
    piece, or back out of it."""
    end = start + piece.numel()
    offset = 0
    for view in views:
        low, high = max(start, offset), min(end, offset + view.numel())
        if low < high:
            inside = piece[low - start : high - start]
            outside = view[low - offset : high - offset]
            if into_piece:
                inside.copy_(outside)
            else:
                outside.copy_(inside)
        offset += view.numel()
        if offset >= end:
            break


def average_gradients(parameters: Iterable[torch.nn.Parameter] | torch.nn.Module) -> None:
    """Average the gradients over all ranks, one all-reduce per dtype.

    Use it instead of DistributedDataParallel in elastic jobs: DDP binds its process group when
    it is constructed and cannot follow a group re-formed after a slice is lost or returns.
    Does nothing in a single process.
    """
    if not dist.is_available() or not dist.is_initialized():
        return
    world_size = dist.get_world_size()
    if world_size == 1:
        return
    if isinstance(parameters, torch.nn.Module):
        parameters = parameters.parameters()
    by_kind: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
    for parameter in parameters:
        if parameter.grad is not None:
            by_kind.setdefault((parameter.grad.device, parameter.grad.dtype), []).append(parameter.grad)
    for grads in by_kind.values():
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat)
        flat /= world_size
        offset = 0
        for grad in grads:
            grad.copy_(flat[offset : offset + grad.numel()].view_as(grad))
            offset += grad.numel()
