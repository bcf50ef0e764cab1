"""Reductions (sum, max and everything built on them) and matrix multiplication."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from lazygrad.dtype import DType, dtypes, fits, is_small_int, least_upper_dtype, to_dtype
from lazygrad.tensor_elementwise import (
    NARROW_FLOATS,
    ElementwiseMixin,
    broadcast_const,
    broadcast_node,
    broadcast_shape,
    check_same_device,
    type_name,
)
from lazygrad.tensor_math import LN_2, LOG2_E
from lazygrad.tensor_movement import as_int, keyword_aliases, normalize_axis
from lazygrad.uop.ops import Ops, UOp

if TYPE_CHECKING:
    from lazygrad.tensor import Tensor


def _refuse_torch_max(keywords: dict, op_name: str) -> None:
    """max and min keep tinygrad's meaning (values only), so PyTorch's max(dim=...), which returns (values,
    indices), is refused with the spellings that give each."""
    if "dim" in keywords:
        arg = "argmax" if op_name == "max" else "argmin"
        raise TypeError(
            f"{op_name}: PyTorch's {op_name}(dim=...) returns (values, indices); here {op_name}(axis) returns the values "
            f"only: use a{op_name}(dim=...) or {op_name}(axis=...) for the values and {arg}(dim=...) for the indices"
        )
    if keywords:
        raise TypeError(f"{op_name}: unexpected keyword arguments {sorted(keywords)}; it takes axis and keepdim")


def product_node(a: UOp, b: UOp) -> UOp:
    """The graph `dot` builds for two float matrices (or batches of them) of one dtype, built on the nodes (half and
    bfloat16 inputs multiplied and summed in float32, rounded once): the same nodes as the steps through tensors (a
    matrix product is the most common heavy op, and those steps took 37 us of Python a product, against 3 for an
    add)."""
    dtype, a_shape, b_shape = a.dtype, a.shape, b.shape
    x = UOp(Ops.RESHAPE, dtype, (a,), (*a_shape[:-1], 1, a_shape[-1]))
    w = UOp(Ops.RESHAPE, dtype, (b,), (*b_shape[:-2], 1, *b_shape[-2:]))
    order = (*range(len(b_shape) - 1), len(b_shape), len(b_shape) - 1)  # (the transpose of its last two axes)
    w = UOp(Ops.PERMUTE, dtype, (w,), order)
    if dtype in NARROW_FLOATS:  # multiplied and summed in float32, as torch's: a product of two halves is exact there
        x, w = UOp(Ops.CAST, dtypes.float32, (x,)), UOp(Ops.CAST, dtypes.float32, (w,))
    shape = broadcast_shape("mul", x.shape, w.shape)
    products = broadcast_node(x, shape).alu(Ops.MUL, broadcast_node(w, shape))
    reduced = UOp(Ops.REDUCE, products.dtype, (products,), (Ops.ADD, (len(shape) - 1,)))
    product = UOp(Ops.RESHAPE, products.dtype, (reduced,), shape[:-1])
    return product if product.dtype == dtype else UOp(Ops.CAST, dtype, (product,))


def softmax_nodes(source: UOp, axes: tuple[int, ...]) -> tuple[UOp, UOp, UOp]:
    """The graph of a float32 or float64 softmax along `axes` as `softmax` composes it, built on the nodes (a
    softmax's steps through tensors took 42 us of Python, against 3 for an add): (x - max, its exp, the exp's sum
    kept along `axes`), which softmax and log_softmax finish."""
    dtype, shape = source.dtype, source.shape
    peak = broadcast_node(UOp(Ops.REDUCE, dtype, (source,), (Ops.MAX, axes)), shape)
    shifted = source.alu(Ops.ADD, UOp(Ops.NEG, dtype, (peak,)))
    exponent = UOp(Ops.EXP2, dtype, (shifted.alu(Ops.MUL, broadcast_const(dtype, LOG2_E, shape)),))
    return shifted, exponent, UOp(Ops.REDUCE, dtype, (exponent,), (Ops.ADD, axes))


def _unbiased_as_correction(method):
    """torch's older `unbiased=` keyword (True: correction 1, False: 0) beside `correction=`."""

    @functools.wraps(method)
    def with_unbiased(self, *args, unbiased: bool | None = None, **kwargs):
        if unbiased is not None:
            if "correction" in kwargs:
                raise TypeError(f"{method.__name__}: got both correction= and unbiased=; pass one")
            kwargs["correction"] = int(bool(unbiased))
        return method(self, *args, **kwargs)

    return with_unbiased


class ReduceMixin:
    """Reductions over `axis` (an int, a tuple, or None for all; PyTorch's `dim=` works too) with `keepdim`."""

    __slots__ = ()

    def _axes(self: Tensor, axis, op_name: str) -> tuple[int, ...]:
        if axis is None:
            return tuple(range(self.ndim))
        if type(axis) is int and 0 < (ndim := len(self.shape)) and -ndim <= axis < ndim:  # (the common case, inline)
            return (axis % ndim,)
        if isinstance(axis, (tuple, list)):
            axes = tuple(axis)
        elif (index := as_int(axis)) is not None:  # (a NumPy int, a one-element int tensor)
            axes = (index,)
        else:
            raise TypeError(f"{op_name}: axis must be an int, a tuple of ints or None, got {axis!r}")
        normalized = tuple(normalize_axis(a, self.ndim, op_name) for a in axes)
        if len(set(normalized)) != len(normalized):
            raise ValueError(f"{op_name}: axis {axis} repeats an axis")
        # a 0-d tensor takes axis 0 or -1 (as in PyTorch), and has no axis to reduce
        return tuple(sorted(normalized)) if self.ndim else ()

    def _reduce(self: Tensor, op: Ops, axis, keepdim: bool, op_name: str) -> Tensor:
        axes = self._axes(axis, op_name)
        if self.ndim == 0:
            return self
        reduced = self._new(UOp(Ops.REDUCE, self.dtype, (self.uop,), (op, axes))) if axes else self
        if keepdim or not axes:
            return reduced
        # (the reduced axes are 1 now: dropping them is a valid reshape, built without reshape's checks)
        return reduced._movement(Ops.RESHAPE, tuple(size for i, size in enumerate(self.shape) if i not in axes))

    def _accumulated(self: Tensor, dtype) -> tuple[Tensor, Tensor]:
        """The input of a sum or product in the result's dtype (`dtype`; else int64 for bools and ints, as in
        PyTorch; else the tensor's own), and that input in the dtype to accumulate in (float32 for half and
        bfloat16)."""
        if dtype is not None:
            source = self.cast(dtype)
        elif self.dtype == dtypes.bool or self.dtype.is_int:
            source = self.cast(dtypes.int64)
        else:
            source = self
        narrow_float = source.dtype in (dtypes.float16, dtypes.bfloat16)
        return source, source.cast(dtypes.float32) if narrow_float else source

    @keyword_aliases(dim="axis")
    def sum(self: Tensor, axis=None, keepdim: bool = False, dtype=None) -> Tensor:
        """The sum; bools and ints sum as int64 unless `dtype` is given, half and bfloat16 accumulate in float32."""
        source, accumulate = self._accumulated(dtype)
        return accumulate._reduce(Ops.ADD, axis, keepdim, "sum").cast(source.dtype)

    def _unwidened_dtype(self: Tensor) -> DType:
        """The dtype for lazygrad's own sums that must not widen to int64 (counts, selections of one value, sums
        that wrap as the input does): the tensor's own, int32 for bools and narrow ints (kernels compute those in
        32 bits anyway)."""
        return dtypes.int32 if self.dtype == dtypes.bool or is_small_int(self.dtype) else self.dtype

    def _sum_unwidened(self: Tensor, axis=None, keepdim: bool = False) -> Tensor:
        return self.sum(axis, keepdim, dtype=self._unwidened_dtype())

    def _cast_for(self: Tensor, op_name: str, dtype) -> Tensor:
        """The input of a float op cast to the float `dtype` the caller asked for (torch's `dtype=`)."""
        dtype = to_dtype(dtype)
        if not dtype.is_float:
            raise TypeError(f"{op_name}: dtype must be a float dtype, got {dtype}; cast the result instead")
        return self.cast(dtype)

    def _sum_of_products(self: Tensor, other: Tensor, axis) -> Tensor:
        """(self * other) summed over `axis`, in the product's dtype; half and bfloat16 multiplied and summed in
        float32 and rounded once, as torch's matmul and conv (a product of two halves is exact in float32: rounded
        to half before the sum, a bfloat16 [1, 1/3] @ [1, -3] gave 0)."""
        dtype = least_upper_dtype(self.dtype, other.dtype, op_name="mul")
        if dtype in NARROW_FLOATS:
            return (self.float() * other.float()).sum(axis).cast(dtype)
        return (self * other)._sum_unwidened(axis)

    @keyword_aliases(dim="axis")
    def prod(self: Tensor, axis=None, keepdim: bool = False, dtype=None) -> Tensor:
        """The product; bools and ints multiply as int64, `dtype` casts the input first (as in PyTorch)."""
        source, accumulate = self._accumulated(dtype)
        return accumulate._reduce(Ops.MUL, axis, keepdim, "prod").cast(source.dtype)

    def max(self: Tensor, axis=None, keepdim: bool = False, **torch_keywords) -> Tensor:
        """The largest value over `axis` (tinygrad's max: values only; `amax` takes PyTorch's `dim=`)."""
        _refuse_torch_max(torch_keywords, "max")
        self._check_nonempty(axis, "max")
        return self._reduce(Ops.MAX, axis, keepdim, "max")

    def min(self: Tensor, axis=None, keepdim: bool = False, **torch_keywords) -> Tensor:
        """The smallest value over `axis` (values only; `amin` takes PyTorch's `dim=`)."""
        _refuse_torch_max(torch_keywords, "min")
        self._check_nonempty(axis, "min")
        return self._order_reversed()._reduce(Ops.MAX, axis, keepdim, "min")._order_reversed()

    @keyword_aliases(dim="axis")
    def amax(self: Tensor, axis=None, keepdim: bool = False) -> Tensor:
        """The largest value over `axis` (or `dim=`), as torch.amax: `max` by PyTorch's name for values only."""
        return self.max(axis, keepdim)

    @keyword_aliases(dim="axis")
    def amin(self: Tensor, axis=None, keepdim: bool = False) -> Tensor:
        """The smallest value over `axis` (or `dim=`), as torch.amin."""
        return self.min(axis, keepdim)

    def _order_reversed(self: Tensor) -> Tensor:
        """A one-to-one map that reverses the order of values, so min is built from max: -x for floats (exact, NaN
        stays NaN), ~x for ints and bools (-x would wrap at the most negative int, which has no opposite)."""
        return -self if self.dtype.is_float else ~self

    def _check_nonempty(self: Tensor, axis, op_name: str) -> None:
        if any(self.shape[a] == 0 for a in self._axes(axis, op_name)):
            raise ValueError(f"{op_name}: cannot reduce over an empty axis of {self.shape} (there is no identity)")

    @keyword_aliases(dim="axis")
    def any(self: Tensor, axis=None, keepdim: bool = False) -> Tensor:
        return self.bool()._reduce(Ops.MAX, axis, keepdim, "any")

    @keyword_aliases(dim="axis")
    def all(self: Tensor, axis=None, keepdim: bool = False) -> Tensor:
        return ~((~self.bool())._reduce(Ops.MAX, axis, keepdim, "all"))

    def _count(self: Tensor, axis) -> int:
        count = 1
        for a in self._axes(axis, "mean"):
            count *= self.shape[a]
        return count

    @keyword_aliases(dim="axis")
    def mean(self: Tensor, axis=None, keepdim: bool = False, dtype=None) -> Tensor:
        """The mean (ints and bools average as floats); `dtype` casts the input first, and must be a float."""
        if dtype is not None and not to_dtype(dtype).is_float:
            raise TypeError(f"mean: dtype must be a float dtype, got {to_dtype(dtype)}; cast the result instead")
        count = self._count(axis)
        if dtype is None and self.dtype in (dtypes.int64, dtypes.uint64):  # (their int64 sum may wrap: as NumPy)
            return (self.cast(dtypes.float64).sum(axis, keepdim) / count).cast(dtypes.default_float)
        if dtype is None and not self.dtype.is_float:  # summed exactly (in int64, as `sum`), then made a float once
            return self.sum(axis, keepdim).cast(dtypes.default_float) / count
        source = self.cast(dtype) if dtype is not None else self._to_float()
        if source.dtype in NARROW_FLOATS:  # summed in float32, as torch does: 5,000 halves of 30 overflow a half
            return source.float().mean(axis, keepdim).cast(source.dtype)
        # divided, not times 1/count: the mean of seven 7s is 7 (and the mean of none is nan)
        return source.sum(axis, keepdim) / count

    @keyword_aliases(dim="axis")
    @_unbiased_as_correction
    def var(self: Tensor, axis=None, keepdim: bool = False, correction: int = 1) -> Tensor:
        """The variance with `correction` subtracted from the count (1: the unbiased estimate, as in torch)."""
        source = self._to_float()
        if source.dtype in NARROW_FLOATS:  # in float32, as the mean
            return source.float().var(axis, keepdim, correction).cast(source.dtype)
        # The values are first shifted by one of their own (the first of each reduced slice, a constant for the
        # gradient: it cancels): a float32 sum of 1e6 + unit noise is off by far more than the spread (200,000
        # values summed one by one: the mean off by 40, and the variance 0), while the sum of their distances from a
        # value among them stays near the spread's scale and rounds little. Then the corrected two-pass form: the
        # deviations' own sum measures what error the mean still has, and its square over n takes it out again.
        count = self._count(axis)
        axes = self._axes(axis, "var")
        if count and axes:
            first = source.shrink(tuple((0, 1) if a in axes else None for a in range(source.ndim)))
            source = source - first.detach()
        deviation = source - source.mean(axis, keepdim=True)
        drift = deviation.sum(axis, keepdim)
        squared = (deviation.square().sum(axis, keepdim) - drift.square() / count).maximum(0)
        # no degrees of freedom left: the sum over zero, as torch divides it (inf, or nan where the sum is 0)
        return squared / max(0, count - correction)

    @keyword_aliases(dim="axis")
    @_unbiased_as_correction
    def std(self: Tensor, axis=None, keepdim: bool = False, correction: int = 1) -> Tensor:
        """The standard deviation: sqrt of `var`."""
        if self.dtype in NARROW_FLOATS:  # the root of the float32 variance, rounded once, as torch: a half variance
            return self.float().std(axis, keepdim, correction).cast(self.dtype)  # above 65504 was inf
        variance = self.var(axis, keepdim, correction)
        # a zero variance (one element, or equal ones) has slope 0 here, as in torch, not the 0 * inf of sqrt's
        is_zero = variance == 0
        return is_zero.where(0.0, is_zero.where(1.0, variance).sqrt())

    @keyword_aliases(dim="axis")
    @_unbiased_as_correction
    def var_mean(self: Tensor, axis=None, keepdim: bool = False, correction: int = 1) -> tuple[Tensor, Tensor]:
        """(var, mean), as torch.var_mean returns them."""
        return self.var(axis, keepdim, correction), self.mean(axis, keepdim)

    @keyword_aliases(dim="axis")
    @_unbiased_as_correction
    def std_mean(self: Tensor, axis=None, keepdim: bool = False, correction: int = 1) -> tuple[Tensor, Tensor]:
        """(std, mean), as torch.std_mean returns them."""
        return self.std(axis, keepdim, correction), self.mean(axis, keepdim)

    def _argmax_along(self: Tensor, axis, keepdim: bool, op_name: str) -> Tensor:
        """The index of the first maximum along `axis`, as int32 (int64 past int32's range: the public argmax widens
        it to int64)."""
        if axis is None:
            return self.flatten()._argmax_along(0, False, op_name).reshape(() if not keepdim else (1,) * self.ndim)
        axis = normalize_axis(axis, self.ndim, op_name)
        if self.ndim == 0:  # (a 0-d tensor's one axis, as torch has it: index 0)
            return self.reshape(1)._argmax_along(0, False, op_name).reshape(())
        self._check_nonempty(axis, op_name)
        length = self.shape[axis]
        # the first index holding the maximum: score each match by (length - index) and take the largest
        shape = [1] * self.ndim
        shape[axis] = length
        countdown = type(self).arange(length, 0, -1, device=self.device).reshape(shape)
        is_max = self == self.max(axis, keepdim=True)
        if self.dtype.is_float:
            # a row holding NaN has the maximum NaN, which equals nothing: its first NaN is the answer, as in torch
            is_max = is_max | (self != self)
        best = (is_max.where(countdown, 0)).max(axis, keepdim=keepdim)
        # int32 keeps the kernel narrow; an axis longer than 2**31 needs int64, or its far indices wrap negative
        return (length - best).cast(dtypes.int32 if fits(length - 1, dtypes.int32) else dtypes.int64)

    @keyword_aliases(dim="axis")
    def argmax(self: Tensor, axis=None, keepdim: bool = False) -> Tensor:
        """The index of the first maximum along `axis` (of the flattened tensor if None), as int64 like PyTorch."""
        return self._argmax_along(axis, keepdim, "argmax").cast(dtypes.int64)

    @keyword_aliases(dim="axis")
    def argmin(self: Tensor, axis=None, keepdim: bool = False) -> Tensor:
        """The index of the first minimum along `axis`, as int64."""
        return self._order_reversed()._argmax_along(axis, keepdim, "argmin").cast(dtypes.int64)

    @keyword_aliases(dim="axis")
    def logsumexp(self: Tensor, axis=None, keepdim: bool = False) -> Tensor:
        """log(sum(exp(x))) over `axis`, shifted by the maximum so nothing overflows."""
        self._axes(axis, "logsumexp")
        source = self._to_float()  # (an int's difference from the maximum would wrap below 0 in unsigned types)
        if self.numel() == 0:  # no maximum to shift by: log(0) = -inf over an empty axis, as in torch
            return source.exp().sum(axis, keepdim).log()
        peak = source.max(axis, keepdim=True)
        # a row of -inf has peak -inf: shift by 0 there so the result is -inf, not nan. The shift takes no gradient
        # (it cancels): through the max, the row's rounding of 1 - sum(softmax) went to its largest element (2% off
        # at the argmax of a row of 131072 values)
        shift = (peak.abs() == float("inf")).where(0, peak).detach()
        total = (source - shift).exp().sum(axis, keepdim=True).log() + shift
        return (
            total
            if keepdim
            else total.reshape(tuple(s for i, s in enumerate(self.shape) if i not in self._axes(axis, "logsumexp")))
        )

    @keyword_aliases(dim="axis")
    def softmax(self: Tensor, axis: int = -1, dtype=None) -> Tensor:
        """exp(x) / sum(exp(x)) along `axis`, shifted by the maximum so nothing overflows; computed, as torch's
        kernels do, as exp(x) times the reciprocal of the sum (one division a row, not one a value). `dtype` casts
        the input first, as torch's."""
        if dtype is not None:
            return self._cast_for("softmax", dtype).softmax(axis)
        axes = self._axes(axis, "softmax")
        source = self._to_float()
        if source.numel() == 0:  # (empty, as in torch: there is no maximum to shift by)
            return source
        if source.dtype in NARROW_FLOATS:  # (in float32, rounded once, as torch's: 9 ulp off rounded at each step)
            return source.float().softmax(axis).cast(source.dtype)
        if source.dtype in (dtypes.float32, dtypes.float64) and axes:
            _, exponent, total = softmax_nodes(source.uop, axes)
            scale = broadcast_node(UOp(Ops.RECIP, exponent.dtype, (total,)), exponent.shape)
            return source._new(exponent.alu(Ops.MUL, scale))
        exponent = (source - source.max(axis, keepdim=True)).exp()
        return exponent * exponent.sum(axis, keepdim=True).reciprocal()

    @keyword_aliases(dim="axis")
    def log_softmax(self: Tensor, axis: int = -1, dtype=None) -> Tensor:
        """x - logsumexp(x) along `axis`; `dtype` casts the input first, as torch's."""
        if dtype is not None:
            return self._cast_for("log_softmax", dtype).log_softmax(axis)
        axes = self._axes(axis, "log_softmax")
        source = self._to_float()
        if source.numel() == 0:
            return source
        if source.dtype in NARROW_FLOATS:  # (in float32, rounded once, as torch's)
            return source.float().log_softmax(axis).cast(source.dtype)
        if source.dtype in (dtypes.float32, dtypes.float64) and axes:
            shifted, _, total = softmax_nodes(source.uop, axes)
            dtype = shifted.dtype
            log = UOp(Ops.LOG2, dtype, (total,)).alu(Ops.MUL, broadcast_const(dtype, LN_2, total.shape))
            return source._new(shifted.alu(Ops.ADD, UOp(Ops.NEG, dtype, (broadcast_node(log, shifted.shape),))))
        shifted = source - source.max(axis, keepdim=True)
        return shifted - shifted.exp().sum(axis, keepdim=True).log()

    # ---- whole-tensor comparisons, differences and statistics ------------------------------------------------------

    def allclose(self: Tensor, other, rtol: float = 1e-05, atol: float = 1e-08, equal_nan: bool = False) -> bool:
        """Whether every element is `isclose` to other's (broadcast), as a Python bool (torch.allclose; it reads the
        result on the host)."""
        return bool(self.isclose(other, rtol, atol, equal_nan).all().item())

    def equal(self: Tensor, other: Tensor) -> bool:
        """Whether other has this shape and equal elements (NaN equals nothing), as a Python bool (torch.equal)."""
        if not isinstance(other, ElementwiseMixin):
            raise TypeError(f"equal: expected a Tensor, got {type_name(other)}")
        check_same_device("equal", self, other)
        if self.shape != other.shape:
            return False
        return self.numel() == 0 or bool((self == other).all().item())

    def trace(self: Tensor) -> Tensor:
        """The sum of a matrix's main diagonal (ints and bools sum as int64, as `sum`)."""
        if self.ndim != 2:
            raise ValueError(f"trace: expected a matrix, got shape {self.shape}; use diagonal(dim1=, dim2=).sum(-1)")
        return self.diagonal().sum()

    def diff(self: Tensor, n: int = 1, dim: int = -1, prepend=None, append=None) -> Tensor:
        """The n-th forward difference along `dim`, x[i+1] - x[i] (for bools x[i+1] != x[i]), after joining
        `prepend` and `append` there (tensors of the same number of dimensions), as torch.diff."""
        if self.ndim == 0:
            raise ValueError("diff: needs a tensor with at least 1 dimension, got a 0-d tensor; reshape(1) first")
        if as_int(n) is None or as_int(n) < 0:
            raise ValueError(f"diff: the order n must be a non-negative int, got {n!r}")
        dim = normalize_axis(dim, self.ndim, "diff")
        for name, extra in (("prepend", prepend), ("append", append)):
            if extra is not None and not isinstance(extra, ElementwiseMixin):
                raise TypeError(f"diff: {name} must be a Tensor, got {type_name(extra)}")
            if extra is not None and extra.ndim != self.ndim:
                raise ValueError(
                    f"diff: {name} {extra.shape} needs the input's {self.ndim} dimensions {self.shape} (they may "
                    f"differ only along dim {dim})"
                )
        joined = [tensor for tensor in (prepend, self, append) if tensor is not None]
        x = joined[0].cat(*joined[1:], dim=dim) if len(joined) > 1 else self
        for _ in range(as_int(n)):
            size = x.shape[dim]
            if size == 0:
                break
            later = x.shrink(tuple((1, size) if a == dim else None for a in range(x.ndim)))
            earlier = x.shrink(tuple((0, size - 1) if a == dim else None for a in range(x.ndim)))
            x = later != earlier if x.dtype == dtypes.bool else later - earlier
        return x

    def cov(
        self: Tensor, correction: int = 1, fweights: Tensor | None = None, aweights: Tensor | None = None
    ) -> Tensor:
        """The covariance matrix of the variables in the rows (columns are observations; a 1-D tensor is one
        variable), divided by the observations' count less `correction` (0 where that is not positive, as torch),
        with integer frequency weights `fweights` and float `aweights` (torch.cov; their values are not checked
        for being non-negative). Size-1 axes of the result are squeezed, as torch's."""
        if self.ndim > 2:
            raise ValueError(
                f"cov: expected a tensor of at most 2 dimensions (variables, observations), got {self.shape}"
            )
        observations = self.reshape(1, -1) if self.ndim < 2 else self
        count = observations.shape[1]
        weights = None
        for name, given in (("fweights", fweights), ("aweights", aweights)):
            if given is None:
                continue
            if not isinstance(given, ElementwiseMixin):
                raise TypeError(f"cov: {name} must be a Tensor, got {type_name(given)}")
            if given.ndim > 1 or given.numel() != count:
                raise ValueError(
                    f"cov: {name} must be 1-D with one weight per observation ({count}), got shape {given.shape}"
                )
            if name == "fweights" and not given.dtype.is_int:
                raise TypeError(f"cov: fweights must be integers, got {given.dtype}; use aweights for float weights")
            if name == "aweights" and not given.dtype.is_float:
                raise TypeError(f"cov: aweights must be floats, got {given.dtype}; cast with .float()")
            given = given.reshape(-1)
            weights = given if weights is None else weights * given
        if weights is None:
            total, norm = count, max(0, count - correction)
            mean = observations.sum(1) / total
        else:
            total = weights.sum()
            mean = (observations * weights).sum(1) / total
            norm = total - (
                correction * (weights * aweights.reshape(-1)).sum() / total if aweights is not None else correction
            )
            norm = (norm > 0).where(norm, 0)
        centered = observations - mean.unsqueeze(1)
        weighted = centered if weights is None else centered * weights
        return (centered @ weighted.transpose(0, 1) / norm).squeeze()

    def corrcoef(self: Tensor) -> Tensor:
        """Pearson's correlation coefficients of the variables in the rows (torch.corrcoef): the covariance over
        the product of the standard deviations, clipped to [-1, 1]."""
        if self.ndim > 2:
            raise ValueError(f"corrcoef: expected a tensor of at most 2 dimensions, got {self.shape}")
        covariance = self.cov()
        if covariance.ndim == 0:
            return covariance / covariance
        deviation = covariance.diagonal().sqrt()
        return (covariance / deviation.reshape(-1, 1) / deviation.reshape(1, -1)).clip(-1, 1)

    # ---- matrix multiplication -------------------------------------------------------------------------------------

    def dot(self: Tensor, other: Tensor) -> Tensor:
        """Matrix product with NumPy's rules: 1-D operands are vectors, leading axes broadcast as a batch."""
        if not isinstance(other, ElementwiseMixin):
            raise TypeError(f"matmul: expected a Tensor, got {type_name(other)}")
        check_same_device("matmul", self, other)
        if self.ndim == 0 or other.ndim == 0:
            raise ValueError(f"matmul: both operands need at least 1 dimension, got {self.shape} and {other.shape}")
        inner_self = self.shape[-1]
        inner_other = other.shape[-2] if other.ndim > 1 else other.shape[0]
        if inner_self != inner_other:
            raise ValueError(
                f"matmul: inner dimensions differ: {self.shape} @ {other.shape} ({inner_self} != {inner_other}); "
                "the last axis of the left operand must match the second-to-last of the right"
            )
        batch_self, batch_other = self.shape[:-2], other.shape[:-2]
        try:
            broadcast_shape("matmul", batch_self, batch_other)
        except ValueError:
            raise ValueError(
                f"matmul: batch dimensions of {self.shape} @ {other.shape} ({batch_self} and {batch_other}) cannot be "
                "broadcast together; each must be equal or 1"
            ) from None
        floats = self.dtype == other.dtype and self.dtype.is_float
        if floats and self.ndim > 1 and other.ndim > 1 and self.device == other.device:  # (else the steps below)
            a, b = self.uop, other.uop
            if a.op is Ops.PERMUTE and a.arg == (1, 0) and b.op is Ops.PERMUTE and b.arg == (1, 0):
                # aᵀ @ bᵀ as (b @ a)ᵀ, the same products added in the same order, computed in a buffer of its own (its
                # stores through the transpose would be apart), then copied transposed (a value, not a view: it can
                # be written into). Read in place, both inputs moved apart along every loop of the product, and its
                # block was scalar (1024²: 220 ms, torch 7)
                return self._new(product_node(b.src[0], a.src[0])).contiguous().T.contiguous()
            return self._new(product_node(a, b))
        x = self.reshape(*self.shape[:-1], 1, self.shape[-1])
        w = (
            other.reshape(*other.shape[:-2], 1, *other.shape[-2:])
            if other.ndim > 1
            else other.reshape(1, other.shape[0], 1)
        )
        w = w.transpose(-1, -2)
        dtype = least_upper_dtype(self.dtype, other.dtype, op_name="matmul")
        if dtype == dtypes.bool or is_small_int(dtype):
            # int matmuls keep their dtype, as in PyTorch: products and sum in 32 bits, wrapped once at the end (a
            # product wrapped to 8 bits, then summed in 32, is neither the exact nor the wrapped result)
            wide = x.cast(dtypes.int32) * w.cast(dtypes.int32)
            product = wide.sum(-1, dtype=dtypes.int32).cast(dtype)
        else:
            product = x._sum_of_products(w, -1)
        if other.ndim == 1:
            product = product.reshape(product.shape[:-1])
        if self.ndim == 1:
            product = (
                product.reshape(product.shape[:-2] + product.shape[-1:])
                if other.ndim > 1
                else product.reshape(product.shape[:-1])
            )
        return product

    def matmul(self: Tensor, other: Tensor) -> Tensor:
        return self.dot(other)

    def outer(self: Tensor, other: Tensor) -> Tensor:
        """The outer product of two 1-D tensors: [i, j] = self[i] * other[j] (torch.outer)."""
        if not hasattr(other, "uop") or self.ndim != 1 or other.ndim != 1:
            raise ValueError(
                f"outer: needs two 1-D tensors, got {self.shape} and {getattr(other, 'shape', type(other).__name__)}"
            )
        return self.reshape(-1, 1) * other.reshape(1, -1)

    def linear(self: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
        """self @ weight + bias, with weight shaped (in, out) as in tinygrad (torch's F.linear takes its transpose);
        a 1-D weight scales elementwise."""
        if weight.ndim > 1 and (self.ndim == 0 or self.shape[-1] != weight.shape[-2]):
            raise ValueError(
                f"linear: input {self.shape} does not end in the {weight.shape[-2]} features that weight {weight.shape} "
                "takes (weight is (in, out): transpose a torch-style (out, in) weight)"
            )
        product = self * weight if weight.ndim == 1 else self.dot(weight)
        return product if bias is None else product + bias
