"""The scheduler: the kernels that compute a tensor graph, in order, each with the buffers it reads and writes.

Which nodes get buffers is fusion's decision (engine/fusion.py); anything realized earlier is read, never recomputed.
A value realized between kernels that does not vary along some axes (a gradient the same for every image, as a
`.sum()` loss gives) is stored once along them and read back through an expand; outputs and copies are stored whole.

Planning happens once per graph structure (`_structure`): a graph built again over new buffers reuses the plan.

Constants are part of a kernel's AST, so they fold into the code and a new Python scalar compiles a new kernel
(DEBUG=1 shows the compile-cache hits). What changes every step lives in device buffers instead — the optimizers'
learning rate and step count, each draw's random source — so a training loop compiles once.
"""

from __future__ import annotations

import heapq
import operator
import time
from dataclasses import dataclass, field
from itertools import accumulate, pairwise
from typing import Any

from lazygrad.device import Device
from lazygrad.dtype import DType
from lazygrad.engine.buffers import forget_buffers, is_buffer_view, new_buffer, realized, realized_view
from lazygrad.engine.fusion import kernel_roots
from lazygrad.engine.kernel_work import split_reduces
from lazygrad.helpers import DEBUG, prod
from lazygrad.uop.ops import ALU, Ops, UOp, _const_key
from lazygrad.uop.pattern import substitute


@dataclass(slots=True)
class ScheduleItem:
    """One kernel (or copy) to run: its AST over DEFINE_GLOBAL parameters, and the BUFFER UOps bound to them, the
    output first."""

    ast: UOp | None
    buffers: list[UOp]
    device: str
    kind: str = "kernel"  # or "copy"
    outputs: list[UOp] = field(default_factory=list)
    reads: list[UOp] = field(default_factory=list)  # the nodes (earlier roots or buffers) the kernel reads

    @property
    def name(self) -> str:
        return "copy" if self.kind == "copy" else f"kernel {self.ast.key.hex()[:8]}"


def _prepare(nodes: list[UOp], aliases: dict[UOp, UOp]) -> dict[UOp, UOp]:
    """The nodes (sources first) that kernels see differently, mapped to what they see: nodes realized earlier read
    from their buffers, DETACH nodes (`aliases`, which `_structure` leaves out of `nodes`) as their sources, and the
    nodes above those rebuilt."""
    done: dict[UOp, UOp] = {}
    key = realized.key
    for node in nodes:
        if node.__dict__.get(key) is not None:
            if (view := realized_view(node)) is not None:
                done[node] = view
                continue
            realized.drop(node)  # (the view of a tensor with a history died: the node is computed again)
        if any(source in done or source in aliases for source in node.src):
            sources = (aliases.get(source, source) for source in node.src)
            done[node] = node.replace(src=tuple(done.get(source, source) for source in sources))
    for detach, source in aliases.items():
        done[detach] = done.get(source, source)
    return done


@dataclass
class Plan:
    """The schedule of one graph structure, with buffers as numbered slots: first the graph's own buffers in
    topological order, then the ones the schedule allocates. Positions number the graph's nodes in
    topological order."""

    kernels: list[tuple[UOp | None, list[int], str, str]]  # AST, buffer slots, device, kind
    new_buffers: list[tuple[str, int, DType]]  # device, size and dtype of each allocated slot
    views: list[tuple[int, int, tuple[tuple[Ops, Any], ...]]]  # position, slot and the reshapes (and expand) viewing it
    remember: tuple[int, ...]  # positions whose value later graphs may reuse
    overwritten: list[int]  # slots that assigns write
    stored_once: bool = False  # whether a value is kept once along axes it is uniform on (see `_uniform_axes`)
    launches: Any = None  # what the runtime prepared to run the kernels again (see realize.run_schedule)
    graph: Any = None  # the device graph it runs them as, with the kernels it holds (see realize.run_as_graph)


@dataclass(slots=True)
class Schedule:
    """A plan bound to one graph's buffers: what realize runs."""

    plan: Plan
    buffers: list[UOp]  # by slot

    def forget_overwritten(self) -> None:
        """Before it runs: nodes computed into (or from) the buffers its assigns write no longer read their values
        there. (Only then: listing a schedule changes nothing.)"""
        if self.plan.overwritten:
            forget_buffers({self.buffers[slot] for slot in self.plan.overwritten})

    @property
    def items(self) -> list[ScheduleItem]:
        """The kernels in order, each with its buffers (made when asked: a repeated graph runs from the plan)."""
        buffers = self.buffers
        return [
            ScheduleItem(ast, [buffers[s] for s in slots], dev, kind) for ast, slots, dev, kind in self.plan.kernels
        ]


_plans: dict[tuple, Plan] = {}
PLAN_CACHE_SIZE = 4096


# What `_structure` found walking a graph from some outputs, which a walk of more outputs (those first) continues:
# (outputs, nodes in order, their positions, buffers, aliases, entries, whether none was realized earlier, the merged
# entries). A plain tuple, made only for a graph that assigns: a realize is on the hot path of every eager op.
_Walk = tuple


def _structure(
    outputs: list[UOp], device: str, walked: _Walk | None = None
) -> tuple[list[UOp], tuple, list[UOp], dict[UOp, UOp], bool, _Walk]:
    """Walk a graph once for what its schedule depends on. Returns its nodes, sources first; the key: each node's op,
    dtype, argument and sources by position, with the ids of buffers and the unique ids of CONTIGUOUS and ASSIGN
    dropped (a buffer used twice is one node, so positions still tell it from two buffers), and the outputs'
    positions; the buffers in order; each DETACH node mapped to the node it stands for (kernels read a DETACH as
    its source, so it takes its source's position and is not among the nodes; so does a node that is an earlier one
    once DETACH nodes are read as their sources, `x.detach() * 2` beside `x * 2`: the key is the one of the graph
    without DETACH nodes); whether no node in it was realized earlier (else kernels see the graph differently:
    see `_prepare`); and, for a graph with an assign, the walk, which `walked` continues where it covered the first
    outputs (values a schedule must compute before an overwrite join its outputs: see Tensor.realize_all)."""
    if walked is not None and walked[0] == outputs[: len(walked[0])]:
        walked_outputs, *parts, as_is, merged = walked
        order, position, buffers, aliases, entries = (part.copy() for part in parts)  # (the first walk's stay)
        merged = None if merged is None else merged.copy()
        roots = outputs[len(walked_outputs) :]
    else:
        order, position, buffers, aliases, entries, as_is, merged = [], {}, [], {}, [device], True, None
        roots = outputs
    assigns = walked is not None  # (whether the graph overwrites a buffer: only such a walk is worth continuing)
    # (`position` is also the visited set: a node popped again was finished before, as the graph has no cycles and
    # its own sources lie above it on the stack; `merged`, once a DETACH is seen: each computed node's entry -> its
    # position)
    realized_key = realized.key  # (`realized.get` inlined: this walk runs on every realize)
    # (the ops as locals: an enum member read from its class is an attribute lookup, several per node)
    DETACH, SLOPE, BUFFER, ASSIGN, unique = Ops.DETACH, Ops.SLOPE, Ops.BUFFER, Ops.ASSIGN, _UNIQUE_ARGS
    position_of = position.__getitem__  # (one bound method for the walk)
    stack: list[tuple[UOp, bool]] = [(root, False) for root in reversed(roots)]
    pop, push = stack.pop, stack.append
    while stack:
        node, sources_done = pop()
        if sources_done:
            op, arg = node.op, node.arg
            if op is DETACH or op is SLOPE:  # (the value of its source)
                at = position[node] = position[node.src[0]]
                aliases[node] = order[at]
                if merged is None:
                    merged = _computed_positions(order, entries)
                continue
            if as_is and node.__dict__.get(realized_key) is not None:
                as_is = False
            if op in unique:
                arg = None
                assigns = assigns or op is ASSIGN
            elif isinstance(arg, (float, int)):  # a constant: 0.0 and -0.0, 1 and True and 1.0 differ
                arg = _const_key(arg)
            # (map over the dict's own method: a comprehension costs a frame of its own)
            entry = (op, node.dtype, arg, tuple(map(position_of, node.src)))
            if merged is not None and op not in unique:
                at = merged.setdefault(entry, len(order))
                if at != len(order):  # an earlier node, once the DETACH nodes below are read as their sources
                    position[node] = at
                    aliases[node] = order[at]
                    continue
            entries.append(entry)
        elif node in position:
            continue
        elif node.src:
            push((node, True))
            for source in reversed(node.src):
                if source in position:
                    continue
                leaf = source
                # (a DETACH or SLOPE of a leaf is the leaf, numbered where it alone would be)
                while leaf.op is DETACH or leaf.op is SLOPE:
                    leaf = leaf.src[0]
                if leaf.src:
                    push((source, False))
                    continue
                # a leaf is numbered at once (small graphs are mostly leaves), its entry kept with its cached facts:
                # it depends on the leaf alone (buffers and constants outlive graphs)
                if leaf not in position:
                    entry = leaf.__dict__.get("structure_entry")
                    if entry is None:
                        entry = leaf.__dict__["structure_entry"] = _leaf_entry(leaf)
                    if leaf.op is BUFFER:
                        buffers.append(leaf)
                    entries.append(entry)
                    position[leaf] = len(order)
                    order.append(leaf)
                while source is not leaf:
                    position[source], aliases[source] = position[leaf], leaf
                    if merged is None:
                        merged = _computed_positions(order, entries)
                    source = source.src[0]
            continue
        else:  # a leaf as an output
            if node.op is BUFFER:
                buffers.append(node)
            entries.append(_leaf_entry(node))
        position[node] = len(order)
        order.append(node)
    key = (*entries, tuple(map(position_of, outputs)))
    walk = (outputs, order, position, buffers, aliases, entries, as_is, merged) if assigns else None
    return order, key, buffers, aliases, as_is, walk


def _computed_positions(order: list[UOp], entries: list[Any]) -> dict[tuple, int]:
    """The position of each computed node walked so far by its entry (`entries` holds the device first, then one
    entry per node of `order`); a node with an argument made unique is left out: equal entries are two nodes."""
    return {
        entry: at
        for at, (node, entry) in enumerate(zip(order, entries[1:]))
        if node.src and node.op not in _UNIQUE_ARGS
    }


def _leaf_entry(node: UOp) -> tuple:
    """A leaf's part of a structure key: a buffer's dtype, size and device (not its id); any other leaf's op, dtype
    and argument. A leaf has no buffer below it to be computed from, so it is never realized (see `_reusable`):
    `_structure` does not look it up."""
    if node.op is Ops.BUFFER:
        return (node.dtype, *node.arg[1:])
    return (node.op, node.dtype, _const_key(node.arg), ())


_UNIQUE_ARGS = (Ops.CONTIGUOUS, Ops.ASSIGN)


@dataclass(slots=True)
class PlannedGraph:
    """A graph with its plan found (or made), before any buffer is allocated: `bind` makes it a schedule. A realize
    that overwrites buffers first asks it which values read them (see Tensor.realize_all), and may plan more."""

    plan: Plan
    nodes: list[UOp]  # the graph's nodes as planned, by position
    inputs: list[UOp]  # its buffers, the plan's first slots
    prepared: dict[UOp, UOp]  # a node of the original graph -> the node planned in its place (see `_prepare`)
    walk: _Walk | None  # the walk of a graph that overwrites a buffer and read no node realized earlier

    def overwritten(self) -> set[UOp]:
        """The buffers its assigns write (an assign writes a buffer of the graph: one of its inputs)."""
        return {self.inputs[slot] for slot in self.plan.overwritten}

    def computed(self) -> set[UOp]:
        """The nodes whose values it will hold in buffers: the keys of `bind`'s map, without making the views."""
        views = {self.nodes[position] for position, _, moves in _kept_views(self.plan)}
        return views | {original for original, new in self.prepared.items() if new in views or is_buffer_view(new)}


def _kept_views(plan: Plan) -> list[tuple[int, int, tuple]]:
    """The plan's views a tensor may be switched to: all, unless values are stored once along axes they are uniform
    on, where a tensor is switched only to memory that holds it in order (later graphs read the rest too)."""
    if not plan.stored_once:
        return plan.views
    return [view for view in plan.views if not (view[2] and view[2][-1][0] is Ops.EXPAND)]


def plan_graph(outputs: list[UOp], device: str, walked: _Walk | None = None) -> PlannedGraph:
    """The plan of the graph that computes `outputs`, found by its structure or made. `walked` is an earlier
    `PlannedGraph.walk` of the first outputs, continued rather than redone.

    Scheduling is planned once per graph structure: a graph built again over new buffers (the next training
    step, the next `(t + 1).realize()`) reuses the plan and only allocates its buffers."""
    start = time.perf_counter() if DEBUG.value >= 1 else 0.0
    nodes, key, inputs, aliases, as_is, walk = _structure(outputs, device, walked)
    # a DETACH is read as its source: it takes its source's position, so the key (and the plan) of a graph is the one
    # of the graph without its DETACH nodes
    prepared, kernel_outputs = aliases, outputs
    if not as_is:  # graphs may contain nodes realized earlier: read those from their buffers
        prepared = _prepare(nodes, aliases)
        kernel_outputs = [prepared.get(output, output) for output in outputs]
        nodes, key, inputs, aliases, _, _ = _structure(kernel_outputs, device)
    plan = _plans.get(key)
    if plan is None and aliases:
        # plan the graph without its DETACH nodes: `_structure` numbers the nodes as it would, so it has the same key
        # (and a repeated graph finds its plan in one walk). Were the keys to differ, the graph without them is
        # scheduled under its own, as a prepared one is.
        stripped = _prepare(nodes, aliases)
        kernel_outputs = [stripped.get(output, output) for output in outputs]
        stripped_nodes, stripped_key, stripped_inputs, _, _, _ = _structure(kernel_outputs, device)
        if stripped_key == key:
            plan = _new_plan(key, kernel_outputs, stripped_nodes, stripped_inputs, device)
        else:
            prepared, nodes, key, inputs = stripped, stripped_nodes, stripped_key, stripped_inputs
            plan = _plans.get(key)
    if plan is None:
        plan = _new_plan(key, kernel_outputs, nodes, inputs, device)
    if DEBUG.value >= 1:
        print(f"scheduled {len(plan.kernels)} kernels in {(time.perf_counter() - start) * 1e3:.2f} ms")
    return PlannedGraph(plan, nodes, inputs, prepared, walk if as_is else None)


def bind(planned: PlannedGraph) -> tuple[Schedule, dict[UOp, UOp], dict[UOp, UOp]]:
    """The schedule of a planned graph, with its new buffers allocated; the map from each computed node (and each
    node found realized earlier) to the buffer view that will hold its value; and the part of that map later graphs
    may reuse."""
    plan, nodes, prepared = planned.plan, planned.nodes, planned.prepared
    buffers = planned.inputs
    if plan.new_buffers:
        buffers = buffers.copy()
        for spec in plan.new_buffers:
            buffers.append(new_buffer(*spec))
    views = {}
    for position, slot, moves in plan.views:
        view = buffers[slot]
        for op, arg in moves:
            view = UOp(op, view.dtype, (view,), arg)
        views[nodes[position]] = view
    remember = {nodes[position]: views[nodes[position]] for position in plan.remember}
    if plan.stored_once:
        views = {nodes[position]: views[nodes[position]] for position, _, _ in _kept_views(plan)}
    if prepared:
        # a node of the original graph found realized, or with a computed node in its place, goes to that buffer view
        becomes = {
            original: views.get(new, new) for original, new in prepared.items() if new in views or is_buffer_view(new)
        }
        remember = {node: view for node, view in becomes.items() if prepared[node] in remember} | remember
        becomes |= views
    else:
        becomes = views
    return Schedule(plan, buffers), becomes, remember


def create_schedule(outputs: list[UOp], device: str) -> tuple[Schedule, dict[UOp, UOp], dict[UOp, UOp]]:
    """The kernels that compute `outputs`, in order (`.items` lists them), with the maps `bind` returns."""
    return bind(plan_graph(outputs, device))


def _new_plan(key: tuple, outputs: list[UOp], nodes: list[UOp], inputs: list[UOp], device: str) -> Plan:
    """Plan the graph of `outputs` (`nodes`, its buffers `inputs`) and keep the plan under `key`."""
    plan = _plans[key] = _make_plan(UOp(Ops.SINK, src=tuple(outputs)), nodes, inputs, device)
    if len(_plans) > PLAN_CACHE_SIZE:
        del _plans[next(iter(_plans))]
    return plan


def _make_plan(sink: UOp, nodes: list[UOp], inputs: list[UOp], device: str) -> Plan:
    """Schedule a graph and abstract the result over its buffers."""
    # A long reduce into fewer values than the device has cores is split in two (see kernel_work.split_reduces): its
    # parts are computed for its kernel alone, so no graph node stands for them.
    split = split_reduces(nodes, Device[device].renderer.target.reduce_parts)
    position = {split.get(node, node): index for index, node in enumerate(nodes)}
    if split:
        sink = UOp(Ops.SINK, src=tuple(split.get(output, output) for output in sink.src))
        sink_nodes = sink.toposort
    else:
        sink_nodes = [*nodes, sink]  # sink.toposort, without walking the graph again
    # Kernels that wait on each other in a cycle get parts computed apart first (see `_computed_apart`).
    forced: frozenset[UOp] = frozenset()
    while True:
        roots, schedule, buffer_views = _build_schedule(sink, sink_nodes, forced, device)
        ordered = _order(schedule)
        if isinstance(ordered, list):
            break
        apart = _computed_apart(ordered, set(roots), forced) - forced
        if not apart:
            raise RuntimeError(
                "schedule: a kernel must read a buffer both before and after an assign overwrites it; realize "
                "the value read before the assign first"
            )
        forced = forced | apart
    slots = {buffer: slot for slot, buffer in enumerate(inputs)}
    new_buffers = []
    for root in roots:
        buffer = buffer_views[root].base
        if buffer not in slots:
            slots[buffer] = len(slots)
            new_buffers.append((buffer.arg[2], buffer.arg[1], buffer.dtype))
    views = []
    for root, view in buffer_views.items():
        if root not in position:
            continue
        moves = []
        while view.op in _STORED_VIEW_OPS:
            moves.append((view.op, view.arg))
            view = view.src[0]
        views.append((position[root], slots[view], tuple(reversed(moves))))
    return Plan(
        [(item.ast, [slots[buffer] for buffer in item.buffers], item.device, item.kind) for item in ordered],
        new_buffers,
        views,
        tuple(position[node] for node in _reusable(sink_nodes, roots, buffer_views) if node in position),
        [slots[root.src[0].base] for root in roots if root.op is Ops.ASSIGN],
        any(view.op is Ops.EXPAND for view in buffer_views.values()),
    )


_STORED_VIEW_OPS = (Ops.RESHAPE, Ops.EXPAND)


def _reusable(sink_nodes: list[UOp], roots: list[UOp], buffer_views: dict[UOp, UOp]) -> list[UOp]:
    """The computed nodes whose values later graphs may reuse (and gradients may be taken through): not values
    computed from the old contents of a buffer this schedule overwrites, but every assign (a unique event, which
    stands for its buffer's new contents once it has run) and what is computed from those new contents."""
    assigned = {root.src[0].base for root in roots if root.op is Ops.ASSIGN}
    reads_assigned: set[UOp] = set()  # reads old contents
    # a node with no buffer below it (a broadcast constant, an arange) belongs to no device: recomputing it is
    # free, and remembering it would hand one device's buffer to a graph on another
    reads_buffer: set[UOp] = set()
    for node in sink_nodes:
        if node.op is not Ops.ASSIGN and (node in assigned or any(source in reads_assigned for source in node.src)):
            reads_assigned.add(node)
        if node.op is Ops.BUFFER or any(source in reads_buffer for source in node.src):
            reads_buffer.add(node)
    return [node for node in buffer_views if node in reads_buffer and node not in reads_assigned]


def _build_schedule(
    sink: UOp, sink_nodes: list[UOp], forced: frozenset[UOp], device: str
) -> tuple[list[UOp], list[ScheduleItem], dict]:
    """The roots, one item per root (each with a fresh output buffer, or its target's for an assign), and the
    buffer view each root's value will be in."""
    # the smallest limit of the devices involved holds for every kernel (graphs rarely span devices)
    devices = {device} | {node.arg for node in sink_nodes if node.op is Ops.COPY}
    limits = [limit for name in devices if (limit := Device[name].max_buffers) is not None]
    roots = kernel_roots(sink, list(sink.src), forced, min(limits, default=None), sink_nodes)
    buffer_views: dict[UOp, UOp] = {}
    schedule: list[ScheduleItem] = []
    devices: dict[UOp, str | None] = {}
    # (outputs become tensors' memory, and a copy moves memory as it is: those are stored whole)
    whole = set(sink.src) | {node.src[0] for node in sink_nodes if node.op is Ops.COPY}
    uniform: dict[UOp, frozenset[int]] = {}
    for root in roots:
        root_device = _device_of(root, devices) or device
        if root.op is Ops.ASSIGN:
            buffer, buffer_views[root] = root.src[0].base, root.src[0]
        else:
            # a value between kernels is stored once along the axes it does not vary on (a gradient that is the
            # same for every image and position, as a `.sum()` loss gives), and read back through an expand
            shape = root.shape
            if root not in whole and root.op not in (Ops.CONTIGUOUS, Ops.COPY) and prod(shape):
                axes = _uniform_axes(root, uniform)
                shape = tuple(1 if axis in axes else size for axis, size in enumerate(shape))
            buffer = new_buffer(root_device, prod(shape), root.dtype)
            view = buffer if shape == (buffer.arg[1],) else UOp(Ops.RESHAPE, root.dtype, (buffer,), shape)
            buffer_views[root] = view if shape == root.shape else UOp(Ops.EXPAND, root.dtype, (view,), root.shape)
        schedule.append(_build_item(root, buffer, buffer_views, root_device))
    return roots, schedule, buffer_views


def _uniform_axes(root: UOp, known: dict[UOp, frozenset[int]]) -> frozenset[int]:
    """The axes along which `root`'s value does not change (every axis of size 1 among them), from its graph:
    constants and expands are uniform, buffers and aranges are not, elementwise ops keep what all their sources
    share, and movement ops carry the axes along. `known` holds the answers for nodes seen before."""
    stack = [root]
    while stack:
        node = stack[-1]
        if node in known:
            stack.pop()
            continue
        missing = [source for source in node.src if source not in known]
        if missing:
            stack.extend(missing)
            continue
        stack.pop()
        shape, op = node.shape, node.op
        ones = frozenset(axis for axis, size in enumerate(shape) if size == 1)
        if op in ALU or op in (Ops.CAST, Ops.BITCAST, Ops.CONTIGUOUS, Ops.DETACH, Ops.SLOPE, Ops.COPY):
            axes = frozenset.intersection(*(known[source] for source in node.src))
        elif op is Ops.REDUCE:
            axes = known[node.src[0]] | frozenset(node.arg[1])
        elif op is Ops.EXPAND or op is Ops.SHRINK or op is Ops.FLIP:  # (an expand keeps its source's size-1 axes)
            axes = known[node.src[0]]
        elif op is Ops.PERMUTE:
            axes = frozenset(axis for axis, old in enumerate(node.arg) if old in known[node.src[0]])
        elif op is Ops.PAD:
            axes = frozenset(axis for axis in known[node.src[0]] if node.arg[axis] == (0, 0))
        elif op is Ops.RESHAPE:
            axes = _reshaped_uniform_axes(node.src[0].shape, known[node.src[0]], shape)
        else:  # a buffer, an arange, an assign's new contents
            axes = frozenset()
        known[node] = axes | ones
    return known[root]


def _reshaped_uniform_axes(old: tuple[int, ...], uniform: frozenset[int], new: tuple[int, ...]) -> frozenset[int]:
    """The uniform axes after a reshape. The two shapes are cut into pieces where their running products meet (a
    merge or a split stays inside one piece); within a piece, the new axes are uniform if all the old ones are.
    (Axes of size 1 lie in no piece here: they are uniform anyway.)"""
    if not prod(old):
        return frozenset()
    old_ends, new_ends = list(accumulate(old, operator.mul)), list(accumulate(new, operator.mul))
    result: set[int] = set()
    for low, high in pairwise([1, *sorted(set(old_ends) & set(new_ends))]):
        if all(axis in uniform for axis, end in enumerate(old_ends) if low < end <= high):
            result.update(axis for axis, end in enumerate(new_ends) if low < end <= high)
    return frozenset(result)


def _device_of(root: UOp, devices: dict[UOp, str | None]) -> str | None:
    """`root.device()`, walking down only to the roots before it (whose devices `devices` holds; None for one with
    no buffer below it), so finding every root's device is linear in the graph. Records `root`'s."""
    found = None
    if root.op is Ops.COPY:
        found = root.arg
    stack, seen = list(root.src), set()
    while stack and found is None:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        if node in devices:
            found = devices[node]
        elif node.op is Ops.COPY:
            found = node.arg
        elif node.op is Ops.BUFFER:
            found = node.arg[2]
        else:
            stack.extend(node.src)
    devices[root] = found
    return found


def _order(schedule: list[ScheduleItem]) -> list[ScheduleItem] | tuple[ScheduleItem, ...]:
    """Kernels in an order that respects data flow and assigns: a kernel that reads a buffer's old value, or the
    value an earlier assign wrote there, runs before the (later) assign that overwrites it. If kernels wait on each
    other in a cycle, those left are returned."""
    producer = {item.outputs[0]: number for number, item in enumerate(schedule)}
    assigners: dict[UOp, list[int]] = {}
    for number, item in enumerate(schedule):
        if item.outputs[0].op is Ops.ASSIGN:
            assigners.setdefault(item.outputs[0].src[0].base, []).append(number)
    after: dict[int, set[int]] = {number: set() for number in range(len(schedule))}
    for number, item in enumerate(schedule):
        for node in item.reads:
            if node in producer:
                after[number].add(producer[node])
                if node.op is Ops.ASSIGN:  # what it wrote stays in its buffer only until a later assign there
                    for assigner in assigners[node.src[0].base]:
                        if assigner != number and schedule[assigner].outputs[0].arg > node.arg:
                            after[assigner].add(number)
            elif node.op is Ops.BUFFER:
                for assigner in assigners.get(node, []):
                    if assigner != number:
                        after[assigner].add(number)
    # the lowest-numbered kernel whose inputs are ready goes next (a heap of those: linear in the schedule)
    waiting = {number: len(before) for number, before in after.items()}
    unblocks: dict[int, list[int]] = {}
    for number, before in after.items():
        for earlier in before:
            unblocks.setdefault(earlier, []).append(number)
    ready = [number for number, count in waiting.items() if count == 0]
    heapq.heapify(ready)
    ordered = []
    while ready:
        number = heapq.heappop(ready)
        ordered.append(number)
        for later in unblocks.get(number, ()):
            waiting[later] -= 1
            if waiting[later] == 0:
                heapq.heappush(ready, later)
    if len(ordered) < len(schedule):  # a cycle: the kernels left waiting
        placed = set(ordered)
        return tuple(schedule[n] for n in range(len(schedule)) if n not in placed)
    return [schedule[number] for number in ordered]


def _computed_apart(stuck: tuple[ScheduleItem, ...], roots: set[UOp], forced: frozenset[UOp]) -> set[UOp]:
    """Nodes to compute in kernels of their own, before any assign, so that kernels waiting on each other in a
    cycle can be ordered. Where a kernel reads both a buffer's old contents and what an assign wrote there (a value
    built before the assign, combined with one built after), the parts of it that read only the old contents.
    Otherwise assigns read each other's old values: the first one's value not computed apart yet (one at a time:
    an optimizer step over a network fed one example fuses each update with the others' gradients, and only
    those in a cycle need a kernel more)."""
    assigned = {item.outputs[0].src[0].base for item in stuck if item.outputs[0].op is Ops.ASSIGN}
    apart: set[UOp] = set()
    for item in stuck:
        if (root := item.outputs[0]).op is not Ops.ASSIGN:
            apart |= _old_reads_beside_new(root, roots, assigned)
    if apart:
        return apart
    values = (item.outputs[0].src[1] for item in stuck if item.outputs[0].op is Ops.ASSIGN)
    return {next((value for value in values if value not in forced), None)} - {None}


def _old_reads_beside_new(root: UOp, roots: set[UOp], assigned: set[UOp]) -> set[UOp]:
    """In `root`'s kernel, the largest parts that read an `assigned` buffer's old contents and nothing an assign
    wrote, where they meet parts that do read what an assign wrote. (Views of the buffer itself are left out: a
    kernel cannot be made of a view.)"""
    reads_new: dict[UOp, bool] = {}
    reads_old: dict[UOp, bool] = {}
    for node in root.toposort:
        inside = node is root or node not in roots  # (another root's value is read from its buffer)
        reads_new[node] = node.op is Ops.ASSIGN or any(reads_new[source] for source in node.src)
        if node.op is Ops.BUFFER:
            reads_old[node] = node in assigned
        else:
            reads_old[node] = inside and node.op is not Ops.ASSIGN and any(reads_old[s] for s in node.src)
    apart = set()
    for node in root.toposort:
        if (node is root or node not in roots) and reads_old[node] and reads_new[node]:
            for source in node.src:
                if reads_old[source] and not reads_new[source] and not is_buffer_view(source):
                    apart.add(source)
    return apart


def _build_item(root: UOp, output: UOp, buffer_views: dict[UOp, UOp], device: str) -> ScheduleItem:
    """The kernel AST for `root`: its graph down to buffers and earlier roots, those replaced by parameters."""
    if root.op is Ops.COPY:
        source = root.src[0]
        source_view = buffer_views.get(source, source)
        if not is_buffer_view(source_view):
            raise RuntimeError("COPY source must be realized first")  # the scheduler realizes it: see kernel_roots
        return ScheduleItem(None, [output, source_view.base], device, kind="copy", outputs=[root], reads=[source])
    buffers: list[UOp] = [output]
    replacements: dict[UOp, UOp] = {}

    def parameter(view: UOp) -> UOp:
        buffer = view.base
        if buffer not in buffers:
            buffers.append(buffer)
        param = UOp(Ops.DEFINE_GLOBAL, buffer.dtype, (), (buffers.index(buffer), buffer.arg[1]))
        return substitute(view, {buffer: param}) if view is not buffer else param

    # walk down from the value, stopping at buffers and at nodes other kernels compute
    value = root.src[0] if root.op is Ops.CONTIGUOUS else root.src[1] if root.op is Ops.ASSIGN else root
    stack, seen = [value], set()
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        if node is not root and node in buffer_views:
            replacements[node] = parameter(buffer_views[node])
        elif node.op is Ops.BUFFER:
            replacements[node] = parameter(node)
        else:
            stack.extend(reversed(node.src))
    kernel_value = substitute(value, replacements)
    if (view := buffer_views[root]).op is Ops.EXPAND:  # stored once along its uniform axes: the first of each
        stored = view.src[0].shape
        kernel_value = UOp(Ops.SHRINK, value.dtype, (kernel_value,), tuple((0, size) for size in stored))
    store = UOp(Ops.STORE, src=(UOp(Ops.DEFINE_GLOBAL, root.dtype, (), (0, output.arg[1])), kernel_value))
    return ScheduleItem(UOp(Ops.SINK, src=(store,)), buffers, device, outputs=[root], reads=list(replacements))
