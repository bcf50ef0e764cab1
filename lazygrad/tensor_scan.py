"""Scans (running sums, products, maxima, log-sum-exps) and sorting (sort, argsort, topk).

Each is built from a pairwise view of the axis: an (n, n) comparison of every element with every other, reduced
along one side. That costs n^2 work per row, which is what a fused elementwise-and-reduce kernel does well for the
short axes these ops usually see; it keeps each op a composition of primitives, with gradients for free (sort's
values are a select of the input, so their gradient goes to exactly the element each came from). Running sums,
products and log-sum-exps of long rows go by blocks, the blocks' totals scanned the same way (`_scan_last`): n*sqrt(n)
work, or n*SCAN_BLOCK a level for the longest rows."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from lazygrad.dtype import dtypes, integer_range
from lazygrad.tensor_elementwise import NARROW_FLOATS
from lazygrad.tensor_movement import keyword_aliases, normalize_axis

if TYPE_CHECKING:
    from lazygrad.tensor import Tensor


# the most values in the prefixes of all rows (rows * n^2) that a scan reduces directly (one kernel); more go by
# blocks. A block's prefixes cost its length per value, and each level of blocks four kernels: rows up to LONG_SCAN
# go by blocks of about sqrt(n) (two levels), longer ones by blocks of SCAN_BLOCK, level after level (a (1, 10^6)
# cumsum: 22 ms in blocks of 512, 2.4 ms in blocks of 16 and ten kernels; (8, 4096): 0.48 ms in blocks of 64, 0.57
# in blocks of 16)
DIRECT_SCAN_WORK, LONG_SCAN, SCAN_BLOCK = 1 << 22, 1 << 13, 16


class ValuesIndices(NamedTuple):
    """(values, indices), by name too, as torch's sort, topk, cummax and cummin return them."""

    values: Tensor
    indices: Tensor


class ScanMixin:
    """Running reductions and sorting along one axis."""

    __slots__ = ()

    def _along_last(self: Tensor, axis: int, op_name: str) -> tuple[Tensor, int]:
        """This tensor with `axis` moved last (a 0-d tensor becomes one element), and the normalized axis."""
        if self.ndim == 0:
            normalize_axis(axis, 0, op_name)
            return self.reshape(1), 0
        axis = normalize_axis(axis, self.ndim, op_name)
        return (self if axis == self.ndim - 1 else self.transpose(axis, -1)), axis

    def _back_from_last(self: Tensor, result: Tensor, axis: int) -> Tensor:
        """`result` (axis last, as `_along_last` made it) put back in this tensor's layout."""
        if self.ndim == 0:
            return result.reshape(())
        return result if axis == self.ndim - 1 else result.transpose(axis, -1)

    def _prefixes(self: Tensor, fill) -> Tensor:
        """(..., n) -> (..., n, n): element [i, j] is x[i] for i <= j and `fill` after: column j holds prefix j."""
        length = self.shape[-1]
        index = type(self).arange(length, device=self.device)
        in_prefix = index.reshape(length, 1) <= index.reshape(1, length)
        return in_prefix.where(self.unsqueeze(-1), fill)

    def _scan(self: Tensor, axis: int, op_name: str, fill, reduce) -> Tensor:
        moved, axis = self._along_last(axis, op_name)
        if moved.shape[-1] == 0:
            return self  # no prefixes to reduce
        return self._back_from_last(moved._scan_last(fill, reduce), axis)

    def _scan_last(self: Tensor, fill, reduce) -> Tensor:
        """The inclusive scan along the last axis by `reduce` (over axis -2), whose identity is `fill`. Where the
        prefixes of every row are more than DIRECT_SCAN_WORK values, rows are scanned in blocks: each block's own
        prefixes, then the scan of the blocks' totals (in blocks again, where long), each block combined with the
        total of the blocks before it. That is n*sqrt(n) work a row instead of n^2, or n*SCAN_BLOCK a level for rows
        longer than LONG_SCAN, in four kernels a level instead of one (the padded values the blocks' prefixes read get
        a buffer of their own, see engine/fusion)."""
        length = self.shape[-1]
        if self.numel() * length <= DIRECT_SCAN_WORK or length < 4:
            return reduce(self._prefixes(fill))
        # (a power of two, at most the square root)
        block = SCAN_BLOCK if length > LONG_SCAN else 1 << (length.bit_length() - 1) // 2
        blocks, batch = -(-length // block), self.shape[:-1]
        padded = self.pad(((0, 0),) * len(batch) + ((0, blocks * block - length),), value=fill)
        within = reduce(padded.reshape(*batch, blocks, block)._prefixes(fill))  # (..., blocks, block)
        totals = within[..., -1]._scan_last(fill, reduce)  # the running totals of whole blocks
        before = totals.pad(((0, 0),) * len(batch) + ((1, -1),), value=fill).unsqueeze(-1).expand(within.shape)
        combined = reduce(within.stack(before, dim=-2))
        return combined.reshape(*batch, blocks * block)[..., :length]

    @keyword_aliases(dim="axis")
    def cumsum(self: Tensor, axis: int = 0, dtype=None) -> Tensor:
        """Running sums along `axis`; bools and ints sum as int64, as in PyTorch, unless `dtype` is given (the input
        is cast to it first, and the sums wrap as that dtype does: int8 100 + 100 is -56)."""
        # sum's own dtype would widen an int `dtype` back to int64 (and the prefixes of bools, filled with int 0,
        # are int32): the sums take the source's dtype, the one asked for
        source = self._scan_source(dtype)
        # half and bfloat16 scans run in float32 and round once, as torch's: the blocked scan rounded its blocks'
        # prefixes and totals before adding them, so a row's result depended on how many rows came with it
        if source.dtype in NARROW_FLOATS:
            return source.float().cumsum(axis).cast(source.dtype)
        return source._scan(axis, "cumsum", 0, lambda prefixes: prefixes.sum(-2, dtype=source.dtype))

    @keyword_aliases(dim="axis")
    def cumprod(self: Tensor, axis: int = 0, dtype=None) -> Tensor:
        """Running products along `axis`; bools and ints multiply as int64, as in PyTorch, unless `dtype` is given
        (the input is cast to it first, and the products wrap as that dtype does)."""
        source = self._scan_source(dtype)  # (the products take its dtype, as cumsum's sums do)
        if source.dtype in NARROW_FLOATS:
            return source.float().cumprod(axis).cast(source.dtype)
        return source._scan(axis, "cumprod", 1, lambda prefixes: prefixes.prod(-2, dtype=source.dtype))

    def _scan_source(self: Tensor, dtype) -> Tensor:
        if dtype is not None:
            return self.cast(dtype)
        return self.cast(dtypes.int64) if self.dtype == dtypes.bool or self.dtype.is_int else self

    @keyword_aliases(dim="axis")
    def logcumsumexp(self: Tensor, axis: int = 0) -> Tensor:
        """log(cumsum(exp(x))) along `axis`, with each prefix shifted by its own maximum (no overflow)."""
        source = self._to_float()
        if source.dtype in NARROW_FLOATS:
            return source.float().logcumsumexp(axis).cast(source.dtype)
        return source._scan(axis, "logcumsumexp", float("-inf"), lambda prefixes: prefixes.logsumexp(-2))

    @keyword_aliases(dim="axis")
    def cummax(self: Tensor, axis: int = 0) -> ValuesIndices:
        """Running maxima along `axis` and the index each came from (the latest one on ties; NaN propagates), as in
        PyTorch. The gradient goes to the element at that index."""
        moved, axis = self._along_last(axis, "cummax")
        if moved.shape[-1] == 0:
            return ValuesIndices(self, self.cast(dtypes.int64))
        lowest = (
            float("-inf")
            if self.dtype.is_float
            else False
            if self.dtype == dtypes.bool
            else integer_range(self.dtype)[0]
        )
        prefixes = moved._prefixes(lowest)
        peaks = prefixes.max(-2, keepdim=True).detach()
        matches = prefixes == peaks
        if self.dtype.is_float:
            matches = matches | (prefixes.isnan() & peaks.isnan())
        length = moved.shape[-1]
        index = type(self).arange(length, device=self.device).reshape(length, 1)
        # the latest matching index within the prefix (entries past it hold `lowest`, so are ruled out by i <= j)
        in_prefix = index <= type(self).arange(length, device=self.device)
        indices = (matches & in_prefix).where(index, -1).max(-2)
        values = (index == indices.unsqueeze(-2)).where(moved.unsqueeze(-1), 0)._sum_unwidened(-2).cast(moved.dtype)
        return ValuesIndices(self._back_from_last(values, axis), self._back_from_last(indices.cast(dtypes.int64), axis))

    @keyword_aliases(dim="axis")
    def cummin(self: Tensor, axis: int = 0) -> ValuesIndices:
        """Running minima along `axis` and the index each came from (the latest one on ties; NaN propagates), as in
        PyTorch: cummax of the values in reversed order (-x for floats, ~x for ints and bools: exact, and no int
        wraps), mapped back. The gradient goes to the element at that index."""
        values, indices = self._order_reversed().cummax(axis)
        return ValuesIndices(values._order_reversed(), indices)

    # ---- sorting ---------------------------------------------------------------------------------------------------

    def _sort_order(self: Tensor, axis: int, descending: bool, op_name: str) -> tuple[Tensor, Tensor, int]:
        """(moved, rank, axis): with `axis` moved last, each element's position in the stable sorted order, NaN
        counting as larger than every number (as PyTorch sorts)."""
        moved, axis = self._along_last(axis, op_name)
        mine, other = moved.unsqueeze(-1), moved.unsqueeze(-2)  # [i, j]: element i against element j
        before = other > mine if descending else other < mine
        same = other == mine
        if moved.dtype.is_float:
            mine_nan, other_nan = mine.isnan(), other.isnan()
            before = (before | (other_nan & ~mine_nan)) if descending else (before | (mine_nan & ~other_nan))
            same = same | (mine_nan & other_nan)
        length = moved.shape[-1]
        index = type(self).arange(length, device=self.device)
        earlier = index.reshape(1, length) < index.reshape(length, 1)  # [i, j]: j comes before i in the input
        rank = (before | (same & earlier))._sum_unwidened(-1)
        return moved, rank, axis

    def sort(self: Tensor, dim: int = -1, descending: bool = False, stable: bool = True) -> ValuesIndices:
        """(values, indices) sorted along `dim`, ascending unless `descending`. Always stable (equal elements keep
        their order, so it equals PyTorch's stable=True); NaN sorts as the largest value. Indices are int64."""
        del stable  # always stable
        moved, rank, axis = self._sort_order(dim, descending, "sort")
        length = moved.shape[-1]
        index = type(self).arange(length, device=self.device)
        # [i, p]: element i goes to position p
        goes_to = rank.unsqueeze(-1) == index
        indices = goes_to.where(index.reshape(length, 1), 0)._sum_unwidened(-2).cast(dtypes.int64)
        # each position's value looked up at its index (a load in codegen, see codegen/lookup.py): exact, -0.0 too,
        # where a sum of the element that goes there with zeros gave +0.0
        values = moved.unsqueeze(-2)._sum_selected(indices.unsqueeze(-1) == index, -1)
        return ValuesIndices(self._back_from_last(values, axis), self._back_from_last(indices, axis))

    def argsort(self: Tensor, dim: int = -1, descending: bool = False, stable: bool = True) -> Tensor:
        """The indices that sort this tensor along `dim` (see `sort`)."""
        return self.sort(dim, descending, stable)[1]

    def topk(self: Tensor, k: int, dim: int = -1, largest: bool = True, sorted: bool = True) -> ValuesIndices:
        """(values, indices) of the k largest (or smallest) elements along `dim`, in sorted order; equal elements
        keep their input order."""
        del sorted  # the results always come in sorted order
        size = self.shape[normalize_axis(dim, self.ndim, "topk")] if self.ndim else 1
        if not isinstance(k, int) or not 0 <= k <= size:
            raise ValueError(f"topk: k must be an int in 0..{size} (the size of dim {dim} of {self.shape}), got {k!r}")
        values, indices = self.sort(dim, descending=largest)
        if self.ndim == 0:
            return ValuesIndices(values, indices)
        window = [None] * self.ndim
        window[normalize_axis(dim, self.ndim, "topk")] = (0, k)
        return ValuesIndices(values.shrink(tuple(window)), indices.shrink(tuple(window)))
