"""Creating tensors: constants, ranges, identity matrices and counter-based random numbers."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Sequence

import numpy as np

from lazygrad.device import Device
from lazygrad.dtype import DType, check_fits, dtypes, fits, python_type_dtype, to_dtype
from lazygrad.engine import rng
from lazygrad.helpers import prod
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


class CreationMixin:
    """Constructors, as class methods of Tensor (`Tensor.zeros`, `Tensor.rand`, ...)."""

    __slots__ = ()

    @classmethod
    def _shape_arg(cls, shape: tuple) -> tuple[int, ...]:
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        for size in shape:
            if not isinstance(size, (int, np.integer)) or isinstance(size, bool) or size < 0:
                raise ValueError(f"shape sizes must be non-negative ints, got {shape}")
        return tuple(int(size) for size in shape)

    @classmethod
    def full(
        cls,
        shape: Sequence[int] | int,
        fill_value: Scalar,
        dtype: DType | str | None = None,
        device: str | None = None,
        requires_grad: bool | None = None,
    ) -> Tensor:
        """A tensor of `shape` filled with `fill_value` (a constant: it costs no memory until realized). With
        requires_grad=True it gets a buffer of its own, since equal constants are otherwise one node."""
        shape = cls._shape_arg((shape,) if isinstance(shape, int) else tuple(shape))
        dtype = to_dtype(dtype) if dtype is not None else python_type_dtype(fill_value)
        check_fits("full", fill_value, dtype)
        const = cls(UOp.const(dtype, fill_value), device=device)
        result = const.reshape((1,) * len(shape)).expand(shape) if shape else const
        if requires_grad:
            result = cls(np.full(shape, fill_value), dtype=dtype, device=device)
        result.requires_grad = requires_grad
        return result

    @classmethod
    def zeros(cls, *shape, dtype=None, device=None, **kwargs) -> Tensor:
        return cls.full(cls._shape_arg(shape), 0.0, dtype=dtype or dtypes.default_float, device=device, **kwargs)

    @classmethod
    def ones(cls, *shape, dtype=None, device=None, **kwargs) -> Tensor:
        return cls.full(cls._shape_arg(shape), 1.0, dtype=dtype or dtypes.default_float, device=device, **kwargs)

    @classmethod
    def empty(cls, *shape, dtype=None, device=None, **kwargs) -> Tensor:
        return cls.zeros(*shape, dtype=dtype, device=device, **kwargs)

    def full_like(self, fill_value: Scalar, dtype=None, **kwargs) -> Tensor:
        return type(self).full(self.shape, fill_value, dtype=dtype or self.dtype, device=self.device, **kwargs)

    def zeros_like(self, **kwargs) -> Tensor:
        return self.full_like(0, **kwargs)

    def ones_like(self, **kwargs) -> Tensor:
        return self.full_like(1, **kwargs)

    def rand_like(self, dtype=None, **kwargs) -> Tensor:
        """Uniform random numbers in [0, 1) of this tensor's shape, dtype (a float; else the default float) and
        device."""
        dtype = dtype or (self.dtype if self.dtype.is_float else None)
        return type(self).rand(*self.shape, dtype=dtype, device=kwargs.pop("device", self.device), **kwargs)

    def randn_like(self, dtype=None, **kwargs) -> Tensor:
        """Standard normal random numbers of this tensor's shape, dtype (a float; else the default float) and
        device."""
        dtype = dtype or (self.dtype if self.dtype.is_float else None)
        return type(self).randn(*self.shape, dtype=dtype, device=kwargs.pop("device", self.device), **kwargs)

    @classmethod
    def arange(
        cls, start: Scalar, stop: Scalar | None = None, step: Scalar = 1, dtype=None, device=None, **kwargs
    ) -> Tensor:
        """Evenly spaced values in [start, stop) (computed inside the kernel that uses them). Ints give the default
        int, or int64 where the values need it; a `dtype` that cannot hold them is an error."""
        if stop is None:
            start, stop = 0, start
        if step == 0:
            raise ValueError("arange: step must not be zero")
        is_float = any(isinstance(value, float) for value in (start, stop, step))
        # (exact for ints of any size: float division would round past 2**53)
        count = max(0, math.ceil((stop - start) / step) if is_float else -((start - stop) // step))
        last = start + (count - 1) * step if count else start
        if dtype is not None:
            dtype = to_dtype(dtype)
            check_fits("arange", start, dtype)
            check_fits("arange", last, dtype)
        elif is_float:
            dtype = dtypes.default_float
        else:
            dtype = max(python_type_dtype(start), python_type_dtype(last))
            check_fits("arange", start if abs(start) > abs(last) else last, dtype)
        # the counter is the loop index (int64 in kernels), narrowed to int32 where that holds every index
        counter_dtype = dtypes.int32 if fits(count - 1, dtypes.int32) else dtypes.int64
        counter = cls(UOp(Ops.ARANGE, counter_dtype, (), count), device=device, **kwargs)
        return (counter.cast(dtype) * step + start).cast(dtype) if (start, step) != (0, 1) else counter.cast(dtype)

    @classmethod
    def linspace(cls, start: Scalar, stop: Scalar, steps: int, dtype=None, device=None) -> Tensor:
        if steps < 0:
            raise ValueError(f"linspace: steps must be non-negative, got {steps}")
        for end in (start, stop):
            check_fits("linspace", end, to_dtype(dtype) if dtype else dtypes.default_float)
        if steps == 1:
            return cls.full((1,), float(start), dtype=dtype, device=device)
        step = (stop - start) / (steps - 1) if steps > 1 else 0.0
        return (cls.arange(steps, device=device).float() * step + start).cast(
            to_dtype(dtype) if dtype else dtypes.default_float
        )

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
    def rand(cls, *shape, dtype=None, device=None, **kwargs) -> Tensor:
        """Uniform random numbers in [0, 1)."""
        shape = cls._shape_arg(shape)
        bits = cls._random_bits(prod(shape), device)
        dtype = to_dtype(dtype) if dtype else dtypes.default_float
        # the top 24 bits give every float32 in [0, 1) with a step of 2**-24; a narrower float takes as many bits as
        # its significand holds (11 for half, 8 for bfloat16), so no value rounds up to 1 when cast
        width = {dtypes.float16: 11, dtypes.bfloat16: 8}.get(dtype, 24)
        values = (bits >> (32 - width)).cast(dtypes.float32) * (2.0**-width)
        result = values.reshape(shape).cast(dtype)
        result.requires_grad = kwargs.get("requires_grad")
        return result

    @classmethod
    def randn(cls, *shape, dtype=None, device=None, **kwargs) -> Tensor:
        """Standard normal random numbers (Box-Muller)."""
        shape = cls._shape_arg(shape)
        uniform = cls.rand(2, *shape, device=device)
        radius = (-2.0 * (1.0 - uniform[0]).log()).sqrt()
        result = (radius * (2 * math.pi * uniform[1]).cos()).cast(to_dtype(dtype) if dtype else dtypes.default_float)
        result.requires_grad = kwargs.get("requires_grad")
        return result

    @classmethod
    def randint(cls, *shape, low: int = 0, high: int = 10, dtype=dtypes.int32, device=None) -> Tensor:
        """Random integers in [low, high): `randint(2, 3, low=0, high=5)`, or torch's `randint(5, (2, 3))` and
        `randint(0, 5, (2, 3))`."""
        if shape and isinstance(shape[-1], (tuple, list)) and len(shape) in (2, 3):  # torch's form
            bounds, shape = shape[:-1], tuple(shape[-1])
            low, high = (0, *bounds) if len(bounds) == 1 else bounds
        if high <= low:
            raise ValueError(f"randint: high ({high}) must be greater than low ({low})")
        return (cls.rand(*shape, device=device) * (high - low)).floor().cast(to_dtype(dtype)) + low

    @classmethod
    def uniform(cls, *shape, low: float = 0.0, high: float = 1.0, dtype=None, device=None, **kwargs) -> Tensor:
        return (cls.rand(*shape, device=device) * (high - low) + low).cast(
            to_dtype(dtype) if dtype else dtypes.default_float
        )

    @classmethod
    def normal(cls, *shape, mean: float = 0.0, std: float = 1.0, dtype=None, device=None, **kwargs) -> Tensor:
        return (cls.randn(*shape, device=device) * std + mean).cast(to_dtype(dtype) if dtype else dtypes.default_float)
