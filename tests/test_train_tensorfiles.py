"""The checkpoint format: state trees as plain data (the codec), arrays as raw bytes split over
several files written and read in parallel (tensor files), and the double-buffered staging that
GPU state goes through (run here with host buffers; tests/test_train_gpu.py runs it on CUDA)."""

from __future__ import annotations

import json
import logging
import math
import warnings
import zlib
from collections import OrderedDict
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
numpy = pytest.importorskip("numpy")

from hotswap.train import files  # noqa: E402
from hotswap.train.torch import tensorfiles  # noqa: E402
from hotswap.train.torch.checkpointer import Checkpointer  # noqa: E402
from hotswap.train.torch.codec import CheckpointFormatError, decode, encode  # noqa: E402
from hotswap.train.events import EventLog  # noqa: E402
from hotswap.train.torch.staging import HostQueue, Staging  # noqa: E402
from hotswap.train.torch.store import MARKER_FILE, CheckpointStore  # noqa: E402


def same(a: Any, b: Any) -> bool:
    """Equal values of the same types, all the way down (tensors: dtype, shape and bytes)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(tensor_bytes(a), tensor_bytes(b))
    if isinstance(a, numpy.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a) and getattr(a, "_metadata", None) == getattr(b, "_metadata", None)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    return a == b


def tensor_bytes(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().contiguous().reshape(-1).view(torch.uint8)


def every_kind_of_value() -> dict[str, Any]:
    shared = torch.arange(4.0)
    ordered = OrderedDict([("weight", torch.ones(2, 2)), ("bias", torch.zeros(2))])
    ordered._metadata = OrderedDict([("", {"version": 2})])  # type: ignore[attr-defined]
    return {
        "format": 1,
        "scalars": [None, True, 0, -(2**70), 1.5, float("inf"), float("-inf"), float("nan"), "text", b"\x00\xff"],
        "containers": ((1, 2), {3, 1}, frozenset({"a"}), {1: "int key", (2, 3): "tuple key", None: 0}, complex(1, -2)),
        "state_dict": ordered,
        "shared": [shared, shared],
        "dtypes": {
            str(dtype): torch.arange(6).to(dtype) if dtype != torch.bool else torch.tensor([True, False])
            for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.int8, torch.int64, torch.uint8, torch.bool, torch.complex64)
        },
        "odd_tensors": [torch.tensor(3.0), torch.empty(0, 5), torch.arange(12.0).reshape(3, 4).t()],
        "numpy": [numpy.arange(5, dtype=numpy.uint32), numpy.float64(2.5), numpy.int64(-3), numpy.zeros((2, 0)), numpy.bool_(True)],
        "torch_values": [torch.float16, torch.device("cpu"), torch.Size([2, 3])],
    }


# The codec ---------------------------------------------------------------------------------------


def test_every_supported_value_round_trips_through_json() -> None:
    tree = every_kind_of_value()
    encoded = encode(tree)
    document = json.loads(json.dumps(encoded.document, allow_nan=False))
    copies = [torch.empty_like(a).copy_(a) if isinstance(a, torch.Tensor) else a.copy() for a in encoded.arrays]
    restored = decode(document, copies)
    assert same(restored, tree)
    assert restored["shared"][0] is restored["shared"][1]  # one array, referred to twice
    assert restored["state_dict"]._metadata == {"": {"version": 2}}


class Opaque:
    pass


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: {"objects": {"fn": len}}, r"the state\['objects'\]\['fn'\]: a builtins.builtin_function_or_method is not plain"),
        (lambda: {"a": [1, Opaque()]}, r"the state\['a'\]\[1\]: a test_train_tensorfiles.Opaque is not plain data"),
        (lambda: {"a": numpy.array([object()])}, r"the state\['a'\]: numpy values of dtype object"),
        (lambda: {"s": torch.eye(3).to_sparse()}, r"the state\['s'\]: a torch.sparse_coo tensor"),
        (lambda: {"q": torch.quantize_per_tensor(torch.ones(2), 0.1, 0, torch.qint8)}, r"the state\['q'\]: tensors of dtype torch.qint8"),
    ],
)
def test_values_that_are_not_plain_data_are_refused_with_their_path(make: Any, message: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # quantized tensors are deprecated
        tree = make()
    with pytest.raises(TypeError, match="^cannot checkpoint " + message):
        encode(tree)


def test_a_document_nested_too_deeply_is_a_format_error() -> None:
    document: Any = 1
    for _ in range(5000):
        document = [document]
    with pytest.raises(CheckpointFormatError, match="nested too deeply"):
        decode(document, [])


def test_a_tree_that_contains_itself_is_refused() -> None:
    loop: list[Any] = [1]
    loop.append(loop)
    with pytest.raises(TypeError, match=r"cannot checkpoint the state\[1\]: it contains itself"):
        encode(loop)


def plain_containers(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    keys = st.text(max_size=3) | st.integers()
    return st.lists(inner, max_size=4) | st.tuples(inner, inner) | st.dictionaries(keys, inner, max_size=4)


plain = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5) | st.binary(max_size=5),
    plain_containers,
    max_leaves=20,
)


@settings(max_examples=200, deadline=None)
@given(plain)
def test_plain_data_round_trips_exactly(tree: Any) -> None:
    encoded = encode(tree)
    assert encoded.arrays == []
    assert same(decode(json.loads(json.dumps(encoded.document, allow_nan=False)), []), tree)


TAGS = ["dict", "tuple", "set", "frozenset", "float", "bytes", "complex", "tensor", "ndarray", "npscalar", "dtype", "device", "size", "nope"]


def json_containers(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """JSON arrays and objects, many of them shaped like the codec's tagged values."""
    keys = st.sampled_from(["t", "v", "i", "ordered", "meta", "x"])
    tagged = st.fixed_dictionaries({"t": st.sampled_from(TAGS), "v": inner}, optional={"i": inner, "ordered": inner, "meta": inner})
    return st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=4) | tagged


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=6),
    json_containers,
    max_leaves=25,
)


@settings(max_examples=400, deadline=None)
@given(json_values)
def test_decoding_any_document_gives_a_tree_or_a_format_error(document: Any) -> None:
    """Whatever a checkpoint's index holds, decoding it builds plain values or says it is malformed."""
    try:
        decode(document, [torch.zeros(1), numpy.zeros(())])
    except CheckpointFormatError:
        pass


# Tensor files -----------------------------------------------------------------------------------


def test_the_checksum_is_zlibs_crc32_whichever_implementation_computes_it() -> None:
    """isal's CRC-32 is used when installed: files must check the same either way."""
    data = bytes(range(256)) * 1000
    assert files.crc32(data, 0) == zlib.crc32(data)
    assert files.crc32(memoryview(data)[500:], files.crc32(data[:500], 0)) == zlib.crc32(data)



@pytest.fixture
def small_files(monkeypatch: pytest.MonkeyPatch) -> None:
    """Files of a few hundred bytes, so that a small state spans several files and chunks."""
    monkeypatch.setattr(tensorfiles, "MIN_FILE_BYTES", 64)
    monkeypatch.setattr(tensorfiles, "CHUNK_BYTES", 48)


def checkpointer(directory: Path, threads: int = 3) -> Checkpointer:
    return Checkpointer(CheckpointStore(directory), EventLog(None), threads=threads)


def test_a_state_split_over_several_files_round_trips(tmp_path: Path, small_files: None) -> None:
    tree = every_kind_of_value()
    info = checkpointer(tmp_path).save(7, tree, "periodic")
    assert sorted(info.files) == ["index.json", "tensors-0.bin", "tensors-1.bin", "tensors-2.bin"]
    sizes = [info.files[f"tensors-{i}.bin"].size for i in range(3)]
    assert max(sizes) - min(sizes) <= 1  # equal shares, whatever the tensor sizes
    restored, _ = checkpointer(tmp_path, threads=2).restore_latest()
    assert same(restored, tree)


def test_a_damaged_data_file_is_named_and_the_older_checkpoint_restored(
    tmp_path: Path, small_files: None, caplog: pytest.LogCaptureFixture
) -> None:
    saver = checkpointer(tmp_path)
    saver.save(1, {"format": 1, "w": torch.zeros(100)}, "periodic")
    info = saver.save(2, {"format": 1, "w": torch.ones(100)}, "periodic")
    damaged = info.path / "tensors-1.bin"
    data = bytearray(damaged.read_bytes())
    data[3] ^= 0x01
    damaged.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="hotswap.train"):
        restored, found = saver.restore_latest()
    assert found.step == 1 and torch.equal(restored["w"], torch.zeros(100))
    assert f"{info.path}: its file tensors-1.bin does not match the checksum in its marker" in caplog.text


def rewrite_index(path: Path, change: Any) -> None:
    """Change a committed checkpoint's index and make its marker agree (as whoever can write
    the directory could)."""
    index = json.loads((path / "index.json").read_text())
    change(index)
    data = json.dumps(index).encode()
    (path / "index.json").write_bytes(data)
    marker = json.loads((path / MARKER_FILE).read_text())
    marker["files"]["index.json"] = {"size": len(data), "crc32": zlib.crc32(data)}
    (path / MARKER_FILE).write_text(json.dumps(marker))


@pytest.mark.parametrize(
    ("change", "complaint"),
    [
        (lambda index: index["arrays"][0].update(shape=[10**12]), "its arrays need"),
        (lambda index: index["arrays"][0].update(dtype="object"), "unknown tensor dtype 'object'"),
        (lambda index: index["files"][0].update(name="../../etc/passwd"), "names an unexpected data file"),
        (lambda index: index.update(tree={"t": "tensor", "i": 5}), "bad array reference"),
        (lambda index: index.update(tree={"t": "pickle", "v": "gASV"}), "unknown tag 'pickle'"),
        (lambda index: index.update(format=1), "is not a format 2 index"),
    ],
)
def test_an_index_that_this_release_did_not_write_is_refused(
    tmp_path: Path, change: Any, complaint: str, caplog: pytest.LogCaptureFixture
) -> None:
    saver = checkpointer(tmp_path)
    saver.save(1, {"format": 1, "w": torch.zeros(3)}, "periodic")
    info = saver.save(2, {"format": 1, "w": torch.ones(3)}, "periodic")
    rewrite_index(info.path, change)
    with caplog.at_level(logging.WARNING, logger="hotswap.train"):
        _, found = saver.restore_latest()
    assert found.step == 1
    assert f"damaged checkpoint {info.path}: it cannot be loaded" in caplog.text and complaint in caplog.text
    assert not info.path.exists() and [p.name[:15] for p in (tmp_path / "damaged").iterdir()] == ["step-0000000002"]


def test_a_data_file_of_the_wrong_size_is_skipped(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    saver = checkpointer(tmp_path)
    saver.save(1, {"format": 1, "w": torch.zeros(3)}, "periodic")
    info = saver.save(2, {"format": 1, "w": torch.ones(3)}, "periodic")
    with open(info.path / "tensors-0.bin", "ab") as handle:
        handle.write(b"more")
    with caplog.at_level(logging.WARNING, logger="hotswap.train"):
        assert saver.restore_latest()[1].step == 1
    assert "its file tensors-0.bin has 16 bytes, the marker says 12" in caplog.text


# Staging (the GPU path's double buffering, with host buffers) ------------------------------------


ON_A_GPU = pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")])


@pytest.mark.parametrize("device", ["cpu", ON_A_GPU])
@pytest.mark.parametrize("chunk", [1, 3, 8, 64, 4099])
def test_staging_moves_every_byte_in_order_whatever_the_chunk(device: str, chunk: int) -> None:
    generator = torch.Generator().manual_seed(chunk)
    host = [torch.randint(0, 256, (n,), dtype=torch.uint8, generator=generator) for n in (0, 1, 7, 64, 3, 129, 0, 9000)]
    pieces = [piece.to(device) for piece in host]
    if device == "cpu":
        staging = Staging(HostQueue(), [torch.empty(chunk, dtype=torch.uint8) for _ in range(2)])
    else:
        staging = Staging.for_cuda(torch.device("cuda", torch.cuda.current_device()), chunk)
        pieces[3] = host[3]  # a host piece among device ones, as a CPU step count among GPU moments
    written = bytearray()
    staging.write_from(pieces, lambda view: written.extend(view))
    expected = b"".join(piece.numpy().tobytes() for piece in host)
    assert bytes(written) == expected

    targets = [torch.zeros_like(piece) for piece in pieces]
    stream = memoryview(expected)

    def read(view: memoryview) -> None:
        nonlocal stream
        assert len(view) <= chunk
        view[:] = stream[: len(view)]
        stream = stream[len(view) :]

    staging.read_into(targets, read)
    assert all(torch.equal(a.cpu(), b) for a, b in zip(targets, host, strict=True)) and not stream



class _SeemsOnGpu(torch.Tensor):
    """A CPU tensor that says it lives on a CUDA GPU (``is_cuda``), as a GPU parameter does:
    what a checkpoint records of where a tensor lived is checked without a GPU."""

    @property
    def is_cuda(self) -> bool:  # type: ignore[override]
        return True


def test_an_asynchronous_save_records_where_each_tensor_lived_not_its_host_copy(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 24 item 4: an asynchronous save copies GPU tensors to host buffers before writing;
    its index must still say "cuda" for them, as a synchronous save's does, or a restore puts
    the GPU state on the CPU. Restored on a machine without a GPU, they come back on the CPU
    with one warning naming the checkpoint. (The GPU test of the same is in
    test_train_checkpoint_gpu.py.)"""
    from hotswap.train.torch import snapshot
    from hotswap.train.torch.codec import spec_of

    weight = torch.arange(12.0).reshape(3, 4)
    real_encode = snapshot.encode

    def encode_with_weight_on_the_gpu(tree: Any) -> Any:  # what encode gives for a GPU weight
        encoded = real_encode(tree)
        encoded.arrays = [a.as_subclass(_SeemsOnGpu) if a is weight else a for a in encoded.arrays]
        return encoded

    monkeypatch.setattr(snapshot, "encode", encode_with_weight_on_the_gpu)
    tree = {"weight": weight, "count": torch.tensor([7]), "rng": numpy.arange(3, dtype=numpy.uint8)}
    saver = checkpointer(tmp_path)
    saver.save_async(5, tree, "periodic")
    info = saver.wait()
    assert info is not None
    index = json.loads((info.path / tensorfiles.INDEX_FILE).read_text())
    assert spec_of(weight.as_subclass(_SeemsOnGpu)).device == "cuda"  # the synchronous save's record
    assert [entry["device"] for entry in index["arrays"]] == ["cuda", "cpu", "cpu"]
    if torch.cuda.is_available():
        return  # restored to the GPU there: test_train_checkpoint_gpu.py
    with caplog.at_level(logging.WARNING, logger="hotswap.train"):
        restored = tensorfiles.TensorFiles(2).read(info.path, info.files)
    assert restored["weight"].device.type == "cpu" and torch.equal(restored["weight"], weight)
    said = [r.getMessage() for r in caplog.records if "no GPU" in r.getMessage()]
    assert len(said) == 1 and "step-0000000005" in said[0] and "restored on the CPU" in said[0], said
