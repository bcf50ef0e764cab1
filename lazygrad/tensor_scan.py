"""Scans (running sums, products, maxima, log-sum-exps) and sorting (sort, argsort, topk).

Each is built from a pairwise view of the axis: an (n, n) comparison of every element with every other, reduced
along one side. That costs n^2 work per row, which is what a fused elementwise-and-reduce kernel does well for the
short axes these ops usually see; it keeps each op a composition of primitives, with gradients for free (sort's
values are a select of the input, so their gradient goes to exactly the element each came from). Running sums,
products, maxima and log-sum-exps of long rows go by blocks, the blocks' totals scanned the same way (`_scan_along`):
n*sqrt(n) work, or n*SCAN_BLOCK a level for the longest rows. Long sorts go through a bitonic sorting network instead
(`_network_order`): n log^2 n work, in log^2 n elementwise kernels."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from lazygrad.dtype import dtypes, integer_range
from lazygrad.helpers import prod
from lazygrad.tensor_elementwise import NARROW_FLOATS
from lazygrad.tensor_movement import as_int, keyword_aliases, normalize_axis

if TYPE_CHECKING:
    from lazygrad.tensor import Tensor


# the most values in the prefixes of all rows (rows * n^2) that a scan reduces directly (one kernel); more go by
# blocks. A block's prefixes cost its length per value, and each level of blocks four kernels: rows up to LONG_SCAN
# go by blocks of about sqrt(n) (two levels), longer ones by blocks of SCAN_BLOCK, level after level (a (1, 10^6)
# cumsum: 22 ms in blocks of 512, 2.4 ms in blocks of 16 and ten kernels; (8, 4096): 0.48 ms in blocks of 64, 0.57
# in blocks of 16)
DIRECT_SCAN_WORK, LONG_SCAN, SCAN_BLOCK = 1 << 22, 1 << 13, 16
# tensors of WIDE_SCAN values or more go by blocks of SCAN_BLOCK whatever their rows' length: a level costs every
# value its block's length, which outweighs a level's four kernels ((4096, 1024) along axis 0: 114 ms in blocks of
# 64, 38 ms in blocks of 16; (1024, 4096) along axis 1: 37 and 25 ms)
WIDE_SCAN = 1 << 18
# the most comparisons (rows * n^2) a sort makes directly, in one kernel; more go through a sorting network, whose
# log2(n)(log2(n)+1)/2 steps are a kernel each (on an AVX-512 core pair: (4, 8192) 16 ms either way; (1, 16384) 32 ms
# direct, 18 through the network; (1, 50257) 184 and 27; (64, 1000) 4.6 and 10)
NETWORK_SORT_WORK = 1 << 28
# the largest k a topk of such rows finds one maximum at a time (k reductions; a network sort's steps are ~log^2 n);
# rows a direct sort would compare in more than TOPK_DIRECT_WORK comparisons take the rounds too where k is at most
# an eighth of n (k passes over a row, not n: topk(5) of 256 x 1000 took 30 ms sorted, torch 0.7)
TOPK_ROUNDS, TOPK_DIRECT_WORK = 64, 1 << 20


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

    def _prefixes(self: Tensor, axis: int, fill) -> Tensor:
        """(..., n, ...) -> (..., n, n, ...), the new axis after `axis`: element [i, j] is x[i] for i <= j and `fill`
        after, so reducing over `axis` leaves prefix j at j."""
        length, inner = self.shape[axis], self.ndim - 1 - axis
        index = type(self).arange(length, device=self.device)
        in_prefix = (index.reshape(length, 1) <= index.reshape(1, length)).reshape(length, length, *(1,) * inner)
        return in_prefix.where(self.unsqueeze(axis + 1), fill)

    def _scan(self: Tensor, axis: int, op_name: str, fill, reduce) -> Tensor:
        if self.ndim == 0:
            normalize_axis(axis, 0, op_name)
            return self.reshape(1)._scan_along(0, fill, reduce).reshape(())
        axis = normalize_axis(axis, self.ndim, op_name)
        return self if self.shape[axis] == 0 else self._scan_along(axis, fill, reduce)

    def _scan_along(self: Tensor, axis: int, fill, reduce) -> Tensor:
        """The inclusive scan along `axis` by `reduce(values, axis)`, whose identity is `fill`. The axes after it stay
        where they are (a scan along axis 0 reads and writes whole rows, not columns). Where the prefixes are more
        than DIRECT_SCAN_WORK values, the axis is scanned in blocks: each block's own prefixes, then the scan of the
        blocks' totals (in blocks again, where long), each block combined with the total of the blocks before it.
        That is n*sqrt(n) work a row instead of n^2, or n*SCAN_BLOCK a level for rows longer than LONG_SCAN and
        tensors of WIDE_SCAN values, in four kernels a level instead of one (the padded values the blocks' prefixes
        read get a buffer of their own, see engine/fusion)."""
        length = self.shape[axis]
        if self.numel() * length <= DIRECT_SCAN_WORK or length < 4:
            return reduce(self._prefixes(axis, fill), axis)
        wide = length > LONG_SCAN or self.numel() >= WIDE_SCAN
        block = SCAN_BLOCK if wide else 1 << (length.bit_length() - 1) // 2  # (a power of two, at most the root)
        blocks, outer, inner = -(-length // block), self.shape[:axis], self.shape[axis + 1 :]
        before_axis, after_axis = ((0, 0),) * len(outer), ((0, 0),) * len(inner)
        padded = self.pad((*before_axis, (0, blocks * block - length), *after_axis), value=fill)
        within = reduce(padded.reshape(*outer, blocks, block, *inner)._prefixes(axis + 1, fill), axis + 1)
        # the running totals of whole blocks, and for each block the total of those before it
        totals = within[(slice(None),) * (axis + 1) + (-1,)]._scan_along(axis, fill, reduce)
        before = totals.pad((*before_axis, (1, -1), *after_axis), value=fill).unsqueeze(axis + 1).expand(within.shape)
        combined = reduce(within.stack(before, dim=axis + 1), axis + 1)
        return combined.reshape(*outer, blocks * block, *inner)[(slice(None),) * axis + (slice(0, length),)]

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
        return source._scan(axis, "cumsum", 0, lambda prefixes, axis: prefixes.sum(axis, dtype=source.dtype))

    @keyword_aliases(dim="axis")
    def cumprod(self: Tensor, axis: int = 0, dtype=None) -> Tensor:
        """Running products along `axis`; bools and ints multiply as int64, as in PyTorch, unless `dtype` is given
        (the input is cast to it first, and the products wrap as that dtype does)."""
        source = self._scan_source(dtype)  # (the products take its dtype, as cumsum's sums do)
        if source.dtype in NARROW_FLOATS:
            return source.float().cumprod(axis).cast(source.dtype)
        return source._scan(axis, "cumprod", 1, lambda prefixes, axis: prefixes.prod(axis, dtype=source.dtype))

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
        return source._scan(axis, "logcumsumexp", float("-inf"), lambda prefixes, axis: prefixes.logsumexp(axis))

    @keyword_aliases(dim="axis")
    def cummax(self: Tensor, axis: int = 0) -> ValuesIndices:
        """Running maxima along `axis` and the index each came from (the latest one on ties; NaN propagates), as in
        PyTorch. The gradient goes to the element at that index. Both are scans (`_scan_along`): long rows go by
        blocks."""
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
        running_max = lambda prefixes, axis: prefixes.max(axis)  # noqa: E731
        peaks = moved.detach()._scan_along(moved.ndim - 1, lowest, running_max)
        # the maximum so far is the latest element that equalled the maximum so far when it came (a later larger one
        # is such an element itself; after a NaN, only a NaN is), so the indices are a running maximum too
        matches = moved.detach() == peaks
        if self.dtype.is_float:
            matches = matches | moved.detach().isnan()
        length = moved.shape[-1]
        index = type(self).arange(length, device=self.device)
        indices = matches.where(index, -1)._scan_along(moved.ndim - 1, -1, running_max)
        values = moved.unsqueeze(-2)._sum_selected(indices.unsqueeze(-1) == index, -1)  # (a load, as sort's values)
        return ValuesIndices(self._back_from_last(values, axis), self._back_from_last(indices.cast(dtypes.int64), axis))

    @keyword_aliases(dim="axis")
    def cummin(self: Tensor, axis: int = 0) -> ValuesIndices:
        """Running minima along `axis` and the index each came from (the latest one on ties; NaN propagates), as in
        PyTorch: cummax of the values in reversed order (-x for floats, ~x for ints and bools: exact, and no int
        wraps), mapped back. The gradient goes to the element at that index."""
        values, indices = self._order_reversed().cummax(axis)
        return ValuesIndices(values._order_reversed(), indices)

    # ---- sorting ---------------------------------------------------------------------------------------------------

    def _direct_order(self: Tensor, descending: bool) -> Tensor:
        """int64 indices that sort (..., n) along its last axis stably: each element's rank is the count of
        elements ordered before it (a smaller key, or an equal one earlier in the row), an (n, n) comparison reduced
        in one kernel; then position p holds the element whose rank is p."""
        keys = self._order_keys(descending)
        length = keys.shape[-1]
        index = type(self).arange(length, device=self.device)
        mine, other = keys.unsqueeze(-1), keys.unsqueeze(-2)  # [i, j]: element i against element j
        earlier = index.reshape(1, length) < index.reshape(length, 1)  # [i, j]: j comes before i in the row
        rank = ((other < mine) | ((other == mine) & earlier))._sum_unwidened(-1)
        goes_to = rank.unsqueeze(-1) == index  # [i, p]: element i goes to position p
        return goes_to.where(index.reshape(length, 1), 0)._sum_unwidened(-2).cast(dtypes.int64)

    def _order_keys(self: Tensor, descending: bool) -> Tensor:
        """Integers (int32, or int64 for 64-bit dtypes) in the order this tensor's values sort in, ascending or
        `descending` as asked: equal values have equal keys (-0.0 and 0.0 too, and every NaN, which sorts as the
        largest value). A float's bits, negative ones with their magnitude bits flipped, order as signed ints; an
        unsigned int with its top bit flipped orders as a signed one; ~key reverses the order without wrapping."""
        values = self.detach()
        if values.dtype in NARROW_FLOATS:
            values = values.float()  # (exact)
        wide = values.dtype.itemsize == 8
        int_type = dtypes.int64 if wide else dtypes.int32
        lowest, highest = integer_range(int_type)
        if values.dtype.is_float:
            bits = (values == 0).where(0.0, values).bitcast(int_type)
            keys = bits ^ ((bits >> (8 * int_type.itemsize - 1)) & highest)
            keys = values.isnan().where(highest - 1, keys)  # (above +inf's key, every NaN alike)
        elif values.dtype.is_unsigned and values.dtype.itemsize >= 4:
            keys = values.bitcast(int_type) ^ lowest
        else:
            keys = values.cast(int_type)
        return ~keys if descending else keys

    def _network_order(self: Tensor, descending: bool) -> Tensor:
        """int64 indices that sort (..., n) along its last axis stably, by a bitonic sorting network: n log^2 n
        work in log2(n)(log2(n)+1)/2 elementwise steps, each putting every element and one partner in order. The
        network orders (key, index) pairs, a total order, so the result is the stable sort's; for 32-bit keys the
        pair is one int64, key * 2^32 + index. The row is padded to a power of two with the largest key, which
        sorts last (its index puts it after equal keys)."""
        keys = self._order_keys(descending)
        length, lead = keys.shape[-1], keys.shape[:-1]
        size = 1 << (length - 1).bit_length()
        if size != length:
            keys = keys.pad(((0, 0),) * len(lead) + ((0, size - length),), value=integer_range(keys.dtype)[1])
        index = type(self).arange(size, dtype=keys.dtype, device=self.device).expand(*lead, size)
        pairs = (keys, index) if keys.dtype == dtypes.int64 else (keys.cast(dtypes.int64) * (1 << 32) + index,)
        span = 2
        while span <= size:  # merge sorted runs of span/2 into runs of span, alternately ascending and descending
            step = span // 2
            while step:
                pairs = _network_step(pairs, span, step)
                step //= 2
            span *= 2
        order = pairs[-1] if len(pairs) == 2 else pairs[0] & 0xFFFFFFFF
        return order.shrink((*((0, n) for n in lead), (0, length))).cast(dtypes.int64)

    def sort(self: Tensor, dim: int = -1, descending: bool = False, stable: bool = True) -> ValuesIndices:
        """(values, indices) sorted along `dim`, ascending unless `descending`. Always stable (equal elements keep
        their order, so it equals PyTorch's stable=True); NaN sorts as the largest value. Indices are int64."""
        del stable  # always stable
        moved, axis = self._along_last(dim, "sort")
        length = moved.shape[-1]
        direct = prod(moved.shape) * length <= NETWORK_SORT_WORK
        indices = moved._direct_order(descending) if direct else moved._network_order(descending)
        index = type(self).arange(length, device=self.device)
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
        axis, size = self._sorted_axis(dim, "topk")
        k = _count_argument(k, "topk", 0, size, f"the size of dim {dim} of {self.shape}")
        work = self.numel() * size  # (the comparisons a direct sort makes)
        rounds = work > NETWORK_SORT_WORK or (work > TOPK_DIRECT_WORK and 8 * k <= size)
        if 0 < k <= TOPK_ROUNDS and rounds and self.dtype.itemsize <= 4:
            moved, _ = self._along_last(axis, "topk")
            indices = moved._picked_in_rounds(k, largest)
            index = type(self).arange(size, device=self.device)
            values = moved.unsqueeze(-2)._sum_selected(indices.unsqueeze(-1) == index, -1)  # (a load, as sort's)
            return ValuesIndices(self._back_from_last(values, axis), self._back_from_last(indices, axis))
        values, indices = self.sort(dim, descending=largest)
        if self.ndim == 0:
            return ValuesIndices(values, indices)
        window = tuple((0, k) if a == axis else (0, n) for a, n in enumerate(self.shape))
        return ValuesIndices(values.shrink(window), indices.shrink(window))

    def _picked_in_rounds(self: Tensor, k: int, largest: bool) -> Tensor:
        """int64 indices of the k first elements of (..., n) along its last axis in the stable order asked, one
        maximum a round: each element is one int64, its key * 2^32 + (2^32 - 1 - index), so the largest is the first
        in order (ties to the earlier index) and names its index; it is then set to the lowest int64, which no
        element is. k reductions over n instead of a sort's log^2 n steps."""
        keys = self._order_keys(descending=not largest)  # (the first in order has the largest key)
        length = keys.shape[-1]
        index = type(self).arange(length, dtype=dtypes.int64, device=self.device)
        remaining = keys.cast(dtypes.int64) * (1 << 32) + ((1 << 32) - 1 - index)
        taken = integer_range(dtypes.int64)[0]
        picked = []
        for round_number in range(k):
            first = remaining.max(-1, keepdim=True)
            picked.append(first)
            remaining = (remaining == first).where(taken, remaining)
            if round_number % 2:  # (in memory every other round: the next maximum's kernel applies one mask itself)
                remaining = remaining.contiguous()
        order = type(self).cat(*picked, dim=-1)
        return ((1 << 32) - 1) - (order & 0xFFFFFFFF)

    def msort(self: Tensor) -> Tensor:
        """The values sorted along the first axis, as torch.msort."""
        return self.sort(0).values

    def kthvalue(self: Tensor, k: int, dim: int = -1, keepdim: bool = False) -> ValuesIndices:
        """(values, indices) of the k-th smallest element along `dim`, k counted from 1, as torch.kthvalue: NaN
        counts as the largest value. Of equal elements, the stable sort's is taken (torch's choice is unspecified)."""
        axis, size = self._sorted_axis(dim, "kthvalue")
        k = _count_argument(k, "kthvalue", 1, size, f"the size of dim {dim} of {self.shape}")
        return self._sorted_pick(axis, k - 1, keepdim)

    def median(self: Tensor, dim: int | None = None, keepdim: bool = False) -> Tensor | ValuesIndices:
        """The lower median (for n values, the ((n - 1) // 2)-th smallest) along `dim` as (values, indices), or of
        every element as a 0-d tensor without `dim`, as torch.median: NaN where there is a NaN (its index is the
        first NaN's). Of equal elements, the stable sort's index is given (torch's choice is unspecified)."""
        return self._median(dim, keepdim, "median")

    def nanmedian(self: Tensor, dim: int | None = None, keepdim: bool = False) -> Tensor | ValuesIndices:
        """`median` of the values that are not NaN (NaN where all are), as torch.nanmedian."""
        return self._median(dim, keepdim, "nanmedian")

    def _median(self: Tensor, dim: int | None, keepdim: bool, op_name: str) -> Tensor | ValuesIndices:
        if dim is None:
            flat = self.reshape(-1)
            if flat.shape[0] == 0 and self.dtype.is_float:
                return type(self).full((), float("nan"), dtype=self.dtype, device=self.device)
            return flat._median(0, False, op_name).values
        axis, size = self._sorted_axis(dim, op_name)
        if size == 0:
            raise ValueError(f"{op_name}: dim {dim} of {self.shape} is empty, so it has no median")
        position = (size - 1) // 2
        if self.dtype.is_float:
            # NaN sorts last, the NaNs in input order: the first NaN comes right after the numbers
            numbers = (~self.isnan()).sum(axis, keepdim=True) if self.ndim else (~self.isnan()).reshape(1).int()
            if op_name == "nanmedian":
                position = ((numbers - 1) // 2).maximum(0)
            else:
                position = (numbers < size).where(numbers, position)
        return self._sorted_pick(axis, position, keepdim)

    def _sorted_axis(self: Tensor, dim: int, op_name: str) -> tuple[int, int]:
        """(axis, its size) for an op along `dim` (a 0-d tensor has one element along axis 0)."""
        if self.ndim == 0:
            normalize_axis(dim, 0, op_name)
            return 0, 1
        axis = normalize_axis(dim, self.ndim, op_name)
        return axis, self.shape[axis]

    def _sorted_pick(self: Tensor, axis: int, position, keepdim: bool) -> ValuesIndices:
        """(values, indices) of the element at `position` (an int, or an int tensor with the axis kept at size 1) of
        the ascending sort along `axis`."""
        if self.ndim == 0:
            values, indices = self.reshape(1)._sorted_pick(0, position, False)
            return ValuesIndices(values, indices)
        values, indices = self.sort(axis)
        if isinstance(position, int):
            window = tuple((position, position + 1) if a == axis else (0, n) for a, n in enumerate(self.shape))
            values, indices = values.shrink(window), indices.shrink(window)
        else:
            values, indices = values.gather(axis, position), indices.gather(axis, position)
        if keepdim:
            return ValuesIndices(values, indices)
        return ValuesIndices(values.squeeze(axis), indices.squeeze(axis))


def _count_argument(value, op_name: str, low: int, high: int, what: str) -> int:
    """`value` as an int in low..high (a NumPy integer too; a bool is refused, as torch refuses it)."""
    count = as_int(value)
    if count is None or not low <= count <= high:
        raise ValueError(f"{op_name}: k must be an int in {low}..{high} ({what}), got {value!r}")
    return count


def _network_step(pairs: tuple[Tensor, ...], span: int, step: int) -> tuple[Tensor, ...]:
    """One step of the bitonic network over (..., size) tensors ordered lexicographically (a key, then ties broken by
    the next): the element at i and the one at i ^ step are put in order, ascending in runs of `span` whose
    i & span is 0, descending in the others. Each step is its own kernel (`contiguous`): fused, an element would
    read 2^steps elements of the step before."""
    lead, size = pairs[0].shape[:-1], pairs[0].shape[-1]
    runs = size // span
    shape = (*lead, (runs + 1) // 2, min(runs, 2), span // (2 * step), 2, step)  # (, run parity, group, side, offset)
    pairs = tuple(p.reshape(shape) for p in pairs)
    low, high = (tuple((0, n) for n in shape[:-2]) + ((side, side + 1), (0, step)) for side in (0, 1))
    swap, tied = None, None
    for p in pairs:  # high sorts first where its key is smaller, or equal and its tie-breaker smaller
        first = p.shrink(high) < p.shrink(low)
        swap = first if swap is None else swap | (tied & first)
        tied = p.shrink(high) == p.shrink(low)
    if runs > 1:
        swap = swap != (type(swap).arange(2, device=swap.device) == 1).reshape(2, 1, 1, 1)  # (odd runs descending)
    return tuple(swap.where(p.flip(-2), p).reshape(*lead, size).contiguous() for p in pairs)
