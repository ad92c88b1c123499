"""pathwaysutils.elastic's API on hotswap: a :class:`Manager` with ``elastic_retry``,
``ScaleUpSignalError``, ``scale_by_active_slices`` and ``wait_for_slices`` (pathwaysutils
v0.1.11), and the older ``good_slice_count``, ``maybe_snapshot`` and ``get_resharded_snapshot``
(the names seed 001's log lines use), over a :class:`~hotswap.train.jax.run.JaxRun`.

One difference runs through all of it: Pathways has one controller that survives a slice, so
pathwaysutils retries the decorated function in the same process. Multi-controller JAX cannot
change its process count in place, so here a retry is a restart of each surviving process into
the next membership generation, its state handed over in memory; the decorated function then
runs again from the top in the new process, and ``get_resharded_snapshot`` returns the state
it held (or a survivor's, on a returning slice). The README maps each name point by point.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any, TypeAlias, TypeVar

import jax

from hotswap.train.jax.run import JaxRun, current, init

RetryPolicy: TypeAlias = Callable[[int, Exception], bool]
_F = TypeVar("_F", bound=Callable[..., Any])


class ElasticRuntimeError(RuntimeError):
    """Elasticity cannot continue (the retry policy said no)."""


class ScaleUpSignalError(Exception):
    """Raise it (at a step boundary) when :attr:`Manager.available_inactive_slices` is not
    empty: the job moves to the larger membership generation."""


class Manager:
    """pathwaysutils' ``Manager`` for a hotswap JAX run (``hotswap.train.jax.init()`` is called
    if the process has no run yet). Slice indices are positions in the current membership:
    hotswap renumbers the active slices 0..n-1 at every generation (``JOB_INDEX``)."""

    def __init__(self, devices: Any = None, *, run: JaxRun | None = None, snapshot_period: int = 1) -> None:
        del devices  # a hotswap run always spans the devices of its active slices
        if snapshot_period < 1:
            raise ValueError(f"snapshot_period must be positive: {snapshot_period=}")
        self.run = run or current() or init()
        self.run.sync.snapshot_every = snapshot_period  # maybe_snapshot's period, counted in steps done
        self._controller: dict[str, Any] = {}

    # Slices --------------------------------------------------------------------------------

    @property
    def total_slice_count(self) -> int:
        return self.run.total_slices

    @property
    def active_slice_count(self) -> int:
        return self.run.slices

    good_slice_count = active_slice_count  # pathwaysutils before v0.1.5

    @property
    def all_slice_indices(self) -> frozenset[int]:
        return frozenset(range(self.total_slice_count))

    @property
    def active_slice_indices(self) -> frozenset[int]:
        return frozenset(range(self.active_slice_count))

    good_slice_indices = active_slice_indices

    @property
    def inactive_slice_indices(self) -> frozenset[int]:
        return self.all_slice_indices - self.active_slice_indices

    @property
    def available_inactive_slices(self) -> frozenset[int]:
        """Slices the controller has published as back (a newer, larger generation) that this
        generation does not use yet. Raise :class:`ScaleUpSignalError` to take them in."""
        newest = self.run.formation.newest_membership()
        if newest is None or newest.generation <= self.run.generation or len(newest.slices) <= self.active_slice_count:
            return frozenset()
        return frozenset(range(self.active_slice_count, len(newest.slices)))

    @property
    def elastic_down_event_count(self) -> int:
        return self.run.progress.elastic_down_events

    @property
    def default_device(self) -> jax.Device:
        return jax.local_devices()[0]

    @property
    def mesh(self) -> jax.sharding.Mesh:
        return self.run.mesh()

    def scale_by_active_slices(self, x: int | float) -> int | float:
        """``x * active / total``; an int must divide exactly (pathwaysutils' rule)."""
        if isinstance(x, bool) or not isinstance(x, (int, float)):
            raise ValueError(f"Unsupported type: {type(x)=}")
        if isinstance(x, float):
            return x * self.active_slice_count / self.total_slice_count
        quotient, remainder = divmod(x * self.active_slice_count, self.total_slice_count)
        if remainder:
            raise ValueError(f"Cannot scale {x=} by active slices because it will result in a remainder of {remainder=}.")
        return quotient

    scale_by_good_slices = scale_by_active_slices

    def wait_for_slices(
        self, slice_count: int | None = None, poll_interval: float = 10, timeout: float | None = None
    ) -> frozenset[int]:
        """Return the active slice indices once at least ``slice_count`` (default: all) are
        active. If this generation has fewer, wait for the controller to publish one with
        enough and move the job there (the process restarts into it); TimeoutError after
        ``timeout`` seconds."""
        wanted = self.total_slice_count if slice_count is None else slice_count
        if self.active_slice_count >= wanted:
            return self.active_slice_indices
        if not self.run.elastic:
            raise TimeoutError(f"Timed out waiting for {wanted} slices: this workload is not elastic and has {self.active_slice_count}.")
        started = time.monotonic()
        while True:
            newest = self.run.formation.newest_membership()
            if newest is not None and newest.generation > self.run.generation and len(newest.slices) >= wanted:
                self.run.formation.reconfigure(newest.generation)
            if timeout is not None and time.monotonic() - started + poll_interval >= timeout:
                raise TimeoutError(
                    f"Timed out waiting for {wanted} slices. Only {self.active_slice_count} active after "
                    f"{time.monotonic() - started:.2f} seconds."
                )
            time.sleep(poll_interval)

    # Retrying ------------------------------------------------------------------------------

    def elastic_retry(
        self,
        max_retries: int | None = None,
        minimum_slice_count: int | None = None,
        poll_interval: float = 10,
        timeout: float | None = None,
        pre_callback: Callable[..., Any] | None = None,
        on_elastic_event_callback: Callable[..., Any] | None = None,
        retry_policy: RetryPolicy | None = None,
    ) -> Callable[[_F], _F]:
        """Run the function once enough slices are active; when a slice is lost (a JAX error
        from a lost peer) or :class:`ScaleUpSignalError` is raised, move to the next
        generation and run it again there (in the restarted process). ``retry_policy(attempt,
        error)`` (or ``max_retries``) may refuse: :class:`ElasticRuntimeError`."""
        if max_retries is not None and retry_policy is not None:
            raise ValueError("Cannot specify both max_retries and retry_policy.")
        if max_retries is not None and max_retries <= 0:
            raise ValueError("max_retries must be positive.")
        limit = max_retries
        policy: RetryPolicy = retry_policy or (lambda attempt, error: limit is None or attempt < limit)

        def decorator(func: _F) -> _F:
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                self.wait_for_slices(minimum_slice_count, poll_interval, timeout)
                if pre_callback is not None:
                    pre_callback()
                try:
                    return func(*args, **kwargs)
                except ScaleUpSignalError as error:
                    self._retry(error, policy, on_elastic_event_callback, failed=False)
                except Exception as error:
                    if not self.run.group.is_peer_failure(error):
                        raise
                    self._retry(error, policy, on_elastic_event_callback, failed=True)

            wrapper.__name__ = getattr(func, "__name__", "wrapper")
            wrapper.__doc__ = func.__doc__
            return wrapper  # type: ignore[return-value]

        return decorator

    def _retry(
        self, error: Exception, policy: RetryPolicy, callback: Callable[..., Any] | None, *, failed: bool
    ) -> None:
        attempt = self.run.formation.attempts + 1
        if callback is not None:
            callback()
        if not policy(attempt, error):
            raise ElasticRuntimeError(f"Elastic attempt {attempt} failed.") from error
        if failed:
            self.run.formation.recover()
        self.run.formation.reconfigure(self.run.formation.newest_generation())

    # Snapshots (pathwaysutils before v0.1.5) -----------------------------------------------

    def get_resharded_snapshot(
        self, mesh: jax.sharding.Mesh, snapshot_jax_arrays: Any, snapshot_controller: Mapping[str, Any] | None = None
    ) -> tuple[int, Any, dict[str, Any]]:
        """``(step, arrays, controller)``: the state this process continues from (its own
        before the restart, a survivor's on a returning slice, else the newest checkpoint,
        resharded), placed like ``snapshot_jax_arrays`` (the initial state, on ``mesh``:
        a fresh process needs it to know the shardings; pathwaysutils kept them on its one
        controller). ``snapshot_controller`` (a JSON-serialisable dict) is restored too."""
        del mesh  # the shardings of snapshot_jax_arrays say where everything goes
        self._controller.update(snapshot_controller or {})
        self.run.register(snapshot_jax_arrays, controller=self._controller)
        state = self.run.restore()
        return self.run.step, state, dict(self._controller)

    def maybe_snapshot(
        self,
        step: int,
        snapshot_jax_arrays: Any = None,
        snapshot_controller: Mapping[str, Any] | None = None,
        force: bool = False,
        block: bool = False,
    ) -> None:
        """Step ``step`` is done and its state is ``snapshot_jax_arrays``: the run's step
        boundary (SIGTERM, membership changes, periodic checkpoints) and, every
        ``snapshot_period`` steps or when ``force``, a copy on the host."""
        del step, block  # the run counts the steps; its host copy is complete when taken
        if snapshot_controller is not None:
            self._controller.clear()
            self._controller.update(snapshot_controller)
        self.run.sync.force_snapshot = force
        self.run.step_done(snapshot_jax_arrays)
