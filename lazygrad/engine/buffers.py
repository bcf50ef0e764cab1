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
from lazygrad.gradient import NO_GRADIENT
from lazygrad.helpers import prod
from lazygrad.uop.ops import MOVEMENT, Ops, UOp


class _CarrierRef(weakref.ref):
    """A weak reference to a node that carries a fact, with the node's key in the list of carriers and the number of
    the setting (see `NodeFact.unchecked`)."""

    __slots__ = ("key", "number")


_settings = itertools.count()  # numbers NodeFact settings in the order they were made


class NodeFact:
    """One kind of fact kept on some nodes, in each node's cached facts: it dies with its node, and looking it up is
    a dictionary read (this runs on every realize; a weak map costs a weak reference per lookup). A weak list of
    the nodes that carry it serves the rare walks over all of them."""

    def __init__(self, key: str):
        self.key = key  # the name in the node's facts (read directly where a lookup is hot)
        # id -> the node, while it lives, in the order the fact was set (a node set again moves to the end)
        self._carriers: dict[int, _CarrierRef] = {}
        self._checked: tuple[Any, int] = (None, -1)  # (a check, the last setting it covered): see `unchecked`

    def get(self, node: UOp) -> Any:
        return node.__dict__.get(self.key)

    def set(self, node: UOp, value: Any) -> None:
        node.__dict__[self.key] = value
        key = id(node)
        self._carriers.pop(key, None)
        reference = self._carriers[key] = _CarrierRef(node, self._died)
        reference.key, reference.number = key, next(_settings)

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

    def unchecked(self, check: Any) -> tuple[list[tuple[UOp, Any]], int]:
        """The live nodes carrying the fact, with it, that were set after the last `checked(check, ...)`: all of them
        where the last check was another one. With the number to pass to `checked` once they are checked. (A check
        whose answer cannot change while a node keeps its fact, the same one on every optimizer step, then costs only
        the settings made since the last step, however many values a program keeps.)"""
        last, covered = self._checked
        upto = next(_settings)
        if last != check:
            return self.items(), upto
        try:
            return self._set_after(covered, self._carriers.values()), upto
        except RuntimeError:  # (another thread's node died meanwhile, changing the map: walk a copy)
            return self._set_after(covered, list(self._carriers.values())), upto

    def _set_after(self, covered: int, references) -> list[tuple[UOp, Any]]:
        found = []
        for reference in reversed(references):  # (the newest settings are the last)
            if reference.number <= covered:
                break
            if (node := reference()) is not None:
                found.append((node, node.__dict__[self.key]))
        return found

    def checked(self, check: Any, upto: int) -> None:
        """The nodes `unchecked(check)` gave, set up to `upto`, are checked (those it did not give were already)."""
        self._checked = (check, upto)

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
# view -> True where realization computed a value before a write into memory its computation reads (a pending loss
# kept before an optimizer step, or a setitem into its input): gradients cannot flow through it (see `_backward`)
history_cut = NodeFact("history_cut")
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


# the argument of the DETACH node `Tensor.detach()` puts over a view of memory: a name of that memory (writes through it
# reach the memory, and it shows the memory's contents) through which no gradient flows
DETACHED_VIEW = "detached view"


def views_memory(node: UOp) -> bool:
    """True for a BUFFER seen through movement ops only (a slice, transpose, flip, pad, reshape, or a detached name
    of one): realizing it computes nothing to keep. (Whether it follows later writes into the buffer, as a torch
    view does, or keeps the values it had when it was made, as a flip or a pad does, `memory_of` says.)"""
    while node.op in MOVEMENT:
        node = node.src[0]
    op = node.op
    if op is _BUFFER:
        return True
    return op is _DETACH and node.arg == DETACHED_VIEW and views_memory(node.src[0])


_BUFFER, _DETACH = Ops.BUFFER, Ops.DETACH  # (read on every realize)


_MISSING = object()
# id -> (a weak reference to) each BUFFER node with writes pending on it (see tensor.py's `_note_write`)
writes_pending: dict[int, weakref.ref] = {}


def memory_of(node: UOp) -> UOp | None:
    """The buffer whose contents `node` shows whenever it is read, as a torch view does: a BUFFER, or one seen through
    the movement ops of a strided view (a reshape that keeps the layout, a slice with positive steps, a transpose, an
    expand, a diagonal, ...), or a detached name of one. None for a computation, and for movement ops that make a
    copy in torch (a flip, a pad, a repeat, a reshape of a transpose): their values are those the buffer had when
    they were made, as any other computation's. A fact cached on the node."""
    op = node.op
    if op is Ops.BUFFER:
        return node
    if op not in MOVEMENT and (op is not Ops.DETACH or node.arg != DETACHED_VIEW):
        return None
    facts = node.__dict__
    found = facts.get("memory", _MISSING)
    if found is _MISSING:
        chain = []
        base = node
        while base.op in MOVEMENT or base.op is Ops.DETACH and base.arg == DETACHED_VIEW:
            chain.append(base)
            base = base.src[0]
        if base.op is not Ops.BUFFER:
            found = None
        elif all(link.op is Ops.RESHAPE or link.op is Ops.DETACH for link in chain):
            found = base  # (reshapes of memory in order: the common case, known without a look at the layout)
        else:
            found = base if strided_view(chain[::-1], base.shape) else None
        facts["memory"] = found
    return found


def write_target(node: UOp) -> UOp | None:
    """The buffer view an assign into a tensor of `node` writes: its reshapes of a BUFFER (a detached name's DETACH
    dropped), or None where `node` is no such view (a computation, a slice or transpose of memory)."""
    chain = []
    while node.op is Ops.RESHAPE or node.op is Ops.DETACH and node.arg == DETACHED_VIEW:
        if node.op is Ops.RESHAPE:
            chain.append(node)
        node = node.src[0]
    if node.op is not Ops.BUFFER:
        return None
    for reshape in reversed(chain):
        node = UOp(Ops.RESHAPE, reshape.dtype, (node,), reshape.arg)
    return node


def strided_view(chain: list[UOp], shape: tuple[int, ...]) -> bool:
    """Whether movement ops `chain` (the first applied first) over values of `shape` laid out in order show each
    element as values[offset + sum(index * stride)] with strides >= 0 and no padding in sight: a view torch can
    make. Each index into the values and each bound a pad sets is tracked as a linear form of the current indices;
    a reshape re-expresses them as torch's `view` does, and where it cannot (it merges axes not laid out as one, as a
    reshape of a transpose does) they are a copy. Only where axes it merges were expanded (as the windows of an
    unfold are made: repeated, re-read with a stride, and cut) is the whole map checked element by element (up to
    VIEW_CHECK_LIMIT elements; a larger one counts as a copy)."""
    linear = _linear_view(chain, shape)
    if linear is None:
        return any(node.op is Ops.EXPAND for node in chain) and _checked_view(chain, shape)
    return linear


VIEW_CHECK_LIMIT = 1 << 16


def _checked_view(chain: list[UOp], shape: tuple[int, ...]) -> bool:
    """`strided_view` by the index of every element (-1 where padding shows)."""
    if any(prod(node.shape) > VIEW_CHECK_LIMIT for node in chain) or prod(shape) > VIEW_CHECK_LIMIT:
        return False
    index = np.arange(prod(shape), dtype=np.int64).reshape(shape)
    for node in chain:
        op, arg = node.op, node.arg
        if op is Ops.RESHAPE:
            index = index.reshape(arg)
        elif op is Ops.PERMUTE:
            index = index.transpose(arg)
        elif op is Ops.EXPAND:
            index = np.broadcast_to(index, arg)
        elif op is Ops.SHRINK:
            index = index[tuple(slice(start, end) for start, end in arg)]
        elif op is Ops.FLIP:
            index = np.flip(index, arg)
        elif op is Ops.PAD:
            index = np.pad(index, arg, constant_values=-1)
    if not index.size:
        return True
    origin = int(index.reshape(-1)[0])
    expected = np.full((), origin, dtype=np.int64)
    for axis, length in enumerate(index.shape):
        stride = int(index[(0,) * axis + (1,) + (0,) * (index.ndim - axis - 1)]) - origin if length > 1 else 0
        if stride < 0:
            return False
        expected = np.expand_dims(expected, -1) + np.arange(length, dtype=np.int64) * stride
    return bool((index >= 0).all() and (index == expected).all())


def _linear_view(chain: list[UOp], shape: tuple[int, ...]) -> bool | None:
    """`strided_view` by linear forms; None where a reshape cannot re-express them."""
    viewed = _view_forms(chain, shape)
    if viewed is None:
        return None
    forms, bounds, shape = viewed
    if not prod(shape):
        return True
    if any(not _always_within(forms[n], *bounds[n], shape) for n in range(1, len(forms))):
        return False  # padding shows
    return all(stride >= 0 or length == 1 for stride, length in zip(forms[0], shape))


def strided_layout(node: UOp) -> tuple[UOp, int, tuple[int, ...]] | None:
    """(buffer, offset, strides) in elements where `node` is a strided view of a BUFFER (torch's kind of view:
    strides >= 0, no padding in sight), so its values can be read from the memory directly; else None."""
    chain = []
    while node.op in MOVEMENT or node.op is Ops.DETACH and node.arg == DETACHED_VIEW:
        if node.op is not Ops.DETACH:
            chain.append(node)
        node = node.src[0]
    if node.op is not Ops.BUFFER or not chain:
        return None
    viewed = _view_forms(chain[::-1], node.shape)
    if viewed is None:
        return None
    forms, bounds, shape = viewed
    if any(not _always_within(forms[n], *bounds[n], shape) for n in range(1, len(forms))):
        return None  # (padding shows)
    if any(stride < 0 for stride in forms[0][:-1]):
        return None
    return node, forms[0][-1], tuple(forms[0][:-1])


def _view_forms(chain: list[UOp], shape: tuple[int, ...]) -> tuple[list[list[int]], list, list[int]] | None:
    """Movement ops `chain` (the first applied first) over values of `shape` as linear forms of the final indices:
    (forms, bounds, final shape). forms[0] gives each element's place in the values (coefficients per axis, then a
    constant), the others the index into each padded axis, which lies inside its bounds where the values show.
    None where a reshape cannot re-express them."""
    strides = [prod(shape[axis + 1 :]) for axis in range(len(shape))]
    shape = list(shape)
    forms = [[*strides, 0]]  # coefficients per axis, then the constant: forms[0] is the index, the others padded axes
    bounds: list[tuple[int, int]] = [(0, 0)]  # (low, high) of each form but the first
    for node in chain:
        op, arg = node.op, node.arg
        if op is Ops.RESHAPE:
            kept = [0] + [n for n in range(1, len(forms)) if not _always_within(forms[n], *bounds[n], shape)]
            forms, bounds = [forms[n] for n in kept], [bounds[n] for n in kept]
            for number, form in enumerate(forms):
                strides = _restride(shape, form[:-1], list(arg))
                if strides is None:
                    return None
                forms[number] = [*strides, form[-1]]
            shape = list(arg)
        elif op is Ops.PERMUTE:
            forms = [[form[axis] for axis in arg] + [form[-1]] for form in forms]
            shape = [shape[axis] for axis in arg]
        elif op is Ops.EXPAND:
            for axis, (old, new) in enumerate(zip(shape, arg)):
                if old != new:
                    for form in forms:
                        form[axis] = 0
            shape = list(arg)
        elif op is Ops.SHRINK:
            for axis, (start, end) in enumerate(arg):
                for form in forms:
                    form[-1] += form[axis] * start
                shape[axis] = end - start
        elif op is Ops.FLIP:
            for axis in arg:
                for form in forms:
                    form[-1] += form[axis] * (shape[axis] - 1)
                    form[axis] = -form[axis]
        elif op is Ops.PAD:
            added = []  # (a form, its bounds): the index into the axis as it was lies inside it
            for axis, (before, after) in enumerate(arg):
                for form in forms:
                    form[-1] -= form[axis] * before
                if before or after:
                    inside = [0] * (len(shape) + 1)
                    inside[axis], inside[-1] = 1, -before
                    added.append((inside, (0, shape[axis])))
                shape[axis] += before + after
            forms += [form for form, _ in added]
            bounds += [limits for _, limits in added]
        # (a detached name's DETACH changes nothing)
    return forms, bounds, shape


def _always_within(form: list[int], low: int, high: int, shape: list[int]) -> bool:
    """Whether low <= form(index) < high for every index of `shape`."""
    least = most = form[-1]
    for coefficient, length in zip(form, shape):
        if length == 0:
            return True
        if coefficient > 0:
            most += coefficient * (length - 1)
        else:
            least += coefficient * (length - 1)
    return low <= least and most < high


def _restride(old_shape: list[int], old_strides: list[int], new_shape: list[int]) -> list[int] | None:
    """The strides that show `old_shape` with `old_strides` as `new_shape`, or None where no strides do (torch's
    computeStride: a reshape keeps its input's layout only where the axes it merges are laid out as one)."""
    if not old_shape:
        return [0] * len(new_shape)
    new_strides = [0] * len(new_shape)
    view_axis = len(new_shape) - 1
    chunk_stride = old_strides[-1]
    tensor_count = view_count = 1
    for axis in range(len(old_shape) - 1, -1, -1):
        tensor_count *= old_shape[axis]
        if axis == 0 or (old_shape[axis - 1] != 1 and old_strides[axis - 1] != tensor_count * chunk_stride):
            while view_axis >= 0 and (view_count < tensor_count or new_shape[view_axis] == 1):
                new_strides[view_axis] = view_count * chunk_stride
                view_count *= new_shape[view_axis]
                view_axis -= 1
            if view_count != tensor_count:
                return None
            if axis > 0:
                chunk_stride = old_strides[axis - 1]
                tensor_count = view_count = 1
    return new_strides if view_axis == -1 else None


def forget_buffers(buffers: set[UOp]) -> None:
    """Drop every remembered result held in one of `buffers` or computed from one: they are about to be
    overwritten, and a graph built later must read (and compute from) the new values."""
    below: dict[UOp, bool] = {}  # node -> whether one of `buffers` is in its graph (shared by every walk below)
    # Only what was remembered since the last call is looked at where that call overwrote the same buffers (each
    # optimizer step overwrites the same): the answer for a node whose fact stayed cannot have changed, as graphs do
    # not, and a program may keep thousands of values with a history (a dataset normalized by tensor ops). (The
    # buffers by their unique numbers: the record of a check keeps no buffer alive.)
    written = frozenset([buffer.arg[0] for buffer in buffers])

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
    remembered, upto = realized.unchecked(written)
    for node, _ in remembered:
        view = realized_view(node)
        if view is None or node.op is not Ops.ASSIGN and (view.base in buffers or reads(node)):
            realized.drop(node)
    realized.checked(written, upto)
    # a view of an overwritten buffer is a leaf now: its values no longer come from that computation. One of a
    # computation that read it keeps its values, but gradients through it would be taken at the new values: its
    # gradient is cut (backward says so, as torch refuses a graph whose saved values were modified), unless no
    # gradient passes into that computation at all (a weight made of last step's argmax): it is a leaf too
    views, upto = history.unchecked(written)
    for view, computation in views:
        if view.base in buffers:
            history.drop(view)
        elif reads(computation):
            history.drop(view)
            if views_on_gradient_paths([computation]):
                history_cut.set(view, True)
    history.checked(written, upto)


def views_on_gradient_paths(roots: list[UOp]) -> list[UOp]:
    """The views of memory (buffers and reshapes of them) a gradient from `roots` reaches: the paths down to them
    pass no DETACH, comparison or integer op. Below those only the values in memory are read."""
    seen, stack, views = set(), list(roots), []
    while stack:
        node = stack.pop()
        if node in seen or node.op in NO_GRADIENT:
            continue
        seen.add(node)
        if node.op in _VIEW_OPS and is_buffer_view(node):
            views.append(node)
        stack.extend(node.src)
    return views


def read_before_overwrite(roots: list[UOp], overwritten: set[UOp], written_now: set[UOp]) -> list[UOp]:
    """The roots whose values depend on the current contents of an `overwritten` buffer: computing them after the
    write would give other values. A root that is only a view of a buffer (movement ops over it) is left out: like
    a PyTorch view, it shows the buffer's contents whenever it is read. The last assign to a buffer in
    `written_now` (run by the same schedule) stands for the new contents; what its value reads is computed before
    the write. An earlier assign to an overwritten buffer (run by it, or before, or one it skips: a later one
    writes the whole buffer) is a value that buffer will not hold any more, as the old contents are."""
    # (plain loops and lookups: an eager training step walks its whole backward graph here, from the gradients the
    # optimizer reads)
    reads: dict[UOp, bool] = {}
    last_writes: dict[UOp, UOp] | None = None  # buffer -> the last assign `written_now` makes to it (found when needed)
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
            elif op is Ops.ASSIGN and (node in written_now or node.src[0].base in overwritten):
                if last_writes is None:
                    last_writes = {}
                    for written in written_now:
                        if written.op is Ops.ASSIGN:
                            buffer = written.src[0].base
                            if buffer not in last_writes or last_writes[buffer].arg < written.arg:
                                last_writes[buffer] = written
                last = last_writes.get(node.src[0].base)
                if node in written_now or last is not None and last.arg > node.arg:
                    reads[node] = last is not node
                else:  # a write issued after this schedule's: it stands for contents to come, read from its value
                    push((node, True))
                    for source in sources:
                        if source not in reads:
                            push((source, False))
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
    return [root for root in roots if reads[root] and memory_of(root) is None]


def realized_view(node: UOp) -> UOp | None:
    """The view of the buffer holding a computed node's value, while there is one."""
    view = node.__dict__.get(realized.key)
    if view is None or view.__class__ is UOp:
        return view
    return view()  # (weak: the view of a tensor with a history, which keeps this node alive)


def remember_history(view: UOp, computation: UOp, expanded: bool = False) -> UOp:
    """Record that `view` holds the value of `computation`; returns the computation with earlier views expanded
    (`expanded`: it is already, so a loop of writes does not walk the whole history it grew at every write).
    Call it before `realized.set` of the nodes the view holds: those refer to a view with a history weakly."""
    if not expanded and history:  # (with no history recorded anywhere, the graph has no view to expand)
        computation = with_history([computation])[computation]
    history.set(view, computation)
    # (and the computation and the buffer know the view, weakly: backward finds the realized tensors in its graph from
    # the graph, and a write the other names of the memory with a history from the buffer)
    reference = weakref.ref(view)
    _note_view(computation, view, reference)
    _note_view(view if view.op is Ops.BUFFER else view.base, view, reference)  # (`base`'s common case inline)
    if history_cut.key in view.__dict__:  # (written since, with a history: its gradient flows again)
        history_cut.drop(view)
    return computation


def weak_notes(facts: dict, name: str) -> dict[int, weakref.ref]:
    """A node's map `facts[name]` of weak references by id (the live tensors holding it, its views with a history),
    made if missing; its dead entries are dropped once it has doubled since it held only live ones (a node may outlive
    many of the objects it notes)."""
    notes = facts.get(name)
    if notes is None:
        notes = facts[name] = {}
    elif len(notes) >= facts.get(name + "_pruned_at", 8):
        forget_dead(facts, name)
    return notes


def forget_dead(facts: dict, name: str) -> None:
    """Drop the dead entries of `weak_notes(facts, name)`, and note when to next."""
    notes = facts[name]
    # (a copy of the items, and pop: other threads' objects may die meanwhile)
    for key in [key for key, reference in list(notes.items()) if reference() is None]:
        notes.pop(key, None)
    facts[name + "_pruned_at"] = max(8, 2 * len(notes))


def _note_view(node: UOp, view: UOp, reference: weakref.ref) -> None:
    """Note on `node` (a computation, a buffer) a view with a history, weakly."""
    weak_notes(node.__dict__, "history_views")[id(view)] = reference


def views_holding(computations) -> list[UOp]:
    """The views whose history is one of `computations`, in their order."""
    found = []
    for computation in computations:
        if (views := computation.__dict__.get("history_views")) is not None:
            for reference in list(views.values()):
                if (view := reference()) is not None and view.__dict__.get(history.key) is computation:
                    found.append(view)
    return found


def views_with_history(buffer: UOp) -> list[UOp]:
    """The views of a BUFFER node (itself, reshapes of it) that have a history."""
    found = []
    for reference in list(buffer.__dict__.get("history_views", {}).values()):
        if (view := reference()) is not None and view.__dict__.get(history.key) is not None and view.base is buffer:
            found.append(view)
    return found


def history_of(node: UOp) -> UOp:
    """The computation a realized view holds, or the node itself."""
    inner = history.get(node)
    return node if inner is None else inner


def with_history(roots: list[UOp]) -> dict[UOp, UOp]:
    """Each node reachable from `roots` mapped to its node in the graph with realized views replaced by the
    computations they hold (the graph gradients are taken on). Not below a node no gradient passes (a DETACH, a
    comparison): there a view's values are what a gradient reads, and those are in its memory, while its history may
    read memory written since (a hidden state detached after an optimizer step: its history read the old weights)."""
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
        if node.op in NO_GRADIENT:
            done[node] = node
            continue
        if not sources_done:
            stack.append((node, True))
            for source in node.src:
                if source not in done:
                    stack.append((source, False))
            continue
        new_src = tuple([done[source] for source in node.src])
        if node.op is Ops.ASSIGN:  # (what an assign writes stays its buffer: only its value has a history)
            new_src = (node.src[0], *new_src[1:])
        done[node] = node if new_src == node.src else node.replace(src=new_src)
    return done
