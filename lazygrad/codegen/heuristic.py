"""The default action list for a kernel (see codegen/opt.py), chosen from the kernel's own graph and the device's
Target, in the order they apply:

- on a CPU, a sum of values selected by an output loop (a lookup's gradient) as a scatter, where its V + T steps a
  column, with only the columns side by side, take less time than the V·T of the sum (`scatter_selected_sum`);
- split loops that are indexed through a division and a modulo (two axes a reshape merged) into the two loops they
  stand for;
- merge neighbouring loops whose indices only appear together as `outer*size + inner`, so a contiguous kernel runs
  one flat loop indexed by the counter alone (and the compiler can vectorize it);
- upcast small output loops that choose between loads (a convolution's taps) whole;
- keep as a loop, opened after the reduce has run, an output loop outside the others that a long reduce does not
  depend on (a weight gradient the same for every output channel);
- register blocking for kernels shaped like a matrix product: upcast output loops along which some input is reused,
  and mark a reduce loop along which every input is contiguous (or fixed, or every other element: a stride-2
  convolution) for the compiler to vectorize, or, where that loop is short and inside other loops of the reduce,
  make its iterations lanes of partial sums (`reduce_in_lanes`);
- unroll small reduce loops into straight-line code (unless the block is large and a loop of the reduce stays; a
  window's stacked taps always);
- on a CPU, copy the weights of a product `x @ w` onto the stack where the reduce reads them rows of memory apart
  (`pack_shared_input`), and keep a reduce's costly values there where the outputs compute them again (a softmax's
  exponentials: `stash_costly_values`).

A device with threads gets its own list (`thread_opts`): the same splits and merges, then, on a device with tensor
cores, a matrix product whose inputs' type and sizes fit one on them (`tensor_core_product`); else output loops that a
reduce does not depend on kept as loops inside a thread, where the device computes in vector types the innermost
output loop cut as wide as its vectors and one loop inside the thread computed in them (`vector_loop`), and then
either a reduce shared by the threads of a block (a full reduction, or few long rows: a block per row), or on a GPU
(no vectors) a matrix product in tiles (a block of outputs per block of threads, a register tile per thread, the
inputs staged in shared memory: `tile_product`), or else the innermost output loops spread over the threads of a
block.

BEAM search times the lists `candidate_opts` offers instead of taking the default one: each register block on a
CPU (with and without the copy of the weights), each block size on a device with threads (a matrix product's tiles
follow it), each number of tensor-core tiles per block, and a GPU's list without tensor cores, and without tiles (on
OpenCL on a CPU, the list without vector types).
"""

from __future__ import annotations

import math
from dataclasses import replace

from lazygrad.codegen.opt import (
    KernelOptError,
    Opt,
    OptOp,
    apply_opt,
    apply_opts,
    borders,
    count_divmod,
    kernel_nodes,
    loop_outside,
    loops_by_axis,
    loops_of_kind,
    loops_used,
    output_loops,
    stored_sum,
    stride,
)
from lazygrad.codegen.renderer import WARP, Target
from lazygrad.codegen.tensor_cores import TILES, pipelines
from lazygrad.dtype import dtypes
from lazygrad.helpers import ALLOW_TF32, prod
from lazygrad.uop.ops import ALU, LoopKind, Ops, UOp
from lazygrad.uop.symbolic import gate_clauses, split_term, sum_terms

# a device with threads gives each row a block when a kernel reduces into at most this many outputs along rows at
# least this long (fewer, longer rows: a thread per output would leave most of the device idle)
ROW_GROUP_OUTPUTS, ROW_GROUP_LENGTH = 1 << 14, 1024
UNROLL_LIMIT = 4  # reduce loops up to this size are unrolled whole
# loops up to this size that choose between gated loads (a window's stacked taps: see tensor_conv) are unrolled or
# upcast whole, as the choice then folds away
TAP_LIMIT = 7
SELECTING_NODES = 4096  # the most nodes that upcasting output loops which choose between loads may copy a kernel to
LARGE_PRODUCT = 1 << 28  # multiply-adds in a matrix product worth the bigger register block
# independent multiply-add chains that keep an x86-64 core's FMA units busy: their latency (4 cycles) times their
# number (2)
FMA_CHAINS = 8
# a matrix product on a GPU: each thread's register tile (at most this many outputs along each of two loops) and
# the reduce iterations staged in shared memory at a time (at most)
TILE_REGISTERS, TILE_DEPTH = 4, 16
PACK_REUSE = 8  # a copy of an input onto the stack pays for itself once the loops inside read it this many times
PAD_WASTE = 8  # an output loop is padded to a multiple of a block only where that adds at most 1/8 of its iterations
# the longest innermost reduce loop (in vectors) inside other loops of its reduce that runs as lanes of partial sums
LANE_VECTORS = 4
CACHE_LINE = 64  # bytes
CACHE_SETS_APART = 1024  # rows of memory a multiple of this many bytes apart share few of a cache's sets
STASH_COST = 8  # operations per value that keeping it on the stack saves computing again (an exp2 is about 30)
TRANSCENDENTAL = frozenset({Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.COS})

# the product shapes blocked as x @ w is: outputs along a row of vectors, rows sharing each loaded vector
ROW_BLOCKED = ("contiguous outputs", "transposed copy")
# a register block: (outputs along the innermost output loop, outputs along each other reused loop); 0 across
# means the reduce loop is the one vectorized
Blocking = tuple[int, int]


class Plan:
    """A kernel and the actions applied to it so far."""

    def __init__(self, sink: UOp, target: Target | None = None):
        self.sink, self.opts, self.target = sink, [], target

    def apply(self, opt: Opt) -> None:
        self.sink = apply_opt(self.sink, opt, self.target)
        self.opts.append(opt)

    def try_apply(self, opt: Opt) -> bool:
        try:
            self.apply(opt)
        except KernelOptError:
            return False
        return True

    def adopt(self, trial: Plan) -> None:
        """Take the actions a trial of this plan (a `Plan` of its kernel) applied, where all of them fit."""
        self.sink, self.opts = trial.sink, [*self.opts, *trial.opts]


def memory_indices(sink: UOp, op: Ops) -> list[UOp]:
    return [node.src[1] for node in kernel_nodes(sink) if node.op is op and node.src[0].op is Ops.DEFINE_GLOBAL]


def contiguous_along(sink: UOp, loop: UOp) -> bool:
    """Whether every load moves by one or stays put along `loop`, and one moves."""
    along = {stride(index, loop) for index in memory_indices(sink, Ops.LOAD)}
    return 1 in along and along <= {0, 1}


def interleaved_along(sink: UOp, loop: UOp) -> bool:
    """Whether every load moves by at most two or stays put along `loop`, and one moves by two: the taps of a
    convolution with stride 2, which the compiler loads as vectors of every other element (two loads and a shuffle)."""
    along = {stride(index, loop) for index in memory_indices(sink, Ops.LOAD)}
    return 2 in along and along <= {0, 1, 2}


def reduce_nodes(sink: UOp) -> list[UOp]:
    return [node for node in kernel_nodes(sink) if node.op is Ops.RANGE_REDUCE]


def blocks(sink: UOp) -> int:
    """The blocks a kernel launches: its output loops not mapped to threads or kept in a thread."""
    return prod(loop.src[0].arg for loop in loops_of_kind(sink, LoopKind.GLOBAL))


def split_amounts(sink: UOp, loop: UOp) -> set[int]:
    """Where `loop` could split so that a division or modulo of it by a constant becomes a loop of its own: for
    `(c*loop + ...) // d` and `% d` with c dividing d, d // c iterations."""
    amounts = set()
    for node in kernel_nodes(sink):
        if node.op in (Ops.IDIV, Ops.MOD) and node.src[1].op is Ops.CONST:
            for base, coefficient in map(split_term, sum_terms(node.src[0])):
                if base is loop and coefficient > 0 and node.src[1].arg % coefficient == 0:
                    amounts.add(node.src[1].arg // coefficient)
    size = loop.src[0].arg
    return {amount for amount in amounts if 1 < amount < size and size % amount == 0}


def split_divided_loops(plan: Plan) -> None:
    """Split loops where that removes divisions and modulos from the kernel: a loop over axes a reshape merged (the
    heads of an attention, written back as one feature axis) then reads memory by plain strides along each part."""
    changed = True
    while changed:
        changed = False
        for loop in sorted(loops_by_axis(plan.sink).values(), key=lambda loop: loop.arg[0]):
            divisions = count_divmod(plan.sink)
            for amount in sorted(split_amounts(plan.sink, loop)):
                candidate = apply_opt(plan.sink, Opt(OptOp.SPLIT, loop.arg[0], amount))
                if count_divmod(candidate) < divisions:
                    plan.sink = candidate
                    plan.opts.append(Opt(OptOp.SPLIT, loop.arg[0], amount))
                    changed = True
                    break
            if changed:
                break


def merge_loops(plan: Plan) -> None:
    """Merge neighbouring output loops, then neighbouring loops of each reduce, innermost first."""
    groups = [[loop.arg[0] for loop in output_loops(plan.sink)]]
    groups += [[loop.arg[0] for loop in node.src[1:]] for node in reduce_nodes(plan.sink)]
    for group in groups:
        for position in range(len(group) - 1, 0, -1):
            plan.try_apply(Opt(OptOp.MERGE, group[position - 1]))


def upcast_selecting_loops(plan: Plan, blocks: int = 1) -> None:
    """Upcast small output loops that choose between loads, whole: in a stack of pieces (a conv's taps) each piece
    is a load gated by a comparison of the loop with constants, and with the loop a constant in each copy, every
    copy keeps one load instead of one per piece. Within SELECTING_NODES nodes of copies in all: each copy is code
    to generate and compile, and a large body copied for every position of four such loops (64 copies of a strided
    convolution's input gradient) took longer to generate than its kernel ran in a hundred steps. On a device with
    threads only while `blocks` outputs are left to spread over them (a weight gradient's few outputs and long
    reduce: its taps in registers would leave most of a GPU idle)."""
    size, copies = len(kernel_nodes(plan.sink)), 1
    outputs = prod(loop.src[0].arg for loop in output_loops(plan.sink))
    for loop in output_loops(plan.sink):
        amount = loop.src[0].arg
        if amount <= TAP_LIMIT and size * copies * amount <= SELECTING_NODES and outputs // amount >= blocks:
            gates = [n.src[2] for n in kernel_nodes(plan.sink) if n.op is Ops.LOAD and len(n.src) == 3]
            if any(loop in gate.toposort for gate in gates):
                plan.apply(Opt(OptOp.UPCAST, loop.arg[0], amount))
                copies *= amount
                outputs //= amount


def rolled_reduce_loop(sink: UOp, reduce: UOp) -> UOp | None:
    """The innermost loop of a reduce that stays a loop (the others unroll whole: see `unrolled_whole`)."""
    return next((loop for loop in reversed(reduce.src[1:]) if not unrolled_whole(sink, loop)), None)


def unrolled_whole(sink: UOp, loop: UOp) -> bool:
    """Whether a reduce loop is short enough to unroll whole: UNROLL_LIMIT, or TAP_LIMIT for a window's taps."""
    return loop.src[0].arg <= (TAP_LIMIT if loop in tap_loops(sink) else UNROLL_LIMIT)


def matrix_shape(sink: UOp, target: Target) -> str | None:
    """Which shape of matrix product a one-reduce kernel is: "contiguous reduce" (x @ wᵀ: every input contiguous
    or fixed along the innermost reduce loop that stays a loop), "contiguous outputs" (x @ w: along the innermost
    output loop), "interleaved reduce" and "interleaved outputs" (the same where some input moves by two: a
    convolution with stride 2), "strided" (none of these: a convolution over 1x1 images), or None (no register
    blocking applies). A loop shorter than a vector counts only where no loop of a vector or more does."""
    reduces = reduce_nodes(sink)
    if not reduces or any(r.src[1:] != reduces[0].src[1:] for r in reduces):
        return None
    if (loop := rolled_reduce_loop(sink, reduces[0])) is None:
        return None
    loops = output_loops(sink)
    stored_in_order = loops and all(stride(index, loops[-1]) == 1 for index in memory_indices(sink, Ops.STORE))
    # a loop shorter than a vector gives vectors only where no other loop does: a 7x7 filter's rows (its reduce)
    # yield to its outputs read every other element, and a row of 7 outputs to a reduce read so
    long_reduce, long_outputs = (
        loop.src[0].arg >= target.vector_width,
        stored_in_order and loops[-1].src[0].arg >= target.vector_width,
    )
    interleaved_outputs = long_outputs and interleaved_along(sink, loops[-1])
    if contiguous_along(sink, loop) and (long_reduce or not interleaved_outputs):
        return "contiguous reduce"
    contiguous_outputs = stored_in_order and contiguous_along(sink, loops[-1])
    if contiguous_outputs and long_outputs:
        return "contiguous outputs"
    if long_reduce and interleaved_along(sink, loop):
        return "interleaved reduce"
    if interleaved_outputs:
        return "interleaved outputs"
    return "contiguous outputs" if contiguous_outputs else "strided"


def packs_transposed(sink: UOp, target: Target) -> bool:
    """Whether a "contiguous reduce" product over one loop (x @ wᵀ, nn.Linear's) runs as "contiguous outputs" does
    (x @ w), its wᵀ copied onto the stack (PACK) a block of columns at a time, each step of the reduce a vector of
    the block's columns: where its rows reuse w at least 4·PACK_REUSE times (so that blocks of up to 8 rows still
    read each copy PACK_REUSE times) and the copy of a two-vector block fits on the stack. A vector of products
    per output, added up at the end, loads a vector of each input per multiply-add shared by 4 outputs; a copied
    block loads one vector per multiply-add shared by 8 rows (128 x 768 @ 768 x 3072: 11.2 ms -> 3.9)."""
    reduces, loops, vector = reduce_nodes(sink), output_loops(sink), target.vector_width
    if not target.pack_bytes or vector < 2 or len(loops) < 2 or len(reduces[0].src) != 2:
        return False
    inner, (loop,) = loops[-1], reduces[0].src[1:]
    loads = [node for node in kernel_nodes(sink) if node.op is Ops.LOAD and node.src[0].op is Ops.DEFINE_GLOBAL]
    copied = [load for load in loads if stride(load.src[1], inner) != 0]
    if any(load.dtype not in (dtypes.float32, dtypes.float64) for load in loads):
        return False
    copy_bytes = loop.src[0].arg * 2 * vector * sum(load.dtype.itemsize for load in copied)
    rows = [
        row
        for row in loops[:-1]
        if row.src[0].arg >= 4 * PACK_REUSE and all(stride(load.src[1], row) == 0 for load in copied)
    ]
    return bool(rows) and inner.src[0].arg >= 2 * vector and copy_bytes <= target.pack_bytes


def copy_transposed(plan: Plan, target: Target) -> bool:
    """Apply the block and copy of a "transposed copy" (`packs_transposed`) to a "contiguous reduce" product, where
    they fit it; whether they did. A block without the copy would read wᵀ one strided value at a time: where the
    block leaves its rows too few iterations to copy for (a convolution's 64 channels in blocks of 16), the product
    keeps its vector of products per output."""
    if not packs_transposed(plan.sink, target):
        return False
    trial = Plan(plan.sink, target)
    block_registers(trial, target, None, "transposed copy")
    pack_shared_input(trial, target, "transposed copy")
    if OptOp.PACK not in {opt.op for opt in trial.opts}:
        return False
    plan.adopt(trial)
    return True


def gates_no_vector_load(sink: UOp, loop: UOp, along: UOp | None) -> bool:
    """Whether padding `loop` (PAD) would gate no load that vectors read along loop `along` (a gated load is no
    vector load): the rows of a product, each row's input read one value at a time anyway, but not a convolution's
    image rows, each read as vectors along the row."""
    loads = memory_indices(sink, Ops.LOAD)
    return along is None or all(stride(index, along) == 0 for index in loads if stride(index, loop) != 0)


def upcast_reused(
    plan: Plan, loops: list[UOp], factors: tuple[int, ...], paddable: frozenset[int] = frozenset()
) -> None:
    """Upcast `loops` along which some input is reused (stride 0), innermost first, by `factors` in turn. A loop the
    next factor does not divide is padded to a multiple (PAD) where its axis is `paddable` and that adds at most
    1/PAD_WASTE of its iterations (a product of 127 rows blocks 4 rows at a time as 128), else passed over."""
    factors = list(factors)
    for loop in reversed(loops):
        if not factors or not any(stride(index, loop) == 0 for index in memory_indices(plan.sink, Ops.LOAD)):
            continue
        size, factor = loop.src[0].arg, factors[0]
        if size % factor and (loop.arg[0] not in paddable or (-size % factor) * PAD_WASTE > size):
            continue
        if size % factor:
            plan.apply(Opt(OptOp.PAD, loop.arg[0], factor))
        plan.apply(Opt(OptOp.UPCAST, loop.arg[0], factors.pop(0)))


def reused_buffers(sink: UOp, loop: UOp) -> frozenset[int]:
    """The inputs (parameter numbers) that some load reads at the same place all along `loop`."""
    return frozenset(
        node.src[0].arg[0]
        for node in kernel_nodes(sink)
        if node.op is Ops.LOAD and node.src[0].op is Ops.DEFINE_GLOBAL and stride(node.src[1], loop) == 0
    )


def fill_block(plan: Plan, axes: list[int], outputs: int, paddable: frozenset[int] = frozenset()) -> None:
    """Upcast output loops (of `axes`, outermost first) along which an input is reused until the register block
    grows `outputs` times: first the loops that reuse an input no chosen loop reuses yet, so that every input's
    loads are shared (a convolution's weights across pixels, its pixels across output channels), innermost first.
    A loop no factor up to `outputs` divides well is padded to a multiple of `outputs` where upcast_reused would."""
    covered: set[int] = set()
    for _ in axes:
        loops = loops_by_axis(plan.sink)
        options = [(axis, reused_buffers(plan.sink, loops[axis])) for axis in reversed(axes) if axis in loops]
        options = [(axis, reused) for axis, reused in options if reused and not reused <= covered] or [
            (axis, reused) for axis, reused in options if reused
        ]
        if outputs < 2 or not options:
            return
        axis, reused = options[0]
        size = loops[axis].src[0].arg
        factor = max(d for d in range(1, min(size, outputs) + 1) if size % d == 0)
        covered |= reused
        if 2 * factor <= outputs and axis in paddable and (-size % outputs) * PAD_WASTE <= size:
            plan.apply(Opt(OptOp.PAD, axis, outputs))
            factor = outputs
        if factor > 1:
            plan.apply(Opt(OptOp.UPCAST, axis, factor))
            outputs //= factor


def block_registers(plan: Plan, target: Target, blocking: Blocking | None, shape: str | None) -> None:
    """Register blocking for a kernel with one reduce, in the two shapes of a matrix product:

    - inputs contiguous along the reduce (x @ wᵀ, sums over the last axis): the reduce loop is vectorized by the
      compiler, and a block of outputs (4×4 with 32 vector registers, 2×4 with 16) shares each loaded vector;
    - inputs contiguous along the output's last axis (x @ w, sums over a leading axis): FMA_CHAINS accumulators
      (fewer leave the multiply-adds waiting on each other), as 2 vectors of outputs by 4 rows where an input is
      reused, fewer vectors by more rows where the row's length asks; a large product two vectors by registers/4
      rows; a last axis that whole vectors do not cover in its largest part of at most two vectors, by as many
      rows as the wider blocks hold;
    - an input that moves by two along the loop of either shape (a convolution with stride 2): vectors along that
      loop, by up to half the vector registers of rows that share them (`block_interleaved`);
    - x @ wᵀ with many rows ("transposed copy", see `packs_transposed`): the block of x @ w, the wᵀ that PACK
      copies read as vectors along the block's columns.

    Where an input is reused along one short output loop only (a batch of 16 rows through a wide layer), a product
    with contiguous outputs takes that loop whole instead, so the other, larger input is read once. Other products
    (strided along every loop) get a scalar block: 4 by 4 outputs sharing each load. Reduces one after another over
    different loops (a softmax's) only get their contiguous loops vectorized.
    `blocking` (from BEAM search) overrides the sizes these rules pick; `shape` is the kernel's `matrix_shape`.
    """
    reduces = reduce_nodes(plan.sink)
    if not reduces:
        return
    if any(r.src[1:] != reduces[0].src[1:] for r in reduces):
        # reduces one after another (a softmax's max, then its sum): each innermost loop along which the inputs
        # are contiguous goes to the compiler's vectorizer
        for loop in sorted({r.src[-1] for r in reduces}, key=lambda loop: loop.arg[0]):
            if contiguous_along(plan.sink, loop):
                plan.apply(Opt(OptOp.VECTORIZE, loop.arg[0]))
        return
    if shape in ("contiguous reduce", "interleaved reduce") and not blocking and reduce_in_lanes(plan, target):
        return
    loops = output_loops(plan.sink)  # (`shape` is None as well for an elementwise kernel whose reduces unroll whole)
    # the output loops a block may pad to a multiple of its size: those whose loads no vector reads (upcast_reused)
    along = {
        "contiguous reduce": rolled_reduce_loop(plan.sink, reduces[0]),
        "contiguous outputs": loops[-1] if loops else None,
        "transposed copy": None,  # (every load a vector reads is the copy's)
    }
    paddable = frozenset(
        loop.arg[0]
        for loop in loops
        if loop.arg[1] is LoopKind.GLOBAL and gates_no_vector_load(plan.sink, loop, along.get(shape or ""))
    )
    if shape == "contiguous reduce":
        # (never a short loop whole: its rows of the small operand, as long as the reduce, would be read again for
        # every output of the other loop, from L2 at best; ResNet18's 16 x 4608 @ 4608 x 512 took 0.63 ms with its
        # 16 rows whole, 0.32 in 4 by 4 blocks)
        plan.apply(Opt(OptOp.VECTORIZE, rolled_reduce_loop(plan.sink, reduces[0]).arg[0]))
        # a vector accumulator per output: half the registers of them (4 by 4 with 32 registers, 2 by 4 with 16)
        inner = max(1, min(4, target.vector_registers // 8))
        upcast_reused(plan, loops, (blocking[1],) * 2 if blocking else (inner, 4) if inner > 1 else (4,), paddable)
    elif shape == "strided":
        # no vector loads: scalar register blocking, each loaded value used by several outputs
        upcast_reused(plan, loops, (4, 4))
    elif shape in ("interleaved reduce", "interleaved outputs"):
        # vectors along the loop where an input moves by two, as many rows as share them
        along = rolled_reduce_loop(plan.sink, reduces[0]) if shape == "interleaved reduce" else loops[-1]
        interleaved = frozenset(
            node.src[0].arg[0]
            for node in kernel_nodes(plan.sink)
            if node.op is Ops.LOAD and node.src[0].op is Ops.DEFINE_GLOBAL and stride(node.src[1], along) == 2
        )
        if shape == "interleaved reduce":
            plan.apply(Opt(OptOp.VECTORIZE, along.arg[0]))
        elif (lanes := largest_divisor(along.src[0].arg, target.vector_width)) > 1:
            plan.apply(Opt(OptOp.UPCAST, along.arg[0], lanes))
        else:  # (a loop of a prime length past the vector width has no vectors: a scalar block, as when strided)
            upcast_reused(plan, loops, (4, 4))
            return
        block_interleaved(plan, interleaved, blocking[1] if blocking else target.vector_registers // 2)
    elif shape in ROW_BLOCKED:
        inner, vector = loops[-1], target.vector_width
        large = prod(loop.src[0].arg for loop in [*loops, *reduces[0].src[1:]]) >= LARGE_PRODUCT
        # enough accumulators that their multiply-adds do not wait on each other (FMA_CHAINS, within half the
        # vector registers): a large product two vectors across by registers/4 rows, others as many vectors across
        # as 4 rows leave (fewer, by more rows, where the row's length asks; at most 8 rows: more rows' values,
        # each broadcast to a vector of its own, cost more than the multiply-adds they feed). More accumulators
        # ran no faster and doubled the IR LLVM compiles.
        accumulators = min(target.vector_registers // 2, FMA_CHAINS)
        wide = [(2 * vector, target.vector_registers // 4)] if large else []
        across = [accumulators // 4 >> halving for halving in range(max(accumulators // 4, 1).bit_length())]
        choices = (
            [blocking] if blocking else wide + [(vector * count, min(accumulators // count, 8)) for count in across]
        )
        if not blocking and not any(reused_buffers(plan.sink, loop) for loop in loops[:-1]):
            # no rows that share the loads (one output loop: a vector times a matrix, a column sum; or rows that read
            # apart, a split column sum's parts), so every accumulator goes across the row (1 x 4096 @ 4096 x 4096 in
            # two vectors of outputs: 4.1 ms, in eight: 3.5; a column sum of 1M x 64 in parts, 26 ms, 7 whole)
            choices = [(vector * (accumulators >> halving), 1) for halving in range(accumulators.bit_length())]
        padded = padded_row(inner.src[0].arg, vector)
        if not blocking and inner.src[0].arg > 1 and inner.src[0].arg % vector and not padded:
            # a row that whole vectors do not cover (attention's over time, a convolution's over an image, a weight
            # gradient's 27 taps): whole where it is at most 4 vectors, else its largest part of at most two, in a
            # block of as many outputs as the wider blocks hold, and two rows at least (the compiler covers the
            # part with vectors and a remainder). A 56-wide image's 3x3 convolution in 28-wide blocks took 17.4 ms,
            # 14.4 whole; a 28-wide one with AVX2, 37.8 ms in 14-wide blocks of two rows, 25.7 whole
            size = inner.src[0].arg
            part = size if size <= 4 * vector else largest_divisor(size, 2 * vector)
            if part > 1:
                plan.apply(Opt(OptOp.UPCAST, inner.arg[0], part))
                rows = max(2, vector * target.vector_registers // 4 // part)
                fill_block(plan, [loop.arg[0] for loop in loops[:-1]], rows, paddable)
                return
        whole = None if blocking else short_reused_loop(plan.sink, loops[:-1], target)
        if whole is not None and vector > 1 and inner.src[0].arg % vector == 0:
            plan.apply(Opt(OptOp.UPCAST, inner.arg[0], vector))
            plan.apply(Opt(OptOp.UPCAST, whole.arg[0], whole.src[0].arg))
            return
        for width, rows in choices:
            short = -inner.src[0].arg % width
            if width > 1 and (not short or (padded and padded_width(inner.src[0].arg, width, vector))):
                # (a target of scalars: no vectors across)
                if short:
                    plan.apply(Opt(OptOp.PAD, inner.arg[0], width))
                plan.apply(Opt(OptOp.UPCAST, inner.arg[0], width))
                upcast_reused(plan, loops[:-1], (rows,), paddable)
                return


def padded_row(size: int, vector: int) -> bool:
    """Whether a product's row of `size` contiguous outputs (past 4 vectors) is padded to a multiple of its block's
    width (PAD): where its largest part of at most two vectors is under half a vector (a prime width: 97, 509, 997;
    998 in parts of 2), so that it would run one output at a time or nearly. The loads the padding gates are no
    vector loads, but the block's other loads and its multiply-adds are, and PACK copies the gated input once for
    all rows: a 997³ product ran at 2.7 GFLOP/s one output at a time, 120 in 32-wide blocks of 8 rows; 998³, 333 ms
    in parts of 2, 15 padded. A part of half a vector or more stays: the compiler covers it with vectors, and a 3x3
    convolution over 65-wide images ran 5x slower padded (its image rows gated) than in parts of 13. A wider block
    than a vector pads only where that adds at most 1/PAD_WASTE of the row (`padded_width`)."""
    return vector > 1 and size > 4 * vector and 2 * largest_divisor(size, 2 * vector) < vector


def padded_width(size: int, width: int, vector: int) -> bool:
    """Whether a padded row of `size` (`padded_row`) runs in blocks `width` wide."""
    return width == vector or (-size % width) * PAD_WASTE <= size


def reduce_in_lanes(plan: Plan, target: Target) -> bool:
    """Where a float sum's innermost rolled loop runs at most LANE_VECTORS vectors and inside other rolled loops of
    the sum (a convolution's weight gradient over images 16 wide): its iterations as lanes (LANES, a loop of whole
    vectors split off first), partial sums kept in vectors across the whole reduce; a compiler that vectorizes the
    loop adds up its lanes at every exit. Then as many outputs in the block as there are vector registers, sharing
    each load (ResNet's 7x7 stem's weight gradient: 3.7 ms vectorized by LLVM, 0.87 in lanes by 4 channels by 7
    taps). Whether it applied."""
    reduces = reduce_nodes(plan.sink)
    loop, width = rolled_reduce_loop(plan.sink, reduces[0]), target.vector_width
    size = loop.src[0].arg
    others = [other for other in reduces[0].src[1:] if other is not loop and not unrolled_whole(plan.sink, other)]
    if any(r.arg is not Ops.ADD or r.dtype != dtypes.float32 for r in reduces) or width < 2 or not others:
        return False
    if size % width or size > LANE_VECTORS * width:
        return False
    axis = loop.arg[0]
    if size > width:
        plan.apply(Opt(OptOp.SPLIT, axis, width))
        axis += 1
    # (the block first: on the kernel without lanes it has fewer loads to look through and copy)
    fill_block(plan, [loop.arg[0] for loop in output_loops(plan.sink)], target.vector_registers)
    plan.apply(Opt(OptOp.LANES, axis))
    return True


def block_interleaved(plan: Plan, interleaved: frozenset[int], outputs: int) -> None:
    """The rows of a block for a product whose vectors load every other element of the inputs `interleaved` (the
    windows of a convolution with stride 2): such a vector costs two loads and a shuffle, so the innermost output
    loop along which all of them are reused takes up to `outputs` rows (half the vector registers), each sharing it."""
    for loop in reversed(output_loops(plan.sink)):
        if interleaved <= reused_buffers(plan.sink, loop):
            amount = largest_divisor(loop.src[0].arg, outputs)
            if amount > 1:
                plan.apply(Opt(OptOp.UPCAST, loop.arg[0], amount))
            return


def short_reused_loop(sink: UOp, loops: list[UOp], target: Target) -> UOp | None:
    """The one output loop along which some input is reused, where it is short enough (more than 4, at most half the
    vector registers) to take whole into the register block: a product with few rows (a batch of 16 through a wide
    layer) then reads its large operand once, instead of once per 4 rows."""
    reusing = {loop: reused_buffers(sink, loop) for loop in loops}
    for buffer in set().union(*reusing.values()):
        along = [loop for loop in loops if buffer in reusing[loop]]
        if len(along) == 1 and 4 < along[0].src[0].arg <= target.vector_registers // 2:
            return along[0]
    return None


def tap_loops(sink: UOp) -> frozenset[UOp]:
    """The loops some load is gated on alone: a short window's taps, stacked (see tensor_conv), each read under a
    gate that picks its tap. Unrolled, such a loop folds those gates away; rolled, every tap's value is a sum of
    gated loads of all the taps. (Kept on the kernel node: the heuristic asks for them again and again.)"""
    if (loops := sink.__dict__.get("tap_loops")) is not None:
        return loops
    found = set()
    for node in kernel_nodes(sink):
        if node.op is Ops.LOAD and len(node.src) == 3:
            for clause in gate_clauses(node.src[2]):
                ranges = [n for n in clause.toposort if n.op is Ops.RANGE]
                if len(ranges) == 1:
                    found.add(ranges[0])
    loops = sink.__dict__["tap_loops"] = frozenset(found)  # (frozen: every caller shares it)
    return loops


def unroll_small_reduces(plan: Plan, target: Target) -> None:
    """Unroll every reduce loop short enough (`unrolled_whole`), unless a loop of the reduce stays and the register
    block fills half the vector registers already: copies of so large a body only crowd the registers (a 7x7
    convolution's 16 by 16 outputs, 3 input channels). A loop that selects a window's taps is unrolled even so: a
    3x3 convolution with stride 2 of 64 channels, 16 by 16 outputs, took 24 ms rolled, 4.3 unrolled."""
    block = prod(opt.amount for opt in plan.opts if opt.op is OptOp.UPCAST)
    full = block >= target.vector_width * target.vector_registers // 2
    taps = tap_loops(plan.sink)
    small = {
        loop
        for node in reduce_nodes(plan.sink)
        for loop in node.src[1:]
        if unrolled_whole(plan.sink, loop)
        and (loop in taps or not full or all(unrolled_whole(plan.sink, other) for other in node.src[1:]))
    }
    for loop in sorted(small, key=lambda loop: loop.arg[0]):
        plan.apply(Opt(OptOp.UNROLL, loop.arg[0], loop.src[0].arg))


def shaped(sink: UOp, target: Target | None = None, opts: list[Opt] | None = None) -> Plan:
    """The plan (for `target`) after the loop changes that come before register blocking (following the actions
    `opts` that made `sink`, if any)."""
    plan = Plan(sink, target)
    plan.opts = list(opts or [])
    split_divided_loops(plan)
    merge_loops(plan)
    upcast_selecting_loops(plan)
    return plan


def loop_around_reduces(plan: Plan) -> None:
    """Keep as a loop (inside the thread, or on a CPU inside the loops split across cores) each output loop that
    some reduce does not depend on, where the reduce is at least as long as the loop: the reduce then runs before
    the loop opens, once instead of once per iteration (a weight gradient the same for every output channel). Else
    the loop's iterations are better spread over threads, each repeating a short reduce (a gradient broadcast over a
    large output). On a CPU, only a loop outside one the reduce depends on: the reduce runs before the others open
    anyway, and they stay split across cores."""
    reduces, used = reduce_nodes(plan.sink), loops_used(plan.sink)
    loops = output_loops(plan.sink)
    for position, loop in enumerate(loops):
        independent = [reduce for reduce in reduces if loop not in used[reduce]]
        if not plan.target.max_threads:
            independent = [reduce for reduce in independent if used[reduce] & set(loops[position + 1 :])]
        repeated = sum(map(iterations, independent))
        if loop.arg[1] is LoopKind.GLOBAL and repeated and loop.src[0].arg <= repeated:
            plan.apply(Opt(OptOp.LOOP, loop.arg[0]))


def largest_divisor(size: int, limit: int, powers_of_two: bool = False) -> int:
    """The largest divisor of `size` up to `limit` (a power of two, if asked)."""
    return max(d for d in range(1, min(size, limit) + 1) if size % d == 0 and (not powers_of_two or d & (d - 1) == 0))


TC_TILES = (8, 4, 2, 1)  # the tensor-core tiles along each side of a block the heuristic tries, largest first
BUSY_BLOCKS = 128  # the blocks a GPU needs to keep all of its multiprocessors busy (an H100 has 132)


def thread_opts(
    sink: UOp,
    target: Target,
    block: int | None = None,
    tiles: bool = True,
    tensor_cores: bool | int = True,
    vectors: bool = True,
    warps: bool = True,
) -> tuple[Opt, ...]:
    """The default actions on a device with threads (aiming for blocks of `block` threads, else the target's; a
    matrix product on tensor cores unless `tensor_cores` is False (a number: with that many tensor-core tiles along
    each side of a block), else in tiles unless `tiles` is False; a loop in vector types where the device has them,
    or memory read and written in wide accesses where it makes them, unless `vectors` is False; short rows and
    columns shared by the threads of a warp unless `warps` is False)."""
    plan = Plan(sink, target)
    split_divided_loops(plan)
    merge_loops(plan)
    upcast_selecting_loops(plan, BUSY_BLOCKS)
    unroll_taps(plan)
    if (
        tensor_cores
        and target.tensor_cores
        and tensor_core_product(plan, TC_TILES if tensor_cores is True else (tensor_cores,))
    ):
        return tuple(plan.opts)
    loop_around_reduces(plan)
    outputs = loops_of_kind(plan.sink, LoopKind.GLOBAL)
    if target.vector_width > 1 and outputs:  # vector lanes along the innermost output loop, inside each thread
        inner = outputs[-1]
        lanes = vector_lanes(inner, target)
        if lanes:
            if lanes < inner.src[0].arg:
                plan.apply(Opt(OptOp.SPLIT, inner.arg[0], lanes))
            plan.apply(Opt(OptOp.LOOP, inner.arg[0] + (lanes < inner.src[0].arg)))
    if target.vector_width > 1 and vectors:
        vector_loop(plan)
    if target.vector_width == 1 and (
        share_rows(plan, block, warps, wide=vectors)
        or group_reduce(plan, block, warps, wide=vectors)
        or (warps and share_columns(plan, block))
    ):
        return tuple(plan.opts)
    if target.vector_width == 1 and tiles and tile_product(plan, block):
        return tuple(plan.opts)
    if vectors:
        wide_outputs(plan)
    # the threads of a block: the innermost output loops, as far as the block size allows
    room = block or target.block_threads
    for loop in reversed(loops_of_kind(plan.sink, LoopKind.GLOBAL)):
        amount = largest_divisor(loop.src[0].arg, room)
        if amount < 2:
            break
        plan.apply(Opt(OptOp.LOCAL, loop.arg[0], amount))
        room //= amount
        if amount < loop.src[0].arg:
            break
    return tuple(plan.opts)


def wide_lanes(plan: Plan, loop: UOp) -> int:
    """How many elements a thread reads or writes at once (`Target.wide_bytes`) along `loop`: where every access of
    device memory that moves along it moves by one element, all of one 4- or 8-byte type, and the lanes divide the
    loop; else 1."""
    wide = plan.target.wide_bytes
    sizes = set()
    for node in kernel_nodes(plan.sink) if wide else ():
        if node.op not in (Ops.LOAD, Ops.STORE) or node.src[0].op is not Ops.DEFINE_GLOBAL:
            continue
        step = stride(node.src[1], loop)
        if step != 0:
            if step != 1:
                return 1
            sizes.add((node.dtype if node.op is Ops.LOAD else node.src[2].dtype).itemsize)
    if len(sizes) != 1 or (size := sizes.pop()) not in (4, 8) or loop.src[0].arg % (wide // size):
        return 1
    return wide // size


def wide_outputs(plan: Plan) -> None:
    """A kernel without a reduce whose memory accesses move by one element along its innermost output loop (an
    elementwise op's): each thread computes neighbouring outputs (UPCAST), read and written in wide accesses
    (float4), where that leaves threads enough for BUSY_BLOCKS blocks. A thread's vector load moves four times the
    bytes of a scalar one: a streaming kernel then needs fewer threads in flight to keep the memory busy."""
    outputs = loops_of_kind(plan.sink, LoopKind.GLOBAL)
    if not outputs or reduce_nodes(plan.sink):
        return
    lanes = wide_lanes(plan, outputs[-1])
    if lanes > 1 and blocks(plan.sink) >= lanes * BUSY_BLOCKS * plan.target.block_threads:
        plan.apply(Opt(OptOp.UPCAST, outputs[-1].arg[0], lanes))


def vector_lanes(loop: UOp, target: Target) -> int:
    """The widest vector of lanes (a power of two up to the target's vector width) that divides `loop`, or 0 where
    that is narrower than 4: narrower vectors do not pay for their gathers."""
    lanes = largest_divisor(loop.src[0].arg, target.vector_width, powers_of_two=True)
    return lanes if lanes >= 4 else 0


def vector_loop(plan: Plan) -> None:
    """On a device with threads that computes in vector types (OpenCL on a CPU), one loop inside each thread is
    computed in vector lanes (VECTORIZE): the innermost output loop kept in the thread, where every store moves by one
    along it; in a kernel without one, the outermost loop of its first reduce, where every load that moves along it
    moves by one (its vector accumulators are combined after it)."""
    kept = loops_of_kind(plan.sink, LoopKind.LOOP)
    if kept:
        loop, accesses = kept[-1], memory_indices(plan.sink, Ops.STORE)
    else:
        reduces = reduce_nodes(plan.sink)
        if not reduces or len(reduces[0].src) < 2:
            return
        loop, used = reduces[0].src[1], loops_used(plan.sink)
        accesses = [index for index in memory_indices(plan.sink, Ops.LOAD) if loop in used[index]]
    if vector_lanes(loop, plan.target) and all(stride(index, loop) == 1 for index in accesses):
        plan.apply(Opt(OptOp.VECTORIZE, loop.arg[0]))


def unroll_taps(plan: Plan) -> None:
    """Unroll a window's tap loops that a reduce runs (see `tap_loops`) whole, in each thread: the gate that picks
    a tap's slice then folds away, where a rolled loop reads every tap's slice for each tap."""
    for loop in sorted(tap_loops(plan.sink), key=lambda loop: -loop.arg[0]):  # (the last first: axes stay numbered)
        if loop.arg[1] is LoopKind.REDUCE and unrolled_whole(plan.sink, loop):
            plan.try_apply(Opt(OptOp.UNROLL, loop.arg[0], loop.src[0].arg))


def tensor_core_product(plan: Plan, tiles_tried: tuple[int, ...] = TC_TILES) -> bool:
    """A matrix product on the target's tensor cores (TC), where its sizes divide the tensor core's tiles and its
    inputs' type has one (half and bfloat16; float32 only where TF32 is allowed); True if it did. A block takes
    the most tensor-core tiles of `tiles_tried` that still leave BUSY_BLOCKS blocks (or the last): larger blocks read
    each input fewer times, but a GPU needs blocks enough for all of its multiprocessors."""
    reduces = reduce_nodes(plan.sink)
    if len(reduces) != 1 or len(reduces[0].src) != 2:
        return False
    axis = reduces[0].src[1].arg[0]
    for tiles in tiles_tried:
        opt = Opt(OptOp.TC, axis, tiles if tiles > 1 else 0)
        try:
            sink = apply_opt(plan.sink, opt, plan.target)
        except KernelOptError:
            continue
        if tiles == tiles_tried[-1] or blocks(sink) >= BUSY_BLOCKS:
            plan.apply(opt)  # (a lookup: applying an action to the same kernel again is cached)
            return True
    return False


def tile_product(plan: Plan, block: int | None) -> bool:
    """Tiles for a matrix product on a GPU: a block of threads computes a block of outputs along the two innermost
    output loops, each thread a register tile of up to TILE_REGISTERS × TILE_REGISTERS outputs spaced a block's
    threads apart (neighbouring threads read neighbouring memory), and the reduce's inputs are staged in shared
    memory TILE_DEPTH iterations at a time. Only where each of the two loops reuses an input (a matrix product, not
    an elementwise kernel), the reduce has one loop and the block's threads divide the outputs; True if it did."""
    reduces, outputs = reduce_nodes(plan.sink), loops_of_kind(plan.sink, LoopKind.GLOBAL)
    if not reduces or len(outputs) < 2 or loops_of_kind(plan.sink, LoopKind.LOOP):
        return False
    if len(reduces[0].src) != 2 or any(r.src[1:] != reduces[0].src[1:] for r in reduces):
        return False
    rows, columns = outputs[-2:]
    if not (reused_buffers(plan.sink, rows) and reused_buffers(plan.sink, columns)):
        return False
    length = reduces[0].src[1].src[0].arg
    depth = max((d for d in range(1, TILE_DEPTH + 1) if length % d == 0 and d < length), default=1)
    threads = block or plan.target.block_threads
    across = 1 << (threads.bit_length() // 2)  # (threads along the columns, then along the rows)
    down = threads // across
    sizes = (rows.src[0].arg, columns.src[0].arg)
    if depth < 4 or sizes[0] % down or sizes[1] % across:
        return False
    # each thread's register tile: up to TILE_REGISTERS along each loop, smaller (the larger side first) where that
    # leaves too few blocks to keep the multiprocessors busy (a deep convolution's weight gradient: 16 blocks of 64
    # × 64 outputs on an H100's 132 multiprocessors)
    fits = [[r for r in range(TILE_REGISTERS, 0, -1) if size % (r * t) == 0] for size, t in zip(sizes, (down, across))]
    registers = [choices[0] for choices in fits]
    while blocks(plan.sink) // (threads * registers[0] * registers[1]) < BUSY_BLOCKS and max(registers) > 1:
        side = 0 if registers[0] >= registers[1] else 1
        registers[side] = next(r for r in fits[side] if r < registers[side])
    # the threads first (a loop split into threads moves the loops numbered after it up by one), then the
    # register tile along what is left of each loop: a thread's outputs are a block's threads apart
    rows_axis, columns_axis = rows.arg[0], columns.arg[0] + (down < sizes[0])
    opts = [Opt(OptOp.LOCAL, rows.arg[0], down), Opt(OptOp.LOCAL, columns_axis, across)]
    opts += [Opt(OptOp.UPCAST, axis, r) for axis, r in zip((rows_axis, columns_axis), registers) if r > 1]
    trial = Plan(plan.sink, plan.target)
    try:
        for opt in opts:
            trial.apply(opt)
        trial.apply(Opt(OptOp.TILE, reduce_nodes(trial.sink)[0].src[1].arg[0], depth))
    except KernelOptError:  # (more threads or shared memory than the device has, or copies than a tile allows)
        return False
    plan.adopt(trial)
    return True


def thread_count(size: int, room: int) -> int:
    """Threads to share `size` iterations: a power of two where that is not far fewer than the most that divide it
    (their partial results then combine by a tree)."""
    power, any_size = largest_divisor(size, room, True), largest_divisor(size, room)
    return power if 2 * power > any_size else any_size


def iterations(reduce: UOp) -> int:
    """The iterations of a reduce: the product of its loops' sizes."""
    return prod(loop.src[0].arg for loop in reduce.src[1:])


def reduce_loops(sink: UOp) -> list[UOp]:
    """The longest loop of each reduce, in loop order."""
    loops = {max(node.src[1:], key=lambda loop: loop.src[0].arg) for node in reduce_nodes(sink)}
    return sorted(loops, key=lambda loop: loop.arg[0])


def longest_reduce_loop(sink: UOp) -> UOp:
    """The longest of the reduces' longest loops (the first of loops as long)."""
    return max(reduce_loops(sink), key=lambda loop: loop.src[0].arg)


def row_threads(plan: Plan, lengths: list[int], loops: list[UOp], block: int | None, warps: bool = True) -> int:
    """The most threads to share each row of a kernel that reduces at most ROW_GROUP_OUTPUTS rows (the reduce
    `loops`, and the row's `lengths`): a block's for rows of at least ROW_GROUP_LENGTH, a warp's for rows of at least
    a warp read in order along the reduce (a layer norm's 128 features: a thread per row would read them one after
    another, the neighbouring threads of its warp a row apart, on few blocks) unless `warps` is False; 0 for a thread
    per row."""
    if blocks(plan.sink) > ROW_GROUP_OUTPUTS:
        return 0
    if min(lengths) >= ROW_GROUP_LENGTH:
        return block or plan.target.block_threads
    if warps and min(lengths) >= WARP and all(rows_read_in_order(plan.sink, loop) for loop in loops):
        return min(WARP, block or plan.target.block_threads)
    return 0


def rows_read_in_order(sink: UOp, loop: UOp) -> bool:
    """Whether the loads move by one (or stay put) along reduce loop `loop`, in a kernel that reduces rows, each for
    its outputs (a layer norm's, reading its weights in every row), or a matrix product of too few outputs to fill
    the GPU with tiles and a reduce long enough to pay for a warp's combine, 4 iterations a thread or more (a
    classifier's 16 x 10 from 512 features: see `shares_inputs`)."""
    few = blocks(sink) <= BUSY_BLOCKS * WARP and loop.src[0].arg >= 4 * WARP
    return contiguous_along(sink, loop) and (few or not shares_inputs(sink, loop))


def shares_inputs(sink: UOp, loop: UOp) -> bool:
    """Whether the kernel is a matrix product along reduce loop `loop`: two loads that move along it stay put along
    different output loops (x @ w: a row of x serves every column of the outputs, a column of w every row), which
    tiles suit. A layer norm's weights, read alike by every row, are no such input: they stay put along every output
    loop its rows move along."""
    outputs = loops_of_kind(sink, LoopKind.GLOBAL)
    stays = {
        frozenset(output for output in outputs if stride(index, output) == 0)
        for index in memory_indices(sink, Ops.LOAD)
        if stride(index, loop) != 0
    }
    return any(not (one <= other or other <= one) for one in stays for other in stays)


def share_rows(plan: Plan, block: int | None, warps: bool = True, wide: bool = True) -> bool:
    """A block per row for a kernel that reduces few long rows and writes them back (a softmax, a layer norm; a warp
    for shorter rows, see `row_threads`): the threads of the block share the row's outputs, and each reduce over the
    row shares them too; True if it did. Unless `wide` is False, where the row's accesses all move by one element
    and every thread has whole vectors of each loop, a thread's outputs and reads are neighbours (`wide_lanes`:
    float4 accesses)."""
    rows, loops = loops_of_kind(plan.sink, LoopKind.LOOP), reduce_loops(plan.sink)
    if not rows or not loops:
        return False
    room = row_threads(plan, [loop.src[0].arg for loop in [rows[-1], *loops]], loops, block, warps)
    amount = thread_count(math.gcd(rows[-1].src[0].arg, *(loop.src[0].arg for loop in loops)), room) if room else 1
    if amount < 2:
        return False
    lanes = wide_lanes(plan, rows[-1]) if wide else 1
    if lanes > 1 and all(
        wide_lanes(plan, loop) == lanes and loop.src[0].arg // lanes % amount == 0 for loop in [rows[-1], *loops]
    ):
        trial = Plan(plan.sink, plan.target)
        if trial.try_apply(Opt(OptOp.UPCAST, rows[-1].arg[0], lanes)) and _share_row(trial, rows[-1], amount, lanes):
            plan.adopt(trial)
            return True
    _share_row(plan, rows[-1], amount)
    return True


def _share_row(plan: Plan, row: UOp, amount: int, lanes: int = 1) -> bool:
    """The row's outputs (`row`) and each reduce loop the threads of a block share, `amount` of them, the reduces
    `lanes` iterations at a time inside each thread (unrolled first: a GROUP comes after every other action);
    whether every action applied."""
    done = plan.try_apply(Opt(OptOp.LOCAL, row.arg[0], amount))
    steps = [(OptOp.UNROLL, lanes)] if lanes > 1 else []
    for op, by in [*steps, (OptOp.GROUP, amount)]:
        for number in range(len(reduce_loops(plan.sink))):
            loop = reduce_loops(plan.sink)[number]  # (found again: a split renumbers them)
            done = plan.try_apply(Opt(op, loop.arg[0], by)) and done
    return done


def summed_columns(plan: Plan, block: int | None) -> UOp | None:
    """The innermost output loop of a kernel whose few outputs each reduce 64 values or more, no matrix product (see
    `share_columns`), where blocks of `block` threads have room for two warps and neighbouring outputs for a warp's
    threads; None for any other."""
    outputs, reduces = loops_of_kind(plan.sink, LoopKind.GLOBAL), reduce_nodes(plan.sink)
    if not outputs or not reduces or (block or plan.target.block_threads) < 2 * WARP:
        return None
    if blocks(plan.sink) > ROW_GROUP_OUTPUTS or max(map(iterations, reduces)) < 2 * WARP:
        return None
    longest = longest_reduce_loop(plan.sink)
    # (37 outputs, a prime number of them more than a warp, have no neighbours to give a warp)
    if shares_inputs(plan.sink, longest) or largest_divisor(outputs[-1].src[0].arg, WARP) < 2:
        return None
    return outputs[-1]


def share_columns(plan: Plan, block: int | None) -> bool:
    """A thread per output for few outputs that each reduce a column (a bias gradient: 128 features summed over a
    batch of 384 rows; batch-norm statistics of 2x2 images) would leave the GPU idle while each thread reads its
    column down, and a block per output would read a column with threads a row apart: a warp's threads take
    neighbouring outputs (reading neighbouring values of a row, as a thread per output would; fewer where the outputs
    are fewer, a classifier's 10) and the block's other threads share the columns; True if it did."""
    inner = summed_columns(plan, block)
    if inner is None:
        return False
    across = largest_divisor(inner.src[0].arg, WARP)  # (a warp's outputs, or all there are: a 10-class bias's)
    trial = Plan(plan.sink, plan.target)
    trial.apply(Opt(OptOp.LOCAL, inner.arg[0], across))
    loop = longest_reduce_loop(trial.sink)  # (found again: a split renumbers)
    amount = thread_count(loop.src[0].arg, (block or plan.target.block_threads) // across)
    if amount < 2 or not trial.try_apply(Opt(OptOp.GROUP, loop.arg[0], amount)):
        return False
    plan.adopt(trial)
    return True


def group_reduce(plan: Plan, block: int | None, warps: bool = True, wide: bool = True) -> bool:
    """Share the longest reduce loop among the threads of a block, where the kernel reduces into one value (a full
    sum) or into few outputs over many iterations (a block per output: a row's sum, a convolution's weight
    gradient, whose output loops not in the reduce stay loops in the thread); True if it did. Of loops as long, one
    along which the loads move by one: neighbouring threads then read neighbouring memory (a weight gradient's image
    columns, not its batch, whose threads read an image apart). A short loop shares the loop outside it too; columns
    read along their outputs are left to `share_columns`. Unless `wide` is False, a loop whose accesses move by one
    element gives each thread whole vectors of it (`wide_lanes`: float4 loads), where every thread of the block
    still has one."""
    reduces = reduce_nodes(plan.sink)
    if not reduces:
        return False
    loop = longest_reduce_loop(plan.sink)
    as_long = (other for reduce in reduces for other in reduce.src[1:] if other.src[0].arg == loop.src[0].arg)
    loop = next((other for other in as_long if contiguous_along(plan.sink, other)), loop)
    size, room = loop.src[0].arg, block or plan.target.block_threads
    if loops_of_kind(plan.sink, LoopKind.GLOBAL):  # (rows, each a block's or a warp's, or a thread's)
        columns = summed_columns(plan, block) if warps and not contiguous_along(plan.sink, loop) else None
        if columns is not None and contiguous_along(plan.sink, columns):
            return False  # (columns, read along the outputs: `share_columns` gives a warp neighbouring outputs)
        room = row_threads(plan, [max(map(iterations, reduces))], [loop], block, warps)
        if not room:
            return False
    lanes = wide_lanes(plan, loop) if wide else 1
    if lanes > 1 and size // lanes % room == 0:
        trial = Plan(plan.sink, plan.target)
        unrolled = trial.try_apply(Opt(OptOp.UNROLL, loop.arg[0], lanes))  # (inside: the loop outside keeps its axis)
        if unrolled and trial.try_apply(Opt(OptOp.GROUP, loop.arg[0], room)):
            plan.adopt(trial)
            return True
    amount = thread_count(size, room)
    # a length few threads divide (a prime one) is padded to a multiple of the block, where that adds at most
    # 1/PAD_WASTE of its iterations: a max of 1000003 values ran on one thread
    if 2 * amount <= room and (-size % room) * PAD_WASTE <= size and plan.try_apply(Opt(OptOp.PAD, loop.arg[0], room)):
        amount = room
    elif amount == size and (outer := loop_outside(plan.sink, loop)) is not None:
        # a short loop: more threads share the loop outside it, up to a warp (fewer leave some of its lanes idle),
        # and on few blocks up to the block (a weight gradient's 32 image columns on 9 blocks), rather than each of
        # few threads looping over the others
        fill = room if blocks(plan.sink) < BUSY_BLOCKS else min(room, WARP)
        if fill >= 2 * size:
            amount *= largest_divisor(outer.src[0].arg, fill // size, powers_of_two=not size & (size - 1))
    return amount >= 2 and plan.try_apply(Opt(OptOp.GROUP, loop.arg[0], amount))


def pack_shared_input(plan: Plan, target: Target, shape: str | None) -> None:
    """Copy the input that the rows of a matrix product share (the weights of x @ w) onto the stack, where the
    reduce reads it with a stride (rows of memory apart, which fall into few cache sets: a power-of-two width keeps
    only 8 of them in L1) and at least PACK_REUSE iterations of a loop read the copy again. `shape` is the kernel's
    `matrix_shape` before its register block."""
    if not target.pack_bytes or shape not in ROW_BLOCKED:
        return
    along, loads = rolled_reduce_loop(plan.sink, reduce_nodes(plan.sink)[0]), memory_indices(plan.sink, Ops.LOAD)
    for loop in reversed(output_loops(plan.sink)[:-1]):
        reused = [index for index in loads if stride(index, loop) == 0]
        # (in a copy the reused loads sit side by side: one step of the reduce moves past all of them)
        apart = [index for index in reused if (stride(index, along) or 0) > len(reused)]
        if loop.src[0].arg >= PACK_REUSE and (apart or (reused and shape == "transposed copy")):
            if not plan.try_apply(Opt(OptOp.PACK, loop.arg[0])):
                # (a copy too large for the stack) the loop still goes innermost: each of its iterations reads the
                # input again while it is in the cache, rather than from memory
                plan.try_apply(Opt(OptOp.INNER, loop.arg[0]))
            return


def stash_costly_values(plan: Plan, target: Target) -> None:
    """Keep on the stack the values of a reduce that the outputs compute again, where each costs at least
    STASH_COST operations, an exp2, log2, sin or cos counting as a polynomial's (a softmax's exponentials: its
    outputs then only scale them)."""
    if not target.pack_bytes:
        return
    used, tried = loops_used(plan.sink), set()
    for reduce in reduce_nodes(plan.sink):
        loop, *others = reduce.src[1:]
        # (a register block's reduces share their loop: one try each loop, a failed try costs a rewrite)
        if not others and loop not in tried and _work_along(reduce.src[0], loop, used) >= STASH_COST:
            tried.add(loop)
            if plan.try_apply(Opt(OptOp.STASH, loop.arg[0])):
                return


def _work_along(value: UOp, loop: UOp, used: dict[UOp, set[UOp]]) -> int:
    """The operations of `value` done once per iteration of `loop`, a transcendental counting STASH_COST. The walk
    stops at nodes outside the loop: none of their sources is in it either."""
    work, seen, stack = 0, set(), [value]
    while stack:
        node = stack.pop()
        if node in seen or loop not in used[node]:
            continue
        seen.add(node)
        if node.op in ALU:
            work += STASH_COST if node.op in TRANSCENDENTAL else 1
        stack.extend(node.src)
    return work


def block_transposed_reads(plan: Plan) -> None:
    """For a kernel without a reduce that writes along its innermost output loop but reads some input rows of memory
    apart along it (a transpose, a permute that moves the last axis), where the rows fall into few cache sets (they
    are a multiple of CACHE_SETS_APART bytes apart, as a power-of-two width's are): upcast an outer output loop along
    which that input is contiguous by a cache line's elements. Each line read then serves a line's outputs at once,
    instead of one output each and leaving the cache before the next row's outputs come back for the rest (a 2048²
    transpose: 14.2 -> 3.0 ms). Rows that spread over the cache sets stay in the cache between those visits and run
    faster without the copies (a 1000² transpose: 0.27 ms, 0.35 upcast)."""
    loops = output_loops(plan.sink)
    if reduce_nodes(plan.sink) or len(loops) < 2:
        return
    inner = loops[-1]
    if any(stride(index, inner) != 1 for index in memory_indices(plan.sink, Ops.STORE)):
        return
    for load in kernel_nodes(plan.sink):
        if load.op is not Ops.LOAD or load.src[0].op is not Ops.DEFINE_GLOBAL:
            continue
        apart = abs(stride(load.src[1], inner) or 0) * load.dtype.itemsize
        if apart < CACHE_LINE or apart % CACHE_SETS_APART:
            continue
        line = CACHE_LINE // load.dtype.itemsize
        for loop in reversed(loops[:-1]):
            if stride(load.src[1], loop) == 1 and (amount := largest_divisor(loop.src[0].arg, line, True)) >= 4:
                plan.apply(Opt(OptOp.UPCAST, loop.arg[0], amount))
                return


def scatter_selected_sum(plan: Plan, target: Target) -> None:
    """SCATTER the kernel's sum where the scatter's V + T steps a column, with only its columns shared by the cores'
    vector lanes, take less time than the sum's V·T a column (a compare and a select each), whose rows are shared
    too. Measured here, the scatter won from a table of 10 rows on (10 rows, 1,000 steps, 16 columns: 3 µs against
    7; 5,000 rows, 64 steps: 4 µs against 202). (On a GPU, where a column is a thread, the scatter needs atomic adds
    to be worth it: not yet.)"""
    if len(plan.sink.src) != 1 or (store := plan.sink.src[0]).op is not Ops.STORE:
        return
    if (summed := stored_sum(store.src[2])) is None:
        return
    reduce = summed[0]
    lanes, length = target.cores * target.vector_width, prod(loop.src[0].arg for loop in reduce.src[1:])
    outputs = prod(loop.src[0].arg for loop in output_loops(plan.sink))
    for loop in output_loops(plan.sink):
        rows = loop.src[0].arg
        columns = outputs // rows
        if (rows + length) / min(lanes, columns) < rows * length / min(lanes, outputs):
            if plan.try_apply(Opt(OptOp.SCATTER, loop.arg[0])):
                break
    else:
        return
    # each step a vector of neighbouring columns: the zeros fill whole cache lines, and the adds are vector ops
    zeros_at = memory_indices(plan.sink, Ops.STORE)[0]
    for loop in reversed(output_loops(plan.sink)):
        if stride(zeros_at, loop) == 1:
            plan.try_apply(Opt(OptOp.UPCAST, loop.arg[0], largest_divisor(loop.src[0].arg, target.vector_width)))
            return


def run_pieces_apart(plan: Plan) -> None:
    """PIECES the output loop a kernel's conditions cut into pieces (a cat's, a reflect pad's), so that each output
    reads its own piece, not every piece under a condition: the innermost output loop, or one whose pieces are an
    iteration each (a stack's: no loop), since the pieces' loops open inside the other output loops. Only where it
    at least halves the loads the loop makes: pieces that each still read most of the inputs (the overlapping
    windows of a max pool's gradient) ran slower apart (3.5 against 1.9 ms), a cat's pieces faster (a stack of 256
    vectors of 4,096 floats 43 -> 16 ms, a reflect pad of 3 around 8 x 64 x 56 x 56 10 -> 2.8 ms)."""
    loops = output_loops(plan.sink)
    for loop in loops:
        cuts = borders(plan.sink, loop)
        if not cuts or not (loop is loops[-1] or len(cuts) + 1 == loop.src[0].arg):
            continue
        try:
            apart = apply_opt(plan.sink, Opt(OptOp.PIECES, loop.arg[0]), plan.target)
        except KernelOptError:
            continue
        if 2 * loads_made(apart) <= loads_made(plan.sink) * loop.src[0].arg:
            plan.apply(Opt(OptOp.PIECES, loop.arg[0]))
            return


def loads_made(sink: UOp) -> int:
    """The loads from memory the kernel's stores make per iteration of its output loops, times the iterations of
    the loops opened around the stores alone (a piece's)."""
    made = 0
    for store in sink.src:
        nodes = store.toposort
        loads = sum(node.op is Ops.LOAD and node.src[0].op is Ops.DEFINE_GLOBAL for node in nodes)
        own = [node for node in nodes if node.op is Ops.RANGE and node.arg[1] is LoopKind.SCATTER]
        made += loads * prod(loop.src[0].arg for loop in own)
    return made


def heuristic_opts(sink: UOp, target: Target, blocking: Blocking | None = None, pack: bool = True) -> tuple[Opt, ...]:
    """The default actions for the prepared kernel `sink` on `target` (with the register block `blocking` where
    one applies and is given; copying a shared input onto the stack unless `pack` is False)."""
    if target.max_threads:
        return thread_opts(sink, target)
    plan = Plan(sink, target)
    run_pieces_apart(plan)
    scatter_selected_sum(plan, target)
    plan = shaped(plan.sink, target, plan.opts)
    loop_around_reduces(plan)
    shape = matrix_shape(plan.sink, target)
    if not (shape == "contiguous reduce" and pack and not blocking and copy_transposed(plan, target)):
        block_registers(plan, target, blocking, shape)
        block_transposed_reads(plan)
        unroll_small_reduces(plan, target)
        if pack:
            pack_shared_input(plan, target, shape)
    stash_costly_values(plan, target)
    return tuple(plan.opts)


def register_blocks(sink: UOp, target: Target) -> list[Blocking]:
    """The register blocks `heuristic_opts` can give this prepared kernel, for BEAM search to time (none on a
    device with threads)."""
    if target.max_threads:
        return []
    plan = shaped(sink)
    shape = matrix_shape(plan.sink, target)
    if shape == "contiguous reduce":
        return [(0, rows) for rows in (2, 4, 8)]
    if shape == "contiguous outputs":
        inner, vector = output_loops(plan.sink)[-1].src[0].arg, target.vector_width
        padded = padded_row(inner, vector)
        widths = [
            width
            for width in (vector, 2 * vector, 4 * vector)
            if not inner % width or (padded and padded_width(inner, width, vector))
        ]
        return [(width, rows) for width in widths for rows in (2, 4, 8)]
    return []


def candidate_opts(sink: UOp, target: Target) -> list[tuple[Opt, ...]]:
    """The action lists BEAM times for this prepared kernel: the default and one per register block on a CPU (where
    it offers blocks); on a device with threads, the default, a product on tensor cores with each other way of
    copying its inputs, one per block size (32 threads up to the device's most: a matrix product's tiles follow it),
    one per number of tensor-core tiles per block, one without tiles, one without vector types, and one with a
    thread per short row or column; duplicates removed, the default list first."""
    if target.max_threads:
        sizes = [1 << bits for bits in range(5, target.max_threads.bit_length())]
        default = thread_opts(sink, target)
        offered = [default, *copy_variants(sink, default, target)]
        offered += [thread_opts(sink, target, size) for size in sizes]
        # (a matrix product with each number of tensor-core tiles per block, without tensor cores, and without tiles)
        offered += [thread_opts(sink, target, tensor_cores=tiles) for tiles in TILES if target.tensor_cores]
        offered.append(thread_opts(sink, target, tensor_cores=False))
        offered.append(thread_opts(sink, target, tiles=False, tensor_cores=False))
        offered.append(thread_opts(sink, target, warps=False))  # (a thread per short row or column)
        # (without vector types or wide accesses: a gather in vectors can cost more than scalar loads, and four
        # outputs a thread leave a quarter of the threads)
        if target.vector_width > 1 or target.wide_bytes:
            offered.append(thread_opts(sink, target, vectors=False))
    else:
        blocks = register_blocks(sink, target)
        # (the default list too where the blocks offered do not make it: a reduce run in lanes)
        offered = [heuristic_opts(sink, target)] if blocks else []
        offered += [heuristic_opts(sink, target, blocking, pack) for pack in (True, False) for blocking in blocks]
    return list(dict.fromkeys(offered))


def copy_variants(sink: UOp, opts: tuple[Opt, ...], target: Target) -> list[tuple[Opt, ...]]:
    """`opts`, where they end in a TC that leaves its copies to the action, once with each other way the block may
    copy its inputs (`tensor_cores.pipelines`, the action's own choice left out: it is `opts`)."""
    if not opts or opts[-1].op is not OptOp.TC or opts[-1].more:
        return []
    product = opts[-1]
    before = apply_opts(sink, opts[:-1], target)
    ways = pipelines(before, loops_by_axis(before)[product.axis], target, bool(ALLOW_TF32), product.amount or 1)
    return [(*opts[:-1], replace(product, amount=product.amount or 1, more=way)) for way in ways[1:]]
