"""Saves without the group: what the survivors of a lost slice write when the job is not elastic.

An orbax checkpoint needs every process of the group (it ends at the group's barriers), and the
group lost a member. But with the state replicated across slices (the run's :meth:`mesh`), the
processes of a surviving slice hold a whole replica between them. So each survivor writes the
shards it holds, on its own, under ``survivors/<step>/``; the next attempt restores from them
when together they cover every array and the step is newer than the newest orbax checkpoint.
The steps since that checkpoint are then not lost.

Each process writes two files, named by the attempt and its rank in the lost group:
``<attempt>-<rank>.bin`` (its shards' bytes, one after another) and, once that is durable,
``<attempt>-<rank>.json`` (what they are: each leaf's global shape and dtype, each shard's
position, offset and CRC-32; the counters, the registered objects' states, why it was saved).
A part exists only once its JSON does (written to a temporary name, then renamed). Parts of
one attempt at one step are combined; a shard held by several processes (replicas) is read
once. A state sharded across slices cannot be covered by the survivors: such a save is never
complete, and the restart takes the newest orbax checkpoint, as it would without it.

No pickle: a checkpoint directory is read back by a later process, so only bytes and JSON.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import os
import re
import shutil
import uuid
import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np

from hotswap.train.files import set_aside
from hotswap.train.jax.trees import Index, leaves_with_paths, rebuild

log = logging.getLogger("hotswap.train")

SURVIVORS_DIR = "survivors"
FORMAT = 1
_PART = re.compile(r"^(\d+)-(\d+)\.json$")


class SurvivorSaveUnreadable(Exception):
    """A survivor save's files are missing, damaged or of another state."""


@dataclasses.dataclass(frozen=True)
class SurvivorSave:
    """One attempt's complete save of one step, in ``directory`` (a run's checkpoint directory)."""

    directory: Path
    step: int
    attempt: int


@dataclasses.dataclass(frozen=True)
class RestoredSurvivorSave:
    state: Any
    counters: dict[str, int]
    objects: dict[str, Any]
    reason: str


class SurvivorSaves:
    """The survivor saves of one checkpoint directory."""

    def __init__(self, directory: Path | str) -> None:
        self.root = Path(directory) / SURVIVORS_DIR

    # Writing (a survivor, without its group) --------------------------------------------------

    def write(
        self,
        *,
        attempt: int,
        rank: int,
        template: Any,
        counters: Mapping[str, int],
        shards: Sequence[Mapping[Index, Any]],
        leaves: Sequence[str],
        objects: Mapping[str, Any],
        reason: str,
    ) -> int:
        """Write this process's part of step ``counters["step"]``; the bytes written.
        ``shards`` as :func:`~hotswap.train.jax.trees.local_shards` gives them for ``template``."""
        step = int(counters["step"])
        directory = self.root / str(step)
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        name = f"{attempt}-{rank}"
        described, chunks, offset = [], [], 0
        for (path, leaf), held in zip(leaves_with_paths(template), shards, strict=True):
            if not hasattr(leaf, "sharding"):  # not a jax.Array: a value of the tree as it is
                described.append(_describe_value(path, held.get((), leaf)))
                continue
            pieces = []
            for bounds, data in held.items():
                raw = np.asarray(data, order="C")  # (ascontiguousarray makes a scalar 1-d)
                as_bytes = raw.reshape(-1).view(np.uint8)
                pieces.append({
                    "bounds": [list(b) for b in bounds], "shape": list(raw.shape), "offset": offset,
                    "nbytes": raw.nbytes, "crc32": zlib.crc32(as_bytes),
                })
                chunks.append(as_bytes)
                offset += raw.nbytes
            dtype = np.dtype(next(iter(held.values())).dtype).name if held else "uint8"
            described.append({"kind": "array", "shape": list(leaf.shape), "dtype": dtype, "pieces": pieces})
        data_path, meta_path = directory / f"{name}.bin", directory / f"{name}.json"
        _replace_durably(data_path, [memoryview(c) for c in chunks])
        meta = {
            "format": FORMAT, "step": step, "attempt": attempt, "rank": rank, "reason": reason,
            "counters": dict(counters), "objects": dict(objects), "leaf_names": list(leaves), "leaves": described,
        }
        _replace_durably(meta_path, [memoryview(json.dumps(meta).encode())])
        _sync_directory(directory)
        return offset

    # Reading (the next attempt) -----------------------------------------------------------------

    def newest_complete(self, newer_than: int | None) -> SurvivorSave | None:
        """The newest (step, attempt) whose parts cover every array, of a step after
        ``newer_than`` (the newest orbax checkpoint's)."""
        for step, attempt in sorted(self._saves(), reverse=True):
            if newer_than is not None and step <= newer_than:
                return None
            try:
                metas = self._metas(step, attempt)
            except SurvivorSaveUnreadable as error:
                log.warning("hotswap: skipping the survivor save of step %d: %s", step, error)
                continue
            if _covers(metas):
                return SurvivorSave(self.root.parent, step, attempt)
        return None

    def read(self, save: SurvivorSave, template: Any, leaf_names: Sequence[str]) -> RestoredSurvivorSave:
        """The save's state placed like ``template``'s arrays; SurvivorSaveUnreadable when its
        files are damaged or hold another tree."""
        metas = self._metas(save.step, save.attempt)
        first = metas[0][1]
        if list(first["leaf_names"]) != list(leaf_names):
            raise SurvivorSaveUnreadable("it holds another tree than the registered state")
        for (path, leaf), saved in zip(leaves_with_paths(template), first["leaves"], strict=True):
            if hasattr(leaf, "shape") and saved["kind"] == "array" and list(leaf.shape) != saved["shape"]:
                raise SurvivorSaveUnreadable(f"leaf {path!r} is {saved['shape']} in it but {list(leaf.shape)} in the registered state")
        merged: list[dict[Index, Any]] = [{} for _ in first["leaves"]]
        for data_path, meta in metas:
            data = np.memmap(data_path, dtype=np.uint8, mode="r") if data_path.stat().st_size else np.zeros(0, np.uint8)
            for held, leaf in zip(merged, meta["leaves"], strict=True):
                if leaf["kind"] != "array":
                    held.setdefault((), _value(leaf))
                    continue
                for piece in leaf["pieces"]:
                    bounds = tuple(tuple(b) for b in piece["bounds"])
                    if bounds not in held:
                        held[bounds] = _piece(data, piece, leaf["dtype"], data_path)
        state = rebuild(template, merged)
        if state is None:
            raise SurvivorSaveUnreadable("its shards do not fit the registered state's shapes")
        return RestoredSurvivorSave(state, dict(first["counters"]), dict(first["objects"]), str(first["reason"]))

    def set_aside(self, save: SurvivorSave, why: str) -> None:
        path = self.root / str(save.step)
        if path.is_dir():
            set_aside(path, why)

    def prune(self, up_to: int) -> None:
        """Remove the saves of steps up to ``up_to`` (an orbax checkpoint of it is committed)."""
        for step, _ in set(self._saves()):
            if step <= up_to:
                shutil.rmtree(self.root / str(step), ignore_errors=True)

    # Inside ----------------------------------------------------------------------------------

    def _saves(self) -> list[tuple[int, int]]:
        found = []
        try:
            steps = [entry for entry in os.scandir(self.root) if entry.name.isdigit() and entry.is_dir()]
        except OSError:
            return []
        for entry in steps:
            with contextlib.suppress(OSError):
                found += [(int(entry.name), int(m.group(1))) for name in os.listdir(entry.path) if (m := _PART.match(name))]
        return sorted(set(found))

    def _metas(self, step: int, attempt: int) -> list[tuple[Path, dict[str, Any]]]:
        directory = self.root / str(step)
        metas = []
        for meta_path in sorted(directory.glob(f"{attempt}-*.json")):
            try:
                meta = json.loads(meta_path.read_bytes())
            except (OSError, ValueError) as error:
                raise SurvivorSaveUnreadable(f"{meta_path} cannot be read ({error})") from error
            if meta.get("format") != FORMAT or meta.get("step") != step:
                raise SurvivorSaveUnreadable(f"{meta_path} is not a save of step {step} this release wrote")
            metas.append((meta_path.with_suffix(".bin"), meta))
        if not metas:
            raise SurvivorSaveUnreadable(f"no part of attempt {attempt} in {directory}")
        return metas


def _covers(metas: Sequence[tuple[Path, dict[str, Any]]]) -> bool:
    """Whether the parts together hold every element of every array leaf."""
    leaves = metas[0][1]["leaves"]
    if any(len(meta["leaves"]) != len(leaves) for _, meta in metas):
        return False
    for position, leaf in enumerate(leaves):
        if leaf["kind"] != "array":
            continue
        distinct = {tuple(tuple(b) for b in p["bounds"]) for _, meta in metas for p in meta["leaves"][position]["pieces"]}
        held = sum(math.prod(stop - start for start, stop in bounds) for bounds in distinct)
        if held != math.prod(leaf["shape"]):  # a sharding's shards never overlap
            return False
    return True


def _piece(data: np.ndarray, piece: Mapping[str, Any], dtype: str, where: Path) -> np.ndarray:
    start, size = int(piece["offset"]), int(piece["nbytes"])
    raw = data[start : start + size]
    if raw.size != size or zlib.crc32(memoryview(np.ascontiguousarray(raw))) != piece["crc32"]:
        raise SurvivorSaveUnreadable(f"{where} is damaged (a shard's bytes differ from what was written)")
    return raw.view(jnp.dtype(dtype)).reshape(piece["shape"])


def _describe_value(path: str, value: Any) -> dict[str, Any]:
    """A leaf that is not a jax.Array (a NumPy array, a number): its value in the JSON."""
    if isinstance(value, (np.ndarray, np.generic)):
        array = np.asarray(value)
        return {"kind": "numpy", "dtype": array.dtype.name, "value": array.tolist(), "scalar": isinstance(value, np.generic)}
    try:
        json.dumps(value)
    except (TypeError, ValueError) as error:
        raise TypeError(f"leaf {path!r} ({type(value).__name__}) cannot be saved without the group") from error
    return {"kind": "json", "value": value}


def _value(leaf: Mapping[str, Any]) -> Any:
    if leaf["kind"] == "numpy":
        array = np.asarray(leaf["value"], dtype=jnp.dtype(leaf["dtype"]))
        return array[()] if leaf["scalar"] else array
    return leaf["value"]


def _replace_durably(path: Path, chunks: Sequence[memoryview]) -> None:
    """``path`` holding ``chunks``, whole or not at all (written under another name, fsynced,
    renamed: a save of the same part again replaces it)."""
    temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}")
    try:
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            for chunk in chunks:
                while chunk:
                    chunk = chunk[os.write(fd, chunk) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temporary, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            temporary.unlink()


def _sync_directory(directory: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
