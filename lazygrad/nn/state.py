"""Model state: finding parameters, state dicts, safetensors files (readable by the `safetensors` library; files
that break the format's rules are rejected, naming the tensor and the rule) and PyTorch `.pth` checkpoints (read
without torch, through an unpickler that builds only tensors and containers)."""

from __future__ import annotations

import json
import os
import pickle
import struct
import sys
import types
import zipfile
from dataclasses import dataclass
from typing import Any

import numpy as np

from lazygrad.device import Device
from lazygrad.dtype import DType, bfloat16_bits, data_to_numpy, dtypes
from lazygrad.engine.buffers import buffer_of, new_buffer
from lazygrad.helpers import prod
from lazygrad.tensor import Tensor
from lazygrad.uop.ops import Ops, UOp

SAFETENSORS_DTYPES = {
    dtypes.float64: "F64",
    dtypes.float32: "F32",
    dtypes.float16: "F16",
    dtypes.bfloat16: "BF16",
    dtypes.int64: "I64",
    dtypes.uint64: "U64",
    dtypes.int32: "I32",
    dtypes.uint32: "U32",
    dtypes.int16: "I16",
    dtypes.uint16: "U16",
    dtypes.int8: "I8",
    dtypes.uint8: "U8",
    dtypes.bool: "BOOL",
}
FROM_SAFETENSORS = {name: dtype for dtype, name in SAFETENSORS_DTYPES.items()}
# the safetensors library's own bound on the header's length
MAX_HEADER_SIZE = 100_000_000


def _members(obj: Any) -> Any:
    """(name, value) of what `obj` holds: a dict's items, a list's or tuple's (a namedtuple's by field), attributes
    (an object with an `_asdict` method gives that dict: a namedtuple, an optimizer). A class or a module holds no
    model state: a model that keeps one (a namedtuple class for its outputs, `self.np = np`) is not walked into it."""
    if isinstance(obj, (type, types.ModuleType)):
        return ()
    if hasattr(obj, "_asdict"):
        obj = obj._asdict()
    if isinstance(obj, dict):
        return obj.items()
    if isinstance(obj, (list, tuple)):
        return enumerate(obj)
    members = dict(vars(obj)) if hasattr(obj, "__dict__") else {}
    for klass in type(obj).__mro__:  # (a class with __slots__ keeps its attributes there)
        for name in getattr(klass, "__slots__", ()):
            if name not in ("__dict__", "__weakref__") and hasattr(obj, name):
                members.setdefault(name, getattr(obj, name))
    return members.items()


def get_state_dict(obj: Any, prefix: str = "", _above: frozenset[int] = frozenset()) -> dict[str, Tensor]:
    """Every Tensor reachable from `obj` through attributes (slots too), lists, tuples and dicts, by dotted name; a
    reference back to an object that holds this one (a layer's `parent`) is not followed."""
    if isinstance(obj, Tensor):
        return {prefix.strip("."): obj}
    if id(obj) in _above:
        return {}
    state: dict[str, Tensor] = {}
    for key, value in _members(obj):
        state.update(get_state_dict(value, f"{prefix}{key}.", _above | {id(obj)}))
    return state


def _tell_loaded(obj: Any, _above: frozenset[int] = frozenset()) -> None:
    """Call `state_loaded()` on each object reachable from `obj` that has one (an optimizer keeps facts about its
    state on the host, which a load may change)."""
    if isinstance(obj, Tensor) or id(obj) in _above:
        return
    if callable(getattr(obj, "state_loaded", None)):
        obj.state_loaded()
    for _, value in _members(obj):
        _tell_loaded(value, _above | {id(obj)})


def _tell_loading(obj: Any, state: dict[str, Any], prefix: str = "", _above: frozenset[int] = frozenset()) -> None:
    """Call `state_loading(state)` on each object reachable from `obj` that has one, with the state under its dotted
    prefix (an optimizer makes the state a checkpoint holds for a parameter that is still frozen)."""
    if isinstance(obj, Tensor) or id(obj) in _above:
        return
    if callable(getattr(obj, "state_loading", None)):
        obj.state_loading({key[len(prefix) :]: value for key, value in state.items() if key.startswith(prefix)})
    for key, value in _members(obj):
        _tell_loading(value, state, f"{prefix}{key}.", _above | {id(obj)})


def _ignored_keys(obj: Any, keys: list[str], prefix: str = "", _above: frozenset[int] = frozenset()) -> set[str]:
    """The keys among `keys` that an object reachable from `obj` (at its dotted prefix) says to skip with its
    `_ignores_state_key` (an optimizer: the parameters its checkpoints held before)."""
    if isinstance(obj, Tensor) or id(obj) in _above:
        return set()
    ignored = set()
    if callable(getattr(obj, "_ignores_state_key", None)):
        ignored = {key for key in keys if key.startswith(prefix) and obj._ignores_state_key(key[len(prefix) :])}
    for key, value in _members(obj):
        ignored |= _ignored_keys(value, keys, f"{prefix}{key}.", _above | {id(obj)})
    return ignored


def get_parameters(obj: Any) -> list[Tensor]:
    """The tensors of `obj`'s state dict, each once."""
    unique: dict[int, Tensor] = {}
    for tensor in get_state_dict(obj).values():
        unique.setdefault(id(tensor), tensor)
    return list(unique.values())


class StateDictError(KeyError, ValueError):
    """A state dict that does not fit the model: missing or unexpected keys (a KeyError) or shapes that differ (a
    ValueError)."""

    def __str__(self) -> str:
        return str(self.args[0])


def load_state_dict(model: Any, state_dict: dict[str, Tensor], strict: bool = True) -> None:
    """Copy `state_dict` into the model's tensors (in place), casting to each tensor's dtype and device. With
    `strict`, keys the model has and the state dict lacks (missing) or the other way round (unexpected) are an
    error; shapes must always match. One error names every such key. Every value is converted and checked before
    the first is copied, so a load that fails leaves the model as it was; an error about a value names its key.
    An optimizer's checkpoint written when its state dict also held the parameters (`params.N`, `buffers.N`) loads
    without them: the model's weights stay as they are."""
    if not isinstance(state_dict, dict):
        raise TypeError(f"load_state_dict: expected a dict of tensors, got {type(state_dict).__name__}")
    _tell_loading(model, state_dict)
    own = get_state_dict(model)
    missing = sorted(set(own) - set(state_dict))
    unexpected = sorted(set(state_dict) - set(own))
    if unexpected:
        ignored = _ignored_keys(model, unexpected)
        unexpected = [key for key in unexpected if key not in ignored]
    mismatched = [
        f"{name}: {shape} in the state dict, {own[name].shape} in the model"
        for name in own
        if name in state_dict and not _shapes_agree(shape := _value_shape(name, state_dict[name]), own[name].shape)
    ]
    problems = []
    if strict and missing:
        problems.append(f"missing keys {missing}")
    if strict and unexpected:
        problems.append(f"unexpected keys {unexpected}")
    if mismatched:
        problems.append(f"shape mismatches [{'; '.join(mismatched)}]")
    if problems:
        fix = "pass strict=False to skip missing and unexpected keys; " if strict and (missing or unexpected) else ""
        raise StateDictError(f"load_state_dict: {', '.join(problems)}; {fix}shapes must always match")
    # every value converted and checked first (an error names its key), so a load that fails changes nothing; arrays
    # become device tensors one at a time, as each is copied in (no second copy of the whole model at once)
    values = {name: _loadable(name, state_dict[name], tensor) for name, tensor in own.items() if name in state_dict}
    for name in values:  # (a view of another tensor cannot be written: found before anything is)
        own[name]._check_writable(f"load_state_dict ({name!r})")
    for name, value in values.items():
        tensor = own[name]
        if not isinstance(value, Tensor):
            value = Tensor(value, dtype=tensor.dtype, device=tensor.device).reshape(tensor.shape)
        tensor.assign(value).realize()
    _tell_loaded(model)


def _loadable(name: str, value: Any, tensor: Tensor) -> Tensor | np.ndarray:
    """`value` (a Tensor, a torch tensor, a NumPy array, a list, a number) made ready to copy into `tensor`: a Tensor
    as one of its dtype, device and shape; anything else as a NumPy array checked to convert into its dtype. An error
    names the key."""
    try:
        if isinstance(value, Tensor):
            return value.to(tensor.device).cast(tensor.dtype).reshape(tensor.shape)
        if hasattr(value, "detach"):  # a torch tensor (a Parameter too): NumPy takes it detached, without bfloat16
            value = value.detach()
            value = value.float() if str(value.dtype) == "torch.bfloat16" else value
            value = value.numpy(force=True)
        array = np.asarray(value)
        if array.dtype.kind == "c":
            raise TypeError(f"it is {array.dtype}, and lazygrad has no complex numbers (load its real part)")
        data_to_numpy(array, tensor.dtype)  # (what Tensor(array, dtype) checks: numbers that fit the dtype)
        return array
    except (TypeError, ValueError, OverflowError, RuntimeError) as error:
        kind = next(kind for kind in (TypeError, ValueError, OverflowError, RuntimeError) if isinstance(error, kind))
        raise kind(f"load_state_dict: the value of {name!r}: {error}") from error


def _value_shape(name: str, value: Any) -> tuple[int, ...]:
    """The shape of a state dict's value, or an error that names its key (a ragged list, a string, None)."""
    if hasattr(value, "shape") and not isinstance(value, np.ndarray):
        return tuple(value.shape)  # (a Tensor or a torch tensor: not converted here)
    try:
        array = np.asarray(value)
    except ValueError as error:
        raise ValueError(f"load_state_dict: the value of {name!r} is not a rectangular array of numbers: {error}")
    if array.dtype.kind not in "biufc":  # (complex values get their own error, from _loadable)
        got = f"{type(value).__name__} of {array.dtype}" if array.ndim else repr(value)[:80]
        raise TypeError(f"load_state_dict: the value of {name!r} is not numbers, got {got}")
    return array.shape


def _shapes_agree(saved: tuple[int, ...], own: tuple[int, ...]) -> bool:
    """Equal shapes, or one value each way (torch keeps counters such as num_batches_tracked as 0-d tensors)."""
    return saved == own or prod(saved) == prod(own) == 1


def safe_save(tensors: dict[str, Tensor], path: str, metadata: dict[str, str] | None = None) -> None:
    """Write tensors to a safetensors file (each tensor's values are copied out and written one at a time)."""
    if metadata is not None and not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
        raise TypeError(f"safe_save: metadata must map strings to strings (as safetensors requires), got {metadata}")
    header: dict[str, Any] = {"__metadata__": metadata} if metadata else {}
    offset = 0
    for name, tensor in tensors.items():
        if name == "__metadata__":
            raise ValueError(
                "safe_save: the name __metadata__ is safetensors' own (the file's metadata); rename the tensor"
            )
        if not hasattr(tensor, "uop"):
            raise TypeError(
                f"safe_save: {name} is a {type(tensor).__name__}, not a Tensor; save Tensor({name}) instead"
            )
        if tensor.dtype not in SAFETENSORS_DTYPES:
            raise TypeError(f"safe_save: {name} has dtype {tensor.dtype}, which safetensors cannot store")
        size = tensor.numel() * tensor.dtype.itemsize
        header[name] = {
            "dtype": SAFETENSORS_DTYPES[tensor.dtype],
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)
    with open(path, "wb") as file:
        file.write(struct.pack("<Q", len(encoded)))
        file.write(encoded)
        for tensor in tensors.values():
            values = tensor.numpy()  # bfloat16 comes back as float32, exactly: write its bits again
            file.write(np.ascontiguousarray(bfloat16_bits(values) if tensor.dtype == dtypes.bfloat16 else values).data)


def safe_load(path: str, device: str | None = None) -> dict[str, Tensor]:
    """Read a safetensors file into tensors on `device` (by default the default device), each read straight from the
    file into its buffer. A file that breaks the format's rules is an error naming the tensor and the rule; F64
    stays float64."""
    device = Device.canonicalize(device) if device is not None else Device.DEFAULT
    if sys.byteorder != "little":
        raise RuntimeError("safe_load: safetensors files are little-endian, and this machine is not")
    with open(path, "rb") as file:
        file_size = os.fstat(file.fileno()).st_size
        if file_size < 8:
            raise ValueError(f"safe_load: {path} has {file_size} bytes, too few for the 8-byte header length")
        (header_size,) = struct.unpack("<Q", file.read(8))
        if header_size > min(MAX_HEADER_SIZE, file_size - 8):
            raise ValueError(
                f"safe_load: {path} says its header has {header_size} bytes, but the file has {file_size - 8} after "
                f"the length (and headers are at most {MAX_HEADER_SIZE}): not a safetensors file, or a truncated one"
            )
        entries = _read_header(file.read(header_size), file_size - 8 - header_size, path)
        for entry in entries:
            if (reason := Device[device].unsupported_dtypes.get(entry.dtype)) is not None:
                raise TypeError(
                    f"safe_load: tensor {entry.name!r} in {path} is {entry.dtype}, which {device} cannot compute in "
                    f"({reason}); load it on another device (device=...) and cast it"
                )
        loaded = {}
        allocator = Device[device].allocator
        for entry in sorted(entries, key=lambda entry: entry.start):  # in file order: one sequential read
            node = new_buffer(device, prod(entry.shape), entry.dtype)
            allocator.readinto(buffer_of(node).handle, file, entry.end - entry.start)
            view = node if entry.shape == (prod(entry.shape),) else UOp(Ops.RESHAPE, entry.dtype, (node,), entry.shape)
            loaded[entry.name] = Tensor(view, device=device)
    return {entry.name: loaded[entry.name] for entry in entries}


@dataclass(frozen=True)
class _Entry:
    """One tensor of a safetensors file: its bytes are [start, end) of the data after the header."""

    name: str
    dtype: DType
    shape: tuple[int, ...]
    start: int
    end: int


def _read_header(text: bytes, data_size: int, path: str) -> list[_Entry]:
    """The tensors a safetensors header describes, in its order, checked against the format's rules: a JSON object
    whose keys are unique; `__metadata__`, if there, a map of strings to strings; every other key a tensor with a
    known dtype, a shape of non-negative ints and data_offsets [start, end] whose length is the shape's bytes; the
    tensors' bytes, in offset order, follow one another without a gap or an overlap and fill the data exactly."""

    def unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise ValueError(f"safe_load: {path} names {key!r} twice in its header")
            seen.add(key)
        return dict(pairs)

    try:
        header = json.loads(text.decode("utf-8"), object_pairs_hook=unique)
    except UnicodeDecodeError:
        raise ValueError(f"safe_load: the header of {path} is not UTF-8 text: not a safetensors file") from None
    except json.JSONDecodeError as error:
        raise ValueError(f"safe_load: the header of {path} is not valid JSON ({error})") from None
    if not isinstance(header, dict):
        raise ValueError(f"safe_load: the header of {path} must be a JSON object, not a {type(header).__name__}")
    metadata = header.pop("__metadata__", None)
    if metadata is not None and (
        not isinstance(metadata, dict) or not all(isinstance(value, str) for value in metadata.values())
    ):
        raise ValueError(f"safe_load: __metadata__ in {path} must map strings to strings, got {str(metadata)[:200]}")
    entries = [_entry(name, info, data_size, path) for name, info in header.items()]
    covered, previous = 0, None
    for entry in sorted(entries, key=lambda entry: (entry.start, entry.end)):
        if entry.start < covered:
            raise ValueError(
                f"safe_load: tensor {entry.name!r} in {path} (bytes {entry.start}..{entry.end}) overlaps tensor "
                f"{previous.name!r} (bytes {previous.start}..{previous.end})"
            )
        if entry.start > covered:
            raise ValueError(
                f"safe_load: bytes {covered}..{entry.start} of the data in {path}, before tensor {entry.name!r}, "
                "belong to no tensor"
            )
        covered, previous = entry.end, entry
    if covered != data_size:
        raise ValueError(
            f"safe_load: the tensors in {path} cover {covered} bytes of data, but it holds {data_size} after the header"
        )
    return entries


def _entry(name: str, info: Any, data_size: int, path: str) -> _Entry:
    """One tensor's entry, checked on its own."""
    where = f"safe_load: tensor {name!r} in {path}"
    if not isinstance(info, dict) or set(info) != {"dtype", "shape", "data_offsets"}:
        raise ValueError(f"{where} must have exactly dtype, shape and data_offsets, got {str(info)[:200]}")
    dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
    if dtype not in FROM_SAFETENSORS:
        raise TypeError(
            f"{where} has dtype {dtype!r}, which lazygrad does not read (it reads {', '.join(FROM_SAFETENSORS)})"
        )
    if not isinstance(shape, list) or not all(_is_count(size) for size in shape):
        raise ValueError(f"{where} has shape {shape}; a shape is a list of non-negative ints")
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_count(offset) for offset in offsets):
        raise ValueError(f"{where} has data_offsets {offsets}; they are two non-negative ints [start, end]")
    start, end = offsets
    if not start <= end <= data_size:
        raise ValueError(
            f"{where} has data_offsets [{start}, {end}], outside the {data_size} bytes of data (or end before start)"
        )
    size = prod(shape) * FROM_SAFETENSORS[dtype].itemsize
    if end - start != size:
        raise ValueError(
            f"{where}: shape {shape} of {dtype} takes {size} bytes, but data_offsets [{start}, {end}] hold {end - start}"
        )
    return _Entry(name, FROM_SAFETENSORS[dtype], tuple(shape), start, end)


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


# ---- PyTorch checkpoints ---------------------------------------------------------------------------------------------

# torch's storage classes (as its pickles name them) and the NumPy dtype of their bytes; bfloat16 is read as the top
# half of a float32
TORCH_STORAGES = {
    "DoubleStorage": np.float64,
    "FloatStorage": np.float32,
    "HalfStorage": np.float16,
    "BFloat16Storage": np.uint16,
    "LongStorage": np.int64,
    "IntStorage": np.int32,
    "ShortStorage": np.int16,
    "CharStorage": np.int8,
    "ByteStorage": np.uint8,
    "BoolStorage": np.bool_,
}
# torch's storage classes of dtypes lazygrad has no dtype for (tensors in them are named in an error, not read)
UNHELD_STORAGES = {
    "ComplexFloatStorage": "complex64",
    "ComplexDoubleStorage": "complex128",
    "QInt8Storage": "qint8",
    "QUInt8Storage": "quint8",
    "QInt32Storage": "qint32",
    "QUInt4x2Storage": "quint4x2",
    "QUInt2x4Storage": "quint2x4",
}
# torch's dtypes by the name its pickles give them (`torch.<name>`): the lazygrad dtype holding each, or, for those
# lazygrad cannot hold, what to save instead. torch writes uint16/32/64, float8 and complex32 tensors as untyped
# bytes with their dtype (_rebuild_tensor_v3), the others in a storage class of their dtype.
_COMPLEX = "lazygrad has no complex numbers; save torch.view_as_real(t), the real and imaginary parts on a last axis"
_FLOAT8 = "lazygrad has no 8- or 4-bit floats; save t.float(), or t.view(torch.uint8) to keep the bits"
_QUANTIZED = "a quantized dtype; save t.dequantize()"
_BITS = "raw bits; save them viewed as an integer dtype of their width (t.view(torch.uint8))"
_SUB_BYTE = "lazygrad has no sub-byte integers; save t.to(torch.int8) or t.to(torch.uint8)"
TORCH_DTYPES: dict[str, DType | str] = {
    "float64": dtypes.float64,
    "float32": dtypes.float32,
    "float16": dtypes.float16,
    "bfloat16": dtypes.bfloat16,
    "int64": dtypes.int64,
    "int32": dtypes.int32,
    "int16": dtypes.int16,
    "int8": dtypes.int8,
    "uint64": dtypes.uint64,
    "uint32": dtypes.uint32,
    "uint16": dtypes.uint16,
    "uint8": dtypes.uint8,
    "bool": dtypes.bool,
    **dict.fromkeys(["complex32", "complex64", "complex128"], _COMPLEX),
    **dict.fromkeys(
        ["float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu", "float4_e2m1fn_x2"],
        _FLOAT8,
    ),
    **dict.fromkeys(["qint8", "quint8", "qint32", "quint4x2", "quint2x4"], _QUANTIZED),
    **dict.fromkeys(["bits1x8", "bits2x4", "bits4x2", "bits8", "bits16"], _BITS),
    **dict.fromkeys([f"{kind}{bits}" for kind in ("int", "uint") for bits in range(1, 8)], _SUB_BYTE),
}
_REBUILDERS = ("_rebuild_tensor_v2", "_rebuild_tensor_v3", "_rebuild_parameter", "_rebuild_parameter_with_state")


@dataclass(frozen=True)
class _StorageType:
    name: str


@dataclass(frozen=True, eq=False)
class _Loaded:
    """A tensor read from a checkpoint: its values and the lazygrad dtype they came in (bfloat16's are float32).
    (Compared and hashed by identity, as torch's tensors are: a pickled set may hold one.)"""

    values: np.ndarray
    dtype: DType


@dataclass(frozen=True, eq=False)
class _Unheld:
    """A tensor (or its storage) of a torch dtype lazygrad cannot hold: named in an error once its key is known."""

    torch_dtype: str


class _Mapping(dict):
    """A loaded OrderedDict: a dict that also takes the attributes torch pickles with a state dict (`_metadata`)."""


def _bytes(text: str = "", encoding: str = "latin1") -> bytes:
    """`bytes` as a protocol-2 pickle writes them: `_codecs.encode(text, "latin1")`, and nothing else of `encode`."""
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise pickle.UnpicklingError(
            f"torch_load: _codecs.encode is loaded only for bytes, got {text!r:.80}, {encoding!r}"
        )
    return text.encode("latin1")


def _bytearray(text: str | bytes = b"", encoding: str = "latin-1") -> bytearray:
    """A bytearray as pickles write it (from its bytes as latin-1 text), never one of a given size."""
    return bytearray(_bytes(text, encoding) if isinstance(text, str) else _checked(text, bytes, "bytearray"))


def _torch_size(sizes: tuple = ()) -> tuple[int, ...]:
    """A torch.Size, as the tuple of ints it is."""
    return tuple(_checked(size, int, "torch.Size") for size in _checked(sizes, (tuple, list), "torch.Size"))


def _torch_device(kind: str, index: int | None = None) -> str:
    """A torch.device, as the string torch prints for it ('cpu', 'cuda:1')."""
    _checked(kind, str, "torch.device")
    return kind if index is None else f"{kind}:{_checked(index, int, 'torch.device')}"


def _checked(value: Any, kind: type | tuple[type, ...], what: str) -> Any:
    """`value`, if it is of the kind torch writes in `what` (an int is not a bool); an error otherwise."""
    if not isinstance(value, kind) or isinstance(value, bool) and kind is int:
        kinds = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
        raise pickle.UnpicklingError(f"torch_load: a pickled {what} holds {value!r:.80}, where torch writes {kinds}")
    return value


# safe builders of the values torch's weights_only loader accepts beside tensors and containers
_VALUES = {
    ("_codecs", "encode"): _bytes,
    ("torch", "Size"): _torch_size,
    ("torch", "device"): _torch_device,
    **{(module, "set"): set for module in ("builtins", "__builtin__")},
    **{(module, "bytearray"): _bytearray for module in ("builtins", "__builtin__")},
    **{(module, "complex"): complex for module in ("builtins", "__builtin__")},
}


class _TensorOnlyUnpickler(pickle.Unpickler):
    """Builds tensors, dicts, lists, tuples, sets, numbers, strings and bytes, and nothing else: a pickle can name any
    function to call, so every other global is refused (loading it would run code the file chose). torch's dtypes,
    devices and sizes become strings and tuples."""

    def __init__(self, file, path: str, read_storage, big_endian: bool):
        super().__init__(file)
        self.path, self.read_storage, self.big_endian = path, read_storage, big_endian

    def find_class(self, module: str, name: str):
        if module == "collections" and name == "OrderedDict":
            return _Mapping
        if module == "torch._utils" and name in _REBUILDERS:
            return getattr(self, name)
        if module == "torch" and (name in TORCH_STORAGES or name in UNHELD_STORAGES):
            return _StorageType(name)
        if module == "torch.storage" and name == "UntypedStorage":
            return _StorageType(name)
        if module == "torch" and name in TORCH_DTYPES:
            return f"torch.{name}"  # (a string, not a callable: a pickle that calls it fails)
        if (module, name) in _VALUES:
            return _VALUES[module, name]
        if module == "torch._utils" and name.startswith("_rebuild_"):
            raise pickle.UnpicklingError(
                f"torch_load: {self.path} holds a tensor that torch rebuilds with torch._utils.{name} (a quantized, "
                "sparse, nested or other special tensor), which lazygrad cannot hold: it holds dense tensors. Save "
                "dense ones (t.dequantize(), t.to_dense())"
            )
        raise pickle.UnpicklingError(
            f"torch_load: {self.path} asks for {module}.{name}, which is not a tensor or a container; only tensors, "
            "dicts, lists, tuples, sets, numbers, strings and bytes are loaded (other objects in a pickle can run "
            "code), so the file is refused. Save a state_dict (model.state_dict()) rather than a whole model"
        )

    def persistent_load(self, pid):
        if not isinstance(pid, tuple) or len(pid) != 5 or pid[0] != "storage" or not isinstance(pid[1], _StorageType):
            raise pickle.UnpicklingError(f"torch_load: {self.path} refers to an unknown kind of storage {pid!r:.200}")
        _, storage_type, key, _location, count = pid
        if storage_type.name in UNHELD_STORAGES:
            return _Unheld(f"torch.{UNHELD_STORAGES[storage_type.name]}")
        if storage_type.name == "UntypedStorage":  # (bytes: the tensor built on them gives their dtype)
            return self.read_storage(str(key), np.uint8, count, "byte")
        values = self.read_storage(str(key), TORCH_STORAGES[storage_type.name], count, storage_type.name)
        return _Loaded(
            values, dtypes.bfloat16 if storage_type.name == "BFloat16Storage" else dtypes.from_numpy(values.dtype)
        )

    def _rebuild_tensor_v2(self, storage, offset, size, stride, requires_grad=False, hooks=None, metadata=None):
        if isinstance(storage, _Unheld):
            return storage
        values = _tensor_from_storage(storage.values, offset, tuple(size), tuple(stride), self.path)
        return _Loaded(values, storage.dtype)

    def _rebuild_tensor_v3(self, storage, offset, size, stride, requires_grad, hooks, dtype, metadata=None):
        """A tensor of a dtype torch keeps no storage class for (uint16/32/64, float8, complex32): untyped bytes."""
        held = TORCH_DTYPES.get(dtype[len("torch.") :]) if isinstance(dtype, str) else None
        if not isinstance(held, DType) or not isinstance(storage, np.ndarray):
            if isinstance(held, str):
                return _Unheld(dtype)
            raise pickle.UnpicklingError(
                f"torch_load: {self.path} describes a tensor of dtype {dtype!r:.80} in a {type(storage).__name__}, "
                "which torch does not write: a corrupt checkpoint"
            )
        order = ">" if self.big_endian else "<"
        elements = storage[: len(storage) // held.itemsize * held.itemsize].view(held.np.newbyteorder(order))
        values = _tensor_from_storage(elements, offset, tuple(size), tuple(stride), self.path)
        if held == dtypes.bfloat16:  # (as a BFloat16Storage is read: the high 16 bits of a float32)
            values = (values.astype(np.uint32) << 16).view(np.float32)
        return _Loaded(values.astype(values.dtype.newbyteorder("=")), held)

    def _rebuild_parameter(self, data, requires_grad=False, hooks=None):
        return data

    def _rebuild_parameter_with_state(self, data, requires_grad=False, hooks=None, state=None):
        return data


def _tensor_from_storage(storage: np.ndarray, offset: int, size: tuple, stride: tuple, path: str) -> np.ndarray:
    """The strided view torch describes, checked to lie inside its storage, copied into its own array."""
    if len(size) != len(stride) or any(s < 0 for s in size) or offset < 0:
        raise ValueError(f"torch_load: {path} describes a tensor with sizes {size}, strides {stride}, offset {offset}")
    last = offset + sum((n - 1) * s for n, s in zip(size, stride)) if all(size) else offset - 1
    if min(stride, default=0) < 0 or last >= len(storage):
        raise ValueError(
            f"torch_load: {path} describes a tensor {size} (strides {stride}, offset {offset}) that reaches past its "
            f"storage of {len(storage)} elements: a corrupt checkpoint"
        )
    itemsize = storage.dtype.itemsize
    view = np.lib.stride_tricks.as_strided(
        storage[offset:], shape=size, strides=tuple(s * itemsize for s in stride), writeable=False
    )
    return np.array(view)


def torch_load(path: str, device: str | None = None) -> Any:
    """Read a PyTorch checkpoint written by `torch.save` (the zip format, torch >= 1.6) without torch: the object
    it holds, with every tensor a lazygrad Tensor on `device`. Every dtype stays what it was; a tensor of a dtype
    lazygrad has none for (complex, float8, quantized) is an error naming its key, its dtype and what to save
    instead. Besides tensors, what torch's own `weights_only` loader takes is loaded: dicts, lists, tuples, sets,
    numbers, strings, bytes, a torch.Size as a tuple of ints, a torch.dtype as its name (the string
    "torch.float32") and a torch.device as its string ("cuda:0"). A pickle that names anything else (a class, a
    function) is refused with an error, since loading it could run code."""
    device = Device.canonicalize(device) if device is not None else Device.DEFAULT
    if not zipfile.is_zipfile(path):
        raise ValueError(
            f"torch_load: {path} is not a zip archive: only torch.save's zip format (the default since torch 1.6) is "
            "read; resave it with a current torch"
        )
    with zipfile.ZipFile(path) as archive:
        names = archive.namelist()
        pickles = [name for name in names if name.endswith("/data.pkl") and name.count("/") == 1]
        if len(pickles) != 1:
            raise ValueError(f"torch_load: {path} has no single <name>/data.pkl: not a torch checkpoint")
        prefix = pickles[0][: -len("data.pkl")]
        big_endian = f"{prefix}byteorder" in names and archive.read(f"{prefix}byteorder").strip() == b"big"
        storages: dict[tuple[str, str], np.ndarray] = {}

        def read_storage(key: str, np_dtype, count: int, kind: str) -> np.ndarray:
            if (key, kind) not in storages:  # (by kind too: tensors of two dtypes may share a storage's bytes)
                entry = f"{prefix}data/{key}"
                if entry not in names:
                    raise ValueError(f"torch_load: {path} refers to storage {key!r}, which the archive lacks")
                raw = archive.read(entry)
                itemsize = np.dtype(np_dtype).itemsize
                if len(raw) < count * itemsize:
                    raise ValueError(
                        f"torch_load: storage {key!r} in {path} holds {len(raw)} bytes, fewer than {count} {kind} "
                        f"elements need ({count * itemsize})"
                    )
                array = np.frombuffer(
                    raw, dtype=np.dtype(np_dtype).newbyteorder(">" if big_endian else "<"), count=count
                )
                if kind == "BFloat16Storage":  # the high 16 bits of a float32
                    array = (array.astype(np.uint32) << 16).view(np.float32)
                storages[key, kind] = array.astype(array.dtype.newbyteorder("="))
            return storages[key, kind]

        with archive.open(pickles[0]) as file:
            loaded = _TensorOnlyUnpickler(file, path, read_storage, big_endian).load()
    return _to_tensors(loaded, device, path)


def _to_tensors(value: Any, device: str, path: str, where: str = "") -> Any:
    """The loaded structure with each loaded array a Tensor in its dtype (`where`: the keys leading to `value`)."""
    if isinstance(value, _Loaded):
        return Tensor(value.values, dtype=value.dtype, device=device)
    if isinstance(value, _Unheld):
        reason = TORCH_DTYPES[value.torch_dtype[len("torch.") :]]
        raise TypeError(
            f"torch_load: the tensor{' at ' + where if where else ''} in {path} is {value.torch_dtype}, which lazygrad "
            f"cannot hold ({reason})"
        )
    if isinstance(value, dict):
        return {key: _to_tensors(item, device, path, f"{where}[{key!r}]") for key, item in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        items = (_to_tensors(item, device, path, f"{where}[{number}]") for number, item in enumerate(value))
        return type(value)(items)
    return value
