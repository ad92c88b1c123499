"""How the local controller serves the requests the CLI committed: each row parsed once into its
typed request (``backends/local/requests.py``), one round each (a refusal when the request
cannot be served), a fault of the machine refused without changing anything, and ``cluster
delete``'s shutdown.

:class:`RequestServing` is given its collaborators (``assembly.py`` builds them), so a request
can be served against fakes of them, without a daemon."""

from __future__ import annotations

import time

from hotswap.backends.local import protocol
from hotswap.backends.local.claim import LostClaim
from hotswap.backends.local.crash_points import crash_at
from hotswap.backends.local.controller.gpu_health import GpuHealthMonitor
from hotswap.backends.local.controller.round_inputs import Deletion, Refusal, RequestRounds, RoundInputs
from hotswap.backends.local.controller.rounds import Outcome, RoundRunner, Withdrawn
from hotswap.backends.local.controller.server import RequestServer
from hotswap.backends.local.controller.state import ClusterState, Inbox
from hotswap.backends.local.requests import dispatch, parse
from hotswap.backends.local.tables import LocalStore, Request
from hotswap.backends.local.workers.lifecycle import Workers
from hotswap.core import events as ev
from hotswap.store import faults

RETRY_S = 1.0  # after a fault of the machine (a full disk), try the round again


class RequestServing:
    """Serving the pending requests, one round each; the loop
    (:class:`~hotswap.backends.local.controller.loop.LocalController`) calls :meth:`work` on
    every wake-up."""

    def __init__(
        self,
        store: LocalStore,
        state: ClusterState,
        inbox: Inbox,
        rounds: RoundRunner,
        server: RequestServer,
        workers: Workers,
        health: GpuHealthMonitor,
    ) -> None:
        self.store = store
        self.state = state
        self.inbox = inbox
        self.rounds = rounds
        self.server = server
        self.workers = workers
        self.health = health

    def work(self) -> bool:
        """Serve pending requests one per round, then any remaining worker events. True once a
        deletion has stopped every worker: the controller's work is done."""
        for request in self.store.requests.pending():
            if self.state.deleting:
                self._finish(request, Outcome(protocol.REJECTED, f"cluster {self.state.cluster.name} is being deleted"))
                continue
            self._serve(request)
        if self.state.deleting:
            self.rounds.commit_exits()
            self.inbox.decided()  # workers are being stopped on purpose: no restarts
            return self.workers.all_gone()
        failed = self.inbox.take_failed_nodes()
        if failed:
            self.rounds.run(
                RoundInputs(
                    [ev.NodeFailed(node, reason) for node, reason in failed.items()],
                    hit=self.workers.on_nodes(set(failed)),
                    kill=True,
                )
            )
        elif self.inbox.events:
            self.rounds.run(RoundInputs([]))
        elif self.workers.stops.pending_exits:  # exits nobody decides on (a deleted workload's workers)
            self.rounds.commit_exits()
        return False

    def _serve(self, request: Request) -> None:
        try:
            asked = dispatch(parse(request.kind, request.payload), RequestRounds(self.state, self.workers.on_nodes))
            if isinstance(asked, Refusal):
                self._finish(request, Outcome(protocol.REJECTED, asked.message))
            elif isinstance(asked, Deletion):
                self._begin_shutdown(request)
            else:
                self._serve_round(request, asked)
        except protocol.ProtocolError as problem:  # not a request: written by something else
            self._finish(request, Outcome(protocol.REJECTED, f"refused: {problem}"))
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

    def _serve_round(self, request: Request, inputs: RoundInputs) -> None:
        self.rounds.run(inputs, request)
        if inputs.warm_workers is not None:  # committed: now the pool may change
            self.workers.resize_spares(inputs.warm_workers, inputs.warm_preload)
        if inputs.zygote is not None:
            self.workers.use_zygote(inputs.zygote)
        if inputs.repaired:  # committed: a repaired GPU may be judged afresh
            self.health.repaired(inputs.repaired)

    def _refuse(self, request: Request, message: str) -> None:
        """Refuse a request whose round could not be committed; if even the refusal cannot be
        written, tell the waiting CLI so (it stays queued: a later wake-up serves it again)."""
        faults.log(f"hotswap: request {request.id} ({request.kind}): {message}")
        try:
            with self.store.transaction():
                if self.store.requests.is_pending(request.id):
                    self.store.requests.finish(request.id, protocol.FAULT, message)
        except Exception as error:
            if not faults.is_fault(error):
                raise
            self.server.fail(request.id, message)
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
        crash_at("deletion-committed")  # (test-only: see crash_points.py)
        self.server.answer(request.id)
        crash_at("deletion-answered")
        self.state.deletion_begun()
        self.workers.stop_everything(time.time())
        crash_at("deletion-signalled")

    def _finish(self, request: Request, outcome: Outcome) -> None:
        with self.store.transaction():
            if not self.store.requests.is_pending(request.id):
                return  # withdrawn meanwhile: its submitter has its answer
            self.store.requests.finish(request.id, outcome.status, outcome.message)
            if outcome.status == protocol.REJECTED:
                self.store.record_event(time.time(), "rejected", f"{request.kind}: {outcome.message}")
        self.server.answer(request.id)
