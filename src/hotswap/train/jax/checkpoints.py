"""Checkpoints of a JAX job with orbax: an asynchronous ``CheckpointManager`` and its own commit
protocol (a step is written to a temporary directory and renamed when every process has
written its shards; an interrupted save never becomes a step), restored onto whatever mesh the
registered state now lives on, so a job saved on 3 slices resumes on 2 with its arrays
resharded.

A step that cannot be read (its metadata or arrays damaged) is moved into ``damaged/`` beside
the steps with one warning (:func:`hotswap.train.files.set_aside`): kept for inspection, never
read again, and out of the way of a later save of that step. The directory must be this user's
and closed to others' writes, as the PyTorch SDK's (:func:`hotswap.train.files.prepare_directory`).

Each step holds two items: ``state`` (the arrays, ``StandardSave``) and ``hotswap`` (the
progress counters, why it was saved, and the registered objects' states, ``JsonSave``). Every
process takes part in saves and restores; rank 0 records the goodput events.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp

from hotswap.api.worker_output import EVENT_CHECKPOINT_SAVE
from hotswap.train import runs
from hotswap.train.events import EventLog
from hotswap.train.files import not_a_directory, prepare_directory, set_aside
from hotswap.train.jax import step_reader
from hotswap.train.jax.survivor_saves import SurvivorSaves
from hotswap.train.jax.trees import StateMismatchError, first_mismatch, leaves_with_paths

log = logging.getLogger("hotswap.train")


@dataclasses.dataclass(frozen=True)
class Restored:
    step: int
    state: Any
    objects: dict[str, Any]
    counters: dict[str, int]
    reason: str
    resumed: bool = False  # from the run's resume source (another run's checkpoint)


class OrbaxCheckpoints:
    def __init__(
        self,
        directory: str,
        keep: int,
        events: EventLog,
        *,
        record_events: bool,
        fallback: str | None = None,
        clean_leftovers: bool = True,
    ) -> None:
        """``clean_leftovers``: remove what killed saves left behind (orbax's temporary step
        directories) now; never in a process that joins a live elastic job, where they may be
        the survivors' save in flight (orbax replaces a step's leftover when it saves the step
        again, and a fresh start removes the rest)."""
        prepare_directory(Path(directory))  # CheckpointDirectoryRefused: another's, or writable by others
        self.directory = directory
        self.fallback = fallback  # the run's resume source, read while ``directory`` has no step
        self.events = events
        self.record_events = record_events
        # What is known of the save in flight: the caller adds how long it blocked, orbax's
        # callback when it was written; the second to arrive records the event.
        self._pending: dict[str, Any] = {}
        self._lock = threading.Lock()
        self.manager = ocp.CheckpointManager(
            directory,
            item_handlers={"state": ocp.StandardCheckpointHandler(), "hotswap": ocp.JsonCheckpointHandler()},
            options=ocp.CheckpointManagerOptions(
                max_to_keep=keep,
                enable_async_checkpointing=True,
                cleanup_tmp_directories=clean_leftovers,
                async_options=ocp.AsyncOptions(post_finalization_callback=self._written),
            ),
        )

    @property
    def busy(self) -> bool:
        return self.manager.is_saving_in_progress()

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def complete_step(self, directory: str | None = None) -> int | None:
        """The newest step on disk (in ``directory``, this run's by default) that a restore can
        read: its save committed."""
        return max(ocp.utils.checkpoint_steps(directory or self.directory), default=None)

    def abandon(self) -> None:
        """The save in flight cannot finish (its peers are gone) and the process is leaving:
        orbax's reports of its failure, from its background threads as the interpreter ends,
        are what the caller already said in one line."""
        logging.getLogger("absl").setLevel(logging.CRITICAL + 1)

    def save(self, step: int, state: Any, objects: dict[str, Any], counters: dict[str, int], reason: str, *, wait: bool) -> float:
        """Save step ``step`` (after any save in flight); return the seconds the caller was
        blocked. Asynchronous unless ``wait``: the arrays are copied to the host before this
        returns, so the caller may go on computing."""
        started = time.monotonic()
        self.manager.wait_until_finished()
        size = sum(int(getattr(leaf, "nbytes", 0)) for _, leaf in leaves_with_paths(state))
        args = ocp.args.Composite(
            state=ocp.args.StandardSave(state),
            hotswap=ocp.args.JsonSave({"counters": counters, "reason": reason, "objects": objects}),
        )
        with self._lock:
            self._pending = {"step": step, "reason": reason, "started": started, "bytes": size}
        self.manager.save(step, args=args, force=True)
        if wait:
            self.manager.wait_until_finished()
        blocking = time.monotonic() - started
        self._complete(step, blocking_s=blocking)
        return blocking

    def _written(self) -> None:
        """orbax: every process has written the step (called on its background thread)."""
        with self._lock:
            step, started = self._pending.get("step"), self._pending.get("started")
        if step is not None and started is not None:
            self._complete(step, total_s=time.monotonic() - started)

    def _complete(self, step: int, **fields: float) -> None:
        with self._lock:
            if self._pending.get("step") != step:
                return
            self._pending.update(fields)
            if "blocking_s" not in self._pending or "total_s" not in self._pending:
                return
            done, self._pending = self._pending, {}
        if self.record_events:  # rank 0: the run's signal follows its saves (termination: a migration waits)
            runs.mark_saved(Path(self.directory), done["reason"])
            SurvivorSaves(self.directory).prune(up_to=step)  # superseded by a checkpoint of the group
            self.events.record(
                EVENT_CHECKPOINT_SAVE,
                step=step,
                blocking_s=round(min(done["blocking_s"], done["total_s"]), 6),
                total_s=round(done["total_s"], 6),
                bytes=done["bytes"],
                reason=done["reason"],
            )

    def wait(self, timeout_s: float | None = None) -> bool:
        """Let the save in flight finish; False if it did not within ``timeout_s`` (a save whose
        peers are gone never finishes: its temporary directory is removed by the next run)."""
        if timeout_s is None:
            self.manager.wait_until_finished()
            return True
        done = threading.Event()

        def waiting() -> None:
            try:
                self.manager.wait_until_finished()
            except Exception as error:
                log.warning("hotswap: checkpoint save failed: %s", error)
            done.set()

        threading.Thread(target=waiting, name="hotswap-checkpoint-wait", daemon=True).start()
        return done.wait(timeout_s)

    def restore_latest(self, template: Any) -> Restored | None:
        """The newest complete checkpoint, its arrays placed like the template's (resharded
        when the mesh changed); None when there is none. A checkpoint whose tree, shapes or
        dtypes differ from the template's raises :class:`StateMismatchError` naming the first
        leaf that differs: a partial or cast restore would be silent corruption."""
        self.manager.wait_until_finished()
        if sorted(ocp.utils.checkpoint_steps(self.directory)) != sorted(self.manager.all_steps()):
            self.manager.reload()  # written or removed by another: what a later save relies on
        found = self._newest(self.manager, self.directory, template)
        if found is None and self.fallback is not None and Path(self.fallback).is_dir():
            source = ocp.CheckpointManager(
                self.fallback,
                item_handlers={"state": ocp.StandardCheckpointHandler(), "hotswap": ocp.JsonCheckpointHandler()},
                options=ocp.CheckpointManagerOptions(create=False, cleanup_tmp_directories=False),
            )
            try:
                found = self._newest(source, self.fallback, template)
            finally:
                source.close()
            if found is not None:
                found = dataclasses.replace(found, resumed=True)
        return found

    @staticmethod
    def _newest(manager: Any, directory: str, template: Any) -> Restored | None:
        """The newest step that restores; the damaged ones newer than it are set aside (and
        the manager told, so that a later save of their step is not refused)."""
        expected = leaves_with_paths(template)
        moved = _set_aside_links(directory)
        if moved:
            manager.reload()  # its list of steps still names them
        try:
            for step in sorted(manager.all_steps(), reverse=True):
                where = f"checkpoint {directory}/{step}"
                path = Path(directory) / str(step)
                try:
                    restored = _restore_as_saved(path, template, expected, where)
                    failure = None
                except StateMismatchError:
                    raise
                except Exception as error:
                    restored, failure = None, error
                if restored is not None:
                    state, extra = restored
                    return Restored(step, state, extra["objects"], extra["counters"], extra["reason"])
                try:  # only for a step that did not restore: why (another tree, or damaged)
                    found = _saved_leaves(manager, step)
                except Exception as error:  # written by something else, or damaged
                    moved |= _set_aside(directory, step, f"its metadata cannot be read ({_one_line(error)})")
                    continue
                _check(expected, found, where)
                assert failure is not None
                moved |= _set_aside(directory, step, f"it cannot be restored ({_one_line(failure)})")
            return None
        finally:
            if moved:
                manager.reload()

    def close(self) -> None:
        self.manager.close()


def _set_aside(directory: str, step: int, why: str) -> bool:
    """Move a damaged step out of the way (every process may try: the first one moves it)."""
    path = Path(directory) / str(step)
    if not path.is_dir():
        log.warning("hotswap: skipping checkpoint %s: %s", path, why)
        return False
    set_aside(path, why)
    return not path.exists()  # moved, here or by another process


def _set_aside_links(directory: str) -> bool:
    """Set aside every step whose name is no directory of its own (a symbolic link): damaged,
    as a tampered step is; whether one was."""
    try:
        entries = [Path(entry.path) for entry in os.scandir(directory) if entry.name.isdigit()]
    except OSError:
        return False
    problems = [(path, not_a_directory(path)) for path in entries]
    for path, problem in problems:
        if problem:
            set_aside(path, problem)
    return any(problem for _, problem in problems)


def _one_line(error: Exception) -> str:
    text = " ".join(str(error).split()) or type(error).__name__
    return text if len(text) <= 300 else text[:297] + "..."


def _saved_leaves(manager: Any, step: int) -> dict[Any, Any]:
    saved = getattr(manager.item_metadata(step)["state"], "tree", None)
    if saved is None:
        raise ValueError("no array metadata")
    return dict(leaves_with_paths(saved))


def _as_saved(template: Any) -> tuple[Any, Any]:
    """The restore target (the template's arrays as shapes with their shardings) and orbax's
    restore arguments for it that read every value as saved: no cast to the template's dtype,
    no padding or truncating to its shape (orbax would do both silently)."""
    target = jax.tree.map(_abstract, template)
    args = jax.tree.map(_uncast, ocp.checkpoint_utils.construct_restore_args(target))
    return target, args


def _uncast(args: Any) -> Any:
    if isinstance(args, ocp.ArrayRestoreArgs):
        if args.dtype is not None and jax.dtypes.issubdtype(args.dtype, jax.dtypes.prng_key):
            return args  # a typed key: orbax restores its key data as saved
        return dataclasses.replace(args, global_shape=None, shape=None, dtype=None, strict=False)
    if isinstance(args, ocp.RestoreArgs) and args.dtype is not None:
        return dataclasses.replace(args, dtype=None)
    return args


def _restore_as_saved(path: Path, template: Any, expected: list[tuple[str, Any]], where: str) -> tuple[Any, dict[str, Any]]:
    """A step's arrays (placed like the template's, values as saved) and its JSON item.

    The tree check runs on what the step holds as saved (shapes and dtypes, never cast), with
    no second read of the step's metadata: hotswap's reader (:mod:`hotswap.train.jax.step_reader`)
    opens the step's arrays and checks them before reading any. A tree it leaves to orbax, or a
    step it cannot read, is read by orbax's own handler (which refuses another tree structure or
    shape) and checked on what that read: only orbax's restore failing makes a step damaged."""
    state = _read(path / "state", template, expected, where)
    if state is None:
        target, restore_args = _as_saved(template)
        arrays = ocp.PyTreeCheckpointHandler()
        try:
            state = arrays.restore(path / "state", args=ocp.args.PyTreeRestore(item=target, restore_args=restore_args))
        finally:
            arrays.close()
        _check(expected, dict(leaves_with_paths(state)), where)
    extra = ocp.JsonCheckpointHandler().restore(path / "hotswap")
    return state, extra


def _read(directory: Path, template: Any, expected: list[tuple[str, Any]], where: str) -> Any | None:
    """The step's arrays read by hotswap's reader; None to let orbax's restore read them."""
    try:
        opened = step_reader.open_step(directory, template)
    except Exception as error:  # damaged, or a layout this reader does not know
        log.debug("hotswap: %s: orbax reads it (%s)", where, _one_line(error))
        return None
    if opened is None:
        return None
    _check(expected, opened.found, where)
    try:
        return opened.read()
    except Exception as error:
        log.debug("hotswap: %s: orbax reads it (%s)", where, _one_line(error))
        return None


def _check(expected: list[tuple[str, Any]], found: dict[str, Any], where: str) -> None:
    problem = first_mismatch(expected, found, where)
    if problem:
        raise StateMismatchError(f"cannot restore: {problem}")


def _abstract(leaf: Any) -> Any:
    if isinstance(leaf, jax.Array):
        return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=leaf.sharding)
    return leaf
