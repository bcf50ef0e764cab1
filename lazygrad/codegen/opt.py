"""Kernel optimization as data: how a kernel's loops run is an ordered list of actions, each a small frozen value
`Opt(op, axis, amount)` naming a loop by its axis number (the number lowering gave it, which merges keep). Applying
an action rewrites the kernel graph and keeps the math; an action that does not fit the kernel raises
KernelOptError, so a list read from disk or built by a search is checked by applying it. Which list a kernel gets
is decided elsewhere (codegen/heuristic.py, or BEAM in engine/search.py); NOOPT=1 applies none.

The actions:

- MERGE(axis): fuse the loop with the next loop inside it of the same kind (the next output loop, or the next loop
  of the same reduce) into one loop of their product, where their indices only appear as `outer*size + inner`
  (else the merge would add divisions, and is refused);
- UPCAST(axis, amount): an output loop computes `amount` consecutive iterations per iteration (register blocking:
  the copies share loads and registers); an amount equal to the loop's size removes the loop;
- UNROLL(axis, amount): the same for a reduce loop: `amount` copies of the reduced value per iteration, combined
  in straight-line code;
- VECTORIZE(axis): mark a reduce loop for the compiler's vectorizer (its inputs are contiguous or fixed along it);
- SPLIT(axis, amount): run the loop as two of its kind, an outer one and an inner one of `amount` iterations numbered
  axis + 1 (the loops numbered after it move up by one). A loop that a reshape merged from two axes, indexed
  through `// amount` and `% amount`, reads memory by plain strides again once split.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from enum import Enum, auto

from lazygrad.helpers import prod
from lazygrad.uop.ops import LoopKind, Ops, UOp
from lazygrad.uop.symbolic import simplify, simplify_gated_loads


class OptOp(Enum):
    MERGE = auto()
    UPCAST = auto()
    UNROLL = auto()
    VECTORIZE = auto()
    SPLIT = auto()


@dataclass(frozen=True)
class Opt:
    """One optimization action: `op` on the loop numbered `axis`, with `amount` where the action takes one."""

    op: OptOp
    axis: int
    amount: int = 0

    def __str__(self) -> str:
        return f"{self.op.name}({self.axis}{f', {self.amount}' if self.amount else ''})"

    def to_json(self) -> list:
        return [self.op.name, self.axis, self.amount]

    @staticmethod
    def from_json(value: object) -> Opt:
        """The action a JSON value `[op name, axis, amount]` describes; ValueError for anything else."""
        if not (isinstance(value, list) and len(value) == 3 and value[0] in OptOp.__members__):
            raise ValueError(f"not an optimization action: {value!r}")
        if not all(type(number) is int and number >= 0 for number in value[1:]):
            raise ValueError(f"not an optimization action: {value!r}")
        return Opt(OptOp[value[0]], value[1], value[2])


class KernelOptError(ValueError):
    """An action that does not apply to this kernel; the message says why."""


# ---- graph rewriting helpers ------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=256)
def kernel_nodes(sink: UOp) -> tuple[UOp, ...]:
    """The nodes of a kernel graph, sources first; kept for the last few graphs, which the actions and the
    heuristic look through again and again."""
    return tuple(sink.toposort)


def count_divmod(sink: UOp) -> int:
    return sum(node.op in (Ops.IDIV, Ops.MOD) for node in kernel_nodes(sink))


def replace_ranges(
    sink: UOp, replacements: dict[UOp, UOp], reduce_ranges: dict[UOp, tuple[UOp, ...]], simplified: bool = True
) -> UOp:
    """`sink` with ranges replaced by expressions; a RANGE_REDUCE's own range list is given by `reduce_ranges`."""
    done: dict[UOp, UOp] = {}
    # a whole kernel's nodes are kept in kernel_nodes (the actions look at them too); a part's are not
    for node in kernel_nodes(sink) if sink.op is Ops.SINK else sink.toposort:
        if node in replacements:
            done[node] = replacements[node]
        elif node.op is Ops.RANGE_REDUCE:
            ranges = reduce_ranges.get(node, tuple(done[source] for source in node.src[1:]))
            done[node] = node.replace(src=(done[node.src[0]], *ranges))
        else:
            new_src = tuple(done[source] for source in node.src)
            done[node] = node if new_src == node.src else node.replace(src=new_src)
    return simplify(done[sink]) if simplified else done[sink]


def new_loop(loop: UOp, size: int, kind: LoopKind | None = None) -> UOp:
    """A loop with `loop`'s axis number (and kind, unless given) and `size` iterations."""
    return UOp(Ops.RANGE, loop.dtype, (UOp.const(loop.dtype, size),), (loop.arg[0], kind or loop.arg[1]))


def loops_by_axis(sink: UOp) -> dict[int, UOp]:
    return {node.arg[0]: node for node in kernel_nodes(sink) if node.op is Ops.RANGE}


def output_loops(sink: UOp) -> list[UOp]:
    """The output (global) loops, outermost first."""
    return sorted(
        (node for node in kernel_nodes(sink) if node.op is Ops.RANGE and node.arg[1] is LoopKind.GLOBAL),
        key=lambda node: node.arg[0],
    )


def reduces_over(sink: UOp, loop: UOp) -> list[UOp]:
    return [node for node in kernel_nodes(sink) if node.op is Ops.RANGE_REDUCE and loop in node.src[1:]]


# ---- the actions --------------------------------------------------------------------------------------------------


def merge(sink: UOp, outer: UOp) -> UOp:
    if outer.arg[1] is LoopKind.GLOBAL:
        group = output_loops(sink)
    else:
        reduces = reduces_over(sink, outer)
        group = list(reduces[0].src[1:]) if reduces else []
    position = group.index(outer)
    if position + 1 >= len(group):
        raise KernelOptError(f"loop {outer.arg[0]} has no loop inside it of its kind to merge with")
    inner = group[position + 1]
    inner_size = inner.src[0].arg
    merged = new_loop(outer, outer.src[0].arg * inner_size)
    reduce_ranges = {}
    for node in kernel_nodes(sink):
        if node.op is Ops.RANGE_REDUCE and outer in node.src[1:] and inner in node.src[1:]:
            reduce_ranges[node] = tuple(merged if r is outer else r for r in node.src[1:] if r is not inner)
    candidate = replace_ranges(sink, {outer: merged // inner_size, inner: merged % inner_size}, reduce_ranges)
    if count_divmod(candidate) > count_divmod(sink):
        raise KernelOptError(f"merging loops {outer.arg[0]} and {inner.arg[0]} would add divisions")
    return candidate


def copies_along(sink: UOp, loop: UOp, positions: list[UOp]) -> list[dict[UOp, UOp]]:
    """For each position, the nodes of the kernel that depend on `loop` rebuilt with the position in its place (a
    node that does not depend on it is itself: look it up with `.get(node, node)`). A reduce over `loop` is where
    the dependence ends. Only the dependent part of the graph is walked per copy."""
    dependent: set[UOp] = {loop}
    order: list[UOp] = []
    for node in kernel_nodes(sink):
        if node.op is Ops.RANGE_REDUCE and loop in node.src[1:]:
            continue
        for source in node.src:
            if source in dependent:
                dependent.add(node)
                order.append(node)
                break
    copies = []
    for position in positions:
        done = {loop: position}
        for node in order:
            done[node] = UOp(node.op, node.dtype, tuple([done.get(source, source) for source in node.src]), node.arg)
        copies.append(done)
    return copies


def upcast(sink: UOp, loop: UOp, factor: int) -> UOp:
    """Run output loop `loop` size/factor times, each iteration doing the work of `factor` consecutive ones."""
    outer = new_loop(loop, loop.src[0].arg // factor)
    copies = copies_along(sink, loop, [outer * factor + part for part in range(factor)])
    stores = dict.fromkeys(copy.get(store, store) for store in sink.src for copy in copies)
    # one simplification of all the copies: what they share is simplified once
    return simplify(sink.replace(src=tuple(stores)))


def unroll(sink: UOp, loop: UOp, factor: int) -> UOp:
    """Every reduce over `loop` reduces `factor` copies of its value per iteration of a loop `factor` times
    shorter (none, when `factor` is the loop's size)."""
    size = loop.src[0].arg
    outer = new_loop(loop, size // factor) if factor < size else None
    positions = [UOp.const(loop.dtype, part) if outer is None else outer * factor + part for part in range(factor)]
    copies = copies_along(sink, loop, positions)
    replacements: dict[UOp, UOp] = {}
    for node in reduces_over(sink, loop):
        combined = None
        for done in copies:
            copy = done.get(node.src[0], node.src[0])
            combined = copy if combined is None else combined.alu(node.arg, copy)
        rest = tuple(outer if r is loop else r for r in node.src[1:] if r is not loop or outer is not None)
        replacements[node] = node.replace(src=(combined, *rest)) if rest else combined
    return replace_ranges(sink, replacements, {})


def split(sink: UOp, loop: UOp, amount: int) -> UOp:
    """`loop` as an outer loop (with its number) around an inner one of `amount` iterations (the next number)."""
    axis = loop.arg[0]
    replacements = {
        node: UOp(Ops.RANGE, node.dtype, node.src, (number + 1, node.arg[1]))
        for number, node in loops_by_axis(sink).items()
        if number > axis
    }
    outer = new_loop(loop, loop.src[0].arg // amount)
    inner = UOp(Ops.RANGE, loop.dtype, (UOp.const(loop.dtype, amount),), (axis + 1, loop.arg[1]))
    replacements[loop] = outer * amount + inner
    reduce_ranges = {
        node: tuple(new for r in node.src[1:] for new in ((outer, inner) if r is loop else (replacements.get(r, r),)))
        for node in reduces_over(sink, loop)
    }
    return replace_ranges(sink, replacements, reduce_ranges)


def apply_opt(sink: UOp, opt: Opt) -> UOp:
    """`sink` with one action applied; KernelOptError where it does not fit the kernel."""
    return _apply_opt(sink, opt)


# the heuristic (or BEAM) applies actions to choose them, and then they are applied again, in order, to the same
# prepared kernel: the second time is a lookup (kernel graphs are interned, so the key is cheap to hash)
@functools.lru_cache(maxsize=256)
def _apply_opt(sink: UOp, opt: Opt) -> UOp:
    loop = loops_by_axis(sink).get(opt.axis)
    if loop is None:
        raise KernelOptError(f"{opt}: the kernel has no loop {opt.axis}")
    size, kind = loop.src[0].arg, loop.arg[1]
    if opt.op is OptOp.MERGE:
        return merge(sink, loop)
    if opt.op is OptOp.VECTORIZE:
        if kind is not LoopKind.REDUCE:
            raise KernelOptError(f"{opt}: loop {opt.axis} is a {kind.name.lower()} loop, not a reduce loop")
        return replace_ranges(sink, {loop: new_loop(loop, size, LoopKind.VECTOR_REDUCE)}, {})
    if opt.amount < 2 or size % opt.amount:
        raise KernelOptError(f"{opt}: the amount must be at least 2 and divide the loop's {size} iterations")
    if opt.op is OptOp.SPLIT:
        if opt.amount == size:
            raise KernelOptError(f"{opt}: the amount must be less than the loop's {size} iterations")
        return split(sink, loop, opt.amount)
    if opt.op is OptOp.UPCAST:
        if kind is not LoopKind.GLOBAL:
            raise KernelOptError(f"{opt}: loop {opt.axis} is a reduce loop: UNROLL it instead")
        return upcast(sink, loop, opt.amount)
    if kind is LoopKind.GLOBAL:
        raise KernelOptError(f"{opt}: loop {opt.axis} is an output loop: UPCAST it instead")
    return unroll(sink, loop, opt.amount)


def prepare(sink: UOp) -> UOp:
    """What every optimized kernel gets before its actions: reduce loops its values do not depend on are dropped
    (a sum of a broadcast is a product; the gradient of a sum or mean reaches a layer as a broadcast constant)."""
    replacements: dict[UOp, UOp] = {}
    for node in kernel_nodes(sink):
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


def apply_opts(sink: UOp, opts: tuple[Opt, ...]) -> UOp:
    """The prepared kernel `sink` with `opts` applied in order, its gated loads simplified last."""
    for opt in opts:
        sink = apply_opt(sink, opt)
    return simplify_gated_loads(sink)
