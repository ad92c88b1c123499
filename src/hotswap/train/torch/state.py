"""What a checkpoint holds: the registered objects, the progress counters and the RNG states.

The *state tree* is a plain nested structure of dicts, lists and tensors::

    {"format": 1,
     "progress": {"step": ..., "elastic_down_events": ...},
     "objects": {name: model/optimizer/scheduler state_dict, dict or list contents},
     "rng": [rank 0's RNG states, rank 1's, ...]}
"""

from __future__ import annotations

import copy
import hashlib
import logging
import random
from collections.abc import Callable, MutableMapping, MutableSequence
from typing import Any

import numpy
import torch
from torch.nn.parallel import DistributedDataParallel

from hotswap.train.torch.codec import encode
from hotswap.train.data import ResumableBatches

log = logging.getLogger("hotswap.train")

TREE_FORMAT = 1


SCALAR_TYPES = (bool, int, float, str, type(None))


def registrable_kind(obj: object) -> str:
    """How the run saves and restores ``obj``; TypeError when it cannot."""
    if isinstance(obj, SCALAR_TYPES):
        return "scalar"
    if callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None)):
        return "stateful"
    if isinstance(obj, MutableMapping):
        return "mapping"
    if isinstance(obj, MutableSequence):
        return "sequence"
    raise TypeError(
        f"cannot register a {type(obj).__name__}: register objects with state_dict()/load_state_dict() "
        "(model, optimizer, scheduler), a dict or list that the run can update in place, or a number "
        "or string (read and set it as run.scalars[name])"
    )


def unwrapped(obj: object) -> object:
    """The module whose state a wrapper saves under prefixed keys: ``torch.compile``'s
    ``OptimizedModule`` (``_orig_mod.``) and DDP (``module.``) share their parameters with it, so
    registering it makes checkpoints restorable with the wrapper or without."""
    while isinstance(obj, torch.nn.Module):
        inner = obj.module if isinstance(obj, DistributedDataParallel) else getattr(obj, "_orig_mod", None)
        if not isinstance(inner, torch.nn.Module):
            break
        obj = inner
    return obj


_WRAPPER_PREFIXES = ("_orig_mod.", "module.")  # torch.compile's, DDP's


def bare_keys(state: Any, module: torch.nn.Module) -> Any:
    """A module's state dict saved through a wrapper (keys all ``_orig_mod.`` or ``module.``
    prefixed, which the module's own keys are not), with the prefixes taken off."""
    if not isinstance(state, dict) or not state:
        return state
    own = module.state_dict().keys()
    for prefix in _WRAPPER_PREFIXES * 2:  # torch.compile over DDP or the other way round
        if all(isinstance(k, str) and k.startswith(prefix) for k in state) and not any(k.startswith(prefix) for k in own):
            state = type(state)((k[len(prefix) :], v) for k, v in state.items())
    return state


def _state_of(obj: Any) -> Any:
    kind = registrable_kind(obj)
    if kind == "stateful":
        return obj.state_dict()
    return dict(obj) if kind == "mapping" else list(obj)


class StateRegistry:
    """Named objects whose state is saved, restored and sent to joining replicas."""

    def __init__(self) -> None:
        self._objects: dict[str, Any] = {}
        self.scalars: dict[str, Any] = {}  # registered numbers and strings, by name: read and set here

    def register(self, name: str, obj: object) -> None:
        """TypeError now, rather than at the first save, if its state is not plain data."""
        if registrable_kind(obj) == "scalar":
            if name in self._objects:
                raise ValueError(f"an object is already registered as {name!r}")
            self.scalars[name] = obj
            return
        obj = unwrapped(obj)
        if name in self.scalars or (name in self._objects and self._objects[name] is not obj):
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
        return {**{name: _state_of(obj) for name, obj in self._objects.items()}, **self.scalars}

    def load(self, states: dict[str, Any]) -> None:
        for name in self.scalars:
            if name in states:
                self.scalars[name] = states[name]
            else:
                log.warning("hotswap: the restored state has nothing for %r; it keeps its current value", name)
        for name, obj in self._objects.items():
            if name not in states:
                log.warning("hotswap: the restored state has nothing for %r; it keeps its current value", name)
                continue
            kind = registrable_kind(obj)
            if kind == "stateful":
                obj.load_state_dict(bare_keys(states[name], obj) if isinstance(obj, torch.nn.Module) else states[name])
            elif kind == "mapping":
                obj.clear()
                obj.update(states[name])
            else:
                obj[:] = states[name]
        unknown = sorted(set(states) - set(self._objects) - set(self.scalars))
        if unknown:
            log.warning("hotswap: the restored state has objects nobody registered: %s", ", ".join(unknown))

    def drop_gradients(self) -> None:
        """Set the gradients of every registered module and optimizer to None."""
        for obj in self._objects.values():
            if isinstance(obj, (torch.nn.Module, torch.optim.Optimizer)):
                obj.zero_grad(set_to_none=True)

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
    elif "cuda_seed" in state and torch.cuda.is_available():
        torch.cuda.manual_seed_all(state["cuda_seed"])


def derived_rng_state(tree: dict[str, Any], rank: int) -> dict[str, Any]:
    """Random streams of their own for ``rank``, where the state has none saved for it (a rank
    that joins, or a restore onto more ranks than saved): seeded from the rank, the step and
    the job's own streams, so they differ from every other rank's and are the same again when
    the run is repeated."""
    basis = next((streams.get("torch") for streams in tree.get("rng") or () if streams is not None), None)
    material = f"hotswap/rank {rank}/step {int(tree['progress'].get('step', 0))}/".encode()
    if isinstance(basis, torch.Tensor):
        material += basis.cpu().numpy().tobytes()
    seed = int.from_bytes(hashlib.sha256(material).digest()[:8], "little") >> 1
    return {
        "python": random.Random(seed).getstate(),
        "numpy": numpy.random.RandomState(seed % 2**32).get_state(),
        "torch": torch.Generator().manual_seed(seed).get_state(),
        "cuda_seed": seed,
    }


def build_tree(
    registry: StateRegistry, progress: dict[str, int], rng_states: list[dict[str, Any] | None]
) -> dict[str, Any]:
    return {"format": TREE_FORMAT, "progress": dict(progress), "objects": registry.state(), "rng": rng_states}


def tree_format_problem(tree: Any) -> str | None:
    if not isinstance(tree, dict) or tree.get("format") != TREE_FORMAT:
        return f"it is not a hotswap state (format {TREE_FORMAT})"
    return None
