"""How much work the scheduler puts into one kernel: a very long chain of fused operations is cut into kernels of at
most KERNEL_WORK_LIMIT work each, and a long reduce into fewer values than the device has cores is split in two
(`split_reduces`), so that all of them share it.

Why: a compiler's time per operation grows with the size of the loop body it optimizes (LLVM's loop vectorizer is
quadratic in it: 2,000 chained multiply-adds in one kernel took 4.6 s to compile, 4,000 took 18 s), while a cut
costs one more buffer written and read, which is nothing beside hundreds of operations per element. Cut kernels of
a repeating chain are often the same AST, so they compile once.

The work of a kernel is counted in operations: one for most, more for the transcendental ones that devices without
them expand into a range reduction and a polynomial. A value used twice in a kernel counts once (the count is
exact, from the set of nodes, where the sum over sources could overcount).
"""

from __future__ import annotations

import math
from typing import Callable

from lazygrad.codegen.lower import reduce_identity
from lazygrad.dtype import dtypes
from lazygrad.helpers import prod
from lazygrad.uop.ops import MOVEMENT, Ops, UOp

# the work per kernel past which a kernel is cut: about where LLVM's compile time per operation starts to grow
# (a chain of 512 multiply-adds compiles at the same cost per operation as one of 128; one of 2,048 at twice it),
# and well above what real kernels hold (an Adam update, with its powers of the betas: about 340)
KERNEL_WORK_LIMIT = 512
# the work of an operation a device expands into a range reduction and a polynomial (the LLVM and C renderers):
# measured by compile time, where one of these costs as much as that many chained multiply-adds (a sine is ~90
# instructions, which compile faster than a dependent chain of that many)
EXPANDED = {Ops.EXP2: 24, Ops.LOG2: 32, Ops.SIN: 48, Ops.COS: 48}
FREE = (Ops.CONST, *MOVEMENT)


def _weight(node: UOp) -> int:
    """The work of computing `node` in a kernel (a buffer: its load; movement ops and constants: none)."""
    return 0 if node.op in FREE else EXPANDED.get(node.op, 1)


def long_chain_cuts(nodes: list[UOp], to_realize: set[UOp], limit: int | None = None) -> set[UOp]:
    """Nodes to realize so that no kernel's work passes `limit` (KERNEL_WORK_LIMIT by default): where a node would pass it, what it computes is cut
    (see `_best_cut`) until it does not. `nodes` are sources first. One pass: the work of a node is the sum of its
    sources' while that stays under the limit; node sets, to count shared values once, are only built past it."""
    limit = KERNEL_WORK_LIMIT if limit is None else limit
    read = {node for node in nodes if node.op is Ops.BUFFER or node in to_realize}  # loads for their readers
    work: dict[UOp, int] = {}  # the work of computing each node in the kernel that reads it (1 once realized)
    members: dict[UOp, frozenset[UOp]] = {}  # the nodes that work counts, kept only where it was needed
    cuts: set[UOp] = set()
    users_left: dict[UOp, int] = {}  # (node sets are dropped once every user has been counted)
    for node in nodes:
        for source in set(node.src):
            users_left[source] = users_left.get(source, 0) + 1
    for node in nodes:
        if node.op is Ops.BUFFER:
            work[node] = 1
            continue
        total = _weight(node) + sum(work[source] for source in node.src)
        if total > limit:
            total = _exact(node, read, members)
        while total > limit and (cut := _best_cut(node, read, work, members)) is not None:
            cuts.add(cut)
            read.add(cut)
            work[cut] = 1
            members.clear()  # node sets through the cut are stale (the work of nodes above it stays an upper bound)
            total = _exact(node, read, members)
        # a realized node is one load for the kernels that read it; its own kernel was counted above
        work[node] = 1 if node in read else total
        if node in read:
            members.pop(node, None)
        for source in set(node.src):
            users_left[source] -= 1
            if not users_left[source]:
                members.pop(source, None)
    return cuts


def _best_cut(node: UOp, read: set[UOp], work: dict[UOp, int], members: dict[UOp, frozenset[UOp]]) -> UOp | None:
    """Which node to realize to shrink `node`'s kernel: where two of its sources compute a value in common (a
    value used twice, as in `sin(x) + exp(x)`), the costliest such value, so it is computed once; else its costliest
    source (below movement ops)."""
    computed = [
        _members(source, read, members) - read for source in node.src if source not in read and work[source] > 1
    ]
    shared = set().union(*(a & b for i, a in enumerate(computed) for b in computed[i + 1 :]))
    # the last values of what they share (no other shared value reads them), below their movement ops
    tops = {top.base for top in shared - {source for other in shared for source in other.src}}
    candidates = [top for top in tops if top.op not in (Ops.BUFFER, Ops.CONST) and top not in read]
    if candidates:
        return _smaller_cut(max(candidates, key=lambda top: work[top]), read, work)
    for source in sorted(node.src, key=lambda source: -work[source]):
        base = source.base
        if work[source] > 1 and base.op not in (Ops.BUFFER, Ops.CONST) and base not in read:
            return _smaller_cut(base, read, work)
    return None


def _smaller_cut(node: UOp, read: set[UOp], work: dict[UOp, int]) -> UOp:
    """`node`, or, where it is larger than every value it reads (made of broadcasts only: the space a reduce's
    products span, which no buffer of the graph is the size of), the costliest value below it in fewer elements: a
    sum of products of broadcasts (each of an LSTM's time steps adds `expand(dg_t) * expand(x_t)`, 32 x 1024 x 256,
    to its weight's gradient) is cut at what it broadcasts (a dg_t, 32 x 1024), not written out whole."""
    size, best, stack, seen = prod(node.shape), None, [node], {node}
    while stack:
        for source in stack.pop().src:
            if source in seen or source.op is Ops.CONST:
                continue
            seen.add(source)
            if source in read or source.op is Ops.BUFFER:
                if prod(source.shape) >= size:
                    return node  # (it reads a value as large: it is not made of broadcasts only)
                continue
            stack.append(source)
            if source.op not in MOVEMENT and prod(source.shape) < size and work[source] > 1:
                if best is None or work[source] > work[best]:
                    best = source
    return node if best is None else best


def _exact(node: UOp, read: set[UOp], members: dict[UOp, frozenset[UOp]]) -> int:
    """The work of `node` counting each node once: the weight of the union of its sources' node sets."""
    nodes = frozenset((node,)).union(*(_members(source, read, members) for source in node.src))
    members[node] = nodes
    return sum(1 if other in read and other is not node else _weight(other) for other in nodes)


def _members(node: UOp, read: set[UOp], members: dict[UOp, frozenset[UOp]]) -> frozenset[UOp]:
    """The nodes counted in `node`'s work for a kernel that reads it, found by walking down to the nodes it reads
    from memory where not kept yet."""
    if node in members:
        return members[node]
    found, stack = set(), [node]
    while stack:
        current = stack.pop()
        if current in found:
            continue
        found.add(current)
        if current in read:
            continue
        if current in members:
            found |= members[current]
        else:
            stack.extend(current.src)
    members[node] = frozenset(found)
    return members[node]


def split_reduces(nodes: list[UOp], parts_of: Callable[[int, int, bool], int]) -> dict[UOp, UOp]:
    """The graph of `nodes` (sources first) with every reduce that `parts_of(outputs, length, rounds)` splits into more than
    one part reduced in two steps: its parts first (one kernel, whose outputs the cores share), then the parts (a
    small kernel). Returns what each changed node (a split reduce, and the nodes above it) becomes."""
    done: dict[UOp, UOp] = {}
    for node in nodes:
        new = node
        if done and any(source in done for source in node.src):
            new = node.replace(src=tuple(done.get(source, source) for source in node.src))
        if node.op is Ops.REDUCE:
            shape, axes = new.src[0].shape, new.arg[1]
            kept = tuple(axis for axis in range(len(shape)) if axis not in axes)
            outputs = prod(shape[axis] for axis in kept)
            # (a sum that is not split adds into one block of float32 accumulators, which a long one overflows in
            # precision: 2**31 ones averaged 0.5)
            rounds = new.arg[0] in (Ops.ADD, Ops.MUL) and new.dtype.is_float
            parts = parts_of(outputs, prod(shape) // max(outputs, 1), rounds)
            if parts > 1 and not picks_one(new):
                new = _reduced_in_parts(new, kept, parts)
        if new is not node:
            done[node] = new
    return done


def picks_one(reduce: UOp) -> bool:
    """Whether a sum picks one value by its index: `Σ where(a == arange, value, 0)` (a gather, an embedding lookup,
    indexing by a tensor or a mask, a sort's values), which codegen makes a load of the value at `a`
    (codegen/lookup.py). Split into parts it would stay a sum, over every position of every part (`x[x > 0]` of a
    million floats took 12 s)."""
    source = reduce.src[0]
    if reduce.arg[0] is not Ops.ADD or source.op is not Ops.WHERE or source.src[0].op is not Ops.XOR:
        return False
    compare = next((node for node in source.src[0].src if node.op is Ops.CMPNE), None)
    return compare is not None and any(_arange_below(side) for side in compare.src)


def _arange_below(node: UOp) -> bool:
    while node.op in (Ops.EXPAND, Ops.RESHAPE, Ops.CAST):
        node = node.src[0]
    return node.op is Ops.ARANGE


MIN_PARTS = 16  # the fewest parts a reduce is split into in place (fewer would leave the parts long)


def _reduced_in_parts(reduce: UOp, kept: tuple[int, ...], parts: int) -> UOp:
    """`reduce` as a reduce of `parts` pieces of each output's values, then of the pieces' results."""
    source, (op, axes), dtype = reduce.src[0], reduce.arg, reduce.dtype
    # the outermost run of reduced axes, merged and split in place into parts (fewer where its length divides only
    # those: a batch norm's batch of 32), the parts moved outermost: the first kernel reads memory in its order, each
    # part a row of it (a column sum moved to the front of its values, x.sum(0) of a tall matrix, read each column
    # apart: 40x slower; the parts as the innermost output of a long matrix product ran it 20x slower)
    first = last = min(axes)
    while last + 1 in axes:
        last += 1
    shape = source.shape
    merged = prod(shape[first : last + 1])
    if (count := math.gcd(merged, parts)) >= MIN_PARTS:
        pieces = UOp(Ops.RESHAPE, dtype, (source,), (*shape[:first], count, merged // count, *shape[last + 1 :]))
        if first:
            order = (first, *range(first), *range(first + 1, len(pieces.shape)))
            pieces = UOp(Ops.PERMUTE, dtype, (pieces,), order)
        # (the reduced axes after the run move by as many as the run merged, less the one the parts added)
        inner = (first + 1, *(axis - (last - first) + 1 for axis in axes if axis > last))
        partial = UOp(Ops.REDUCE, dtype, (pieces,), (op, inner))
        total = UOp(Ops.REDUCE, dtype, (partial,), (op, (0,)))
        return UOp(Ops.RESHAPE, dtype, (total,), reduce.shape)
    order = (*kept, *axes)
    if order != tuple(range(len(order))):
        source = UOp(Ops.PERMUTE, dtype, (source,), order)
    sizes = tuple(source.shape[: len(kept)])
    length = prod(source.shape[len(kept) :])
    if length % parts:  # its values in one axis, padded to a multiple of the parts with the reduce's identity
        source = UOp(Ops.RESHAPE, dtype, (source,), (*sizes, length))
        padding = (*((0, 0),) * len(sizes), (0, -length % parts))
        source = UOp(Ops.PAD, dtype, (source,), padding)  # (zeros: a sum's identity)
        if op is not Ops.ADD:  # (a max's is the lowest value, a product's 1: where the values are not, those)
            inside = UOp(Ops.RESHAPE, dtypes.bool, (UOp.const(dtypes.bool, True),), (1,) * (len(sizes) + 1))
            inside = UOp(Ops.EXPAND, dtypes.bool, (inside,), (*sizes, length))
            inside = UOp(Ops.PAD, dtypes.bool, (inside,), padding)
            identity = UOp(
                Ops.RESHAPE, dtype, (UOp.const(dtype, reduce_identity(op, dtype)),), (1,) * len(inside.shape)
            )
            identity = UOp(Ops.EXPAND, dtype, (identity,), inside.shape)
            source = UOp(Ops.WHERE, dtype, (inside, source, identity))
        length += -length % parts
    pieces = UOp(Ops.RESHAPE, dtype, (source,), (*sizes, parts, length // parts))
    partial = UOp(Ops.REDUCE, dtype, (pieces,), (op, (len(sizes) + 1,)))
    total = UOp(Ops.REDUCE, dtype, (partial,), (op, (len(sizes),)))
    return UOp(Ops.RESHAPE, dtype, (total,), reduce.shape)
