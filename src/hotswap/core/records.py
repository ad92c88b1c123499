"""Immutable records that are cheap to make: :func:`fast_init` over a frozen slots dataclass.

A frozen dataclass's own ``__init__`` sets every field through ``object.__setattr__`` (a
lookup by name past the frozen guard): about 0.1 µs a field. A decision round makes several
records (the events it is given, its actions, their effects, the next snapshot and its
indexes), and a simulated month makes millions; filled through the slots' own setters they
cost a third to a half. Everything else (frozen assignment, equality, hashing, repr, pickling,
``dataclasses.replace``, the signature) stays the dataclass's own.
"""

from __future__ import annotations

import dataclasses
from typing import TypeVar

_C = TypeVar("_C", bound=type)
_HAS_FACTORY = object()  # the default of a field with a default factory (as in the dataclass's own)


def fast_init(cls: _C) -> _C:
    """Give a frozen slots dataclass an ``__init__`` that fills its slots directly; put it
    above ``@dataclasses.dataclass(frozen=True, slots=True)``. It takes the same arguments,
    defaults and default factories; a class with ``__post_init__``, init-only or
    keyword-only fields keeps the dataclass's own (refused here, so that nothing differs)."""
    params = getattr(cls, "__dataclass_params__", None)
    if params is None or not params.frozen or "__slots__" not in cls.__dict__:
        raise TypeError(f"{cls.__name__}: fast_init is for frozen slots dataclasses")
    fields = dataclasses.fields(cls)
    if hasattr(cls, "__post_init__") or any(not f.init or f.kw_only for f in fields):
        raise TypeError(f"{cls.__name__}: __post_init__, init=False or kw_only fields need the dataclass's __init__")
    namespace: dict[str, object] = {"_HAS_FACTORY": _HAS_FACTORY}
    arguments, lines = [], []
    for position, field in enumerate(fields):
        name = field.name
        namespace[f"_set{position}"] = getattr(cls, name).__set__  # the slot's own setter
        if field.default is not dataclasses.MISSING:
            namespace[f"_default{position}"] = field.default
            arguments.append(f"{name}=_default{position}")
        elif field.default_factory is not dataclasses.MISSING:
            # As the dataclass does: a sentinel default, replaced by a fresh value per record.
            namespace[f"_factory{position}"] = field.default_factory
            arguments.append(f"{name}=_HAS_FACTORY")
            lines.append(f"    if {name} is _HAS_FACTORY: {name} = _factory{position}()")
        else:
            arguments.append(name)
        lines.append(f"    _set{position}(self, {name})")
    # Generated like the dataclass's own __init__ (dataclasses builds it from source text too).
    source = f"def __init__(self, {', '.join(arguments)}):\n" + "\n".join(lines or ["    pass"]) + "\n"
    # (Named so that a traceback, or a test, tells it from the dataclass's own.)
    exec(compile(source, f"<fast_init {cls.__qualname__}>", "exec"), namespace)  # noqa: S102 (built above from the field names)
    init = namespace["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    init.__doc__ = cls.__init__.__doc__
    cls.__init__ = init  # type: ignore[misc]
    return cls
