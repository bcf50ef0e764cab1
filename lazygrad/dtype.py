"""Data types: a small frozen record per type, the `dtypes` namespace users import, and the rules for the dtype
Python numbers and data take and whether a dtype holds them."""

from __future__ import annotations

import functools
import math
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
    kind: str  # "bool", "int", "uint" or "float"; `np_name` is the NumPy dtype holding its bits (bfloat16: uint16)

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

    @functools.cached_property  # (a dtype is immutable; making a NumPy dtype costs more than looking one up)
    def np(self) -> np.dtype:
        """The NumPy dtype of this dtype's memory (bfloat16, which NumPy lacks, is held as its uint16 bits)."""
        return np.dtype(self.np_name)

    @functools.cached_property  # (asked on every op built: then an attribute read)
    def is_float(self) -> bool:
        return self.kind == "float"

    @functools.cached_property
    def is_int(self) -> bool:
        return self.kind in ("int", "uint")

    @functools.cached_property
    def is_unsigned(self) -> bool:
        return self.kind == "uint"

    @functools.cached_property
    def bits(self) -> int:
        return 8 * self.itemsize


_dtypes: dict[tuple, DType] = {}


_by_numpy_dtype: dict[np.dtype, DType] = {}  # see dtypes.from_numpy


class dtypes:
    """The dtypes lazygrad supports. `float32` is the default float, `int32` the default int."""

    void = DType(-1, 0, "void", "void", "void")
    bool = DType(0, 1, "bool", "bool", "bool")
    uint8 = DType(1, 1, "uint8", "uint8", "uint")
    int8 = DType(2, 1, "int8", "int8", "int")
    int16 = DType(3, 2, "int16", "int16", "int")
    uint16 = DType(4, 2, "uint16", "uint16", "uint")
    int32 = DType(5, 4, "int32", "int32", "int")
    uint32 = DType(6, 4, "uint32", "uint32", "uint")
    int64 = DType(7, 8, "int64", "int64", "int")
    uint64 = DType(8, 8, "uint64", "uint64", "uint")
    float16 = DType(9, 2, "float16", "float16", "float")
    # memory holds its bits as uint16 (NumPy has no bfloat16); kernels compute it in float32, rounding after each op
    bfloat16 = DType(10, 2, "bfloat16", "uint16", "float")
    float32 = DType(11, 4, "float32", "float32", "float")
    # never a default (Python floats become float32), but kept from float64 NumPy data, dtype=dtypes.float64 and F64
    # in safetensors
    float64 = DType(12, 8, "float64", "float64", "float")
    default_float = float32
    default_int = int32
    # the type of index arithmetic inside kernels
    index = int64

    half = float16
    float = float32
    double = float64
    int = int32
    long = int64
    short = int16
    char = int8
    uchar = uint8
    bf16 = bfloat16

    @staticmethod
    def all() -> tuple[DType, ...]:
        return (
            dtypes.bool,
            dtypes.uint8,
            dtypes.int8,
            dtypes.int16,
            dtypes.uint16,
            dtypes.int32,
            dtypes.uint32,
            dtypes.int64,
            dtypes.uint64,
            dtypes.float16,
            dtypes.bfloat16,
            dtypes.float32,
            dtypes.float64,
        )

    @staticmethod
    def ints() -> tuple[DType, ...]:
        """The integer dtypes, narrowest first (signed before unsigned of the same width, except 8 bits)."""
        return tuple(dtype for dtype in dtypes.all() if dtype.is_int)

    @staticmethod
    def from_numpy(np_dtype: np.dtype) -> DType:
        """The DType for a NumPy dtype (data without a dtype takes the defaults instead: see `data_to_numpy`)."""
        np_dtype = np.dtype(np_dtype)
        if (found := _by_numpy_dtype.get(np_dtype)) is not None:
            return found
        # by name: NumPy's uint16 is never bfloat16 (and a NumPy dtype's name is slow to get: ~5 us, so the answer
        # is kept, every Tensor made from NumPy data asks)
        name = np_dtype.name
        for dtype in dtypes.all():
            if dtype.name == name:
                _by_numpy_dtype[np_dtype] = dtype
                return dtype
        raise TypeError(f"unsupported dtype {np_dtype}: lazygrad supports {', '.join(d.name for d in dtypes.all())}")


def is_small_int(dtype: DType) -> bool:
    """Whether `dtype` is an integer narrower than 32 bits (kernels compute those in 32 bits and wrap back)."""
    return dtype.is_int and dtype.itemsize < 4


def bfloat16_bits(values: np.ndarray | float) -> np.ndarray:
    """float32 values rounded to the nearest bfloat16 (ties to even), as the uint16 bits of those bfloat16s; NaN
    stays a (quiet) NaN and values beyond bfloat16's range become infinities."""
    with np.errstate(over="ignore", invalid="ignore"):
        single = np.asarray(values, dtype=np.float32)
    bits = single.view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(single)
    return np.where(nan, (bits >> 16).astype(np.uint16) | np.uint16(0x40), rounded)


def bfloat16_to_float32(bits: np.ndarray) -> np.ndarray:
    """The float32 values of bfloat16 bits (exact: every bfloat16 is a float32)."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def round_bfloat16(value: float) -> float:
    """A Python float rounded to bfloat16 (through float32, as kernels compute bfloat16)."""
    return float(bfloat16_to_float32(bfloat16_bits(value)))


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
    if isinstance(value, str) and isinstance(getattr(dtypes, value, None), DType) and value != "void":
        return getattr(dtypes, value)
    try:
        np_dtype = np.dtype(value)
    except TypeError:
        np_dtype = None
    if np_dtype is not None and np_dtype.name in {d.np_name for d in dtypes.all()}:
        return dtypes.from_numpy(np_dtype)
    names = ", ".join(d.name for d in dtypes.all())
    raise TypeError(f"unsupported dtype {value!r}: lazygrad supports {names}")


def _promote(a: DType, b: DType, op_name: str) -> DType:
    if a == b or b == dtypes.bool:
        return a
    if a == dtypes.bool:
        return b
    if a.is_float and b.is_float:
        # neither half type holds the other: they meet in float32, as in PyTorch
        return dtypes.float32 if {a, b} == {dtypes.float16, dtypes.bfloat16} else max(a, b)
    if a.is_float or b.is_float:
        return a if a.is_float else b
    # two ints: the narrowest int that holds every value of both (uint8 and int8 give int16, as in PyTorch)
    low = min(integer_range(a)[0], integer_range(b)[0])
    high = max(integer_range(a)[1], integer_range(b)[1])
    for candidate in dtypes.ints():
        if integer_range(candidate)[0] <= low and integer_range(candidate)[1] >= high:
            return candidate
    raise TypeError(
        f"{op_name}: no integer dtype holds every value of both {a} and {b}; cast one operand first, e.g. "
        f".cast(dtypes.int64) or .float()"
    )


def least_upper_dtype(*types: DType, op_name: str = "promotion") -> DType:
    """The dtype operands of these dtypes compute in, as PyTorch's `torch.result_type` of tensors: bool < ints <
    floats; two ints give the narrowest int holding both (int8 and int16: int16; uint8 and int8: int16), two floats
    the wider (float16 and bfloat16: float32). Where PyTorch refuses (uint16/uint32/uint64 beside another int) the
    same rule applies, as in NumPy; only uint64 beside a signed int, which no int holds, is an error."""
    result = types[0]
    for other in types[1:]:
        result = _promote(result, other, op_name)
    return result


def beside_zero_dim(dtype: DType, zero_dim: DType) -> DType:
    """The dtype of a binary op of a tensor with dimensions (`dtype`) and a 0-d one, as torch.result_type: the
    tensor with dimensions keeps its dtype unless the 0-d one is of a higher kind (bool < int < float), whose dtype
    it then takes (`half * x.mean()` stays half; `int32 * Tensor(2.5)` is float32)."""

    def kind(of: DType) -> int:
        return 0 if of == dtypes.bool else 2 if of.is_float else 1

    return dtype if kind(zero_dim) <= kind(dtype) else zero_dim


def python_type_dtype(value) -> DType:
    """The dtype a Python scalar becomes on its own: bool, the default int (int64 for an int it cannot hold) or the
    default float."""
    if isinstance(value, bool):
        return dtypes.bool
    if isinstance(value, int):
        return dtypes.default_int if fits(value, dtypes.default_int) else dtypes.int64
    return dtypes.default_float


def scalar_dtype(op_name: str, value: int | float | bool, dtype: DType) -> DType:
    """The dtype a Python number computes in beside a tensor of `dtype`. As in PyTorch: the tensor's dtype (a float
    beside an int or bool tensor: the default float; an int beside a bool tensor: the default int), so `uint8 + 1`
    stays uint8, and a number beside a float16 or bfloat16 tensor is rounded to that dtype (one too large becomes
    inf), as PyTorch's `+`, `-`, `%`, `**` and comparisons round it; its `*`, `/` and `//` keep the number in float32
    (Tensor.mul and Tensor.div see to that, not this). Unlike PyTorch, an int the dtype cannot hold never wraps
    around: it widens the computation to int32 or int64 (`uint8 + 300` is int32), and one that no int can hold beside
    the tensor's values is an error."""
    if isinstance(value, bool) or dtype.is_float:
        return dtype
    if isinstance(value, float):
        return dtypes.default_float
    wanted = dtypes.default_int if dtype == dtypes.bool else dtype
    if fits(value, wanted):
        return wanted
    for wider in (dtypes.default_int, dtypes.int64):
        try:
            candidate = least_upper_dtype(wanted, wider)
        except TypeError:
            continue
        if fits(value, candidate):
            return candidate
    raise OverflowError(
        f"{op_name}: {value} does not fit in {dtype}, nor in int64, the widest integer; compute in floats: "
        f"cast the tensor with .float() or pass the number as {float(value)!r}"
    )


def integer_range(dtype: DType) -> tuple[int, int]:
    """The smallest and largest value of an integer (or bool) dtype."""
    if dtype == dtypes.bool:
        return 0, 1
    if dtype.is_unsigned:
        return 0, (1 << dtype.bits) - 1
    return -(1 << (dtype.bits - 1)), (1 << (dtype.bits - 1)) - 1


def _misfit(values: int | float | np.ndarray, dtype: DType) -> int | float | None:
    """A value of `values` (a number or an array) that an integer `dtype` cannot hold once truncated toward zero,
    as a cast would (nan and infinities included), or None."""
    if not dtype.is_int:
        return None
    if isinstance(values, np.ndarray):
        if values.size == 0 or values.dtype == np.bool_:
            return None
        extremes = [values.min().item(), values.max().item()]  # nan is both
    else:
        extremes = [values]
    low, high = integer_range(dtype)
    for value in extremes:
        if isinstance(value, float) and (not math.isfinite(value) or not low <= math.trunc(value) <= high):
            return value
        if isinstance(value, int) and not low <= value <= high:
            return value
    return None


def fits(values: int | float | np.ndarray, dtype: DType) -> bool:
    """Whether `dtype` holds every value (float dtypes hold every number: one too large becomes inf)."""
    return _misfit(values, dtype) is None


def check_fits(op_name: str, values: int | float | np.ndarray, dtype: DType, of_tensor: bool = False) -> None:
    """Raise OverflowError, naming the op, the value and the fix, when an integer `dtype` cannot hold a value (the
    dtype of the tensor the op writes into where `of_tensor`: then the fix is a wider tensor)."""
    value = _misfit(values, dtype)
    if value is None:
        return
    low, high = integer_range(dtype)
    if of_tensor:
        wider = "a value in that range, or cast the tensor to a wider dtype first (x.cast(dtypes.int64))"
    elif dtype == dtypes.int64 and isinstance(value, int) and value > 0:
        wider = "dtype=dtypes.uint64 or a float dtype"
    elif dtype == dtypes.uint64 and isinstance(value, int) and value < 0:
        wider = "dtype=dtypes.int64 or a float dtype"
    elif dtype.bits == 64:
        wider = "a float dtype"
    else:
        wider = "dtype=dtypes.int64 or a float dtype"
    raise OverflowError(f"{op_name}: {value!r} does not fit in {dtype} (which holds {low}..{high}); use {wider}")


def _ints_beyond_int64(data: object) -> np.ndarray | None:
    """The values of nested lists that hold Python ints only, some beyond int64 (NumPy reads those as float64), flat;
    else None. Checked in full only where the first number is an int, so a list of floats costs nothing more."""
    first = data
    while isinstance(first, (list, tuple)) and first:
        first = first[0]
    if not isinstance(first, int) or isinstance(first, bool):
        return None
    values = np.array(data, dtype=object).reshape(-1)
    beyond = all(isinstance(value, int) for value in values) and any(abs(value) > 2**63 - 1 for value in values)
    return values if beyond else None


def _dtype_of_typed_items(data: list | tuple) -> DType | None:
    """The dtype of nested lists whose items all carry one (tensors, NumPy scalars and arrays), promoted as torch
    infers it (a list of float64 tensors is float64, of uint8 ones uint8); None where any is a Python number."""
    first = data
    while isinstance(first, (list, tuple)) and first:
        first = first[0]
    if not isinstance(getattr(first, "dtype", None), (DType, np.dtype)):
        return None  # (a list of Python numbers: the common case, told by its first item)
    found, pending = [], [data]
    while pending:
        item = pending.pop()
        if isinstance(item, (list, tuple)):
            pending.extend(item)
        elif isinstance(kind := getattr(item, "dtype", None), DType):
            found.append(kind)
        elif isinstance(kind, np.dtype) and kind.kind in "biuf":
            found.append(dtypes.from_numpy(kind))
        else:
            return None
    return least_upper_dtype(*found) if found else None


def data_to_numpy(data: object, dtype: DType | None) -> tuple[np.ndarray, DType]:
    """The data as a C-ordered array holding the tensor's dtype (bfloat16: its uint16 bits): `dtype`, else a NumPy
    array's (or NumPy scalar's) own dtype, float64 included, as in PyTorch; a list's floats become the default float
    and its ints the default int (int64 for ints it cannot hold). Ints that do not fit are an error, never wrapped; floats too large for a float
    dtype become inf."""
    numpy_data = isinstance(data, (np.ndarray, np.generic))
    if isinstance(data, np.ndarray):
        array = data
    else:
        try:
            array = np.array(data)
        except ValueError as error:
            raise ValueError(f"Tensor: nested lists must be rectangular (ragged input): {error}") from None
        if array.dtype == object:
            if all(isinstance(value, int) for value in array.flat):  # ints beyond NumPy's int64 and uint64
                check_fits(
                    "Tensor", max(array.flat, key=abs), dtype if dtype is not None and dtype.is_int else dtypes.int64
                )
            raise ValueError("Tensor: nested lists must be rectangular and hold only numbers (ragged input)")
        # (NumPy read them as floats, rounding them)
        if array.dtype.kind == "f" and (values := _ints_beyond_int64(data)) is not None:
            target = dtype if dtype is not None and dtype.is_int else dtypes.int64
            for extreme in (min(values), max(values)):
                check_fits("Tensor", extreme, target)
            array = np.array(data, dtype=target.np)
    if array.dtype.kind in "US":
        raise TypeError(f"Tensor: cannot make a tensor from strings ({array.dtype})")
    if dtype is None and not numpy_data and isinstance(data, (list, tuple)):
        dtype = _dtype_of_typed_items(data)
    if dtype is None:
        if array.dtype.kind == "f" and not numpy_data:
            dtype = dtypes.default_float
        elif array.dtype.kind in "iu" and not numpy_data:
            dtype = dtypes.default_int if fits(array, dtypes.default_int) else dtypes.int64
        else:
            dtype = dtypes.from_numpy(array.dtype)
    if array.size == 0 and array.dtype == np.float64 and not numpy_data:
        array = array.astype(np.float32)
    check_fits("Tensor", array, dtype)
    with np.errstate(over="ignore", invalid="ignore"):  # a float too large for the dtype becomes inf, as in PyTorch
        if dtype == dtypes.bfloat16:
            # (not np.ascontiguousarray, which makes a 0-d array 1-d)
            return np.array(bfloat16_bits(np.asarray(array, dtype=np.float32)), order="C"), dtype
        return np.array(array, dtype=dtype.np, order="C"), dtype
