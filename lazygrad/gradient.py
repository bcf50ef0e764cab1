"""Symbolic differentiation: one derivative rule per differentiable primitive UOp, and `compute_gradient`, which
walks the graph once in reverse topological order and returns new UOps. Nothing is computed here."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

from lazygrad.device import Device
from lazygrad.dtype import dtypes
from lazygrad.helpers import argsort
from lazygrad.uop.ops import MOVEMENT, Ops, UOp, toposort


def full(shape: tuple[int, ...], dtype, value) -> UOp:
    """A constant broadcast to `shape`."""
    const = UOp.const(dtype, value)
    if not shape:
        return const
    return UOp(Ops.EXPAND, dtype, (UOp(Ops.RESHAPE, dtype, (const,), (1,) * len(shape)),), shape)


def full_like(node: UOp, value: float) -> UOp:
    """A constant with `node`'s shape and dtype."""
    return full(node.shape, node.dtype, value)


def equal(a: UOp, b: UOp) -> UOp:
    """a == b as "not (a != b)" (true for equal values, false for nan)."""
    return a.alu(Ops.CMPNE, b).alu(Ops.XOR, full(a.shape, dtypes.bool, True))


def is_finite(node: UOp) -> UOp:
    """Neither inf nor nan."""
    below_inf = node.alu(Ops.CMPLT, full_like(node, math.inf))
    return below_inf.alu(Ops.AND, full_like(node, -math.inf).alu(Ops.CMPLT, node))


# the CONTIGUOUS nodes of gradients: negative numbers, apart from those of Tensor.contiguous
_gradient_copies = itertools.count(-1, -1)


def contiguous_gradient(out: UOp, grad: UOp) -> UOp:
    """The gradient of a copy (CONTIGUOUS): where the copy reorders its source (a permute or a flip among the views
    under it) and the gradient is a sum, in a buffer laid out as the copy is, so that the kernel computing the sum
    stores its rows in order and the view back to the source's layout is a copy of its own. Stored through the
    view, every store of that kernel would be apart from the last (a transposed convolution's weight gradient:
    100 ms, 12 in the copy's layout)."""
    node, computed = out.src[0], grad
    while node.op in MOVEMENT and node.op not in (Ops.PERMUTE, Ops.FLIP):
        node = node.src[0]
    while computed.op in MOVEMENT or computed.op is Ops.CAST:
        computed = computed.src[0]
    # (an elementwise gradient reads through the view as cheaply as it would store through it)
    if node.op not in (Ops.PERMUTE, Ops.FLIP) or computed.op is not Ops.REDUCE:
        return grad
    return UOp(Ops.CONTIGUOUS, grad.dtype, (grad,), next(_gradient_copies))


def reduce_sum(node: UOp, axes: tuple[int, ...]) -> UOp:
    return UOp(Ops.REDUCE, node.dtype, (node,), (Ops.ADD, axes)) if axes else node


def expand_to(node: UOp, shape: tuple[int, ...]) -> UOp:
    return node if node.shape == shape else UOp(Ops.EXPAND, node.dtype, (node,), shape)


def cast_like(node: UOp, like: UOp) -> UOp:
    return node if node.dtype == like.dtype else UOp(Ops.CAST, like.dtype, (node,))


def divide(a: UOp, b: UOp) -> UOp:
    return a * b.alu(Ops.RECIP)


def binary_max_gradient(out: UOp, grad: UOp) -> tuple[UOp, UOp]:
    # torch's rule: the loser gets 0, a tie halves, and with a nan both get the gradient; by selects, not a 0/1 mask
    # times grad, so the loser's share of an infinite gradient is 0, not 0 * inf = nan
    a, b = out.src
    a_wins, b_wins, tie = b.alu(Ops.CMPLT, a), a.alu(Ops.CMPLT, b), equal(a, b)
    zero, share = full_like(grad, 0.0), tie.where(grad * full_like(grad, 0.5), grad)
    return b_wins.where(zero, share), a_wins.where(zero, share)


def remainder_gradient(out: UOp, grad: UOp) -> tuple[UOp | None, UOp | None]:
    if not out.dtype.is_float:  # (an integer remainder: no gradient)
        return None, None
    a, b = out.src
    return grad, (grad * divide(a + out.alu(Ops.NEG), b)).alu(Ops.NEG)


def reduce_gradient(out: UOp, grad: UOp) -> tuple[UOp]:
    source = out.src[0]
    reduce_op, axes = out.arg
    expanded_grad = expand_to(grad, source.shape)
    if reduce_op is Ops.ADD:
        return (expanded_grad,)
    if reduce_op is Ops.MUL:
        # each element's share is the product of the others: with no zero that is out / x; with one zero only the
        # zero's share is nonzero (the product of the rest); with more, every share is 0
        is_zero = equal(source, full_like(source, 0.0))
        nonzero = is_zero.where(full_like(source, 1.0), source)
        product_of_nonzero = expand_to(UOp(Ops.REDUCE, source.dtype, (nonzero,), (Ops.MUL, axes)), source.shape)
        # the zeros counted as 1 + x (1 at either zero), so the count has slope 1 in each zero: with one zero the
        # others' shares are the product of the rest times `zero_slope` (value 0, slope 1 in the zero), not the
        # constant 0, so a second derivative reads their slope in the zero, the product of the rest
        ones_at_zeros = is_zero.where(source + full_like(source, 1.0), full_like(source, 0.0))
        zeros = expand_to(reduce_sum(ones_at_zeros, axes), source.shape)
        zero_slope = zeros + UOp(Ops.DETACH, zeros.dtype, (zeros,)).alu(Ops.NEG)
        none_zero, one_zero = equal(zeros, full_like(zeros, 0.0)), equal(zeros, full_like(zeros, 1.0))
        others = divide(product_of_nonzero, nonzero)
        # (an overflowed or nan product of the rest keeps the constant 0 there: inf * 0 would make the share nan)
        finite_others = is_finite(others).where(others, full_like(source, 0.0))
        share = is_zero.where(
            one_zero.where(product_of_nonzero, full_like(source, 0.0)),
            none_zero.where(others, one_zero.where(finite_others * zero_slope, full_like(source, 0.0))),
        )
        return (expanded_grad * share,)
    # max: the gradient goes to every maximal element, split evenly among ties; a NaN maximum is each NaN's (it
    # equals nothing: the count was 0, and the gradient NaN everywhere)
    peak = expand_to(out, source.shape)
    is_max = equal(source, peak)
    if source.dtype.is_float:
        is_max = is_max.alu(Ops.OR, source.alu(Ops.CMPNE, source).alu(Ops.AND, peak.alu(Ops.CMPNE, peak)))
    is_max = cast_like(is_max, source)
    count = expand_to(reduce_sum(is_max, axes), source.shape)
    return (divide(is_max, count) * expanded_grad,)


def pad_gradient(out: UOp, grad: UOp) -> tuple[UOp]:
    window = tuple((before, before + size) for (before, _), size in zip(out.arg, out.src[0].shape))
    return (UOp(Ops.SHRINK, grad.dtype, (grad,), window),)


def shrink_gradient(out: UOp, grad: UOp) -> tuple[UOp]:
    padding = tuple((start, size - end) for (start, end), size in zip(out.arg, out.src[0].shape))
    return (UOp(Ops.PAD, grad.dtype, (grad,), padding),)


def expand_gradient(out: UOp, grad: UOp) -> tuple[UOp]:
    axes = tuple(i for i, (old, new) in enumerate(zip(out.src[0].shape, out.shape)) if old != new)
    return (reduce_sum(grad, axes),)


def cast_gradient(out: UOp, grad: UOp) -> tuple[UOp | None]:
    return (cast_like(grad, out.src[0]),) if out.src[0].dtype.is_float else (None,)


LN_2 = math.log(2)

# one rule per primitive: (the gradient of the node, the node) -> one gradient (or None) per source
DERIVATIVES: dict[Ops, Callable[[UOp, UOp], tuple[UOp | None, ...]]] = {
    Ops.ADD: lambda grad, out: (grad, grad),
    Ops.MUL: lambda grad, out: (grad * out.src[1], grad * out.src[0]),
    Ops.NEG: lambda grad, out: (grad.alu(Ops.NEG),),
    Ops.RECIP: lambda grad, out: ((grad * out * out).alu(Ops.NEG),),
    # d(a/b) = da / b - out · db / b, divided as the forward pass is (torch's rule)
    Ops.FDIV: lambda grad, out: (grad / out.src[1], ((grad * out) / out.src[1]).alu(Ops.NEG)),
    Ops.SQRT: lambda grad, out: (divide(grad, out * full_like(out, 2.0)),),
    Ops.EXP2: lambda grad, out: (grad * out * full_like(out, LN_2),),
    Ops.LOG2: lambda grad, out: (divide(grad, out.src[0] * full_like(out, LN_2)),),
    Ops.SIN: lambda grad, out: (grad * out.src[0].alu(Ops.COS),),
    Ops.COS: lambda grad, out: ((grad * out.src[0].alu(Ops.SIN)).alu(Ops.NEG),),
    Ops.MAX: lambda grad, out: binary_max_gradient(out, grad),
    # a float remainder a - q*b, its truncated quotient q = (a - out) / b held constant
    Ops.MOD: lambda grad, out: remainder_gradient(out, grad),
    Ops.WHERE: lambda grad, out: (
        None,
        out.src[0].where(grad, full_like(grad, 0.0)),
        out.src[0].where(full_like(grad, 0.0), grad),
    ),
    Ops.CAST: lambda grad, out: cast_gradient(out, grad),
    Ops.REDUCE: lambda grad, out: reduce_gradient(out, grad),
    Ops.RESHAPE: lambda grad, out: (UOp(Ops.RESHAPE, grad.dtype, (grad,), out.src[0].shape),),
    Ops.PERMUTE: lambda grad, out: (UOp(Ops.PERMUTE, grad.dtype, (grad,), tuple(argsort(list(out.arg)))),),
    Ops.EXPAND: lambda grad, out: expand_gradient(out, grad),
    Ops.PAD: lambda grad, out: pad_gradient(out, grad),
    Ops.SHRINK: lambda grad, out: shrink_gradient(out, grad),
    Ops.FLIP: lambda grad, out: (UOp(Ops.FLIP, grad.dtype, (grad,), out.arg),),
    Ops.CONTIGUOUS: lambda grad, out: (contiguous_gradient(out, grad),),
    Ops.SLOPE: lambda grad, out: (None, grad * out.arg),
    Ops.COPY: lambda grad, out: (UOp(Ops.COPY, grad.dtype, (grad,), out.src[0].device(Device.DEFAULT)),),
}
# comparisons, integer ops, DETACH and the leaves have no rule: no gradient flows through them
NO_GRADIENT = {Ops.CMPLT, Ops.CMPNE, Ops.IDIV, Ops.AND, Ops.OR, Ops.XOR, Ops.SHL, Ops.SHR, Ops.DETACH}


def rule_for(node: UOp, grad: UOp) -> tuple[UOp | None, ...]:
    """The gradient of each of `node`'s sources, given the node's `grad` (None where none flows)."""
    rule = DERIVATIVES.get(node.op)  # (the ops in NO_GRADIENT, and the leaves, have none)
    return (None,) * len(node.src) if rule is None else rule(grad, node)


def compute_gradients(
    seeds: dict[UOp, UOp], targets: list[UOp], order: list[UOp] | None = None
) -> tuple[dict[UOp, UOp], dict[UOp, UOp]]:
    """Gradients of the sum of (root · seed) over `seeds` with respect to each target, as new UOps, and for each
    gradient contribution the forward node whose rule made it (for the backward-graph dump). `order` is
    `toposort(list(seeds))` where the caller has it."""
    target_set = set(targets)
    # only nodes with a path to a target need a gradient
    leads_to_target: dict[UOp, bool] = {}
    if order is None:
        order = toposort(list(seeds))
    for node in order:
        leads_to_target[node] = node in target_set or any(leads_to_target[s] for s in node.src)
    grads: dict[UOp, UOp] = {}
    made_by: dict[UOp, UOp] = {}
    for root, seed in seeds.items():
        grads[root] = grads[root] + seed if root in grads else seed
    for node in reversed(order):
        if node not in grads or not leads_to_target[node] or not node.src:
            continue
        for source, contribution in zip(node.src, rule_for(node, grads[node])):
            if contribution is None or not leads_to_target[source] or not source.dtype.is_float:
                continue
            made_by[contribution] = node
            grads[source] = grads[source] + contribution if source in grads else contribution
    return {target: grads[target] for target in targets if target in grads}, made_by


def compute_gradient(root: UOp, root_grad: UOp, targets: list[UOp]) -> dict[UOp, UOp]:
    """d(root · root_grad)/d(target) for each target reachable from `root`, as new UOps."""
    return compute_gradients({root: root_grad}, targets)[0]
