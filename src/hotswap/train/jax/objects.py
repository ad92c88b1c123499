"""Python objects saved with the arrays: the data position (``ResumableBatches``) and anything
else with ``state_dict()``/``load_state_dict()``, or a dict updated in place. Their states go
into the checkpoint as JSON (orbax's ``JsonSave``), so they must be JSON-serialisable."""

from __future__ import annotations

import copy
import json
from collections.abc import MutableMapping
from typing import Any


class ObjectRegistry:
    def __init__(self) -> None:
        self._objects: dict[str, Any] = {}

    def register(self, name: str, obj: object) -> None:
        stateful = callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))
        if not stateful and not isinstance(obj, MutableMapping):
            raise TypeError(
                f"cannot register a {type(obj).__name__} as {name!r}: register objects with "
                "state_dict()/load_state_dict(), or a dict the run can update in place"
            )
        if name in self._objects and self._objects[name] is not obj:
            raise ValueError(f"a different object is already registered as {name!r}")
        self._objects[name] = obj

    def state(self) -> dict[str, Any]:
        """A copy of every object's state, as it is now (JSON-checked, so a save cannot fail
        on it later)."""
        states = {}
        for name, obj in self._objects.items():
            state = obj.state_dict() if hasattr(obj, "state_dict") else dict(obj)
            try:
                json.dumps(state)
            except TypeError as error:
                raise TypeError(f"the state of {name!r} is not JSON-serialisable: {error}") from None
            states[name] = copy.deepcopy(state)
        return states

    def load(self, states: dict[str, Any]) -> None:
        missing = sorted(set(self._objects) - set(states))
        if missing:
            raise ValueError(f"the saved state has no object {missing[0]!r} (it has {sorted(states)})")
        for name, obj in self._objects.items():
            state = copy.deepcopy(states[name])
            if hasattr(obj, "load_state_dict"):
                obj.load_state_dict(state)
            else:
                obj.clear()
                obj.update(state)
