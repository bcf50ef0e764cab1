"""Data types: a small frozen record per type, and the `dtypes` namespace users import."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, eq=False)
class DType:
    """A scalar type: its priority for promotion, size in bytes, name, NumPy equivalent and kind.

    There is one object per type (equal fields give the same object, unpickling too), so equality and hashing are
    by identity: both run in C, and every UOp's interning key hashes a dtype."""

    priority: int
    itemsize: int
    name: str
    np_name: str
    kind: str  # "bool", "int", "uint" or "float"

    def __new__(cls, priority: int, itemsize: int, name: str, np_name: str, kind: str) -> DType:
        key = (priority, itemsize, name, np_name, kind)
        if (existing := _dtypes.get(key)) is None:
            existing = _dtypes[key] = super().__new__(cls)
        return existing

    def __reduce__(self):
        return DType, (self.priority, self.itemsize, self.name, self.np_name, self.kind)

    def __lt__(self, other: DType) -> bool:  # promotion order: max() of dtypes is the one they promote to
        return self.priority < other.priority

    def __gt__(self, other: DType) -> bool:
        return self.priority > other.priority

    def __repr__(self) -> str:
        return f"dtypes.{self.name}"

    @property
    def np(self) -> np.dtype:
        return np.dtype(self.np_name)

    @property
    def is_float(self) -> bool:
        return self.kind == "float"

    @property
    def is_int(self) -> bool:
        return self.kind in ("int", "uint")

    @property
    def is_unsigned(self) -> bool:
        return self.kind == "uint"

    @property
    def bits(self) -> int:
        return 8 * self.itemsize


_dtypes: dict[tuple, DType] = {}


class dtypes:
    """The dtypes lazygrad supports. `float32` is the default float, `int32` the default int."""

    void = DType(-1, 0, "void", "void", "void")
    bool = DType(0, 1, "bool", "bool", "bool")
    int32 = DType(5, 4, "int32", "int32", "int")
    uint32 = DType(6, 4, "uint32", "uint32", "uint")
    int64 = DType(7, 8, "int64", "int64", "int")
    float16 = DType(9, 2, "float16", "float16", "float")
    float32 = DType(11, 4, "float32", "float32", "float")
    # used inside kernels (accurate range reduction), not offered for tensors
    float64 = DType(12, 8, "float64", "float64", "float")
    default_float = float32
    default_int = int32
    # the type of index arithmetic inside kernels
    index = int64

    half = float16
    float = float32
    int = int32

    @staticmethod
    def all() -> tuple[DType, ...]:
        return (dtypes.bool, dtypes.int32, dtypes.uint32, dtypes.int64, dtypes.float16, dtypes.float32)

    @staticmethod
    def from_numpy(np_dtype: np.dtype) -> DType:
        """The DType for a NumPy dtype; float64 maps to float32 and int64 to int32 as in tinygrad's defaults."""
        np_dtype = np.dtype(np_dtype)
        remap = {"float64": "float32"}
        name = remap.get(np_dtype.name, np_dtype.name)
        for dtype in dtypes.all():
            if dtype.np_name == name:
                return dtype
        raise TypeError(f"unsupported dtype {np_dtype}: lazygrad supports {', '.join(d.name for d in dtypes.all())}")


def to_dtype(value: DType | str | type | np.dtype) -> DType:
    """Accept a DType, a name like "float32", a NumPy dtype or a Python type, and return the DType."""
    if isinstance(value, DType):
        return value
    if value is float:
        return dtypes.default_float
    if value is int:
        return dtypes.default_int
    if value is bool:
        return dtypes.bool
    if isinstance(value, str) and hasattr(dtypes, value) and isinstance(getattr(dtypes, value), DType):
        return getattr(dtypes, value)
    try:
        np_dtype = np.dtype(value)
    except TypeError:
        np_dtype = None
    if np_dtype is not None and np_dtype.name in {d.np_name for d in dtypes.all()}:
        return dtypes.from_numpy(np_dtype)
    names = ", ".join(d.name for d in dtypes.all())
    raise TypeError(f"unsupported dtype {value!r}: lazygrad supports {names}")


def least_upper_dtype(*types: DType) -> DType:
    """The dtype two operands promote to: the one with the highest priority (bool < int < float)."""
    return max(types)


def python_type_dtype(value) -> DType:
    """The dtype a Python scalar becomes on its own."""
    if isinstance(value, bool):
        return dtypes.bool
    if isinstance(value, int):
        return dtypes.default_int
    return dtypes.default_float
