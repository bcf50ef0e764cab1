"""Lookups by index: a sum over a loop of values selected where the loop's index equals a value `a` that does not
depend on the loop (`where(a == i, value, 0)`: the one-hot masks of gather, embedding lookups and indexing by
tensors) is the one value at `a`.
Lowering leaves that sum as a loop; this rewrite makes it a load at `a`, gated by `a` lying inside the loop. A lookup
in a table of V rows then reads one row instead of V, and codegen sees an elementwise kernel.

The tensor graph keeps the one-hot form, so a lookup's gradient (a sum over the lookups that chose each row) stays a
composition of primitives; only its forward reads change here. That gradient is the same sum with the selection made
by an output loop instead (`Σ_t where(a_t == row, value_t, 0)`); codegen's SCATTER action (codegen/opt.py) runs it as
a scatter, with the helpers here."""

from __future__ import annotations

import functools

from lazygrad.dtype import dtypes
from lazygrad.uop.ops import Ops, UOp, dtype_limits
from lazygrad.uop.pattern import PatternMatcher, UPat, graph_rewrite, substitute
from lazygrad.uop.symbolic import gate_clauses


def _loop_index_cast(node: UOp, loop: UOp) -> bool:
    """Whether `node` is the loop's index, through casts to integer types that hold every one of its values."""
    last = loop.src[0].arg - 1
    while node.op is Ops.CAST:
        if not node.dtype.is_int or node.dtype == dtypes.bool or dtype_limits(node.dtype)[1] < last:
            return False
        node = node.src[0]
    return node is loop


def equal_to_loop(condition: UOp, loop: UOp) -> UOp | None:
    """`a` where `condition` is `a == loop index` (rendered as not(a != index)), `a` an integer free of the loop."""
    if condition.op is not Ops.XOR or not any(s.op is Ops.CONST and s.arg is True for s in condition.src):
        return None
    compare = next((s for s in condition.src if s.op is Ops.CMPNE), None)
    if compare is None:
        return None
    for value, index in (compare.src, reversed(compare.src)):
        if _loop_index_cast(index, loop) and value.dtype.is_int and loop not in value.toposort:
            return value
    return None


def condition_and_value(body: UOp) -> tuple[UOp, UOp] | None:
    """(condition, value) where `body` is `value` if the condition holds else 0, cast or not (a half lookup sums in
    float32; a cast bool is 1 where it holds: a count). A product with the condition's 0 or 1 is not one: 0 * inf is
    NaN, so a one-hot matrix times a table with an infinite row is NaN everywhere, as in torch, and that stays a sum."""
    casts = []
    while body.op is Ops.CAST:
        casts.append(body.dtype)
        body = body.src[0]
    if body.dtype == dtypes.bool and casts:  # (a count: the condition itself, as 1 or 0)
        condition, value = body, UOp.const(dtypes.bool, True)
    elif body.op is not Ops.WHERE or body.src[2].op is not Ops.CONST or body.src[2].arg != 0:
        return None
    else:
        condition, value = body.src[0], body.src[1]
    for dtype in reversed(casts):  # (a cast of 0 is 0: the casts go to the value, innermost first)
        value = value.cast(dtype)
    return condition, value


def _selection(body: UOp, loop: UOp) -> tuple[UOp, UOp, UOp | None] | None:
    """(a, value, other condition) where `body` is `value` if `a == loop index` (and the other condition) else 0."""
    selected = condition_and_value(body)
    if selected is None:
        return None
    condition, value = selected
    clauses = gate_clauses(condition)  # (a conjunction: one clause may be the selection)
    for clause in clauses:
        a = equal_to_loop(clause, loop)
        if a is not None:
            others = [c for c in clauses if c is not clause]
            return a, value, functools.reduce(UOp.logical_and, others) if others else None
    return None


def gate_loads_reading(node: UOp, valid: UOp, index: UOp) -> UOp:
    """`node` with every load whose index reads `index` gated by `valid` (it may lie outside the buffer otherwise)."""
    gated = {}
    for load in node.toposort:
        if load.op is Ops.LOAD and load.src[0].op is Ops.DEFINE_GLOBAL and index in load.src[1].toposort:
            gate = valid if len(load.src) == 2 else load.src[2].logical_and(valid)
            gated[load] = load.replace(src=(load.src[0], load.src[1], gate))
    return substitute(node, gated) if gated else node


def collapse_lookup(reduce: UOp) -> UOp | None:
    """A sum whose body selects by one of its loops, with that loop replaced by a load at the selected index."""
    body, loops = reduce.src[0], reduce.src[1:]
    for loop in loops:
        selection = _selection(body, loop)
        if selection is None:
            continue
        a, value, rest = selection
        index = a.cast(dtypes.index)
        inside = UOp.const(dtypes.index, -1).lt(index).logical_and(index.lt(loop.src[0].arg))
        condition = inside if rest is None else inside.logical_and(rest)
        picked = substitute(condition.where(value, UOp.const(value.dtype, 0)), {loop: index})
        # (the loads of `rest` too: it is read before it is known to hold)
        picked = gate_loads_reading(picked, inside, index)
        remaining = tuple(other for other in loops if other is not loop)
        return UOp(Ops.RANGE_REDUCE, reduce.dtype, (picked, *remaining), reduce.arg) if remaining else picked
    return None


_lookups = PatternMatcher([(UPat(Ops.RANGE_REDUCE, arg=Ops.ADD, name="reduce"), collapse_lookup)])


def collapse_lookups(sink: UOp) -> UOp:
    """Every sum in a lowered kernel that selects one element by index, made a load of that element."""
    if not any(node.op is Ops.RANGE_REDUCE for node in sink.toposort):
        return sink
    return graph_rewrite(sink, _lookups)
