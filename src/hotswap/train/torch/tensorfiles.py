"""The files of one checkpoint (format 2): a JSON index and the arrays' raw bytes.

::

    index.json        the state tree as plain data (:mod:`hotswap.train.torch.codec`), each array's
                      kind, dtype, shape and device, and the data files in order
    tensors-<i>.bin   the arrays' bytes back to back, in index order, cut into one file per
                      I/O thread of about equal size (an array may span two files)

Nothing in these files can run code when read: the index is JSON, the data is bytes copied
into arrays allocated from a checked dtype and shape.

Saving is disk-bound, so the bytes go to disk the shortest way: CPU tensors are written from
their own memory (no copy, no serialisation); GPU tensors through two reused pinned buffers
per thread (:mod:`hotswap.train.torch.staging`); several threads write their own file at once; each
thread checksums its bytes while they are in cache and starts their write-back early, so the
final ``fsync`` waits only for the tail. Restoring reads each file in its own thread straight
into the new arrays (through pinned buffers for GPU ones), checking each file's CRC-32 in the
same pass.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import logging
import os
import re
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy
import torch

from hotswap.train.torch.codec import ArraySpec, CheckpointFormatError, Encoded, decode, torch_dtypes
from hotswap.train.files import CheckpointDamaged, FileDigest, crc32, open_checkpoint_file, write_file_durably
from hotswap.train.torch.staging import Staging

log = logging.getLogger("hotswap.train")

INDEX_FILE = "index.json"
INDEX_FORMAT = 2
CHUNK_BYTES = 32 << 20  # one write or read call; write-back is started after each
MIN_FILE_BYTES = 64 << 20  # below this a thread of its own is not worth a file
MAX_THREADS = 8
_DATA_FILE = re.compile(r"^tensors-[0-9]{1,3}\.bin$")
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def io_threads() -> int:
    """Threads for a save or a restore: one per CPU this process may use, at most 8."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    return max(1, min(MAX_THREADS, cpus))


def byte_view(array: torch.Tensor | numpy.ndarray) -> torch.Tensor:
    """The array's bytes as a 1-D uint8 tensor on its device (a view when it is contiguous)."""
    if isinstance(array, numpy.ndarray):
        return torch.from_numpy(numpy.ascontiguousarray(array).reshape(-1).view(numpy.uint8))
    tensor = array.detach().resolve_conj().resolve_neg()
    if not (tensor.is_cuda or tensor.is_cpu):
        tensor = tensor.cpu()  # other accelerators: a plain copy
    return tensor.contiguous().reshape(-1).view(torch.uint8)


def _cut(views: Sequence[torch.Tensor], lengths: Sequence[int]) -> list[list[torch.Tensor]]:
    """The byte stream of ``views`` cut into consecutive pieces of ``lengths``."""
    files: list[list[torch.Tensor]] = []
    stream = iter(views)
    current, offset = None, 0
    for length in lengths:
        pieces = []
        while length:
            if current is None or offset == current.numel():
                current, offset = next(stream), 0
                continue
            take = min(length, current.numel() - offset)
            pieces.append(current[offset : offset + take])
            offset, length = offset + take, length - take
        files.append(pieces)
    return files


def _file_lengths(total: int, threads: int) -> list[int]:
    count = max(1, min(threads, total // MIN_FILE_BYTES))
    base, extra = divmod(total, count)
    return [base + (1 if i < extra else 0) for i in range(count)]


def _runs(pieces: list[torch.Tensor]) -> list[tuple[torch.device | None, list[torch.Tensor]]]:
    """Consecutive pieces that go through one GPU's staging (CPU pieces join them: small ones,
    such as optimizer step counts, must not break the pipeline), or, with no GPU in a run,
    straight to the file."""
    runs: list[tuple[torch.device | None, list[torch.Tensor]]] = []
    for piece in pieces:
        gpu = piece.device if piece.is_cuda else None
        if runs and (gpu is None or runs[-1][0] in (None, gpu)):
            if runs[-1][0] is None and gpu is not None:
                runs[-1] = (gpu, runs[-1][1])
            runs[-1][1].append(piece)
        else:
            runs.append((gpu, [piece]))
    return runs


def _host_chunks(piece: torch.Tensor) -> list[memoryview]:
    view = memoryview(piece.numpy())
    return [view[start : start + CHUNK_BYTES] for start in range(0, len(view), CHUNK_BYTES)]


class _Sink:
    """One data file being written: its size, its CRC-32, early write-back."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.size = 0
        self.crc = 0
        self._flushed = 0  # write-back started up to here

    def write(self, view: memoryview) -> None:
        self.crc = crc32(view, self.crc)  # zlib's releases the GIL, like os.write
        while view:
            written = os.write(self.fd, view)
            view = view[written:]
            self.size += written
        if self.size - self._flushed >= CHUNK_BYTES:
            # Starts write-back of what is written so far (Linux), so the disk works while the
            # rest is copied in and fsync only waits for the tail.
            _advise(self.fd, self._flushed, self.size - self._flushed, "POSIX_FADV_DONTNEED")
            self._flushed = self.size


class _Source:
    """One data file being read: exact reads and the CRC-32 of what was read."""

    def __init__(self, fd: int, name: str) -> None:
        self.fd = fd
        self.name = name
        self.crc = 0

    def read_into(self, view: memoryview) -> None:
        filled = 0
        while filled < len(view):
            count = os.readv(self.fd, [view[filled:]])
            if count == 0:
                raise CheckpointDamaged(f"its file {self.name} ends early")
            filled += count
        self.crc = crc32(view, self.crc)


class TensorFiles:
    """Writes and reads the files of checkpoints; keeps pinned staging buffers between saves."""

    def __init__(self, threads: int | None = None) -> None:
        self.threads = threads or io_threads()
        self._staging: dict[torch.device, list[Staging]] = {}  # idle ones, per device
        self._lock = threading.Lock()

    # Writing -------------------------------------------------------------------------------

    def write(self, directory: Path, encoded: Encoded) -> dict[str, FileDigest]:
        """Write ``encoded`` into ``directory`` (each file fsynced); the files' digests."""
        views = [byte_view(array) for array in encoded.arrays]
        _synchronize(views)  # the state's last updates are done before the side streams copy
        lengths = _file_lengths(sum(view.numel() for view in views), self.threads)
        names = [f"tensors-{i}.bin" for i in range(len(lengths))]
        index = {
            "format": INDEX_FORMAT,
            "tree": encoded.document,
            "arrays": [spec.document() for spec in encoded.specs()],
            "files": [{"name": name, "bytes": length} for name, length in zip(names, lengths, strict=True)],
        }
        jobs = [
            (lambda path=directory / name, pieces=pieces: self._write_file(path, pieces))
            for name, pieces in zip(names, _cut(views, lengths), strict=True)
        ]
        jobs.append(lambda: write_file_durably(directory / INDEX_FILE, _dumps(index)))
        return dict(zip([*names, INDEX_FILE], self._run(jobs), strict=True))

    def _write_file(self, path: Path, pieces: list[torch.Tensor]) -> FileDigest:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_CLOEXEC, 0o600)
        try:
            sink = _Sink(fd)
            self._move(pieces, sink.write, writing=True)
            os.fsync(fd)
            return FileDigest(sink.size, sink.crc)
        finally:
            os.close(fd)

    # Reading -------------------------------------------------------------------------------

    def read(self, directory: Path, digests: dict[str, FileDigest]) -> Any:
        """The tree saved in ``directory`` whose files have ``digests`` (from its marker).
        CheckpointDamaged or CheckpointFormatError when it cannot be used."""
        index = self._read_index(directory, digests)
        specs = [ArraySpec.from_document(entry) for entry in index["arrays"]]
        names, lengths = _data_files(index["files"], digests, sum(spec.nbytes for spec in specs))
        on_gpu = sum(spec.device == "cuda" for spec in specs)
        if on_gpu and not torch.cuda.is_available():
            log.warning(
                "hotswap: checkpoint %s holds %d GPU tensor(s) but this process has no GPU: they are restored on the CPU",
                directory,
                on_gpu,
            )
        arrays = [_allocate(spec) for spec in specs]
        views = [byte_view(array) for array in arrays]
        _synchronize(views)  # nothing queued still uses the memory the new arrays were given
        jobs = [
            (lambda name=name, pieces=pieces: self._read_file(directory / name, digests[name], pieces))
            for name, pieces in zip(names, _cut(views, lengths), strict=True)
        ]
        self._run(jobs)
        return decode(index["tree"], arrays)

    def _read_index(self, directory: Path, digests: dict[str, FileDigest]) -> dict[str, Any]:
        digest = digests.get(INDEX_FILE)
        if digest is None:
            raise CheckpointDamaged(f"its marker lists no {INDEX_FILE}")
        fd = open_checkpoint_file(directory / INDEX_FILE, digest.size)
        try:
            source = _Source(fd, INDEX_FILE)
            data = bytearray(digest.size)
            source.read_into(memoryview(data))
        finally:
            os.close(fd)
        if source.crc != digest.crc32:
            raise CheckpointDamaged(f"its file {INDEX_FILE} does not match the checksum in its marker")
        try:
            index = json.loads(data, parse_constant=_reject_constant)
        except (ValueError, RecursionError) as error:
            raise CheckpointFormatError(f"{INDEX_FILE} is not valid JSON ({error})") from None
        if not isinstance(index, dict) or index.get("format") != INDEX_FORMAT:
            raise CheckpointFormatError(f"{INDEX_FILE} is not a format {INDEX_FORMAT} index")
        if not (isinstance(index.get("arrays"), list) and isinstance(index.get("files"), list) and "tree" in index):
            raise CheckpointFormatError(f"{INDEX_FILE} lacks its tree, array or file table")
        return index

    def _read_file(self, path: Path, digest: FileDigest, pieces: list[torch.Tensor]) -> None:
        fd = open_checkpoint_file(path, digest.size)
        try:
            _advise(fd, 0, 0, "POSIX_FADV_SEQUENTIAL")
            source = _Source(fd, path.name)
            self._move(pieces, source.read_into, writing=False)
        finally:
            os.close(fd)
        if source.crc != digest.crc32:
            raise CheckpointDamaged(f"its file {path.name} does not match the checksum in its marker")

    # Threads and staging -------------------------------------------------------------------

    def _move(self, pieces: list[torch.Tensor], transfer: Callable[[memoryview], None], *, writing: bool) -> None:
        """Every byte of ``pieces``, in order, to (``writing``) or from ``transfer``: host
        memory directly, GPU memory through staging."""
        for gpu, run in _runs(pieces):
            if gpu is None:
                for piece in run:
                    for chunk in _host_chunks(piece):
                        transfer(chunk)
                continue
            with self._staging_for(gpu) as staging:
                (staging.write_from if writing else staging.read_into)(run, transfer)

    def _run(self, jobs: list[Callable[[], Any]]) -> list[Any]:
        """Run ``jobs`` on up to ``threads`` threads (started for this call only, so none is
        left behind, e.g. across a fork); their results in order, or the first error."""
        if len(jobs) == 1 or self.threads == 1:
            return [job() for job in jobs]
        with concurrent.futures.ThreadPoolExecutor(min(self.threads, len(jobs)), "hotswap-io") as pool:
            futures = [pool.submit(job) for job in jobs]
            return [future.result() for future in futures]

    @contextlib.contextmanager
    def _staging_for(self, device: torch.device) -> Iterator[Staging]:
        """An idle staging of ``device`` (made on first use: pinned memory is slow to allocate)."""
        with self._lock:
            idle = self._staging.setdefault(device, [])
            staging = idle.pop() if idle else None
        if staging is None:
            staging = Staging.for_cuda(device)
        try:
            yield staging
        finally:
            with self._lock:
                self._staging[device].append(staging)


def _data_files(entries: list[Any], digests: dict[str, FileDigest], total: int) -> tuple[list[str], list[int]]:
    """The data files of an index, checked against the marker and the arrays' total size."""
    names, lengths = [], []
    for entry in entries:
        if not (isinstance(entry, dict) and set(entry) == {"name", "bytes"}):
            raise CheckpointFormatError(f"{INDEX_FILE} has a malformed file entry")
        name, length = entry["name"], entry["bytes"]
        if not (isinstance(name, str) and _DATA_FILE.match(name)) or name in names:
            raise CheckpointFormatError(f"{INDEX_FILE} names an unexpected data file {name!r}")
        digest = digests.get(name)
        if digest is None or type(length) is not int or digest.size != length:
            raise CheckpointDamaged(f"its marker and {INDEX_FILE} disagree about {name}")
        names.append(name)
        lengths.append(length)
    if sum(lengths) != total:
        raise CheckpointFormatError(f"{INDEX_FILE}: its arrays need {total} bytes, its files hold {sum(lengths)}")
    return names, lengths


def _synchronize(views: list[torch.Tensor]) -> None:
    """Wait for the work queued on the GPUs that ``views`` live on (the I/O threads copy on
    side streams, which are not ordered after the caller's)."""
    for device in {view.device for view in views if view.is_cuda}:
        torch.cuda.synchronize(device)


def _advise(fd: int, offset: int, length: int, advice: str) -> None:
    """A hint to the kernel's page cache, where there is one (not on macOS)."""
    if hasattr(os, "posix_fadvise"):
        try:
            os.posix_fadvise(fd, offset, length, getattr(os, advice))
        except OSError:
            pass  # a hint: some file systems do not take it


def _allocate(spec: ArraySpec) -> torch.Tensor | numpy.ndarray:
    if spec.kind == "ndarray":
        return numpy.empty(spec.shape, dtype=numpy.dtype(spec.dtype))
    device = "cpu"
    if spec.device == "cuda" and torch.cuda.is_available():
        device = f"cuda:{torch.cuda.current_device()}"  # this process's GPU, wherever it was saved
    return torch.empty(spec.shape, dtype=torch_dtypes()[spec.dtype], device=device)


def _dumps(document: Any) -> bytes:
    return json.dumps(document, allow_nan=False, separators=(",", ":")).encode()


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not allowed")

