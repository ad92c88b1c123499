"""How the local controller serves the requests the CLI committed: one round each (a refusal
when the request cannot be served), a fault of the machine refused without changing anything,
and ``cluster delete``'s shutdown."""

from __future__ import annotations

import time

from hotswap.backends.local import protocol
from hotswap.backends.local.claim import LostClaim
from hotswap.backends.local.controller.requests import Refusal, RoundInputs, round_inputs
from hotswap.backends.local.controller.rounds import Outcome, RoundRunner, Withdrawn
from hotswap.backends.local.protocol import RequestKind
from hotswap.core import events as ev
from hotswap.store import faults
from hotswap.backends.local.tables import Request

RETRY_S = 1.0  # after a fault of the machine (a full disk), try the round again


class RequestServing(RoundRunner):
    """Serving requests; the loop (:class:`~hotswap.backends.local.controller.loop.LocalController`)
    calls :meth:`_work` on every wake-up."""

    failed_gpu_nodes: dict[str, str]
    deleting: bool
    stopped: bool
    retry_at: float | None

    def _work(self) -> None:
        """Serve pending requests one per round, then any remaining worker events."""
        for request in self.store.requests.pending():
            if self.deleting:
                self._finish(request, Outcome(protocol.REJECTED, f"cluster {self.cluster.name} is being deleted"))
                continue
            self._serve(request)
        if self.deleting:
            self._commit_exits()
            self.pending_events.clear()  # workers are being stopped on purpose: no restarts
            if self.workers.all_gone():
                self.stopped = True
            return
        if self.failed_gpu_nodes:
            failed, self.failed_gpu_nodes = self.failed_gpu_nodes, {}
            self._round(
                RoundInputs(
                    [ev.NodeFailed(node, reason) for node, reason in failed.items()],
                    hit=self.workers.on_nodes(set(failed)),
                    kill=True,
                ),
                None,
            )
        elif self.pending_events:
            self._round(RoundInputs([]), None)
        elif self.workers.pending_exits:  # exits nobody decides on (a deleted workload's workers)
            self._commit_exits()

    def _serve(self, request: Request) -> None:
        try:
            kind = protocol.check_payload(request.kind, request.payload)
        except protocol.ProtocolError as problem:
            self._finish(request, Outcome(protocol.REJECTED, f"refused: {problem}"))
            return
        try:
            if kind is RequestKind.SHUTDOWN:
                self._begin_shutdown(request)
                return
            inputs = round_inputs(request, kind, self.snapshot, self.cluster, self.workers.on_nodes)
            if isinstance(inputs, Refusal):
                self._finish(request, Outcome(protocol.REJECTED, inputs.message))
                return
            self._round(inputs, request)
            if inputs.warm_workers is not None:  # committed: now the pool may change
                self.workers.resize_spares(inputs.warm_workers, inputs.warm_preload)
            if inputs.zygote is not None:
                self.workers.use_zygote(inputs.zygote)
            if inputs.repaired:  # committed: a repaired GPU may be judged afresh
                self.health.repaired(inputs.repaired)
        except Withdrawn:
            self.server.answer(request.id)
        except LostClaim:
            raise
        except Exception as error:
            if faults.is_fault(error):  # a full disk, a locked database: refuse, change nothing
                self._refuse(request, str(faults.explain(error)))
                return
            faults.log()  # a bug: answer, log it, keep serving the other requests
            self._finish(request, Outcome(protocol.REJECTED, f"internal error: {error!r}"))

    def _refuse(self, request: Request, message: str) -> None:
        """Refuse a request whose round could not be committed; if even the refusal cannot be
        written, tell the waiting CLI so (it stays queued) and try again soon."""
        faults.log(f"hotswap: request {request.id} ({request.kind}): {message}")
        try:
            with self.store.transaction():
                if self.store.requests.is_pending(request.id):
                    self.store.requests.finish(request.id, protocol.FAULT, message)
        except Exception as error:
            if not faults.is_fault(error):
                raise
            self.server.fail(request.id, message)
            self.retry_at = time.time() + RETRY_S
            return
        self.server.answer(request.id)

    def _begin_shutdown(self, request: Request) -> None:
        """`cluster delete`: commit that the cluster is being deleted (so that any controller
        from now on finishes the job, and a re-run of the command can), answer, then stop every
        worker; the loop ends once they are all gone."""
        with self.store.transaction():
            if not self.store.requests.is_pending(request.id):
                raise Withdrawn()
            self.store.mark_deleted()
            self.store.requests.finish(request.id, protocol.DONE, "stopping every worker")
        self.server.answer(request.id)
        self.deleting = True
        self.workers.stop_everything(time.time())

    def _finish(self, request: Request, outcome: Outcome) -> None:
        with self.store.transaction():
            if not self.store.requests.is_pending(request.id):
                return  # withdrawn meanwhile: its submitter has its answer
            self.store.requests.finish(request.id, outcome.status, outcome.message)
            if outcome.status == protocol.REJECTED:
                self.store.record_event(time.time(), "rejected", f"{request.kind}: {outcome.message}")
        self.server.answer(request.id)
