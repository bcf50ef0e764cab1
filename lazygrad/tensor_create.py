"""Creating tensors: constants, ranges, identity matrices and counter-based random numbers."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Sequence

import numpy as np

from lazygrad.device import Device
from lazygrad.dtype import DType, check_fits, dtypes, fits, python_type_dtype, to_dtype
from lazygrad.engine import rng
from lazygrad.helpers import prod
from lazygrad.tensor_movement import as_int
from lazygrad.uop.ops import Ops, UOp

if TYPE_CHECKING:
    from lazygrad.tensor import Scalar, Tensor


def _hash32(bits: Tensor) -> Tensor:
    """`rng.mix32` on a uint32 tensor, built from shifts, xors and wrapping multiplies."""
    bits = bits ^ (bits >> 16)
    bits = bits * 0x7FEB352D
    bits = bits ^ (bits >> 15)
    bits = bits * 0x846CA68B
    return bits ^ (bits >> 16)


def _has(device: str | None, dtype: DType) -> bool:
    """Whether `device` (the default one when None) computes in `dtype` (an OpenCL device may lack 64-bit types)."""
    return dtype not in Device[Device.canonicalize(device) if device is not None else Device.DEFAULT].unsupported_dtypes


def _wide_float(device: str | None) -> DType:
    """The dtype ranges are computed in before the cast to their own: float64, as torch computes them (float32 on
    a device without float64)."""
    return dtypes.float64 if _has(device, dtypes.float64) else dtypes.float32


def _random_float_dtype(op_name: str, dtype) -> DType:
    """`dtype` (the default float when None), which must be a float: random ints come from randint (torch refuses
    too; a cast would give zeros from rand, truncated noise from randn)."""
    dtype = to_dtype(dtype) if dtype is not None else dtypes.default_float
    if not dtype.is_float:
        raise TypeError(
            f"{op_name}: needs a float dtype, got {dtype}; use Tensor.randint for random integers, or cast the floats"
        )
    return dtype


def _largest_below(value: float, dtype: DType) -> float:
    """The largest number of float `dtype` below `value` (the bound of a draw in [low, value))."""
    if dtype == dtypes.bfloat16:  # (NumPy has no bfloat16: a float32 whose low 16 bits are zero, rounded down)
        below = _largest_below(value, dtypes.float32)
        bits = int(np.array(below, np.float32).view(np.uint32))
        kept = bits & 0xFFFF0000
        if kept != bits and below < 0:  # (cutting a negative one's bits moved it up: one step further down)
            kept += 0x10000
        return float(np.array(kept, np.uint32).view(np.float32))
    kind = dtype.np.type
    nearest = kind(value)
    return float(nearest) if float(nearest) < value else float(np.nextafter(nearest, kind(-np.inf)))


def _python_number(op_name: str, value):
    """`value` as a Python int or float: a NumPy scalar or a one-element tensor (torch takes both) is read as its
    number, which a range's size and the kernel keys need."""
    if value is None or isinstance(value, (int, float)) and not isinstance(value, bool):
        return value
    if hasattr(value, "uop") and value.numel() == 1 and not value.dtype == dtypes.bool:
        return value.item()
    if isinstance(value, (np.integer, np.floating)):
        return value.item()
    raise TypeError(f"{op_name}: expected a number, got {type(value).__name__} {value!r}")


def _stop_or_end(op_name: str, stop, end):
    """The range's end, given as tinygrad's `stop` or torch's `end`."""
    if end is None:
        return stop
    if stop is not None:
        raise TypeError(f"{op_name}: got both stop={stop!r} and end={end!r} (end is PyTorch's name for stop); pass one")
    return end


class CreationMixin:
    """Constructors, as class methods of Tensor (`Tensor.zeros`, `Tensor.rand`, ...). A shape is given as sizes
    (`zeros(2, 3)`), one sequence (`zeros((2, 3))`) or PyTorch's keyword (`zeros(size=(2, 3))`)."""

    __slots__ = ()

    @classmethod
    def _shape_arg(cls, shape: tuple, size=None, op_name: str | None = None) -> tuple[int, ...]:
        """The shape of `zeros(2, 3)`, `zeros((2, 3))` or `zeros(size=(2, 3))`, checked."""
        if size is not None:
            if shape:
                raise TypeError(f"{op_name}: got the shape twice, as {shape} and as size={size!r}; pass one")
            shape = (size,)
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        sizes = tuple(as_int(dim) for dim in shape)
        if any(size is None or size < 0 for size in sizes):
            raise ValueError(f"{op_name + ': ' if op_name else ''}shape sizes must be non-negative ints, got {shape}")
        return sizes

    @classmethod
    def full(
        cls,
        shape: Sequence[int] | int | None = None,
        fill_value: Scalar | None = None,
        dtype: DType | str | None = None,
        device: str | None = None,
        requires_grad: bool | None = None,
        *,
        size: Sequence[int] | int | None = None,
    ) -> Tensor:
        """A tensor of `shape` (or PyTorch's `size=`) filled with `fill_value` (a constant: it costs no memory until
        realized). With requires_grad=True it gets a buffer of its own, since equal constants are otherwise one node."""
        if fill_value is None or shape is None and size is None:
            raise TypeError(f"full: needs a shape and a fill_value, got shape={shape!r}, fill_value={fill_value!r}")
        shape = cls._shape_arg(() if shape is None else (shape,), size, "full")
        dtype = to_dtype(dtype) if dtype is not None else python_type_dtype(fill_value)
        check_fits("full", fill_value, dtype)
        const = cls(UOp.const(dtype, fill_value), device=device)
        result = const.reshape((1,) * len(shape)).expand(shape) if shape else const
        if requires_grad:
            result = cls(np.full(shape, fill_value), dtype=dtype, device=device)
        result.requires_grad = requires_grad
        return result

    @classmethod
    def zeros(cls, *shape, size=None, dtype=None, device=None, requires_grad=None) -> Tensor:
        shape = cls._shape_arg(shape, size, "zeros")
        return cls.full(shape, 0.0, dtype=dtype or dtypes.default_float, device=device, requires_grad=requires_grad)

    @classmethod
    def ones(cls, *shape, size=None, dtype=None, device=None, requires_grad=None) -> Tensor:
        shape = cls._shape_arg(shape, size, "ones")
        return cls.full(shape, 1.0, dtype=dtype or dtypes.default_float, device=device, requires_grad=requires_grad)

    @classmethod
    def empty(cls, *shape, size=None, dtype=None, device=None, requires_grad=None) -> Tensor:
        """Zeros (a constant costs nothing until realized, so there is no uninitialized memory to save)."""
        shape = cls._shape_arg(shape, size, "empty")
        return cls.zeros(shape, dtype=dtype, device=device, requires_grad=requires_grad)

    def full_like(self, fill_value: Scalar, dtype=None, device=None, requires_grad=None) -> Tensor:
        return type(self).full(
            self.shape, fill_value, dtype=dtype or self.dtype, device=device or self.device, requires_grad=requires_grad
        )

    def zeros_like(self, dtype=None, device=None, requires_grad=None) -> Tensor:
        return self.full_like(0, dtype=dtype, device=device, requires_grad=requires_grad)

    def ones_like(self, dtype=None, device=None, requires_grad=None) -> Tensor:
        return self.full_like(1, dtype=dtype, device=device, requires_grad=requires_grad)

    def new_full(self, size, fill_value: Scalar, dtype=None, device=None, requires_grad=None) -> Tensor:
        """A tensor of `size` filled with `fill_value`, of this tensor's dtype and device unless given (torch's)."""
        return type(self).full(
            size, fill_value, dtype=dtype or self.dtype, device=device or self.device, requires_grad=requires_grad
        )

    def new_zeros(self, *size, dtype=None, device=None, requires_grad=None) -> Tensor:
        return self.new_full(self._shape_arg(size, op_name="new_zeros"), 0, dtype, device, requires_grad)

    def new_ones(self, *size, dtype=None, device=None, requires_grad=None) -> Tensor:
        return self.new_full(self._shape_arg(size, op_name="new_ones"), 1, dtype, device, requires_grad)

    def new_empty(self, *size, dtype=None, device=None, requires_grad=None) -> Tensor:
        return self.new_zeros(*size, dtype=dtype, device=device, requires_grad=requires_grad)

    def new_tensor(self, data, dtype=None, device=None, requires_grad=None) -> Tensor:
        """`data` as a tensor of this tensor's dtype and device unless given (torch's)."""
        return type(self)(data, dtype=dtype or self.dtype, device=device or self.device, requires_grad=requires_grad)

    def empty_like(self, dtype=None, device=None, requires_grad=None) -> Tensor:
        """Zeros of this tensor's shape, dtype and device (see `empty`)."""
        return self.full_like(0, dtype=dtype, device=device, requires_grad=requires_grad)

    def rand_like(self, dtype=None, device=None, requires_grad=None) -> Tensor:
        """Uniform random numbers in [0, 1) of this tensor's shape, dtype (a float; else the default float) and
        device."""
        dtype = dtype or (self.dtype if self.dtype.is_float else None)
        return type(self).rand(self.shape, dtype=dtype, device=device or self.device, requires_grad=requires_grad)

    def randn_like(self, dtype=None, device=None, requires_grad=None) -> Tensor:
        """Standard normal random numbers of this tensor's shape, dtype (a float; else the default float) and
        device."""
        dtype = dtype or (self.dtype if self.dtype.is_float else None)
        return type(self).randn(self.shape, dtype=dtype, device=device or self.device, requires_grad=requires_grad)

    @classmethod
    def arange(
        cls,
        start: Scalar | None = None,
        stop: Scalar | None = None,
        step: Scalar = 1,
        dtype=None,
        device=None,
        *,
        end: Scalar | None = None,
        requires_grad: bool | None = None,
    ) -> Tensor:
        """Evenly spaced values in [start, stop): `arange(stop)`, `arange(start, stop, step)`, or with PyTorch's
        `end=` for stop. Computed inside the kernel that uses them. Ints give the default int, or int64 where the
        values need it; a `dtype` that cannot hold them is an error. Floats are `start + i * step` computed in float64
        and rounded once to the dtype, as in PyTorch (float32 on a device without float64)."""
        start, stop, step, end = (_python_number("arange", value) for value in (start, stop, step, end))
        stop = _stop_or_end("arange", stop, end)
        if stop is None:
            if start is None:
                raise TypeError("arange: missing the end of the range: arange(end), arange(start, end) or arange(end=)")
            start, stop = 0, start
        start = 0 if start is None else start
        if step == 0:
            raise ValueError("arange: step must not be zero")
        is_float = any(isinstance(value, float) for value in (start, stop, step))
        # (exact for ints of any size: float division would round past 2**53)
        count = max(0, math.ceil((stop - start) / step) if is_float else -((start - stop) // step))
        dtype = to_dtype(dtype) if dtype is not None else dtypes.default_float if is_float else None
        if dtype is not None and not dtype.is_float and is_float:
            # as PyTorch: the count comes from the floats, the values from start and step truncated to ints
            # (arange(0, 2, 0.5, dtype=int32) is four zeros)
            start, step = math.trunc(start), math.trunc(step)
        last = start + (count - 1) * step if count else start
        if dtype is not None:
            check_fits("arange", start, dtype)
            check_fits("arange", last, dtype)
        else:
            dtype = max(python_type_dtype(start), python_type_dtype(last))
            check_fits("arange", start if abs(start) > abs(last) else last, dtype)
        # the counter is the loop index (int64 in kernels), narrowed to int32 where that holds every index
        counter_dtype = dtypes.int32 if fits(count - 1, dtypes.int32) else dtypes.int64
        counter = cls(UOp(Ops.ARANGE, counter_dtype, (), count), device=device)
        if (start, step) == (0, 1):
            result = counter.cast(dtype)
        else:
            # a float32 product and sum round twice (arange(1, -1, -0.3) gave 0.39999998, not 0.4)
            wide = _wide_float(counter.device) if dtype.is_float else dtype
            result = (counter.cast(wide) * step + start).cast(dtype)
        result.requires_grad = requires_grad
        return result

    @classmethod
    def linspace(
        cls,
        start: Scalar,
        stop: Scalar | None = None,
        steps: int | None = None,
        dtype=None,
        device=None,
        *,
        end: Scalar | None = None,
        requires_grad: bool | None = None,
    ) -> Tensor:
        """`steps` evenly spaced values from start to stop (PyTorch's `end=`), both included, as PyTorch computes
        them: the first half counts up from start and the second half down from stop (so both ends are exact), in
        float64, then rounded once to the dtype (float32 on a device without float64). Int dtypes truncate start,
        stop and the values toward zero, as PyTorch does."""
        start, stop, end = (_python_number("linspace", value) for value in (start, stop, end))
        if hasattr(steps, "uop") and steps.numel() == 1:
            steps = steps.item()
        stop = _stop_or_end("linspace", stop, end)
        if stop is None or steps is None:
            raise TypeError(f"linspace: needs start, stop and steps, got stop={stop!r} and steps={steps!r}")
        if not isinstance(steps, (int, np.integer)) or isinstance(steps, bool) or steps < 0:
            raise ValueError(f"linspace: steps must be a non-negative int, got {steps!r}")
        steps = int(steps)
        dtype = to_dtype(dtype) if dtype is not None else dtypes.default_float
        for value in (start, stop):
            check_fits("linspace", value, dtype)
        if not dtype.is_float:
            start, stop = math.trunc(start), math.trunc(stop)  # (PyTorch reads them as the int dtype first)
        if steps <= 1:
            return cls.full((steps,), start, dtype=dtype, device=device, requires_grad=requires_grad)
        step = (stop - start) / (steps - 1)
        index = cls.arange(steps, device=device)
        index = index.cast(_wide_float(index.device))
        up, down = index * step + start, (index - (steps - 1)) * step + stop
        result = (index < steps // 2).where(up, down).cast(dtype)
        result.requires_grad = requires_grad
        return result

    @classmethod
    def eye(cls, n: int, m: int | None = None, dtype=None, device=None) -> Tensor:
        """The identity matrix (n × m)."""
        m = n if m is None else m
        if n < 0 or m < 0:
            raise ValueError(f"eye: sizes must be non-negative, got n={n}, m={m}")
        rows = cls.arange(n, device=device).reshape(n, 1)
        cols = cls.arange(m, device=device).reshape(1, m)
        return (rows == cols).cast(to_dtype(dtype) if dtype else dtypes.default_float)

    @classmethod
    def manual_seed(cls, seed: int = 0) -> None:
        """Make the random numbers that follow repeatable (the same on every device)."""
        rng.manual_seed(seed)

    @classmethod
    def _random_bits(cls, count: int, device: str | None) -> Tensor:
        """`count` pseudo-random uint32 values: a counter-based hash of (seed, counter), computed in the kernel.

        The counter values come from a random source of their own (engine/rng.py), so these bits are a pure
        function of it: every kernel computing them gets the same values, and each call gets new ones."""
        device = Device.canonicalize(device) if device is not None else Device.DEFAULT
        source = cls(rng.random_source(count, device), device=device, requires_grad=False)
        start, key = source.shrink(((0, 1),)).expand(count), source.shrink(((1, 2),)).expand(count)
        return _hash32(_hash32(cls.arange(count, device=device).cast(dtypes.uint32) + start) ^ key)

    @classmethod
    def _random_wide_bits(cls, count: int, device: str | None) -> Tensor:
        """`count` pseudo-random uint64 values (two uint32 draws each), or uint32 ones on a device without 64-bit
        ints."""
        if not _has(device, dtypes.uint64):
            return cls._random_bits(count, device)
        bits = cls._random_bits(2 * count, device).cast(dtypes.uint64)
        return (bits[:count] << 32) | bits[count:]

    @classmethod
    def _exponential(cls, shape: tuple[int, ...], device: str | None) -> Tensor:
        """Exp(1) draws, float32: -log(u) for u an odd multiple of 2**-24 in (0, 1), so each is positive and finite."""
        bits = cls._random_bits(prod(shape), device)
        odd = (((bits >> 9) << 1) | 1).cast(dtypes.float32) * 2.0**-24  # (at most 2**24 - 1: exact in float32)
        return -odd.log().reshape(shape)

    @classmethod
    def rand(cls, *shape, size=None, dtype=None, device=None, requires_grad=None) -> Tensor:
        """Uniform random numbers in [0, 1), of a float dtype."""
        shape = cls._shape_arg(shape, size, "rand")
        dtype = _random_float_dtype("rand", dtype)
        if dtype == dtypes.float64:
            # 53 random bits, every float64 in [0, 1) with a step of 2**-53 (as torch's): the 32 bits of one draw
            # above the top 21 of another, each exact in float64, as is their sum
            count = prod(shape)
            bits = cls._random_bits(2 * count, device)
            high, low = bits[:count].cast(dtypes.float64), (bits[count:] >> 11).cast(dtypes.float64)
            result = ((high * 2.0**21 + low) * 2.0**-53).reshape(shape)
            result.requires_grad = requires_grad
            return result
        bits = cls._random_bits(prod(shape), device)
        # the top 24 bits give every float32 in [0, 1) with a step of 2**-24; a narrower float takes as many bits as
        # its significand holds (11 for half, 8 for bfloat16), so no value rounds up to 1 when cast
        width = {dtypes.float16: 11, dtypes.bfloat16: 8}.get(dtype, 24)
        values = (bits >> (32 - width)).cast(dtypes.float32) * (2.0**-width)
        result = values.reshape(shape).cast(dtype)
        result.requires_grad = requires_grad
        return result

    @classmethod
    def randn(cls, *shape, size=None, dtype=None, device=None, requires_grad=None) -> Tensor:
        """Standard normal random numbers (Box-Muller), of a float dtype."""
        shape = cls._shape_arg(shape, size, "randn")
        dtype = _random_float_dtype("randn", dtype)
        # (float64 from float64 uniforms, 53 bits each: from float32 ones, every value was a float32, cut at 5.8 sigma)
        uniform = cls.rand(2, *shape, device=device, dtype=dtypes.float64 if dtype == dtypes.float64 else None)
        radius = (-2.0 * (1.0 - uniform[0]).log()).sqrt()
        result = (radius * (2 * math.pi * uniform[1]).cos()).cast(dtype)
        result.requires_grad = requires_grad
        return result

    @classmethod
    def randint(
        cls, *args, low: int | None = None, high: int | None = None, size=None, dtype=dtypes.int32, device=None
    ) -> Tensor:
        """Random integers in [low, high), each value equally likely: `randint(2, 3, low=0, high=5)` (the sizes,
        high 10 unless given), or torch's `randint(5, (2, 3))`, `randint(0, 5, (2, 3))` and `randint(0, 5, size=...)`.

        A value is 64 random bits modulo the range's width, which favours some values by a relative `width / 2**64`:
        below 2**-32 for every range up to 2**32 values (every int32 one). A device without 64-bit ints takes 32 bits
        (a bias of `width / 2**32`)."""
        if size is not None or args and isinstance(args[-1], (tuple, list)) and len(args) in (2, 3):  # torch's form
            bounds, shape = (args, size) if size is not None else (args[:-1], args[-1])
            if len(bounds) > 2 or bounds and (low is not None or high is not None):
                raise TypeError(
                    f"randint: got the bounds {bounds} and low={low}, high={high}: pass them one way, randint(low, "
                    "high, size) or randint(size=..., low=..., high=...)"
                )
            if len(bounds) == 2:
                low, high = bounds
            elif len(bounds) == 1:
                high = bounds[0]
        else:
            shape = args
        low, high = 0 if low is None else low, 10 if high is None else high
        shape = cls._shape_arg(shape if isinstance(shape, tuple) else (shape,), op_name="randint")
        for bound in (low, high):
            if not isinstance(bound, (int, np.integer)) or isinstance(bound, bool):
                raise TypeError(f"randint: low and high must be ints, got low={low!r}, high={high!r}")
        low, high, dtype = int(low), int(high), to_dtype(dtype)
        if high <= low:
            raise ValueError(f"randint: high ({high}) must be greater than low ({low})")
        if dtype == dtypes.bool and not 0 <= low < high <= 2:
            raise ValueError(f"randint: dtype=dtypes.bool holds 0 and 1 only, got low={low}, high={high}")
        check_fits("randint", low, dtype)
        check_fits("randint", high - 1, dtype)
        bits = cls._random_wide_bits(prod(shape), device).reshape(shape)
        width = 2**bits.dtype.bits
        if high - low > width:
            raise TypeError(f"randint: a range of {high - low} values needs 64-bit ints, which {bits.device} lacks")
        offset = bits if high - low == width else bits % (high - low)
        # low added modulo 2**bits, then read as signed where low is negative: the two's complement of the value
        signed = dtypes.int64 if bits.dtype == dtypes.uint64 else dtypes.int32
        return (offset + low % width).cast(signed if low < 0 else bits.dtype).cast(dtype)

    @classmethod
    def randperm(cls, n: int, dtype=dtypes.int64, device=None) -> Tensor:
        """A random permutation of 0..n-1, int64 as in PyTorch and as lazygrad's other indices (argsort, topk): the
        order that sorts n random 64-bit keys (equal keys, which the stable sort keeps in order, have odds below
        n**2 / 2**65). It costs what argsort does: n**2 comparisons."""
        if not isinstance(n, (int, np.integer)) or isinstance(n, bool) or n < 0:
            raise ValueError(f"randperm: n must be a non-negative int, got {n!r}")
        dtype = to_dtype(dtype)
        check_fits("randperm", max(int(n) - 1, 0), dtype)
        return cls._random_wide_bits(int(n), device).argsort().cast(dtype)

    def multinomial(self, num_samples: int = 1, replacement: bool = False) -> Tensor:
        """`num_samples` indices (int64) drawn from each row of a 1-D or 2-D tensor of non-negative weights (not
        necessarily summing to 1), as in PyTorch. Without replacement an index is drawn once at most.

        Both are the exponential race: the index of the largest `weight / E` over draws E ~ Exp(1) has the odds
        `weight / sum`, and the k largest are a draw without replacement (PyTorch's own method for that). A zero
        weight is never drawn. With replacement each sample races all the categories: rows * num_samples *
        categories random numbers. The weights are not checked, as that would need their values: negative and NaN
        ones count as zero, and a row with fewer non-zero weights than the samples drawn without replacement, or none,
        gives zero-weight indices too (PyTorch raises for all of these)."""
        if self.ndim not in (1, 2) or self.shape[-1] == 0:
            raise ValueError(
                f"multinomial: needs a 1-D or 2-D tensor of weights, one category at least, got {self.shape}"
            )
        if not self.dtype.is_float:
            raise TypeError(f"multinomial: needs float weights, got {self.dtype}; cast them first (.float())")
        categories = self.shape[-1]
        num_samples = as_int(num_samples) if as_int(num_samples) is not None else num_samples
        if not isinstance(num_samples, int) or num_samples < 1:
            raise ValueError(f"multinomial: num_samples must be a positive int, got {num_samples!r}")
        if not replacement and num_samples > categories:
            raise ValueError(
                f"multinomial: cannot draw {num_samples} samples without replacement from {categories} categories; "
                "pass replacement=True or fewer samples"
            )
        # with replacement, every sample races all the categories: (..., num_samples, categories)
        weights = self.detach() if self.dtype.itemsize >= 4 else self.detach().float()  # (a half log is coarse)
        weights = weights.unsqueeze(-2) if replacement else weights
        races = type(self)._exponential(
            (*self.shape[:-1], *((num_samples,) if replacement else ()), categories), self.device
        )
        # compared as logs (Gumbel keys), which neither overflow nor underflow; a zero weight's key is below every other
        keys = (weights > 0).where(weights.log() - races.log(), float("-inf"))
        if replacement:
            return keys.argmax(-1)
        if num_samples == 1:  # (the one largest key: a reduce, where topk sorts the row, n^2 compares)
            return keys.argmax(-1).unsqueeze(-1)
        return keys.topk(num_samples, dim=-1)[1]

    @classmethod
    def uniform(
        cls, *shape, low: float = 0.0, high: float = 1.0, size=None, dtype=None, device=None, requires_grad=None
    ) -> Tensor:
        """Uniform random numbers in [low, high), of a float dtype."""
        shape, dtype = cls._shape_arg(shape, size, "uniform"), _random_float_dtype("uniform", dtype)
        result = (cls.rand(shape, device=device) * (high - low) + low).cast(dtype)
        if high > low:  # (a draw just below high rounds to it, in float32 or in the dtype: kept below, as torch's)
            result = result.minimum(_largest_below(high, dtype))
        result.requires_grad = requires_grad
        return result

    @classmethod
    def normal(
        cls, *shape, mean: float = 0.0, std: float = 1.0, size=None, dtype=None, device=None, requires_grad=None
    ) -> Tensor:
        """Normal random numbers of `mean` and `std`, of a float dtype."""
        shape, dtype = cls._shape_arg(shape, size, "normal"), _random_float_dtype("normal", dtype)
        result = (cls.randn(shape, device=device) * std + mean).cast(dtype)
        result.requires_grad = requires_grad
        return result
