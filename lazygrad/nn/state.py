"""Model state: finding parameters, state dicts, and safetensors files (readable by the `safetensors` library)."""

from __future__ import annotations

import json
import struct
from typing import Any

import numpy as np

from lazygrad.dtype import dtypes
from lazygrad.tensor import Tensor

SAFETENSORS_DTYPES = {
    dtypes.float32: "F32",
    dtypes.float16: "F16",
    dtypes.int32: "I32",
    dtypes.bool: "BOOL",
    dtypes.int64: "I64",
    dtypes.uint32: "U32",
}
FROM_SAFETENSORS = {name: dtype for dtype, name in SAFETENSORS_DTYPES.items()} | {"F64": dtypes.float32}


def get_state_dict(obj: Any, prefix: str = "") -> dict[str, Tensor]:
    """Every Tensor reachable from `obj` through attributes, lists, tuples and dicts, by dotted name."""
    if isinstance(obj, Tensor):
        return {prefix.strip("."): obj}
    if hasattr(obj, "_asdict"):
        obj = obj._asdict()
    if isinstance(obj, dict):
        items = obj.items()
    elif isinstance(obj, (list, tuple)):
        items = enumerate(obj)
    elif hasattr(obj, "__dict__"):
        items = vars(obj).items()
    else:
        return {}
    state: dict[str, Tensor] = {}
    for key, value in items:
        state.update(get_state_dict(value, f"{prefix}{key}."))
    return state


def get_parameters(obj: Any) -> list[Tensor]:
    """The tensors of `obj`'s state dict, each once."""
    unique: dict[int, Tensor] = {}
    for tensor in get_state_dict(obj).values():
        unique.setdefault(id(tensor), tensor)
    return list(unique.values())


def load_state_dict(model: Any, state_dict: dict[str, Tensor], strict: bool = True) -> None:
    """Copy `state_dict` into the model's tensors (in place). With `strict`, missing and unexpected keys are an
    error; shapes must always match."""
    own = get_state_dict(model)
    missing = sorted(set(own) - set(state_dict))
    unexpected = sorted(set(state_dict) - set(own))
    if strict and (missing or unexpected):
        raise KeyError(f"load_state_dict: missing keys {missing}, unexpected keys {unexpected}")
    for name, tensor in own.items():
        if name not in state_dict:
            continue
        value = state_dict[name]
        if value.shape != tensor.shape:
            raise ValueError(
                f"load_state_dict: {name} has shape {value.shape} in the state dict but {tensor.shape} in the model"
            )
        tensor.assign(value.to(tensor.device).cast(tensor.dtype)).realize()


def safe_save(tensors: dict[str, Tensor], path: str, metadata: dict[str, str] | None = None) -> None:
    """Write tensors to a safetensors file."""
    header: dict[str, Any] = {"__metadata__": metadata} if metadata else {}
    blobs, offset = [], 0
    for name, tensor in tensors.items():
        if tensor.dtype not in SAFETENSORS_DTYPES:
            raise TypeError(f"safe_save: {name} has dtype {tensor.dtype}, which safetensors cannot store")
        data = tensor.numpy().tobytes()
        header[name] = {
            "dtype": SAFETENSORS_DTYPES[tensor.dtype],
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + len(data)],
        }
        blobs.append(data)
        offset += len(data)
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)
    with open(path, "wb") as file:
        file.write(struct.pack("<Q", len(encoded)))
        file.write(encoded)
        for blob in blobs:
            file.write(blob)


def safe_load(path: str, device: str | None = None) -> dict[str, Tensor]:
    """Read a safetensors file into tensors."""
    with open(path, "rb") as file:
        raw = file.read()
    (header_size,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + header_size])
    body = raw[8 + header_size :]
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] not in FROM_SAFETENSORS:
            raise TypeError(f"safe_load: {name} has dtype {info['dtype']}, which lazygrad does not support")
        start, end = info["data_offsets"]
        np_dtype = {"F64": np.float64, "BOOL": np.bool_}.get(info["dtype"], FROM_SAFETENSORS[info["dtype"]].np)
        array = np.frombuffer(body[start:end], dtype=np_dtype).reshape(info["shape"])
        tensors[name] = Tensor(array, dtype=FROM_SAFETENSORS[info["dtype"]], device=device)
    return tensors
