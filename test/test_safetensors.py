"""safetensors files: what lazygrad writes the safetensors library reads and the other way round (float64
included), files that break the format's rules are errors naming the tensor and the rule, and loading reads each
tensor straight into its buffer."""

import json
import re
import struct
import tracemalloc

import numpy as np
import pytest

from lazygrad import Device, Tensor, dtypes
from lazygrad.helpers import MOCKCUDA
from lazygrad.nn.state import safe_load, safe_save

ARRAYS = {
    "f64": np.array([1e300, 1 + 2**-52, -0.0, 5e-324]),
    "f32": np.arange(12, dtype=np.float32).reshape(3, 4) / 7,
    "f16": np.array([1.5, -65504, 0.0009765625], np.float16),
    "i64": np.array([2**62, -(2**63)], np.int64),
    "i32": np.array([[-(2**31), 2**31 - 1]], np.int32),
    "u32": np.array([2**32 - 1, 0], np.uint32),
    "bool": np.array([True, False, True]),
    "scalar": np.array(2.5, np.float32),
    "empty": np.zeros((0, 3), np.float32),
}
DTYPES = {
    "f64": dtypes.float64,
    "f32": dtypes.float32,
    "f16": dtypes.float16,
    "i64": dtypes.int64,
    "i32": dtypes.int32,
    "u32": dtypes.uint32,
    "bool": dtypes.bool,
    "scalar": dtypes.float32,
    "empty": dtypes.float32,
}


@pytest.fixture
def safetensors():
    pytest.importorskip("safetensors")
    import safetensors.numpy

    return safetensors


def test_files_of_the_safetensors_library_load_with_their_dtypes(safetensors, tmp_path):
    path = str(tmp_path / "theirs.safetensors")
    safetensors.numpy.save_file(ARRAYS, path, metadata={"source": "numpy"})
    loaded = safe_load(path)
    assert list(loaded) == list(safetensors.numpy.load_file(path))
    for name, array in ARRAYS.items():
        assert loaded[name].dtype == DTYPES[name], name
        assert loaded[name].shape == array.shape, name
        np.testing.assert_array_equal(loaded[name].numpy(), array, err_msg=name)
    # float64 stays float64: 1e300 is not inf, 1 + 2**-52 is not 1, and it computes in float64
    np.testing.assert_array_equal((loaded["f64"] * 2).numpy(), ARRAYS["f64"] * 2)


def test_files_lazygrad_writes_load_in_the_safetensors_library(safetensors, tmp_path):
    path = str(tmp_path / "ours.safetensors")
    tensors = {name: Tensor(array, dtype=DTYPES[name]) for name, array in ARRAYS.items()}
    tensors["lazy"] = Tensor(ARRAYS["f64"], dtype=dtypes.float64) * 3
    safe_save(tensors, path, metadata={"who": "lazygrad"})
    theirs = safetensors.numpy.load_file(path)
    for name, array in ARRAYS.items():
        assert theirs[name].dtype == array.dtype, name
        np.testing.assert_array_equal(theirs[name], array, err_msg=name)
    np.testing.assert_array_equal(theirs["lazy"], ARRAYS["f64"] * 3)
    with safetensors.safe_open(path, "np") as file:
        assert file.metadata() == {"who": "lazygrad"}
    ours = safe_load(path)
    for name in tensors:
        np.testing.assert_array_equal(ours[name].numpy(), theirs[name], err_msg=name)


def test_loading_reads_each_tensor_straight_into_its_buffer(tmp_path):
    # 8 MB in sizes no other test uses, so no buffer comes from the memory of dead ones
    arrays = {f"w{number}": np.full(262_147 + number, number, np.float32) for number in range(8)}
    header, offset = {}, 0
    for name, array in arrays.items():
        header[name] = entry(shape=array.shape, offsets=(offset, offset + array.nbytes))
        offset += array.nbytes
    path = write(tmp_path / "eight.safetensors", header, b"".join(array.tobytes() for array in arrays.values()))
    Tensor([1.0]).numpy()  # the device is up
    tracemalloc.start()
    try:
        loaded = safe_load(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # host memory holds the buffers themselves and little else (reading the file whole, or copying each tensor, would
    # double it); a device with memory of its own stages one tensor at a time, so the largest is the least seen —
    # except a real GPU's, whose memory and pinned staging buffers the driver allocates, out of tracemalloc's sight
    assert peak < offset * 1.25
    if Device.DEFAULT != "CUDA" or MOCKCUDA:
        assert max(array.nbytes for array in arrays.values()) <= peak
    for name, array in arrays.items():
        np.testing.assert_array_equal(loaded[name].numpy(), array)


def test_a_device_without_float64_names_the_tensor(tmp_path, monkeypatch):
    path = str(tmp_path / "doubles.safetensors")
    safe_save({"weights": Tensor(ARRAYS["f64"], dtype=dtypes.float64)}, path)
    monkeypatch.setattr(Device[Device.DEFAULT], "unsupported_dtypes", {dtypes.float64: "no doubles"})
    with pytest.raises(TypeError) as error:
        safe_load(path)
    assert str(error.value) == (
        f"safe_load: tensor 'weights' in {path} is dtypes.float64, which {Device.DEFAULT} cannot compute in "
        "(no doubles); load it on another device (device=...) and cast it"
    )


# ---- files that break the format's rules ---------------------------------------------------------------------------


def write(path, header, data: bytes = b"", length: int | None = None) -> str:
    """A safetensors file by hand: the header (an object to encode, or raw bytes), its length, the data."""
    text = header if isinstance(header, bytes) else json.dumps(header).encode()
    with open(path, "wb") as file:
        file.write(struct.pack("<Q", len(text) if length is None else length) + text + data)
    return str(path)


def entry(dtype="F32", shape=(2,), offsets=(0, 8)) -> dict:
    return {"dtype": dtype, "shape": list(shape), "data_offsets": list(offsets)}


MALFORMED = {
    "too_short": (b"", None, None, ValueError, "safe_load: {path} has 0 bytes, too few for the 8-byte header length"),
    "header_beyond_file": (
        {"a": entry()},
        bytes(8),
        10**6,
        ValueError,
        "safe_load: {path} says its header has 1000000 bytes, but the file has 69 after the length",
    ),
    "huge_header_length": (
        {"a": entry()},
        bytes(8),
        2**63,
        ValueError,
        "safe_load: {path} says its header has 9223372036854775808 bytes",
    ),
    "not_utf8": (b"\xff\xfe{}", b"", None, ValueError, "safe_load: the header of {path} is not UTF-8 text"),
    "not_json": (b"{'a': 1}", b"", None, ValueError, "safe_load: the header of {path} is not valid JSON"),
    "not_an_object": (
        [1, 2],
        b"",
        None,
        ValueError,
        "safe_load: the header of {path} must be a JSON object, not a list",
    ),
    "duplicate_key": (
        b'{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, '
        b'"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}',
        bytes(8),
        None,
        ValueError,
        "safe_load: {path} names 'a' twice in its header",
    ),
    "metadata_not_strings": (
        {"__metadata__": {"epochs": 3}, "a": entry()},
        bytes(8),
        None,
        ValueError,
        "safe_load: __metadata__ in {path} must map strings to strings, got {{'epochs': 3}}",
    ),
    "metadata_not_a_map": (
        {"__metadata__": ["x"]},
        b"",
        None,
        ValueError,
        "safe_load: __metadata__ in {path} must map strings to strings, got ['x']",
    ),
    "entry_missing_a_key": (
        {"a": {"dtype": "F32", "shape": [2]}},
        bytes(8),
        None,
        ValueError,
        "safe_load: tensor 'a' in {path} must have exactly dtype, shape and data_offsets, got",
    ),
    "entry_not_an_object": (
        {"a": [0, 8]},
        bytes(8),
        None,
        ValueError,
        "safe_load: tensor 'a' in {path} must have exactly dtype, shape and data_offsets, got [0, 8]",
    ),
    "unknown_dtype": (
        {"a": entry(dtype="F8_E4M3", offsets=(0, 4))},
        bytes(4),
        None,
        TypeError,
        "safe_load: tensor 'a' in {path} has dtype 'F8_E4M3', which lazygrad does not read (it reads F64, F32, F16, "
        "BF16, I64, U64, I32, U32, I16, U16, I8, U8, BOOL)",
    ),
    "negative_shape": (
        {"a": entry(shape=(-1,))},
        bytes(8),
        None,
        ValueError,
        "safe_load: tensor 'a' in {path} has shape [-1]; a shape is a list of non-negative ints",
    ),
    "float_shape": (
        {"a": entry(shape=(2.0,))},
        bytes(8),
        None,
        ValueError,
        "safe_load: tensor 'a' in {path} has shape [2.0]; a shape is a list of non-negative ints",
    ),
    "negative_offset": (
        {"a": entry(offsets=(-8, 0))},
        bytes(8),
        None,
        ValueError,
        "safe_load: tensor 'a' in {path} has data_offsets [-8, 0]; they are two non-negative ints [start, end]",
    ),
    "three_offsets": (
        {"a": entry(offsets=(0, 4, 8))},
        bytes(8),
        None,
        ValueError,
        "safe_load: tensor 'a' in {path} has data_offsets [0, 4, 8]; they are two non-negative ints [start, end]",
    ),
    "offsets_past_the_data": (
        {"a": entry(offsets=(0, 8))},
        bytes(4),
        None,
        ValueError,
        "safe_load: tensor 'a' in {path} has data_offsets [0, 8], outside the 4 bytes of data (or end before start)",
    ),
    "end_before_start": (
        {"a": entry(shape=(0,), offsets=(8, 4))},
        bytes(8),
        None,
        ValueError,
        "safe_load: tensor 'a' in {path} has data_offsets [8, 4], outside the 8 bytes of data (or end before start)",
    ),
    "size_not_the_shape": (
        {"a": entry(shape=(3,), offsets=(0, 8))},
        bytes(8),
        None,
        ValueError,
        "safe_load: tensor 'a' in {path}: shape [3] of F32 takes 12 bytes, but data_offsets [0, 8] hold 8",
    ),
    "overlap": (
        {"a": entry(offsets=(0, 8)), "b": entry(offsets=(4, 12))},
        bytes(12),
        None,
        ValueError,
        "safe_load: tensor 'b' in {path} (bytes 4..12) overlaps tensor 'a' (bytes 0..8)",
    ),
    "same_bytes_twice": (
        {"a": entry(offsets=(0, 8)), "b": entry(offsets=(0, 8))},
        bytes(8),
        None,
        ValueError,
        "safe_load: tensor 'b' in {path} (bytes 0..8) overlaps tensor 'a' (bytes 0..8)",
    ),
    "gap": (
        {"a": entry(offsets=(0, 8)), "b": entry(offsets=(12, 20))},
        bytes(20),
        None,
        ValueError,
        "safe_load: bytes 8..12 of the data in {path}, before tensor 'b', belong to no tensor",
    ),
    "data_left_over": (
        {"a": entry(offsets=(0, 8))},
        bytes(16),
        None,
        ValueError,
        "safe_load: the tensors in {path} cover 8 bytes of data, but it holds 16 after the header",
    ),
}


@pytest.mark.parametrize("case", MALFORMED)
def test_malformed_files_are_errors_naming_the_problem(case, tmp_path):
    header, data, length, error_type, message = MALFORMED[case]
    path = str(tmp_path / f"{case}.safetensors")
    if case == "too_short":
        open(path, "wb").close()
    else:
        write(path, header, data, length)
    with pytest.raises(error_type, match="^" + re.escape(message.format(path=path))):
        safe_load(path)


def test_well_formed_edge_cases_load(tmp_path):
    # tensors listed out of offset order, empty tensors at any offset, no metadata, null metadata
    header = {
        "__metadata__": None,
        "late": entry(offsets=(8, 16)),
        "empty": entry(shape=(0, 5), offsets=(8, 8)),
        "early": entry(offsets=(0, 8)),
        "scalar": entry(dtype="I32", shape=(), offsets=(16, 20)),
    }
    data = np.array([1, 2, 3, 4], np.float32).tobytes() + np.array([-7], np.int32).tobytes()
    loaded = safe_load(write(tmp_path / "edge.safetensors", header, data))
    assert list(loaded) == ["late", "empty", "early", "scalar"]
    np.testing.assert_array_equal(loaded["early"].numpy(), [1, 2])
    np.testing.assert_array_equal(loaded["late"].numpy(), [3, 4])
    assert loaded["empty"].shape == (0, 5) and loaded["scalar"].item() == -7


def test_saving_metadata_that_is_not_strings_is_an_error(tmp_path):
    with pytest.raises(TypeError) as error:
        safe_save({"a": Tensor([1.0])}, str(tmp_path / "meta.safetensors"), metadata={"epochs": 3})
    assert (
        str(error.value)
        == "safe_save: metadata must map strings to strings (as safetensors requires), got {'epochs': 3}"
    )


def test_a_tensor_named_like_the_metadata_is_refused(tmp_path):
    # (the file would be written, and then refused by every reader: the name is the header's metadata entry)
    with pytest.raises(ValueError, match="the name __metadata__ is safetensors' own"):
        safe_save({"__metadata__": Tensor([1.0])}, str(tmp_path / "named.safetensors"))
    assert not (tmp_path / "named.safetensors").exists()
