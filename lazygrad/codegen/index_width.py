"""32-bit index arithmetic on devices with threads, where a kernel's indices provably fit.

Index arithmetic is int64 (`dtypes.index`), so that any buffer can be addressed. A GPU computes a 64-bit integer op
as two or more 32-bit instructions, and divides (or takes the remainder) by a constant in a long sequence of them:
the reshapes, permutes and windows of a kernel turn into many such divisions. So, as PyTorch's and tinygrad's GPU
kernels do, a kernel for a device with threads computes its indices in int32 wherever that gives the same values:
when every int64 value in it lies within int32's range, by its bounds (`UOp.bounds`, which are the dtype's whole
range for any value read from memory or not known). Such a kernel computes every one of them exactly in int32, so
every int64 node becomes an int32 one. A kernel that reads, writes or accumulates int64 values (their bounds are
unknown), bitcasts one, or addresses more than 2**31 elements keeps all of its index arithmetic in int64.
"""

from __future__ import annotations

from lazygrad.dtype import dtypes
from lazygrad.uop.ops import Ops, UOp, dtype_limits

I32, I64 = dtypes.int32, dtypes.int64
LOWEST, HIGHEST = dtype_limits(I32)


def narrow_indices(sink: UOp) -> UOp:
    """`sink` with its int64 values computed in int32, where all of them fit (see above); else `sink` as it is."""
    nodes = sink.toposort
    wide = [node for node in nodes if node.dtype == I64]
    if not wide:
        return sink
    for node in wide:
        low, high = node.bounds
        if low < LOWEST or high > HIGHEST:
            return sink
    if any(node.op is Ops.BITCAST and node.src[0].dtype == I64 for node in nodes):
        return sink  # (its bits, not its value: a narrower source changes them)
    narrowed: dict[UOp, UOp] = {}
    for node in nodes:
        sources = tuple(narrowed.get(source, source) for source in node.src)
        if node.dtype == I64:
            narrowed[node] = UOp(node.op, I32, sources, node.arg)
        elif sources != node.src:
            narrowed[node] = UOp(node.op, node.dtype, sources, node.arg)
    return narrowed.get(sink, sink)
