"""Kernel optimizations that keep the math and change the loops (NOOPT=1 turns them off):

- drop reduce loops the reduced value does not depend on (a sum of a broadcast is a product);
- merge adjacent loops whose indices only appear together as `outer*size + inner`, so a contiguous kernel runs
  one flat loop indexed by the counter alone (and LLVM can vectorize it);
- upcast small global loops that choose between loads (a convolution's taps) whole;
- upcast: repeat a kernel's body for consecutive values of a loop so several outputs share loads and registers
  (register blocking, for loops along which some input is reused);
- mark a reduce loop along which every input is contiguous (or fixed) as "contiguous_reduce", for the compiler
  to vectorize;
- unroll small reduce loops into straight-line code.

Every choice depends only on the kernel's own AST, except a register block that BEAM search timed.
"""

from __future__ import annotations

import itertools

from lazygrad.helpers import prod
from lazygrad.uop.ops import Ops, UOp
from lazygrad.uop.symbolic import simplify, simplify_gated_loads

UNROLL_LIMIT = 4
LARGE_PRODUCT = 1 << 28  # multiply-adds in a matrix product worth the bigger register block


def count_divmod(sink: UOp) -> int:
    return sum(node.op in (Ops.IDIV, Ops.MOD) for node in sink.toposort)


def replace_ranges(
    sink: UOp, replacements: dict[UOp, UOp], reduce_ranges: dict[UOp, tuple[UOp, ...]], simplified: bool = True
) -> UOp:
    """`sink` with ranges replaced by expressions; a RANGE_REDUCE's own range list is given by `reduce_ranges`."""
    done: dict[UOp, UOp] = {}
    for node in sink.toposort:
        if node in replacements:
            done[node] = replacements[node]
        elif node.op is Ops.RANGE_REDUCE:
            ranges = reduce_ranges.get(node, tuple(done[source] for source in node.src[1:]))
            done[node] = node.replace(src=(done[node.src[0]], *ranges))
        else:
            new_src = tuple(done[source] for source in node.src)
            done[node] = node if new_src == node.src else node.replace(src=new_src)
    return simplify(done[sink]) if simplified else done[sink]


def merge_pair(sink: UOp, outer: UOp, inner: UOp) -> UOp | None:
    """`sink` with two loops fused into one, or None when that would add divisions."""
    inner_size = inner.src[0].arg
    merged = UOp(Ops.RANGE, outer.dtype, (UOp.const(outer.dtype, outer.src[0].arg * inner_size),), outer.arg)
    reduce_ranges = {}
    for node in sink.toposort:
        if node.op is Ops.RANGE_REDUCE and outer in node.src[1:] and inner in node.src[1:]:
            reduce_ranges[node] = tuple(merged if r is outer else r for r in node.src[1:] if r is not inner)
    candidate = replace_ranges(sink, {outer: merged // inner_size, inner: merged % inner_size}, reduce_ranges)
    return candidate if count_divmod(candidate) <= count_divmod(sink) else None


def merge_loops(sink: UOp) -> UOp:
    """Merge neighbouring global loops, then neighbouring loops of each reduce, innermost first."""
    global_ranges = sorted(
        (n for n in sink.toposort if n.op is Ops.RANGE and n.arg[1] == "global"), key=lambda n: n.arg[0]
    )
    groups = [global_ranges] + [list(n.src[1:]) for n in sink.toposort if n.op is Ops.RANGE_REDUCE]
    for group in groups:
        position = len(group) - 1
        while position > 0:
            outer, inner = group[position - 1], group[position]
            merged = merge_pair(sink, outer, inner)
            if merged is not None:
                sink = merged
                new_range = next(n for n in sink.toposort if n.op is Ops.RANGE and n.arg == outer.arg)
                group[position - 1 : position + 1] = [new_range]
            position -= 1
    return sink


def unroll_reduces(sink: UOp) -> UOp:
    """Replace the small loops of each reduce by the reduction of copies of its value, one per combination of
    their values (all built first, then simplified together once)."""
    replacements: dict[UOp, UOp] = {}
    for node in sink.toposort:
        if node.op is not Ops.RANGE_REDUCE:
            continue
        small = [loop for loop in node.src[1:] if loop.src[0].arg <= UNROLL_LIMIT]
        if not small:
            continue
        combined = None
        for values in itertools.product(*(range(loop.src[0].arg) for loop in small)):
            constants = {loop: UOp.const(loop.dtype, value) for loop, value in zip(small, values)}
            copy = replace_ranges(node.src[0], constants, {}, simplified=False)
            combined = copy if combined is None else combined.alu(node.arg, copy)
        rest = tuple(loop for loop in node.src[1:] if loop not in small)
        replacements[node] = node.replace(src=(combined, *rest)) if rest else combined
    return replace_ranges(sink, replacements, {}) if replacements else sink


def stride(index: UOp, loop: UOp) -> int | None:
    """How much `index` grows when `loop` grows by one, or None when that is not a constant."""
    difference = simplify(replace_ranges(index, {loop: loop + 1}, {}) - index)
    return difference.arg if difference.op is Ops.CONST else None


def memory_indices(sink: UOp, op: Ops) -> list[UOp]:
    return [node.src[1] for node in sink.toposort if node.op is op and node.src[0].op is Ops.DEFINE_GLOBAL]


def upcast(sink: UOp, loop: UOp, factor: int) -> UOp:
    """Run `loop` size/factor times, each iteration doing the work of `factor` consecutive ones."""
    outer = UOp(Ops.RANGE, loop.dtype, (UOp.const(loop.dtype, loop.src[0].arg // factor),), loop.arg)
    stores: dict[UOp, None] = {}
    for store in sink.src:
        for part in range(factor):
            stores[replace_ranges(store, {loop: outer * factor + part}, {}, simplified=False)] = None
    # one simplification of all the copies: what they share is simplified once
    return simplify(sink.replace(src=tuple(stores)))


def global_loops(sink: UOp) -> list[UOp]:
    return sorted((n for n in sink.toposort if n.op is Ops.RANGE and n.arg[1] == "global"), key=lambda n: n.arg[0])


def upcast_reused(sink: UOp, loops: list[UOp], factor: int, limit: int) -> UOp:
    """Upcast up to `limit` of `loops` (innermost first) along which some input is reused (stride 0)."""
    for loop in reversed(loops):
        if limit and loop.src[0].arg % factor == 0:
            if any(stride(index, loop) == 0 for index in memory_indices(sink, Ops.LOAD)):
                sink, limit = upcast(sink, loop, factor), limit - 1
    return sink


# a register block: (outputs along the innermost output loop, outputs along each other reused loop); 0 across
# means the reduce loop is the one vectorized
Blocking = tuple[int, int]


def matrix_shape(sink: UOp) -> str | None:
    """Which shape of matrix product a one-reduce kernel is: "contiguous reduce" (x @ wᵀ: every input contiguous
    or fixed along the innermost reduce loop), "contiguous outputs" (x @ w: along the innermost output loop), or
    None (no register blocking applies)."""
    reduces = [n for n in sink.toposort if n.op is Ops.RANGE_REDUCE]
    if not reduces or any(r.src[1:] != reduces[0].src[1:] for r in reduces):
        return None
    if all(loop.src[0].arg <= UNROLL_LIMIT for loop in reduces[0].src[1:]):
        return None
    loads, stores = memory_indices(sink, Ops.LOAD), memory_indices(sink, Ops.STORE)
    along_reduce = {stride(index, reduces[0].src[-1]) for index in loads}
    if 1 in along_reduce and along_reduce <= {0, 1}:
        return "contiguous reduce"
    loops = global_loops(sink)
    if loops:
        along_inner = {stride(index, loops[-1]) for index in loads}
        if 1 in along_inner and along_inner <= {0, 1} and all(stride(index, loops[-1]) == 1 for index in stores):
            return "contiguous outputs"
    return None


def blocking_choices(sink: UOp) -> list[Blocking]:
    """The register blocks `optimize` can give this (lowered) kernel, for BEAM search to time."""
    sink = shape_loops(sink)
    shape = matrix_shape(sink)
    if shape == "contiguous reduce":
        return [(0, rows) for rows in (2, 4, 8)]
    if shape == "contiguous outputs":
        inner = global_loops(sink)[-1].src[0].arg
        return [(width, rows) for width in (16, 32, 64) if inner % width == 0 for rows in (2, 4, 8)]
    return []


def upcast_reduce_kernel(sink: UOp, blocking: Blocking | None = None) -> UOp:
    """Register blocking for a kernel with one reduce, in the two shapes of a matrix product:

    - inputs contiguous along the reduce (x @ wᵀ, sums over the last axis): the reduce loop is marked
      "contiguous_reduce" for the compiler to vectorize, and a 4×4 block of outputs shares each loaded vector;
    - inputs contiguous along the output's last axis (x @ w, sums over a leading axis): a block of 16 (× 4 where
      an input is reused) outputs, which the compiler packs into vectors; 32 × 8 for a large product.

    Reduces one after another over different loops (a softmax's) only get their contiguous loops marked.
    `blocking` (from BEAM search) overrides the sizes these rules pick.
    """
    loops = global_loops(sink)
    reduces = [n for n in sink.toposort if n.op is Ops.RANGE_REDUCE]
    if not reduces:
        return sink
    if any(r.src[1:] != reduces[0].src[1:] for r in reduces):
        # reduces one after another (a softmax's max, then its sum): each innermost loop along which the inputs
        # are contiguous goes to the compiler's vectorizer (several reduces over the same loops, in one loop nest,
        # are blocked below)
        contiguous = {}
        for loop in {r.src[-1] for r in reduces}:
            along = {stride(index, loop) for index in memory_indices(sink, Ops.LOAD)}
            if 1 in along and along <= {0, 1}:
                contiguous[loop] = UOp(Ops.RANGE, loop.dtype, loop.src, (loop.arg[0], "contiguous_reduce"))
        return replace_ranges(sink, contiguous, {}) if contiguous else sink
    shape = matrix_shape(sink)  # (None as well for an elementwise kernel whose reduces unroll whole)
    if shape == "contiguous reduce":
        loop = reduces[0].src[-1]
        contiguous = UOp(Ops.RANGE, loop.dtype, loop.src, (loop.arg[0], "contiguous_reduce"))
        rows = blocking[1] if blocking else 4
        return upcast_reused(replace_ranges(sink, {loop: contiguous}, {}), loops, rows, limit=2)
    if shape == "contiguous outputs":
        inner = loops[-1]
        # a large product gets two 16-wide vectors across by 8 rows (16 of the 32 vector registers accumulate:
        # twice the speed at 1024³, but slower to compile), others and odd sizes one vector by 4 rows
        work = prod(loop.src[0].arg for loop in [*loops, *reduces[0].src[1:]])
        choices = [blocking] if blocking else [(32, 8), (16, 4)] if work >= LARGE_PRODUCT else [(16, 4)]
        for width, rows in choices:
            if inner.src[0].arg % width == 0:
                return upcast_reused(upcast(sink, inner, width), loops[:-1], rows, limit=1)
    return sink


def unroll_selecting_loops(sink: UOp) -> UOp:
    """Upcast small global loops that choose between loads, whole: in a stack of pieces (a conv's taps) each piece
    is a load gated by a comparison of the loop with constants, and with the loop a constant in each copy, every
    copy keeps one load instead of one per piece."""
    for loop in global_loops(sink):
        if loop.src[0].arg <= UNROLL_LIMIT:
            gates = [n.src[2] for n in sink.toposort if n.op is Ops.LOAD and len(n.src) == 3]
            if any(loop in gate.toposort for gate in gates):
                sink = upcast(sink, loop, loop.src[0].arg)
    return sink


def drop_invariant_reduce_loops(sink: UOp) -> UOp:
    """A reduce over loops its value does not depend on: a sum is the value times their trip count, a max or min
    the value itself (the gradient of a sum or mean reaches a layer as a broadcast constant)."""
    replacements: dict[UOp, UOp] = {}
    for node in sink.toposort:
        if node.op is not Ops.RANGE_REDUCE or node.arg not in (Ops.ADD, Ops.MAX):
            continue
        used = set(node.src[0].toposort)
        unused = [loop for loop in node.src[1:] if loop not in used]
        if not unused:
            continue
        value = node.src[0]
        if node.arg is Ops.ADD:
            value = value.alu(Ops.MUL, UOp.const(value.dtype, prod(loop.src[0].arg for loop in unused)))
        rest = tuple(loop for loop in node.src[1:] if loop in used)
        replacements[node] = node.replace(src=(value, *rest)) if rest else value
    return replace_ranges(sink, replacements, {}) if replacements else sink


def shape_loops(sink: UOp) -> UOp:
    """The loop changes that come before register blocking: invariant reduce loops dropped, loops merged, loops
    that choose between loads upcast."""
    return unroll_selecting_loops(merge_loops(drop_invariant_reduce_loops(sink)))


def optimize(sink: UOp, blocking: Blocking | None = None) -> UOp:
    """The optimized kernel graph (with the register block `blocking` where one applies and is given)."""
    sink = shape_loops(sink)
    if any(node.op is Ops.RANGE_REDUCE for node in sink.toposort):
        sink = upcast_reduce_kernel(sink, blocking)
    return simplify_gated_loads(unroll_reduces(sink))
