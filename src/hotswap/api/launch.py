"""How a backend starts a run's workers (:class:`Launch`) and the run a ``workload create`` starts
(:class:`Run`), as frozen records.

A backend's ``prepare_workload`` builds them (the run: ``backends.requests.new_run``); the local
backend sends the launch to its controller in a request and keeps it with the workload in its
database, the Kubernetes backend renders the run into its JobSet. Their JSON (``to_dict``/``to_json``)
is exactly the objects of earlier releases, so records of existing databases read back to the same
meaning, and a record read and written again is unchanged (keys this release does not know are
kept, in ``extra``).

One record holds each fact: what the user asked (their variables, the directories and images as
given) is the spec's (:class:`~hotswap.api.spec.WorkloadSpec`); what a backend derived from it
for this run (the environment the workers start from, the directory they run in, this run's
checkpoint directory, the volume mounted) is the launch's.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

# What a new run asked to resume from (``Run.mode``).
RUN_AUTO = "auto"  # a pending migration checkpoint of its predecessor, if any
RUN_FRESH = "fresh"  # nothing
RUN_FROM = "from"  # ``source``: a run id under the checkpoint root, or a checkpoint directory


@dataclasses.dataclass(frozen=True, slots=True)
class Run:
    """A run of ``workload create``: its id and what the user asked it to resume from. The local
    backend resolves it once (``resume_from``: the directory its workers restore from, "" for
    none; ``resumed_from``: the same for people, run/path/kind, None for a fresh start;
    ``not_resumed``: run/path/reason of a predecessor's checkpoint passed over, e.g. a run that
    failed, so a fresh start says why); an unresolved run has ``resume_from`` None and none of
    these keys in its JSON, a run that passed nothing over no ``not_resumed``."""

    id: str
    mode: str = RUN_AUTO
    source: str | None = None  # RUN_FROM's run id or directory
    resume_from: str | None = None
    resumed_from: Mapping[str, Any] | None = None
    not_resumed: Mapping[str, Any] | None = None
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # keys of other releases, kept

    def resolved(
        self, resume_from: str, resumed_from: Mapping[str, Any] | None, not_resumed: Mapping[str, Any] | None = None
    ) -> Run:
        return dataclasses.replace(self, resume_from=resume_from, resumed_from=resumed_from, not_resumed=not_resumed)

    def to_dict(self) -> dict[str, Any]:
        value: dict[str, Any] = {**self.extra, "id": self.id, "mode": self.mode}
        if self.source is not None:
            value["source"] = self.source
        if self.resume_from is not None:
            value["resume_from"] = self.resume_from
            value["resumed_from"] = None if self.resumed_from is None else dict(self.resumed_from)
        if self.not_resumed is not None:
            value["not_resumed"] = dict(self.not_resumed)
        return value

    @classmethod
    def from_dict(cls, value: Mapping[str, Any]) -> Run:
        """A run's JSON object (TypeError/ValueError/KeyError for anything else)."""
        if not isinstance(value, Mapping):
            raise TypeError("a run is not an object")
        known = {"id", "mode", "source", "resume_from", "resumed_from", "not_resumed"}
        resumed_from, not_resumed = value.get("resumed_from"), value.get("not_resumed")
        return cls(
            id=_text(value["id"], "the run's id"),
            mode=_text(value.get("mode", RUN_AUTO), "the run's mode"),
            source=None if value.get("source") is None else str(value["source"]),
            resume_from=None if value.get("resume_from") is None else _text(value["resume_from"], "the run's resume_from"),
            resumed_from=dict(resumed_from) if isinstance(resumed_from, Mapping) else None,
            not_resumed=dict(not_resumed) if isinstance(not_resumed, Mapping) else None,
            extra={key: item for key, item in value.items() if key not in known},
        )


@dataclasses.dataclass(frozen=True, slots=True)
class HeldStart:
    """Why the held-back workers of ``attempt`` start, once they do (the local backend: a restart
    whose workers wait, committed with its round so a restarted controller still knows)."""

    attempt: int
    cause: str


HELD_START_KEY = "held_start_cause"  # HeldStart's key in a launch's JSON
EARLIER_USER_ENV_KEY = "user_env"  # where earlier releases kept the user's variables in a launch's JSON


@dataclasses.dataclass(frozen=True, slots=True)
class Launch:
    """How a backend starts this run's workers, as it derived it from a ``workload create``:
    ``environ``, the environment they start from, under the user's variables (the spec's) and the
    contract's (the local backend's: its creator's; a pod's: its image's, so none here);
    ``cwd``, the directory they run in ("" : the image's); ``checkpoint_dir``, this run's
    checkpoint directory as they see it ("" : none); the run (None: a workload of a release
    without runs). A backend may set entries of its own: ``checkpoint_volume`` (Kubernetes: the
    volume its pods mount), ``held_start`` (local: a held-back restart's cause).

    A record of an earlier release also kept the user's variables (``user_env``, the spec's
    ``env`` plus the variables the local backend derived, and those an earlier demo gave its
    workers): read back, they are :attr:`earlier_user_env`, and still reach the workers
    (:attr:`start_environment`)."""

    environ: Mapping[str, str]
    cwd: str
    checkpoint_dir: str
    run: Run | None = None
    checkpoint_volume: str | None = None
    held_start: HeldStart | None = None
    earlier_user_env: Mapping[str, str] | None = None  # an earlier release's "user_env"
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # keys of other releases, kept

    @property
    def start_environment(self) -> dict[str, str]:
        """The environment the workers start from: ``environ``, and an earlier release's
        ``user_env`` over it (the user's variables, applied over it again by the worker's
        environment, are among them with the same values, so the workers get what they got)."""
        return {**self.environ, **(self.earlier_user_env or {})}

    def to_dict(self) -> dict[str, Any]:
        value: dict[str, Any] = {**self.extra, "environ": dict(self.environ), "cwd": self.cwd, "checkpoint_dir": self.checkpoint_dir}
        if self.earlier_user_env is not None:
            value[EARLIER_USER_ENV_KEY] = dict(self.earlier_user_env)
        if self.run is not None:
            value["run"] = self.run.to_dict()
        if self.checkpoint_volume is not None:
            value["checkpoint_volume"] = self.checkpoint_volume
        if self.held_start is not None:
            value[HELD_START_KEY] = {"attempt": self.held_start.attempt, "cause": self.held_start.cause}
        return value

    def to_json(self) -> str:
        """The JSON text the local backend stores (keys sorted, as always)."""
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, value: Mapping[str, Any]) -> Launch:
        """A launch's JSON object (TypeError/ValueError/KeyError for anything else)."""
        if not isinstance(value, Mapping):
            raise TypeError("a launch is not an object")
        known = {"environ", "cwd", "checkpoint_dir", "run", "checkpoint_volume", HELD_START_KEY, EARLIER_USER_ENV_KEY}
        run, volume, held = value.get("run"), value.get("checkpoint_volume"), value.get(HELD_START_KEY)
        earlier = value.get(EARLIER_USER_ENV_KEY)
        return cls(
            environ=_mapping(value["environ"], "the environment"),
            cwd=_text(value["cwd"], "cwd"),
            checkpoint_dir=_text(value["checkpoint_dir"], "checkpoint_dir"),
            run=None if run is None else Run.from_dict(run),
            checkpoint_volume=None if volume is None else _text(volume, "checkpoint_volume"),
            held_start=_held_start(held),
            earlier_user_env=None if earlier is None else _mapping(earlier, "the user's environment"),
            extra={key: item for key, item in value.items() if key not in known},
        )

    @classmethod
    def from_json(cls, text: str) -> Launch:
        return cls.from_dict(json.loads(text))


def _held_start(value: Any) -> HeldStart | None:
    """A held start cause as it was stored; an unreadable one is no cause (it was only a hint)."""
    if not isinstance(value, Mapping) or not isinstance(value.get("attempt"), int) or not isinstance(value.get("cause"), str):
        return None
    return HeldStart(value["attempt"], value["cause"])


def _text(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{what} is not text")
    return value


def _mapping(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise ValueError(f"{what} is not an object")
    return dict(value)
