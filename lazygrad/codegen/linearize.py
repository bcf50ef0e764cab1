"""Linearizing: the kernel graph becomes a list of UOps in execution order, with explicit loops.

Output loops open first and close last (on a device with threads, the loops left beside the block and thread
indices; on a CPU, the loops kept as loops open inside the others); a reduce that depends only on the outer ones
runs before the inner ones open. A RANGE_REDUCE becomes an accumulator (DEFINE_ACC) set before its loops, updated
inside them (LOAD/STORE on the accumulator) and read after them. Before a reduce's loops open, every part of its
body that does not depend on them is emitted, so each value is computed once, in the outermost loop where it can be,
and every use of a value comes after it in a scope that contains it. A copy of the reduce's inputs into shared
memory (a tile, up to its barrier, or a PREFETCH of the next iteration's) is emitted in the outermost of the reduce's
loops where it can be, and an iteration of a loop that waited at a barrier or copied ahead ends at another, so that
the next iteration's copy does not overwrite values still to be read, and reads only copies that have landed. A
copy of inputs onto the stack (a PACK: its stores inside loops of their own, up to its barrier) runs where the output
loops it needs are open, before the next one opens. A reduce of tensor-core products
(WMMA) is one accumulator (the warp's fragment) that each WMMA adds into.
"""

from __future__ import annotations

import itertools

from lazygrad.codegen.lower import reduce_identity
from lazygrad.codegen.opt import kernel_nodes, loops_used, output_loops, union_of
from lazygrad.uop.ops import LoopKind, Ops, UOp


def toposort_until_reduce(roots: tuple[UOp, ...] | list[UOp], skip: dict[UOp, UOp]) -> list[UOp]:
    """Nodes reachable from `roots` without entering a RANGE_REDUCE's sources, sources first, each once; a node in
    `skip` is left out with everything below it."""
    order, visited, stack = [], set(), [(root, False) for root in reversed(roots)]
    while stack:
        node, sources_done = stack.pop()
        if sources_done:
            order.append(node)
        elif node not in visited and node not in skip:
            visited.add(node)
            stack.append((node, True))
            if node.op is not Ops.RANGE_REDUCE:
                stack.extend([(source, False) for source in reversed(node.src) if source not in visited])
    return order


def reduces_below(nodes: tuple[UOp, ...]) -> dict[UOp, frozenset[UOp]]:
    """The reduces each node's value needs, directly or through other reduces and memory the threads share."""
    below: dict[UOp, frozenset[UOp]] = {}
    passed_on: dict[UOp, frozenset[UOp]] = {}  # what a node's users need through it: its own, and a reduce itself
    for node in nodes:
        needed = below[node] = union_of([passed_on[source] for source in node.src])
        passed_on[node] = needed | {node} if node.op is Ops.RANGE_REDUCE else needed
    return below


class Linearizer:
    def __init__(self, sink: UOp):
        nodes = kernel_nodes(sink)
        self.sink = sink
        self.used = loops_used(sink)  # the loops each value depends on
        self.program: list[UOp] = []
        self.linear: dict[UOp, UOp] = {}  # graph node -> its UOp in the program
        self.accumulators = 0
        self.open: set[UOp] = set()
        self.reduces = [node for node in nodes if node.op is Ops.RANGE_REDUCE]
        # what a group of threads computed together, read back from their shared memory or from each other
        self.shared_reads = [
            node
            for node in nodes
            if (node.op is Ops.LOAD and node.src[0].op is Ops.DEFINE_LOCAL) or node.op is Ops.SHUFFLE
        ]
        # copies onto the stack, each with the loops that make it
        self.packs: dict[UOp, list[UOp]] = {}
        for node in nodes:
            if node.op is Ops.BARRIER and (loops := [r for r in self.used[node] if r.arg[1] is LoopKind.PACK]):
                self.packs[node] = sorted(loops, key=lambda loop: loop.arg[0])
        # (asked only of reduces that could share a loop nest with another)
        self.reduces_below = reduces_below(nodes) if len(self.reduces) > 1 else {}

    def emit_node(self, node: UOp) -> None:
        if node in self.linear:
            return
        if node.op is Ops.RANGE_REDUCE:
            self.emit_reduce(node)
            return
        if node.op is Ops.RANGE:
            raise RuntimeError("a loop must be opened by its reduce or as a global loop")
        linear = UOp(node.op, node.dtype, tuple([self.linear[source] for source in node.src]), node.arg)
        self.linear[node] = linear
        if node.op is not Ops.CONST:
            self.program.append(linear)

    def emit(self, root: UOp) -> None:
        # what is emitted already was emitted with its sources: its part of the graph is not walked again
        for node in toposort_until_reduce((root,), self.linear):
            self.emit_node(node)

    def open_loop(self, loop: UOp) -> None:
        self.linear[loop] = loop
        self.program.append(loop)
        self.open.add(loop)

    def close_loop(self, loop: UOp) -> None:
        self.program.append(UOp(Ops.ENDRANGE, src=(loop,)))
        self.open.discard(loop)

    def emit_reduce(self, node: UOp) -> None:
        """Emit `node` and every other reduce over the same loops that can run beside it (the copies an upcast
        makes): one loop nest, one accumulator each, so their loads and updates can share registers."""
        loops = node.src[1:]
        group, members, loop_set = [node], {node}, frozenset(loops)
        for other in self.reduces:
            if other in members or other.src[1:] != loops or other in self.linear:
                continue
            if self.used[other.src[0]] - loop_set <= self.open and not self.reduces_below[other] & members:
                group.append(other)
                members.add(other)
        # hoist what does not depend on these loops (one walk for the group: the copies share most of their nodes)
        body = toposort_until_reduce([member.src[0] for member in group], self.linear)
        for inner in body:
            if inner.op is not Ops.RANGE and not (self.used[inner] & loop_set):
                self.emit_node(inner)
        accumulators = []
        for member in group:
            identity = UOp.const(member.dtype, reduce_identity(member.arg, member.dtype)).arg
            accumulators.append(UOp(Ops.DEFINE_ACC, member.dtype, (), (identity, self.accumulators)))
            self.accumulators += 1
        self.program.extend(accumulators)
        # a tile's copy into shared memory: in the outermost loop where it can be, before the inner loops open
        copies = [node for node in body if node.op is Ops.BARRIER or node.op is Ops.PREFETCH]
        opened: dict[UOp, int] = {}
        for position, loop in enumerate(loops):
            self.open_loop(loop)
            opened[loop], inside = len(self.program), frozenset(loops[position + 1 :])
            for barrier in copies:
                if barrier not in self.linear and not (self.used[barrier] & inside):
                    self.emit(barrier)
        for member in group:
            if member.src[0].op is Ops.WMMA:  # (its sources: it is emitted below, adding into the accumulator)
                for source in member.src[0].src:
                    self.emit(source)
            else:
                self.emit(member.src[0])
        for member, accumulator in zip(group, accumulators):
            current = UOp(Ops.LOAD, member.dtype, (accumulator, *loops))
            value = member.src[0]
            if value.op is Ops.WMMA:  # a warp's multiply-accumulate: d = a·b + c, c the accumulator
                sources = (*(self.linear[source] for source in value.src), current)
                updated = UOp(Ops.WMMA, value.dtype, sources, value.arg)
            else:
                updated = current.alu(member.arg, self.linear[value])
            self.program.extend([current, updated, UOp(Ops.STORE, src=(accumulator, updated))])
        for loop in reversed(loops):
            if any(node.op is Ops.BARRIER or node.op is Ops.PREFETCH for node in self.program[opened[loop] :]):
                # the threads copied into shared memory in this iteration: none copies the next iteration's values
                # over them before every thread has read them (nor reads a copy made ahead before it has landed)
                self.program.append(UOp(Ops.BARRIER))
            self.close_loop(loop)
        # what was computed from these loops' indices lives inside them: a reduce over the same loops that opens
        # them again later (one that needs an output loop not open yet) computes it again there
        inside = [
            node for node in self.linear if node.op is not Ops.RANGE and self.used.get(node, frozenset()) & loop_set
        ]
        for inner in inside:
            del self.linear[inner]
        for member, accumulator in zip(group, accumulators):
            self.linear[member] = UOp(Ops.LOAD, member.dtype, (accumulator,))
            self.program.append(self.linear[member])

    def emit_in_loops(self, stores: tuple[UOp, ...], loops: list[UOp]) -> None:
        """Stores inside loops of their own (a PACK's copy, a SCATTER's steps, a piece of PIECES): what does not depend on the loops
        first, then the loops around the stores."""
        for node in toposort_until_reduce(stores, self.linear):
            if node.op is not Ops.RANGE and not self.used[node].intersection(loops):
                self.emit_node(node)
        for loop in loops:
            self.open_loop(loop)
        for store in stores:
            self.emit(store)
        for loop in reversed(loops):
            self.close_loop(loop)

    def emit_pack(self, barrier: UOp) -> None:
        self.emit_in_loops(barrier.src, self.packs[barrier])
        self.emit_node(barrier)

    def emit_stores(self) -> None:
        """The kernel's stores, in order; each run of stores made by the same loops of a SCATTER in one nest of them
        (its zeros, then its steps: each in turn, after the one before)."""
        for loops, run in itertools.groupby(self.sink.src, key=self.scatter_loops):
            if loops:
                self.emit_in_loops(tuple(run), list(loops))
            else:
                for store in run:
                    self.emit(store)

    def scatter_loops(self, store: UOp) -> tuple[UOp, ...]:
        loops = (loop for loop in self.used[store] if loop.arg[1] is LoopKind.SCATTER)
        return tuple(sorted(loops, key=lambda loop: loop.arg[0]))

    def run(self) -> list[UOp]:
        self.program.extend(self.sink.arg)
        for node in self.program:
            self.linear[node] = node
        # the loops that stay loops on a device with threads open inside the ones it maps (a CPU's cores), so that
        # a reduce they do not depend on runs before them
        outputs = sorted(output_loops(self.sink), key=lambda loop: loop.arg[1] in (LoopKind.LOOP, LoopKind.VECTOR))
        for loop in outputs:
            for barrier, loops in self.packs.items():  # (the loops inside need the copies)
                if barrier not in self.linear and self.used[barrier] - set(loops) <= self.open:
                    self.emit_pack(barrier)
            # a reduce that needs only the loops open so far runs here, once per their index (a softmax's max and
            # sum, once per row; a full reduction's result, once), not inside the loops still to open
            for node in self.reduces:
                if node not in self.linear and self.used[node] <= self.open:
                    self.emit_node(node)
            # so does a reduce the threads of a block shared (its barriers are outside the loops they do not need)
            for node in self.shared_reads:
                if node not in self.linear and self.used[node] <= self.open:
                    self.emit(node)
            self.open_loop(loop)
        self.emit_stores()
        for loop in reversed(outputs):
            self.close_loop(loop)
        return self.program


def linearize(sink: UOp) -> list[UOp]:
    """The kernel graph as a list of UOps in execution order."""
    return Linearizer(sink).run()
