"""Fusion: which nodes of a tensor graph get a buffer of their own (`kernel_roots`); the rest are computed inside the
kernels of those.

Rules: elementwise chains fuse; movement ops never copy; a reduce fuses with its elementwise
prologue and epilogue; a reduce is realized on its own when fusing it would compute it more than once per value
(it is expanded afterwards, nested in another reduce's loop, read through two different views, or read by two
kernels). The one exception is a reduce over the last axes read back along its row (a softmax's max and sum): codegen
computes it once per row, before the row's other loops, so it fuses. Elementwise work read through an expand is
computed once per element of the expand: where that repeats more work than a kernel launch costs (a layer norm's
output read by the products after it), it gets a buffer of its own. A pad read through several views (a padded
convolution's taps, a padded max pool's, whose pad with -inf is a where over two pads), or through a large window
that repeats it (a 7x7 convolution's, a long scan's), is realized, so the taps read memory without bounds checks. So is a random value (computed from random sources alone, such as a fresh
layer's weights) that a kernel would compute more than once, or that two kernels read: it is drawn once.
Outputs, CONTIGUOUS, COPY and ASSIGN are always realized. Where a device limits how many buffers a kernel takes
(OpenCL and CUDA limit the bytes of its parameters), parts of a kernel that would read more are computed apart first.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lazygrad.engine.buffers import is_buffer_view
from lazygrad.engine.kernel_work import long_chain_cuts
from lazygrad.engine.rng import is_random_source
from lazygrad.helpers import prod
from lazygrad.uop.ops import MOVEMENT, Ops, UOp


def _expands(node: UOp) -> bool:
    return node.op is Ops.EXPAND and prod(node.arg) > prod(node.src[0].shape)


def _reduces_suffix(node: UOp) -> bool:
    """A reduce over the last axes of its source: its loops can run innermost, under the kept axes' loops."""
    shape, axes = node.src[0].shape, node.arg[1]
    return tuple(axes) == tuple(range(len(shape) - len(axes), len(shape)))


def _broadcasts_suffix(node: UOp, loops: tuple[int, ...] | None) -> bool:
    """An expand of the last axes to the shape of the loops around it (a softmax's max, read along its row)."""
    if node.op is not Ops.EXPAND or node.shape != loops:
        return False
    widened = [axis for axis, (before, after) in enumerate(zip(node.src[0].shape, node.shape)) if before != after]
    return bool(widened) and widened == list(range(widened[0], len(loops)))


# what a reduce met on the way down from a kernel's root would be: computed once per index of the loops around it
# (FREE), inside another reduce's loop (NESTED), or once per element of an expand (REPEATED)
FREE, NESTED, REPEATED = range(3)
PAD_GROWTH = 2  # a pad that grows its source this many times or more repeats the work below it (see `_kernel_facts`)


def _random_leaves(nodes: list[UOp], to_realize: set[UOp]) -> set[UOp]:
    """The nodes computed from random sources alone (and constants), movement ops aside: pure functions of buffers
    nothing writes, worth a buffer of their own once their values would be computed more than once. What reads
    only random values already to be realized is cheap, and not one of them."""
    random: set[UOp] = set()
    data: set[UOp] = set(to_realize)
    for node in nodes:
        if node in data:
            continue
        if node.op is Ops.BUFFER:
            (random if is_random_source(node) else data).add(node)
        elif node.op in (Ops.ASSIGN, Ops.COPY) or any(source in data for source in node.src):
            data.add(node)
        elif any(source in random for source in node.src):
            random.add(node)
    return {node for node in random if node.op is not Ops.BUFFER and node.op not in MOVEMENT}


@dataclass
class _KernelFacts:
    """What `_unsafe_reduces` finds walking one kernel (from its root down to what other kernels compute), kept
    while no node it touched changes (gets a buffer of its own, or stops or starts being random): then a walk again
    would find the same."""

    touched: set[UOp] = field(default_factory=set)
    unsafe: set[UOp] = field(default_factory=set)
    computed: set[UOp] = field(default_factory=set)  # elementwise nodes it computes
    reached: set[UOp] = field(default_factory=set)  # reduces and random values it reaches
    operands: set[UOp] = field(default_factory=set)  # costly values it reads through an expand
    permuted: dict[UOp, UOp | None] = field(default_factory=dict)  # permuted views it reads, and the reduce reading


def _unsafe_reduces(
    roots: list[UOp],
    to_realize: set[UOp],
    random_leaves: set[UOp],
    known: dict[UOp, _KernelFacts] | None = None,
) -> set[UOp]:
    """Reduces that must become buffers: reached from more than one kernel, inside the loop of another reduce or
    below an expand in the kernel that would fuse them, or read there through two different views (a padded copy
    beside another): each would compute the reduce several times per output. Also pads read through two different
    views (the taps of a padded convolution) or through windows: realized, the taps read memory without a bounds
    check each. And random values (the outermost node of a computation from random sources, such as a fresh
    layer's weights) in any of those places: a weight read by a convolution is drawn once, not once per output.

    One expand is fine: that of a reduce over the last axes back to the loops around it, as a softmax reads its row's
    max and sum. Codegen computes such a reduce once per row, before the row's inner loops (and the loop of any
    other reduce over the row), so a softmax is one kernel.

    Elementwise work below an expand is computed once per element of the expand: cheap work (a bias and a ReLU)
    stays fused, costly work (a layer norm's output read by the products after it, a softmax's read by attention's
    second product) becomes a buffer, computed once, and so does fairly cheap work that a product repeats a lot (an
    MLP's ReLU output and gradient mask, read once per output column of a 512-wide product). Where the reader sees it
    permuted (a convolution's windows, an im2col), the buffer holds it in the reader's order, so the products over it
    read rows. These values are decided first: a reduce below one is judged again once it is a buffer."""
    known = {} if known is None else known  # each kernel's facts, from an earlier call where still true
    reached_by: dict[UOp, set[UOp]] = {}
    computed_by: dict[UOp, set[UOp]] = {}  # elementwise nodes, and the kernels computing them
    # permuted views of unrealized values read through an expand: by which kernels, each with the reduce reading it
    permuted_by: dict[UOp, dict[UOp, UOp | None]] = {}
    unsafe: set[UOp] = set()
    operands: set[UOp] = set()  # costly values read through an expand
    costs: Costs = {}
    for root in roots:
        if root not in known:
            known[root] = _kernel_facts(root, to_realize, random_leaves, costs)
        facts = known[root]
        unsafe |= facts.unsafe
        operands |= facts.operands
        for node in facts.computed:
            computed_by.setdefault(node, set()).add(root)
        for node in facts.reached:
            reached_by.setdefault(node, set()).add(root)
        for read, inside in facts.permuted.items():
            permuted_by.setdefault(read, {})[root] = inside
    if new_operands := operands - to_realize:
        # new ones first: a reduce they read may be unsafe only where they would recompute it (a ReLU's gradient
        # mask over a product, also summed for the bias's gradient), and once they are buffers it fuses into theirs
        return new_operands
    unsafe |= operands
    unsafe.update(node for node, roots_reaching in reached_by.items() if len(roots_reaching) > 1)
    unsafe.update(_shared_costly_work(computed_by, to_realize, costs))
    # a permuted view that two kernels read through expands (a convolution's windows, read by the forward product and
    # by the weight's gradient) is written once in their order: both products then read rows. Not where a product
    # reduces short rows of it (3 channels of 3x3 taps): those it reads directly, faster than a copy
    unsafe.update(
        view
        for view, kernels in permuted_by.items()
        if len(kernels) > 1 and all(_row_reduced(reduce) >= WINDOW_ROW for reduce in kernels.values())
    )
    return unsafe


def _kernel_facts(root: UOp, to_realize: set[UOp], random_leaves: set[UOp], costs: Costs) -> _KernelFacts:
    """Walk the kernel computing `root` for what `_unsafe_reduces` judges."""
    facts = _KernelFacts(touched={root})
    # the movement ops each reduce is read through (since the last other op)
    views: dict[UOp, set[tuple[UOp, ...]]] = {}
    seen: set[tuple] = set()
    # (node, what a reduce there would be, the movement ops above it, the shape of the loops around it, whether
    # it is inside a random value computed in this kernel, the reduce it is inside)
    in_random = root in random_leaves
    if root.op is Ops.REDUCE:
        loops = root.src[0].shape if _reduces_suffix(root) else None
        stack = [(source, NESTED, (), loops, in_random, root) for source in root.src]
    else:
        stack = [(root, FREE, (), root.shape, in_random, None)]
    touched = facts.touched
    while stack:
        state = stack.pop()
        node, where, view, loops, in_random, inside = state
        touched.add(node)
        if state in seen or (node in to_realize and node is not root):
            continue
        seen.add(state)
        if (node.op is Ops.PAD or _pads_with_value(node)) and node is not root:
            views.setdefault(node, set()).add(view)
        if node is not root and node.op not in MOVEMENT and node.op not in (Ops.BUFFER, Ops.CONST, Ops.REDUCE):
            facts.computed.add(node)
        if node is not root and (node.op is Ops.REDUCE or (node in random_leaves and not in_random)):
            facts.reached.add(node)
            views.setdefault(node, set()).add(view)
            if where is not FREE:
                facts.unsafe.add(node)
        in_random = in_random or node in random_leaves
        if node.op is Ops.REDUCE:
            where, loops, inside = NESTED, node.src[0].shape if _reduces_suffix(node) else None, node
        elif _broadcasts_suffix(node, loops) and where is not REPEATED:
            where, loops = FREE, node.src[0].shape
        elif _expands(node):
            where, loops = REPEATED, None
            computed = _below_movement(node, to_realize)
            touched.add(computed)
            if computed not in to_realize and _repeats_costly_work(
                node, computed, to_realize, costs, inside is not None
            ):
                # a kernel of its own (what it reads is decided there, not here), written in the order this
                # reader walks it where a permute lies between
                facts.operands.add(node.src[0] if _permutes(node.src[0], computed) else computed)
                touched.update(costs[computed][1])  # (the walk goes no further: what the cost looked at)
                continue
            read = node.src[0]
            if read not in to_realize and computed not in to_realize and computed.op is not Ops.BUFFER:
                if _permutes(read, computed):
                    facts.permuted[read] = inside
        elif node.op is Ops.PAD and prod(node.shape) >= PAD_GROWTH * prod(node.src[0].shape):
            # a pad computes its source at every position, the padding's too, whose values it drops: a product read
            # through the pad that stacks it among others (`stack([x_t @ w for t in ...])`, the gradient of `x[:, t]`)
            # ran every step's product for every output. Below it a reduce is worth a buffer, as below an expand
            where, loops = REPEATED, None
        elif node.shape != loops:
            loops = None
        source_view = (*view, node) if node.op in MOVEMENT else ()
        stack.extend((source, where, source_view, loops, in_random, inside) for source in node.src)
    # a pad read through two views (a padded convolution's stacked taps) or through windows (a large kernel's, a
    # scan's: each element read once per tap) is realized, so that the reads need no gate
    facts.unsafe.update(
        node
        for node, ways in views.items()
        if len(ways) > 1 or ((node.op is Ops.PAD or _pads_with_value(node)) and any(map(_windows, ways)))
    )
    return facts


def _windows(view: tuple[UOp, ...]) -> bool:
    """Whether movement ops (`view`, from the reader down) reshape an expanded value: a window that repeats an axis
    and reads the copies as one longer axis, each shifted by a tap (see tensor_conv's `_window`)."""
    expanded = [at for at, op in enumerate(view) if _expands(op)]
    return bool(expanded) and any(op.op is Ops.RESHAPE for op in view[: expanded[-1]])


def _pads_with_value(node: UOp) -> bool:
    """Whether `node` is a pad with a value other than zero (a max pool's -inf): `where(pad(True), pad(x), value)`."""
    return node.op is Ops.WHERE and node.src[0].op is Ops.PAD and node.src[1].op is Ops.PAD


def _shared_costly_work(computed_by: dict[UOp, set[UOp]], to_realize: set[UOp], costs: Costs) -> set[UOp]:
    """Costly elementwise values that several kernels would each compute in full (a pooling's gradient read by a
    batch norm's backward sums and by its elementwise part), where that repeats enough work to pay for a buffer:
    the outermost of them, so that what they are made of is computed once inside them."""
    shared = {
        node
        for node, kernels in computed_by.items()
        if len(kernels) > 1
        and _cost(node, to_realize, costs) >= COSTLY
        and costs[node][0] * prod(node.shape) * (len(kernels) - 1) >= SHARED_WORK
    }
    inner: set[UOp] = set()
    for node in list(shared):
        stack, seen, largest = list(node.src), set(), 0
        while stack:
            current = stack.pop()
            if current in seen:
                continue
            seen.add(current)
            if current in to_realize or current.op in (Ops.BUFFER, Ops.REDUCE):
                largest = max(largest, prod(current.shape or (1,)))
                continue
            if current in shared:
                inner.add(current)
            stack.extend(current.src)
        if prod(node.shape) > largest:  # an expansion (a product before its sum): a buffer would be larger than
            shared.discard(node)  # anything the kernels read
    return shared - inner


# the cost of computing a value, in simple ALU operations: what a transcendental or a division costs; the cost per
# value from which elementwise work read through an expand is computed once into a buffer instead; and how many
# operations the repeats must add up to, to be worth a kernel launch and a pass over memory
# the values a product must reduce along its rows (its last axis and the others it reduces) for the windows it reads
# to be worth a buffer of their own
WINDOW_ROW = 64


def _row_reduced(reduce: UOp | None) -> float:
    """How many values `reduce` combines into each output where it reduces its last axis (a product over rows: a
    convolution's forward pass over channels and taps); infinite where it does not (a weight's gradient)."""
    if reduce is None or len(reduce.src[0].shape) - 1 not in reduce.arg[1]:
        return float("inf")
    return prod(reduce.src[0].shape[axis] for axis in reduce.arg[1])


SLOW_OPS = {Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.COS, Ops.SQRT, Ops.RECIP, Ops.FDIV, Ops.IDIV, Ops.MOD}
SLOW_OP_COST, COSTLY, REPEATED_WORK = 4, 12, 1 << 18
# an operand of a product (a value read through an expand inside a reduce) is computed once into a buffer from a
# lower cost, where it is repeated a lot: each repeat is in the product's innermost loop, beside a multiply-add (a
# ReLU's gradient mask, cost 8, fused into an MLP's weight gradient made it take twice as long). Where less is
# repeated (a transformer's 32-wide feed-forward, a batch norm's scale) the extra kernels cost as much as they save
PRODUCT_OPERAND_COSTLY, PRODUCT_REPEATED_WORK = 6, 1 << 26
# the operations that several kernels computing one value must repeat, in all, to be worth its buffer: more than an
# expand's, since a kernel's extra loop costs little where the value stays in cache, while each buffer adds a launch
SHARED_WORK = 1 << 21


def _is_one_hot(node: UOp) -> bool:
    """Whether `node` is a one-hot mask, `a == arange` as bools or as numbers: cheap to compute where it is read, and
    a sum over its arange axis of values it selects becomes a lookup at `a` in codegen (see codegen/lookup.py) only
    where it fuses."""

    def under_views(node: UOp) -> UOp:
        while node.op in MOVEMENT or node.op is Ops.CAST:
            node = node.src[0]
        return node

    node = under_views(node)
    if node.op is not Ops.XOR or node.src[0].op is not Ops.CMPNE or under_views(node.src[1]).arg is not True:
        return False
    return any(under_views(side).op is Ops.ARANGE for side in node.src[0].src)


def _repeats_costly_work(expand: UOp, computed: UOp, to_realize: set[UOp], costs: Costs, in_product: bool) -> bool:
    """Whether the elementwise value `computed`, read through `expand` (inside a reduce where `in_product`), is
    costly and repeated enough to be computed once into a buffer."""
    if _is_one_hot(computed):
        return False
    cost = _cost(computed, to_realize, costs)
    work = cost * (prod(expand.shape) - prod(expand.src[0].shape))
    if cost >= COSTLY and work >= REPEATED_WORK:
        return True
    return in_product and cost >= PRODUCT_OPERAND_COSTLY and work >= PRODUCT_REPEATED_WORK


def _permutes(view: UOp, base: UOp) -> bool:
    """Whether the movement ops from `base` up to `view` reorder its elements (and only that: no pad, shrink or
    expand changes what is read)."""
    permuted = False
    while view is not base:
        if view.op not in (Ops.PERMUTE, Ops.RESHAPE):
            return False
        permuted, view = permuted or view.op is Ops.PERMUTE, view.src[0]
    return permuted


def _below_movement(node: UOp, to_realize: set[UOp]) -> UOp:
    """The first node under `node` that is not a movement op, or that gets a buffer (a view computed apart in its
    reader's order is what its reader reads: looking below it, the same operand was found again and again)."""
    node = node.src[0]
    while node.op in MOVEMENT and node not in to_realize:
        node = node.src[0]
    return node


# a node's cost, and the nodes its count looked at (whose being realized would change it)
Costs = dict[UOp, tuple[int, frozenset[UOp]]]


def _cost(node: UOp, to_realize: set[UOp], costs: Costs) -> int:
    """What computing elementwise `node` in a kernel costs, counted up to COSTLY: its ALU operations (a slow one
    counts SLOW_OP_COST), each input read counting one, down to buffers, reduces (which are realized where an expand
    repeats them) and nodes that get their own."""
    if node.op in (Ops.BUFFER, Ops.CONST, Ops.REDUCE) or node in to_realize:
        return 0
    if node not in costs:
        total, seen, stack = 0, set(), [node]
        while stack and total < COSTLY:
            current = stack.pop()
            if current in seen:
                continue
            seen.add(current)
            if current.op in (Ops.BUFFER, Ops.REDUCE) or (current in to_realize and current is not node):
                total += 1
            elif current.op is not Ops.CONST:
                total += SLOW_OP_COST if current.op in SLOW_OPS else current.op not in MOVEMENT
                stack.extend(current.src)
        costs[node] = (total, frozenset(seen))
    return costs[node][0]


def kernel_roots(
    sink: UOp,
    outputs: list[UOp],
    forced: frozenset[UOp] = frozenset(),
    max_buffers: int | None = None,
    nodes: list[UOp] | None = None,
) -> list[UOp]:
    """Every node that gets its own buffer (`forced` ones too), sources before users; with `max_buffers`, enough
    of them that no kernel takes more buffers than that. `nodes` is `sink.toposort` where the caller has it."""
    to_realize = {node for node in outputs if not is_buffer_view(node)} | set(forced)
    if nodes is None:
        nodes = sink.toposort
    to_realize |= {node for node in nodes if node.op in (Ops.CONTIGUOUS, Ops.COPY, Ops.ASSIGN)}
    # an assign whose kernel would read its target at other indices than it writes computes its value first
    assigns = [node for node in nodes if node.op is Ops.ASSIGN]
    if assigns:
        targets = _targets_below(nodes, assigns)
        to_realize |= {node.src[1] for node in assigns if _reads_target_elsewhere(node, targets)}
    # a copy moves memory as it is, so its source must sit in a buffer
    to_realize |= {node.src[0] for node in nodes if node.op is Ops.COPY and not is_buffer_view(node.src[0])}
    # a very long chain becomes several kernels, each of a size a compiler handles in linear time. Cut once, first:
    # realizing more nodes below only makes kernels smaller, so the passes after it keep every kernel under the limit
    to_realize |= long_chain_cuts(nodes, to_realize)
    # each kernel's facts for `_unsafe_reduces`, kept from one round to the next while what they touched is unchanged
    known: dict[UOp, _KernelFacts] = {}
    realized_before: set[UOp] = set()
    random_before: set[UOp] = set()
    while True:
        roots = [node for node in nodes if node in to_realize]
        random_leaves = _random_leaves(nodes, to_realize)
        changed = (to_realize - realized_before) | (random_leaves ^ random_before)
        known = {root: facts for root, facts in known.items() if facts.touched.isdisjoint(changed)}
        realized_before, random_before = set(to_realize), random_leaves
        # (a node found unsafe that is computed apart already gains nothing from another round: without this, a
        # costly operand read through an expand of a realized view was found again and again, for ever)
        unsafe = _unsafe_reduces(roots, to_realize, random_leaves, known) - to_realize
        if not unsafe:
            more = _too_wide(roots, to_realize, max_buffers, nodes)
            if not more:
                return roots
            to_realize |= more
            continue
        # of random values nested in each other (a mask, and the mask cast to float), the inner one first: once
        # it is realized, the outer one is cheap to compute from it
        random_unsafe = unsafe & random_leaves
        to_realize |= {
            node
            for node in unsafe
            if node not in random_unsafe or not any(other in node.toposort for other in random_unsafe - {node})
        }


def _too_wide(roots: list[UOp], to_realize: set[UOp], max_buffers: int | None, nodes: list[UOp]) -> set[UOp]:
    """Nodes to compute apart so that no kernel takes more than `max_buffers` buffers (its output and what it reads;
    OpenCL and CUDA limit the bytes of a kernel's parameters). Going up from a kernel's inputs, where a node would
    read too many, its sources that read the most become kernels of their own, each then read as one buffer."""
    if max_buffers is None or sum(node.op is Ops.BUFFER or node in to_realize for node in nodes) < max_buffers:
        return set()
    apart: set[UOp] = set()
    for root in roots:
        if root.op is Ops.COPY:
            continue
        reads: dict[UOp, frozenset[UOp]] = {}
        for node in _kernel_nodes(root, to_realize):
            if node is not root and (node in to_realize or node.op is Ops.BUFFER):
                reads[node] = frozenset((node,))
                continue
            for source in sorted(node.src, key=lambda source: -len(reads[source])):
                if len(frozenset().union(*(reads[s] for s in node.src))) < max_buffers:
                    break
                if len(reads[source]) > 1:
                    apart.add(source)
                    reads[source] = frozenset((source,))
            reads[node] = frozenset().union(*(reads[source] for source in node.src))
    return apart


def _kernel_nodes(root: UOp, to_realize: set[UOp]) -> list[UOp]:
    """The nodes of the kernel computing `root`, sources first, down to (and with) the buffers and other kernels'
    roots it reads."""
    order: list[UOp] = []
    stack, seen = [(root, False)], set()
    while stack:
        node, expanded = stack.pop()
        if expanded:
            order.append(node)
        elif node not in seen:
            seen.add(node)
            stack.append((node, True))
            if node is root or node not in to_realize:
                stack.extend((source, False) for source in node.src)
    return order


def _targets_below(nodes: list[UOp], assigns: list[UOp]) -> tuple[dict[UOp, int], dict[UOp, int]]:
    """Each assign's target buffer as a bit, and for each node (sources first) the bits of the targets below it
    (or that it is)."""
    bits: dict[UOp, int] = {}
    for assign in assigns:
        bits.setdefault(assign.src[0].base, 1 << len(bits))
    below: dict[UOp, int] = {}
    for node in nodes:
        mask = bits.get(node, 0)
        for source in node.src:
            mask |= below[source]
        below[node] = mask
    return bits, below


def _reads_target_elsewhere(assign: UOp, targets: tuple[dict[UOp, int], dict[UOp, int]]) -> bool:
    """True when the value of `assign` reads the target buffer through a reduce or a movement op, so writing in
    place would overwrite elements that are still to be read. (`targets`, from `_targets_below`, tells which nodes
    have the target below them: the walk only goes there, so checking every assign of a training step is cheap.)"""
    target_view, value = assign.src
    target = target_view.base
    bits, below = targets
    bit = bits[target]
    stack, seen = [(value, False)], set()
    while stack:
        node, moved = stack.pop()
        if (node, moved) in seen or not below[node] & bit:
            continue
        seen.add((node, moved))
        if node is target_view or node is target or (node.op is Ops.ASSIGN and node.src[0].base is target):
            if moved:
                return True
            continue
        shifts = node.op is Ops.REDUCE or (node.op in MOVEMENT and node.op is not Ops.RESHAPE)
        stack.extend((source, moved or shifts) for source in node.src)
    return False
