"""PyTorch ops beyond tinygrad's: NaN-ignoring and fused elementwise ops (fmax, fmin, frac, heaviside, addcmul,
addcdiv, logaddexp2), searching and counting (searchsorted, bucketize, bincount, histc, unique, triu_indices,
tril_indices), norms, products and membership (norm, cosine_similarity, cross, hypot, logit, isin), adaptive
pooling, and torch's in-place `_` forms (add_, fill_, copy_, uniform_, ...). Each is a composition of other tensor ops; a search or a
count compares every value with every boundary or bin (an arange) and sums, so its work is values × boundaries.
`unique`, whose length depends on the values, is found on the host, as `nonzero`."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from lazygrad.dtype import dtypes, integer_range, to_dtype
from lazygrad.tensor_elementwise import check_device_has, check_same_device, is_number, type_name
from lazygrad.tensor_index import SELECT_FIX, comparable_index, refuse_host_values_in_capture
from lazygrad.tensor_math import LN_2
from lazygrad.tensor_movement import as_int, normalize_axis
from lazygrad.tensor_nn import _check_tensor

# `searchsorted` compares every value with every boundary, unless the sequence is longer than SEARCH_LENGTH and that
# would be more than SEARCH_WORK comparisons: then it halves (`_halving_count`). Measured warm on two CPU cores
# (LLVM): a comparison costs ~0.07 ns, a round of halving ~0.8 ns a value, plus ~2 ms more to schedule its larger
# graph; halving was slower at 64 boundaries for 10^6 values (5.2 against 4.7 ms) and at 25.6M comparisons (256 for
# 10^5 values: 2.1 against 2.1 ms; 32,768 for 10^3: 2.3 against 2.3), faster from 128 boundaries for 10^6 values
# (7.9 against 11 ms) and from about 35M comparisons (384 for 10^5: 2.3 against 2.9 ms; 8,192 for 10^4: 2.9 against
# 5.6); 8,192 for 10^5 values took 4 ms against 45
SEARCH_LENGTH, SEARCH_WORK = 64, 1 << 25

if TYPE_CHECKING:
    from lazygrad.tensor import Tensor


def _host_extrema(tensor: Tensor) -> tuple:
    """(min, max) of a non-empty tensor as Python numbers, read on the host in one step."""
    low, high = type(tensor).stack(tensor.min(), tensor.max()).numpy().tolist()
    return low, high


def _triangle_indices(cls, row, col, offset, dtype, device, op_name: str, upper: bool) -> Tensor:
    """The (2, N) row and column indices of a row × col matrix's upper (or lower) triangle from diagonal `offset`,
    in row-major order (computed on the host: they depend on the sizes only)."""
    for name, value in (("row", row), ("col", col), ("offset", offset)):
        if as_int(value) is None:
            raise TypeError(f"{op_name}: {name} must be an int, got {value!r}")
    rows, cols, offset = as_int(row), as_int(col), as_int(offset)
    if rows < 0 or cols < 0:
        raise ValueError(f"{op_name}: row and col must be non-negative, got row={rows}, col={cols}")
    dtype = to_dtype(dtype)
    if not dtype.is_int:
        raise TypeError(f"{op_name}: dtype must be an int dtype (int64 or int32, as torch), got {dtype}")
    make = np.triu_indices if upper else np.tril_indices
    indices = np.stack(make(rows, offset, cols)).astype(np.int64).reshape(2, -1)
    return cls(indices, dtype=dtype, device=device)


class ExtraMixin:
    """PyTorch's NaN-ignoring and fused elementwise ops, and its searches and counts."""

    __slots__ = ()

    # ---- elementwise -----------------------------------------------------------------------------------------------

    def fmax(self: Tensor, other) -> Tensor:
        """The elementwise maximum ignoring NaN: the other value where one is NaN, NaN only where both are
        (torch.fmax); a tie passes the gradient to self, as torch's."""
        x, y = self._operands(other, "fmax")
        keep = (x >= y) | y.isnan() if x.dtype.is_float else x >= y
        return keep.where(x, y)

    def fmin(self: Tensor, other) -> Tensor:
        """The elementwise minimum ignoring NaN (torch.fmin); a tie passes the gradient to self."""
        x, y = self._operands(other, "fmin")
        keep = (x <= y) | y.isnan() if x.dtype.is_float else x <= y
        return keep.where(x, y)

    def frac(self: Tensor) -> Tensor:
        """The fractional part, x - trunc(x), with the sign of x (torch.frac: float tensors only); slope 1."""
        if not self.dtype.is_float:
            raise TypeError(
                f"frac: needs a float tensor, got {self.dtype} (an int has no fraction); cast with .float()"
            )
        return self - self.trunc()

    def heaviside(self: Tensor, values) -> Tensor:
        """0 where self < 0, `values` where self == 0, 1 where self > 0 (and 0 at NaN, as torch.heaviside).
        A tensor of values must have self's dtype, as torch requires."""
        if hasattr(values, "uop") and values.dtype != self.dtype:
            raise TypeError(
                f"heaviside: input is {self.dtype} but values is {values.dtype}; torch takes one dtype: cast values "
                f"with .cast({self.dtype})"
            )
        x, at_zero = self._operands(values, "heaviside")
        return (x == 0).where(at_zero, (x > 0).cast(x.dtype))

    def addcmul(self: Tensor, tensor1, tensor2, *, value=1) -> Tensor:
        """self + value * tensor1 * tensor2, all three broadcast together (torch.addcmul)."""
        _check_addc_value(value, (self, tensor1, tensor2), "addcmul")
        return self + (tensor1 * value if value != 1 else tensor1) * tensor2

    def addcdiv(self: Tensor, tensor1, tensor2, *, value=1) -> Tensor:
        """self + value * tensor1 / tensor2, all three broadcast together (torch.addcdiv); two int (or bool)
        tensor1 and tensor2 are refused, as in torch."""
        _check_tensor(tensor1, "addcdiv", "tensor1")
        _check_tensor(tensor2, "addcdiv", "tensor2")
        if not tensor1.dtype.is_float and not tensor2.dtype.is_float:
            raise TypeError(
                f"addcdiv: tensor1 ({tensor1.dtype}) and tensor2 ({tensor2.dtype}) are both ints; torch no longer "
                "divides ints here: write self + value * (tensor1 / tensor2) for true division, or cast one to float"
            )
        _check_addc_value(value, (self, tensor1, tensor2), "addcdiv")
        return self + (tensor1 * value if value != 1 else tensor1) / tensor2

    def logaddexp2(self: Tensor, other) -> Tensor:
        """log2(2**x + 2**y) without overflow: max(x, y) + log1p(2**-|x - y|) / ln 2 (torch.logaddexp2)."""
        x, y = self._operands(other, "logaddexp2")
        x, y = x._to_float(), y._to_float()
        same_infinity = (x == y) & x.isinf()  # x - y would be nan; the answer is that infinity
        distance = same_infinity.where(0.0, (x - y).abs())
        return x.maximum(y) + same_infinity.where(0.0, (-distance).exp2().log1p() * (1 / LN_2))

    # ---- searching and counting ------------------------------------------------------------------------------------

    def searchsorted(
        self: Tensor, values, *, out_int32: bool = False, right: bool = False, side: str | None = None, sorter=None
    ) -> Tensor:
        """For each of `values`, where it would go in this sorted sequence (the last axis; a 1-D sequence serves
        every value, an N-D one the values of the same leading indices): the count of elements below it (at or
        below it with right=True or side="right"), as int64 (int32 with out_int32), as torch.searchsorted(self,
        values). A NaN value goes last; NaN in the sequence counts as above every value (NumPy's order: torch's
        binary search has no defined answer there). `sorter` gives the order that sorts the sequence."""
        if side not in (None, "left", "right"):
            raise ValueError(f"searchsorted: side must be 'left' or 'right', got {side!r}")
        if side is not None and right != (side == "right") and right:
            raise ValueError(f"searchsorted: side={side!r} and right=True ask for opposite sides; pass one of them")
        right = right or side == "right"
        if self.ndim == 0:
            raise ValueError("searchsorted: the sorted sequence needs at least 1 dimension, got a 0-d tensor")
        if sorter is not None:
            _check_tensor(sorter, "searchsorted", "sorter")
            if sorter.shape != self.shape or not sorter.dtype.is_int:
                raise ValueError(
                    f"searchsorted: sorter must be int indices of the sequence's shape {self.shape}, got "
                    f"{sorter.dtype} {sorter.shape}"
                )
            sequence = self.gather(-1, sorter)
        else:
            sequence = self
        if is_number(values):
            if self.ndim != 1:
                raise ValueError(f"searchsorted: a number searches a 1-D sequence only, got {self.shape}")
            values = type(self)(values, device=self.device)
        _check_tensor(values, "searchsorted", "values")
        check_same_device("searchsorted", self, values)
        if self.ndim > 1 and (values.ndim != self.ndim or values.shape[:-1] != self.shape[:-1]):
            raise ValueError(
                f"searchsorted: an N-D sequence {self.shape} needs values of the same leading dimensions "
                f"{self.shape[:-1]} + (any,), got {values.shape}; use a 1-D sequence to search every value"
            )
        length = self.shape[-1]
        # (..., K, 1) values against (..., 1, M) boundaries
        boundaries = sequence.reshape(*((1,) * values.ndim), length) if self.ndim == 1 else sequence.unsqueeze(-2)
        if length > SEARCH_LENGTH and length * values.numel() > SEARCH_WORK:
            count = boundaries._halving_count(values, right)
        else:
            probes = values.unsqueeze(-1)
            below = boundaries <= probes if right else boundaries < probes
            if probes.dtype.is_float:
                below = below | probes.isnan()
            count = below.sum(-1)
        return count.cast(dtypes.int32 if out_int32 else dtypes.int64)

    def _halving_count(boundaries: Tensor, values: Tensor, right: bool) -> Tensor:
        """How many of the sorted `boundaries` (..., 1, M) lie below each of `values` (..., K) (at or below with
        `right`), by halving: log2(M) rounds, each a lookup of one boundary per value and a comparison, all
        elementwise (a lookup is a load: one kernel), where counting compares every value with every boundary. A NaN
        value counts them all; a NaN boundary, sorted last, counts as above every value."""
        length = boundaries.shape[-1]
        positions = type(boundaries).arange(length, device=boundaries.device)
        step = 1 << (length.bit_length() - 1)
        # the first round's boundary is the same for every value: a slice (a lookup at a constant index is a sum)
        first = boundaries.shrink((*(None for _ in boundaries.shape[:-1]), (step - 1, step))).squeeze(-1)
        count = (first <= values if right else first < values).where(step, 0).cast(dtypes.int32)
        step >>= 1
        while step:
            # is the (count + step)-th boundary below the value? The count stays below the first one that is not
            candidate = count + step
            index = candidate.minimum(length) - 1
            boundary = boundaries._sum_selected(index.unsqueeze(-1) == positions, -1)
            below = boundary <= values if right else boundary < values
            count = ((candidate <= length) & below).where(candidate, count)
            step >>= 1
        return values.isnan().where(length, count) if values.dtype.is_float else count

    def bucketize(self: Tensor, boundaries: Tensor, *, out_int32: bool = False, right: bool = False) -> Tensor:
        """The index of each value's bucket among the sorted 1-D `boundaries`: i where boundaries[i-1] < x <=
        boundaries[i] (boundaries[i-1] <= x < boundaries[i] with right=True), as torch.bucketize."""
        _check_tensor(boundaries, "bucketize", "boundaries")
        if boundaries.ndim != 1:
            raise ValueError(f"bucketize: boundaries must be 1-D, got shape {boundaries.shape}; use searchsorted")
        return boundaries.searchsorted(self, out_int32=out_int32, right=right)

    def bincount(self: Tensor, weights: Tensor | None = None, minlength: int = 0) -> Tensor:
        """How often each value 0..max occurs in this 1-D tensor of non-negative ints (at least `minlength` counts),
        as int64; with `weights`, their sums instead (float32 weights give float32, others float64, as torch).
        The length depends on the values, so the largest is read on the host when the op is built, as one_hot's
        without num_classes."""
        if self.ndim != 1 or not self.dtype.is_int:
            raise TypeError(
                f"bincount: needs a 1-D tensor of non-negative ints, got {self.dtype} of shape {self.shape}"
            )
        if as_int(minlength) is None or as_int(minlength) < 0:
            raise ValueError(f"bincount: minlength must be a non-negative int, got {minlength!r}")
        if weights is not None:
            _check_tensor(weights, "bincount", "weights")
            check_same_device("bincount", self, weights)
            if weights.shape != self.shape:
                raise ValueError(
                    f"bincount: weights must be 1-D of the input's length {self.shape}, got {weights.shape}"
                )
        refuse_host_values_in_capture(
            self,
            "bincount",
            "Count outside the TinyJit function, or with a known count: x.one_hot(count).sum(0) (weighted: "
            "(x.one_hot(count) * w.unsqueeze(-1)).sum(0))",
        )
        length = as_int(minlength)
        if self.numel():
            low, high = _host_extrema(self)
            if low < 0:
                raise ValueError(f"bincount: the input holds {low}; it counts non-negative ints only")
            length = max(length, int(high) + 1)
        matches = comparable_index(self).unsqueeze(-1) == type(self).arange(length, device=self.device)
        if weights is None:
            return matches.sum(0)
        dtype = weights.dtype if weights.dtype in (dtypes.float32, dtypes.float64) else dtypes.float64
        check_device_has(dtype, self.device, "bincount")
        return matches.where(weights.cast(dtype).unsqueeze(-1), 0).sum(0)

    def histc(self: Tensor, bins: int = 100, min=0, max=0) -> Tensor:  # noqa: A002 (torch's names)
        """A histogram of all the values in `bins` equal bins over [min, max] (the data's own range where min ==
        max, widened by 1 each way where that is one value), as torch.histc: values outside it and NaN are left
        out, max itself falls in the last bin; a float tensor of counts in self's dtype."""
        if not self.dtype.is_float:
            raise TypeError(f"histc: needs a float tensor, got {self.dtype}; cast with .float()")
        if as_int(bins) is None or as_int(bins) <= 0:
            raise ValueError(f"histc: bins must be a positive int, got {bins!r}")
        bins = as_int(bins)
        if not is_number(min) or not is_number(max):
            raise TypeError(f"histc: min and max must be numbers, got {type_name(min)} and {type_name(max)}")
        low, high = float(min), float(max)
        if low == high and self.numel():
            refuse_host_values_in_capture(self, "histc without a range (min == max)", "Pass min and max")
            low, high = (float(v) for v in _host_extrema(self))
        if low == high:
            low, high = low - 1, high + 1
        if not (math.isfinite(low) and math.isfinite(high)):
            raise ValueError(f"histc: the range [{low}, {high}] is not finite")
        if low > high:
            raise ValueError(f"histc: max must be larger than min, got min={low}, max={high}")
        # the edges in self's dtype, and the bin as torch computes it there: (x - min) * bins / (max - min)
        scalar = np.float64 if self.dtype == dtypes.float64 else np.float32
        low, high = scalar(low), scalar(high)
        values = self.flatten().detach()
        position = ((values - float(low)) * bins / float(high - low)).floor().minimum(bins - 1)
        inside = (values >= float(low)) & (values <= float(high))
        index = inside.where(position, -1).cast(dtypes.int32)
        counts = (index.unsqueeze(-1) == type(self).arange(bins, device=self.device)).sum(0)
        return counts.cast(self.dtype)

    def unique(self: Tensor, sorted: bool = True, return_inverse: bool = False, return_counts: bool = False, dim=None):
        """The distinct values in ascending order (of the flattened tensor, or the distinct slices along `dim`), with
        each element's place among them (`return_inverse`: the input's shape, or the length of `dim`) and each one's
        count (`return_counts`), as torch.unique: every NaN is distinct, -0.0 equals 0.0. Found on the host (how many
        there are depends on the values: the tensor is realized), and not differentiable, as torch's."""
        del sorted  # (always sorted, as torch's CPU unique)
        refuse_host_values_in_capture(self, "unique", SELECT_FIX)
        values = self.numpy()
        if dim is None:
            found = np.unique(values.reshape(-1), return_inverse=True, return_counts=True, equal_nan=False)
            distinct, inverse, counts = found[0], found[1].reshape(self.shape), found[2]
        else:
            axis = normalize_axis(dim, self.ndim, "unique")
            distinct, inverse, counts = np.unique(values, return_inverse=True, return_counts=True, axis=axis)
            inverse = inverse.reshape(-1)
        result = [type(self)(distinct, dtype=self.dtype, device=self.device)]
        if return_inverse:
            result.append(type(self)(inverse.astype(np.int64), device=self.device))
        if return_counts:
            result.append(type(self)(counts.astype(np.int64), device=self.device))
        return result[0] if len(result) == 1 else tuple(result)

    # ---- norms, products and membership ----------------------------------------------------------------------------

    def norm(self: Tensor, p="fro", dim=None, keepdim: bool = False) -> Tensor:
        """The p-norm over `dim` (all elements by default), as torch.norm: "fro" and 2 the Euclidean norm, inf the
        largest |x|, -inf the smallest, 0 the count of non-zero elements, another p (sum |x|^p)^(1/p). Half and
        bfloat16 are computed in float32 (their squares overflow past 256). At a zero vector the gradient is 0, as
        torch's (the root's slope there is infinite)."""
        if self.dtype in (dtypes.float16, dtypes.bfloat16):
            return self.float().norm(p, dim, keepdim).cast(self.dtype)
        source = self._to_float()
        axes = source._axes(dim, "norm")
        if p != "fro" and (isinstance(p, bool) or not isinstance(p, (int, float, np.integer, np.floating))):
            raise ValueError(f"norm: p must be 'fro' or a number, got {p!r} (the nuclear norm is not implemented)")
        p = 2 if p == "fro" else float(p)
        magnitude = source.abs()
        if p == math.inf:
            return magnitude.max(axes, keepdim)
        if p == -math.inf:
            return magnitude.min(axes, keepdim)
        if p == 0:  # (a count: slope 0, through a select that is never taken)
            return (source < source).where(source, (source != 0).cast(source.dtype)).sum(axes, keepdim)
        if p == 1:
            return magnitude.sum(axes, keepdim)
        if p == 2:
            powered = magnitude.square()
        else:  # (|x|^p by a select at 0, where its slope is infinite for p < 1: torch's gradient is 0 there)
            nonzero = magnitude != 0
            # (0^p is inf for a negative p: one zero makes the sum inf, and the norm 0)
            powered = nonzero.where(nonzero.where(magnitude, 1.0) ** p, 0.0 if p > 0 else math.inf)
        total = powered.sum(axes, keepdim)
        zero = total == 0  # (the root taken of 1 there, and the result 0 by a select: slope 0, not 0 * inf)
        root = zero.where(1.0, total).sqrt() if p == 2 else zero.where(1.0, total) ** (1 / p)
        return zero.where(0.0, root)

    def cosine_similarity(self: Tensor, other: Tensor, dim: int = 1, eps: float = 1e-8) -> Tensor:
        """x·y / (max(|x|, eps) max(|y|, eps)) along `dim`, the operands broadcast (torch's F.cosine_similarity)."""
        _check_tensor(other, "cosine_similarity", "the other operand")
        x, y = self._to_float()._operands(other._to_float(), "cosine_similarity")
        return (x * y).sum(dim) / (x.norm(dim=dim).maximum(eps) * y.norm(dim=dim).maximum(eps))

    def cross(self: Tensor, other: Tensor, dim=None) -> Tensor:
        """The cross product of 3-vectors along `dim` (without it, the first axis of size 3, as torch.cross), the
        operands broadcast."""
        _check_tensor(other, "cross", "the other operand")
        x, y = self._operands(other, "cross")
        if dim is None:
            dim = next((axis for axis, size in enumerate(x.shape) if size == 3), None)
            if dim is None:
                raise ValueError(f"cross: no axis of size 3 in {x.shape}; pass dim= naming one")
        dim = normalize_axis(dim, x.ndim, "cross")
        if x.shape[dim] != 3:
            raise ValueError(f"cross: dim {dim} of {x.shape} has size {x.shape[dim]}, not 3")

        def part(t: Tensor, i: int) -> Tensor:
            return t.narrow(dim, i, 1)

        return type(self).cat(
            part(x, 1) * part(y, 2) - part(x, 2) * part(y, 1),
            part(x, 2) * part(y, 0) - part(x, 0) * part(y, 2),
            part(x, 0) * part(y, 1) - part(x, 1) * part(y, 0),
            dim=dim,
        )

    def hypot(self: Tensor, other) -> Tensor:
        """sqrt(x² + y²) without overflow or underflow in between (the larger magnitude times sqrt(1 + r²)); an
        infinity gives inf even beside NaN, as C's hypot and torch."""
        x, y = self._to_float()._operands(other._to_float() if hasattr(other, "uop") else other, "hypot")
        a, b = x.abs(), y.abs()
        large, small = a.maximum(b), a.minimum(b)
        ratio = (large == 0).where(0.0, small / (large == 0).where(1.0, large))
        result = large * (1 + ratio * ratio).sqrt()
        return (a.isinf() | b.isinf()).where(math.inf, result)

    def logit(self: Tensor, eps: float | None = None) -> Tensor:
        """log(p / (1 - p)), with p clamped to [eps, 1 - eps] where `eps` is given (torch.logit); as log(p) -
        log1p(-p), whose slope at 0 and 1 is inf, as torch's (the quotient's was NaN there)."""
        p = self._to_float()
        if eps is not None:
            p = p.clamp(eps, 1 - eps)
        return p.log() - (-p).log1p()

    def isin(self: Tensor, test_elements, invert: bool = False) -> Tensor:
        """Whether each element is among `test_elements` (a tensor or a number), as torch.isin: each element is
        compared with every test element (elements × tests work)."""
        tests = test_elements if hasattr(test_elements, "uop") else type(self)(test_elements, device=self.device)
        check_same_device("isin", self, tests)
        if tests.numel() == 0:
            found = self.zeros_like(dtype=dtypes.bool)
        else:
            found = (self.unsqueeze(-1) == tests.reshape(-1)).any(-1)
        return ~found if invert else found

    # ---- adaptive pooling --------------------------------------------------------------------------------------

    def adaptive_avg_pool1d(self: Tensor, output_size) -> Tensor:
        """The mean over `output_size` bins of the last axis, as torch's F.adaptive_avg_pool1d."""
        return self._adaptive_pool(1, output_size, "avg", "adaptive_avg_pool1d")

    def adaptive_avg_pool2d(self: Tensor, output_size) -> Tensor:
        """The mean over bins of the last two axes, `output_size` of them (an int, or a pair with None keeping an
        axis), as torch's F.adaptive_avg_pool2d: bin j of n values into m covers [floor(j n / m), ceil((j+1) n / m))."""
        return self._adaptive_pool(2, output_size, "avg", "adaptive_avg_pool2d")

    def adaptive_avg_pool3d(self: Tensor, output_size) -> Tensor:
        """The mean over bins of the last three axes, as torch's F.adaptive_avg_pool3d."""
        return self._adaptive_pool(3, output_size, "avg", "adaptive_avg_pool3d")

    def adaptive_max_pool1d(self: Tensor, output_size) -> Tensor:
        """The maximum over bins of the last axis, as torch's F.adaptive_max_pool1d (values only)."""
        return self._adaptive_pool(1, output_size, "max", "adaptive_max_pool1d")

    def adaptive_max_pool2d(self: Tensor, output_size) -> Tensor:
        """The maximum over bins of the last two axes, as torch's F.adaptive_max_pool2d (values only)."""
        return self._adaptive_pool(2, output_size, "max", "adaptive_max_pool2d")

    def _adaptive_pool(self: Tensor, dims: int, output_size, kind: str, op_name: str) -> Tensor:
        if self.ndim < dims:
            raise ValueError(f"{op_name}: needs at least {dims} axes to pool, got shape {self.shape}")
        sizes = (output_size,) * dims if as_int(output_size) is not None else tuple(output_size)
        if len(sizes) != dims:
            raise ValueError(f"{op_name}: output_size needs {dims} sizes, got {output_size!r}")
        result = self._to_float() if kind == "avg" else self
        for offset, size in enumerate(sizes):
            axis = self.ndim - dims + offset
            length = self.shape[axis]
            size = length if size is None else as_int(size)
            if size is None or size <= 0 or length == 0:
                raise ValueError(
                    f"{op_name}: output sizes must be positive ints over non-empty axes, got {output_size!r} for "
                    f"{self.shape}"
                )
            moved = result.transpose(axis, -1)
            if length % size == 0:  # (equal bins: a reshape and a reduce)
                binned = moved.reshape(*moved.shape[:-1], size, length // size)
                pooled = binned.mean(-1) if kind == "avg" else binned.max(-1)
            else:  # (bins that overlap or differ in size: each one a row of a mask over the axis)
                starts = [j * length // size for j in range(size)]
                ends = [-(-(j + 1) * length // size) for j in range(size)]
                inside = np.array([[start <= i < end for i in range(length)] for start, end in zip(starts, ends)])
                mask = type(self)(inside, device=self.device)
                if kind == "avg":  # (a select and a sum, not a product with the weights: 0 * inf is NaN)
                    counts = type(self)(inside.sum(-1).astype(np.float32), device=self.device).cast(moved.dtype)
                    pooled = mask.where(moved.unsqueeze(-2), 0.0).sum(-1) / counts
                else:
                    if moved.dtype.is_float:
                        lowest = -math.inf
                    else:
                        lowest = False if moved.dtype == dtypes.bool else integer_range(moved.dtype)[0]
                    pooled = mask.where(moved.unsqueeze(-2), lowest).max(-1)
            result = pooled.transpose(axis, -1)
        return result

    # ---- torch's in-place forms: the op's result written into this tensor, as `+=` does (see Tensor._in_place) -----

    def add_(self: Tensor, other, alpha=1) -> Tensor:
        return self._in_place("add_", self + (other * alpha if alpha != 1 else other))

    def sub_(self: Tensor, other, alpha=1) -> Tensor:
        return self._in_place("sub_", self - (other * alpha if alpha != 1 else other))

    def mul_(self: Tensor, other) -> Tensor:
        return self._in_place("mul_", self * other)

    def div_(self: Tensor, other, rounding_mode=None) -> Tensor:
        return self._in_place("div_", self.div(other, rounding_mode=rounding_mode))

    def pow_(self: Tensor, exponent) -> Tensor:
        return self._in_place("pow_", self**exponent)

    def clamp_(self: Tensor, min=None, max=None) -> Tensor:  # noqa: A002 (torch's names)
        return self._in_place("clamp_", self.clamp(min, max))

    clip_ = clamp_

    def masked_fill_(self: Tensor, mask: Tensor, value) -> Tensor:
        return self._in_place("masked_fill_", self.masked_fill(mask, value))

    def fill_(self: Tensor, value) -> Tensor:
        """Every element set to `value` (a number or a one-element tensor), in place."""
        if hasattr(value, "uop"):
            if value.numel() != 1:
                raise ValueError(f"fill_: the value must be a number or a one-element tensor, got shape {value.shape}")
            filled = value.reshape(()).cast(self.dtype).expand(self.shape)
        else:
            filled = type(self).full(self.shape, value, dtype=self.dtype, device=self.device)
        return self._in_place("fill_", filled)

    def zero_(self: Tensor) -> Tensor:
        return self.fill_(0)

    def copy_(self: Tensor, src) -> Tensor:
        """`src` (broadcast to this shape, cast to this dtype, moved to this device) written into this tensor."""
        if not hasattr(src, "uop"):
            src = type(self)(src, dtype=self.dtype, device=self.device)
        if src.ndim > self.ndim or any(a not in (1, b) for a, b in zip(src.shape[::-1], self.shape[::-1])):
            raise ValueError(
                f"copy_: the source {src.shape} does not broadcast to this tensor's {self.shape}; reshape or slice it"
            )
        return self._in_place("copy_", src.to(self.device).cast(self.dtype)._broadcast_to(self.shape))

    def uniform_(self: Tensor, a: float = 0.0, b: float = 1.0) -> Tensor:
        """Uniform random numbers in [a, b), in place (as torch's initializers write weights)."""
        drawn = type(self).uniform(self.shape, low=a, high=b, dtype=self.dtype, device=self.device)
        return self._in_place("uniform_", drawn)

    def normal_(self: Tensor, mean: float = 0.0, std: float = 1.0) -> Tensor:
        """Normal random numbers of `mean` and `std`, in place."""
        drawn = type(self).normal(self.shape, mean=mean, std=std, dtype=self.dtype, device=self.device)
        return self._in_place("normal_", drawn)

    @classmethod
    def triu_indices(cls, row: int, col: int, offset: int = 0, *, dtype=dtypes.int64, device=None) -> Tensor:
        """The (2, N) row and column indices of the upper triangle of a row × col matrix, from the diagonal
        `offset` up (torch.triu_indices)."""
        return _triangle_indices(cls, row, col, offset, dtype, device, "triu_indices", upper=True)

    @classmethod
    def tril_indices(cls, row: int, col: int, offset: int = 0, *, dtype=dtypes.int64, device=None) -> Tensor:
        """The (2, N) row and column indices of the lower triangle of a row × col matrix, from the diagonal
        `offset` down (torch.tril_indices)."""
        return _triangle_indices(cls, row, col, offset, dtype, device, "tril_indices", upper=False)


def _unary_in_place(name: str):
    """torch's in-place form of the unary op `name` (`exp_`): its result written into the tensor."""

    def in_place(self: Tensor) -> Tensor:
        return self._in_place(f"{name}_", getattr(self, name)())

    in_place.__name__ = in_place.__qualname__ = f"{name}_"
    in_place.__doc__ = f"`{name}` written into this tensor, as torch's `{name}_`."
    return in_place


for _name in ("neg", "abs", "exp", "log", "sqrt", "relu", "sigmoid", "tanh"):
    setattr(ExtraMixin, f"{_name}_", _unary_in_place(_name))


def _check_addc_value(value, tensors, op_name: str) -> None:
    """addcmul's and addcdiv's `value` is a number; a float value with all-int tensors is refused, as in torch."""
    if not is_number(value):
        raise TypeError(f"{op_name}: value must be a number, got {type_name(value)}")
    for tensor in tensors:
        _check_tensor(tensor, op_name, "every operand")
    if isinstance(value, (float, np.floating)) and not any(t.dtype.is_float for t in tensors):
        raise TypeError(
            f"{op_name}: value {value} is a float but the tensors are ints ({', '.join(str(t.dtype) for t in tensors)});"
            " pass an int value or cast a tensor to float"
        )
