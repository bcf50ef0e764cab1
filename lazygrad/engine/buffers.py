"""The link between BUFFER UOps and device memory.

A BUFFER UOp owns its `Buffer` (kept with the node's cached facts): when the last UOp (and so the last Tensor or
graph) referring to the buffer dies, the memory is freed. Realized results are remembered the same way, so any graph that still
contains a computed node reads the buffer instead of recomputing it.
"""

from __future__ import annotations

import itertools
import weakref
from typing import Any

import numpy as np

from lazygrad.device import Buffer
from lazygrad.dtype import DType
from lazygrad.uop.ops import MOVEMENT, Ops, UOp


class _CarrierRef(weakref.ref):
    """A weak reference to a node that carries a fact, with the node's key in the list of carriers."""

    __slots__ = ("key",)


class NodeFact:
    """One kind of fact kept on some nodes, in each node's cached facts: it dies with its node, and looking it up is
    a dictionary read (this runs on every realize; a weak map costs a weak reference per lookup). A weak list of
    the nodes that carry it serves the rare walks over all of them."""

    def __init__(self, key: str):
        self.key = key  # the name in the node's facts (read directly where a lookup is hot)
        self._carriers: dict[int, _CarrierRef] = {}  # id -> the node, while it lives

    def get(self, node: UOp) -> Any:
        return node.__dict__.get(self.key)

    def set(self, node: UOp, value: Any) -> None:
        node.__dict__[self.key] = value
        reference = self._carriers[id(node)] = _CarrierRef(node, self._died)
        reference.key = id(node)

    def _died(self, reference: _CarrierRef) -> None:
        if self._carriers.get(reference.key) is reference:  # (not a newer node that took the dead one's id)
            del self._carriers[reference.key]

    def drop(self, node: UOp) -> None:
        if node.__dict__.pop(self.key, None) is not None:
            del self._carriers[id(node)]

    def items(self) -> list[tuple[UOp, Any]]:
        """Every live node carrying the fact, with it."""
        found = []
        for reference in list(self._carriers.values()):
            if (node := reference()) is not None:
                found.append((node, node.__dict__[self.key]))
        return found

    def __bool__(self) -> bool:
        return bool(self._carriers)


# computed node -> the view of the buffer that holds its value: the view itself, or a weak reference to it where the
# view has a history (see `realized_view`)
realized = NodeFact("realized")
# view a tensor was switched to by realization -> the computation it replaced, so gradients still flow through it:
# as long as anything reads the view (a loss built on a tensor that has died since), not only while the tensor lives.
# The computation's nodes then refer to the view weakly (`realized`): the two would otherwise keep each other alive,
# and their buffers, until the cyclic collector ran.
history = NodeFact("history")
_unique_ids = itertools.count()
_VIEW_OPS = (Ops.BUFFER, Ops.RESHAPE)


def new_buffer(device: str, size: int, dtype: DType, random_count: int | None = None) -> UOp:
    """A fresh BUFFER UOp with (not yet allocated) device memory behind it. A random source (see engine/rng.py)
    carries the count of values it covers as a fourth part of its arg."""
    arg = (next(_unique_ids), size, device) if random_count is None else (next(_unique_ids), size, device, random_count)
    node = UOp(Ops.BUFFER, dtype, (), arg)
    # each BUFFER node is unique (a fresh id), so its memory is one more fact about it, looked up on every launch
    node.__dict__["buffer"] = Buffer(device, size, dtype)
    return node


def buffers_made_from_now() -> int:
    """A number below the id of every BUFFER made from now on (and above every earlier one's)."""
    return next(_unique_ids)


def buffer_from_numpy(array: np.ndarray, device: str, dtype: DType) -> UOp:
    """A BUFFER UOp holding a copy of `array`, viewed with the array's shape."""
    node = new_buffer(device, array.size, dtype)
    buffer_of(node).copyin(array)
    return node if array.shape == (array.size,) else UOp(Ops.RESHAPE, dtype, (node,), array.shape)


def buffer_of(node: UOp) -> Buffer:
    """The memory behind a BUFFER UOp."""
    return node.__dict__["buffer"]


def is_buffer_view(node: UOp) -> bool:
    """True for a BUFFER, or reshapes of one: a node whose value already sits, in order, in memory."""
    while node.op is Ops.RESHAPE:
        node = node.src[0]
    return node.op is Ops.BUFFER


def views_memory(node: UOp) -> bool:
    """True for a BUFFER seen through movement ops only (a slice, transpose, flip, pad, reshape): a view, whose
    values are the buffer's contents whenever it is read, so realizing it computes nothing to keep."""
    while node.op in MOVEMENT:
        node = node.src[0]
    return node.op is Ops.BUFFER


def forget_buffers(buffers: set[UOp]) -> None:
    """Drop every remembered result held in one of `buffers` or computed from one: they are about to be
    overwritten, and a graph built later must read (and compute from) the new values."""
    below: dict[UOp, bool] = {}  # node -> whether one of `buffers` is in its graph (shared by every walk below)

    def reads(root: UOp) -> bool:
        stack = [(root, False)]
        while stack:
            node, sources_done = stack.pop()
            if node in below:
                continue
            if sources_done:
                below[node] = any(below[source] for source in node.src)
            elif node in buffers:
                below[node] = True
            else:
                stack.append((node, True))
                stack.extend((source, False) for source in node.src if source not in below)
        return below[root]

    # (an executed assign stays: it stands for its buffer's current contents)
    for node, _ in realized.items():
        view = realized_view(node)
        if view is None or node.op is not Ops.ASSIGN and (view.base in buffers or reads(node)):
            realized.drop(node)
    # a view of an overwritten buffer, or of a computation that read it, is a leaf now: its values no longer come
    # from that computation, and gradients through it would be taken at the new values
    for view, computation in history.items():
        if view.base in buffers or reads(computation):
            history.drop(view)


def read_before_overwrite(roots: list[UOp], overwritten: set[UOp], written_now: set[UOp]) -> list[UOp]:
    """The roots whose values depend on the current contents of an `overwritten` buffer: computing them after the
    write would give other values. A root that is only a view of a buffer (movement ops over it) is left out: like
    a PyTorch view, it shows the buffer's contents whenever it is read. An assign in `written_now` (run by the
    same schedule) stands for the new contents; what its value reads is computed before the write."""
    # (plain loops and lookups: an eager training step walks its whole backward graph here, from the gradients the
    # optimizer reads)
    reads: dict[UOp, bool] = {}
    stack = [(root, False) for root in roots]
    pop, push, realized_key = stack.pop, stack.append, realized.key
    while stack:
        node, sources_done = pop()
        if node in reads:
            continue
        op = node.op
        sources = node.src[1:] if op is Ops.ASSIGN else node.src  # (an assign's target is written, not read)
        if not sources_done:
            if op is Ops.BUFFER:
                reads[node] = node in overwritten
            elif op is Ops.ASSIGN and node in written_now:
                reads[node] = False
            elif (
                node.__dict__.get(realized_key) is not None
                and (view := realized_view(node)) is not None
                and (view.base in overwritten)
            ):
                reads[node] = True  # its value sits in the buffer about to be overwritten
            else:
                push((node, True))
                for source in sources:
                    if source not in reads:
                        push((source, False))
            continue
        for source in sources:
            if reads[source]:
                reads[node] = True
                break
        else:
            reads[node] = False
    return [root for root in roots if reads[root] and not _is_view_of_buffer(root)]


def _is_view_of_buffer(node: UOp) -> bool:
    while node.op in MOVEMENT:
        node = node.src[0]
    return node.op is Ops.BUFFER


def realized_view(node: UOp) -> UOp | None:
    """The view of the buffer holding a computed node's value, while there is one."""
    view = node.__dict__.get(realized.key)
    if view is None or view.__class__ is UOp:
        return view
    return view()  # (weak: the view of a tensor with a history, which keeps this node alive)


def remember_history(view: UOp, computation: UOp) -> UOp:
    """Record that `view` holds the value of `computation`; returns the computation with earlier views expanded.
    Call it before `realized.set` of the nodes the view holds: those refer to a view with a history weakly."""
    # (with no history recorded anywhere, the graph has no view to expand)
    expanded = with_history([computation])[computation] if history else computation
    history.set(view, expanded)
    return expanded


def history_of(node: UOp) -> UOp:
    """The computation a realized view holds, or the node itself."""
    inner = history.get(node)
    return node if inner is None else inner


def with_history(roots: list[UOp]) -> dict[UOp, UOp]:
    """Each node reachable from `roots` mapped to its node in the graph with realized views replaced by the
    computations they hold (the graph gradients are taken on)."""
    done: dict[UOp, UOp] = {}
    stack = [(root, False) for root in roots]
    while stack:
        node, sources_done = stack.pop()
        if node in done:
            continue
        # only views of buffers have history (checked first: the lookup in the weak map is the slow part)
        if node.op in _VIEW_OPS and (inner := history_of(node)) is not node:  # expanded when it was recorded
            done[node] = inner
            continue
        if not sources_done:
            stack.append((node, True))
            for source in node.src:
                if source not in done:
                    stack.append((source, False))
            continue
        new_src = tuple([done[source] for source in node.src])
        done[node] = node if new_src == node.src else node.replace(src=new_src)
    return done
