"""What a checkpoint holds: the registered objects, the progress counters and the RNG states.

The *state tree* is a plain nested structure of dicts, lists and tensors::

    {"format": 1,
     "progress": {"step": ..., "elastic_down_events": ...},
     "objects": {name: model/optimizer/scheduler state_dict, dict or list contents},
     "rng": [rank 0's RNG states, rank 1's, ...]}
"""

from __future__ import annotations

import copy
import logging
import random
from collections.abc import Callable, MutableMapping, MutableSequence
from typing import Any

import numpy
import torch

from hotswap.train.torch.codec import encode
from hotswap.train.data import ResumableBatches

log = logging.getLogger("hotswap.train")

TREE_FORMAT = 1


def registrable_kind(obj: object) -> str:
    """How the run saves and restores ``obj``; TypeError when it cannot."""
    if callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None)):
        return "stateful"
    if isinstance(obj, MutableMapping):
        return "mapping"
    if isinstance(obj, MutableSequence):
        return "sequence"
    raise TypeError(
        f"cannot register a {type(obj).__name__}: register objects with state_dict()/load_state_dict() "
        "(model, optimizer, scheduler), or a dict or list that the run can update in place"
    )


def _state_of(obj: Any) -> Any:
    kind = registrable_kind(obj)
    if kind == "stateful":
        return obj.state_dict()
    return dict(obj) if kind == "mapping" else list(obj)


class StateRegistry:
    """Named objects whose state is saved, restored and sent to joining replicas."""

    def __init__(self) -> None:
        self._objects: dict[str, Any] = {}

    def register(self, name: str, obj: object) -> None:
        """TypeError now, rather than at the first save, if its state is not plain data."""
        registrable_kind(obj)
        if name in self._objects and self._objects[name] is not obj:
            raise ValueError(f"a different object is already registered as {name!r}")
        encode(_state_of(obj), root=f"{name!r}")
        self._objects[name] = obj

    def optimizers(self) -> list[torch.optim.Optimizer]:
        return [obj for obj in self._objects.values() if isinstance(obj, torch.optim.Optimizer)]

    def changed_only_by_optimizers(self) -> Callable[[torch.Tensor], bool]:
        """Whether a tensor of the state is a parameter or optimizer state of a registered
        optimizer: between step boundaries, only ``optimizer.step()`` changes those."""
        owned: set[int] = set()
        for optimizer in self.optimizers():
            for group in optimizer.param_groups:
                owned.update(parameter.data_ptr() for parameter in group["params"])
            for per_parameter in optimizer.state.values():
                owned.update(value.data_ptr() for value in per_parameter.values() if isinstance(value, torch.Tensor))
        return lambda tensor: tensor.data_ptr() in owned

    def state(self) -> dict[str, Any]:
        """The registered objects' states. Tensors are the live ones: copy before training on."""
        return {name: _state_of(obj) for name, obj in self._objects.items()}

    def load(self, states: dict[str, Any]) -> None:
        for name, obj in self._objects.items():
            if name not in states:
                log.warning("hotswap: the restored state has nothing for %r; it keeps its current value", name)
                continue
            kind = registrable_kind(obj)
            if kind == "stateful":
                obj.load_state_dict(states[name])
            elif kind == "mapping":
                obj.clear()
                obj.update(states[name])
            else:
                obj[:] = states[name]
        unknown = sorted(set(states) - set(self._objects))
        if unknown:
            log.warning("hotswap: the restored state has objects nobody registered: %s", ", ".join(unknown))

    def positions(self) -> dict[str, Any]:
        """Data positions, cheap to copy: taken at each step start so an abandoned step re-runs
        on the same batch."""
        return {
            name: copy.deepcopy(obj.state_dict())
            for name, obj in self._objects.items()
            if isinstance(obj, ResumableBatches)
        }

    def restore_positions(self, positions: dict[str, Any]) -> None:
        for name, state in positions.items():
            self._objects[name].load_state_dict(state)


def rng_state() -> dict[str, Any]:
    """Every random number generator a training step may draw from, on this process."""
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": numpy.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    numpy.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def build_tree(registry: StateRegistry, progress: dict[str, int], rng_states: list[dict[str, Any]]) -> dict[str, Any]:
    return {"format": TREE_FORMAT, "progress": dict(progress), "objects": registry.state(), "rng": rng_states}


def tree_format_problem(tree: Any) -> str | None:
    if not isinstance(tree, dict) or tree.get("format") != TREE_FORMAT:
        return f"it is not a hotswap state (format {TREE_FORMAT})"
    return None
