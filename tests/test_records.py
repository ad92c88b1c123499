"""core/records.py's fast_init: a frozen slots dataclass filled through its slots' setters is
the same record as one made by the dataclass's own ``__init__``, and the records a decision
round makes by the thousand (events, actions, effects, snapshots, workloads) are made so."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from hotswap.core import actions as act
from hotswap.core import events as ev
from hotswap.core.effects import ActionEffect
from hotswap.core.index import Indexes
from hotswap.core.model import Node, Slice, Snapshot
from hotswap.core.records import fast_init
from hotswap.core.scheduler import Decision
from hotswap.core.workload import Workload


@dataclasses.dataclass(frozen=True, slots=True)
class Plain:
    name: str
    size: int = 1
    tags: tuple[str, ...] = ()
    extra: dict[str, int] = dataclasses.field(default_factory=dict)


@fast_init
@dataclasses.dataclass(frozen=True, slots=True)
class Fast:
    name: str
    size: int = 1
    tags: tuple[str, ...] = ()
    extra: dict[str, int] = dataclasses.field(default_factory=dict)


def _fields(record: object) -> tuple:
    return tuple(getattr(record, f.name) for f in dataclasses.fields(record))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [(("a",), {}), (("a", 3), {}), (("a",), {"tags": ("x",)}), ((), {"name": "b", "extra": {"k": 1}, "size": 0}), (("a", 2, ("t",), {"k": 2}), {})],
)
def test_a_fast_record_holds_what_the_dataclass_init_would(args: tuple, kwargs: dict) -> None:
    fast, plain = Fast(*args, **kwargs), Plain(*args, **kwargs)
    assert _fields(fast) == _fields(plain)
    assert repr(fast).removeprefix("Fast") == repr(plain).removeprefix("Plain")
    assert fast == Fast(*args, **kwargs) and fast != Fast("other")
    assert pickle.loads(pickle.dumps(fast)) == fast
    assert dataclasses.replace(fast, size=9) == Fast(fast.name, 9, fast.tags, fast.extra)


def test_a_fast_record_stays_frozen_and_gets_a_fresh_default_from_each_factory() -> None:
    first, second = Fast("a"), Fast("b")
    with pytest.raises(dataclasses.FrozenInstanceError):
        first.size = 2  # type: ignore[misc]
    assert first.extra == {} and first.extra is not second.extra
    with pytest.raises(TypeError):
        Fast()  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        Fast("a", nothing=1)  # type: ignore[call-arg]


def test_fast_init_refuses_what_it_would_make_differently() -> None:
    @dataclasses.dataclass(frozen=True)
    class NoSlots:
        name: str

    @dataclasses.dataclass(frozen=True, slots=True)
    class PostInit:
        name: str

        def __post_init__(self) -> None:
            pass

    @dataclasses.dataclass(frozen=True, slots=True)
    class KeywordOnly:
        name: str = dataclasses.field(kw_only=True)

    for cls in (NoSlots, PostInit, KeywordOnly):
        with pytest.raises(TypeError):
            fast_init(cls)


HOT_RECORDS = [*act.ACTION_TYPES, *(t for t in vars(ev).values() if isinstance(t, type) and dataclasses.is_dataclass(t) and t.__module__ == ev.__name__),
               ActionEffect, Decision, Snapshot, Node, Slice, Indexes, Workload]


@pytest.mark.parametrize("cls", HOT_RECORDS, ids=lambda cls: cls.__name__)
def test_the_records_a_round_makes_are_filled_through_their_slots(cls: type) -> None:
    assert cls.__init__.__code__.co_filename == f"<fast_init {cls.__qualname__}>"
