"""The tensor-core action, TC(axis, tiles) or TC(axis, tiles, steps, stages): a matrix product's reduce loop `axis`
runs on the warp-level matrix multiply-accumulate of a tensor core (the target's `tensor_cores`).

A block computes a tile of tiles × tiles tensor-core tiles of the outputs (m × n each; the innermost output loop
along which the first input of the product moves and the second is fixed gives the rows, the innermost one the
other way round the columns). Its warps split the tile: one warp for tiles 1, a 2 × 2 grid of them for more (one,
where the target's blocks hold fewer than four warps), each warp holding the accumulators of its part's
tensor-core tiles. Each iteration the block's threads copy the inputs' tiles for up to K_STEPS tensor-core steps
along the reduce (rows × k·steps and k·steps × columns) into shared memory (any prologue computed on the way; each
input laid out as it lies in memory, so that neighbouring threads copy neighbouring elements, 16 bytes at a time
where they can; each line of a tile padded by 16 bytes, so that a warp's loads of a tile's rows do not wait on
each other in the same memory banks), wait at a barrier, and every warp multiply-accumulates its tiles step by
step (WMMAs): an input tile read from shared memory serves a warp's whole row or column of tiles, and the block's
copy serves all its warps. Where the target's copies go on without the thread (`Target.async_copies`: CUDA's
cp.async) and the reduce takes several copies, each input has two tiles: the first copy is made before the loop,
and each iteration starts the next copy into the other tile (a PREFETCH) before computing on this one, so that the
copy's wait on device memory overlaps the tensor cores' work; the iteration ends at the barrier where it has landed.
The action takes the steps per copy and the tiles per input it is given, else the first way that fits
(`pipelines`, which BEAM times one by one).
After the loop each accumulator goes to shared memory, and each thread reads its share of the values back for the
rest of the kernel (the cast, an epilogue, the store), neighbouring threads neighbouring columns.

A fragment (the tiles and the accumulator the warp holds together) is a value of the kernel graph like any other:
the reduce over the loop is the sum of the WMMAs (the linearizer makes it one accumulator the WMMA adds into), and
a store of it into shared memory is the warp's store of the whole accumulator. A WMMA reads its input tiles at an
offset into the block's copies, with the copies' row length (`ldm`) in its argument. The product is the sum of the
exact products of the inputs (half, bfloat16 or TF32: what a tensor core computes) in float32, not the product
rounded to the inputs' type first, which the same kernel computes without TC.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING

from lazygrad.codegen.opt import (
    KernelOptError,
    constant_term,
    gated_load,
    kernel_nodes,
    loops_by_axis,
    loops_used,
    new_loop,
    output_loops,
    replace_ranges,
    shared_bytes,
    stride,
    upcast,
)
from lazygrad.dtype import DType, dtypes
from lazygrad.uop.ops import LoopKind, Ops, UOp
from lazygrad.uop.symbolic import simplify

if TYPE_CHECKING:
    from lazygrad.codegen.renderer import Target, TensorCore


def product_operands(name: str, reduce: UOp) -> tuple[DType, UOp, UOp]:
    """The product a sum reduces, as (its inputs' type, its first input, its second): `cast(float, a) *
    cast(float, b)` (or `cast(float, a * b)`) for inputs a and b of a narrow float type, `a * b` for float32."""
    product = reduce.src[0]
    if product.op is Ops.CAST:
        product = product.src[0]
    if reduce.arg is not Ops.ADD or product.op is not Ops.MUL:
        raise KernelOptError(f"{name}: the reduce is not a sum of products")
    first, second = product.src
    if first.op is Ops.CAST and second.op is Ops.CAST and first.src[0].dtype == second.src[0].dtype != first.dtype:
        first, second = first.src[0], second.src[0]  # (a tensor core multiplies narrow floats exactly)
    return first.dtype, first, second


def choose_core(name: str, dtype: DType, reduce: UOp, target: Target, allow_tf32: bool) -> TensorCore:
    """The target's tensor core for a product of `dtype` inputs summed in `reduce`'s."""
    core = next((c for c in target.tensor_cores if c.input == dtype and c.accumulator == reduce.dtype), None)
    if core is None:
        kinds = ", ".join(f"{c.input.name} into {c.accumulator.name}" for c in target.tensor_cores)
        raise KernelOptError(
            f"{name}: no tensor core multiplies {dtype.name} into {reduce.dtype.name} (the device's: {kinds})"
        )
    if dtype == dtypes.float32 and not allow_tf32:
        raise KernelOptError(
            f"{name}: float32 products run on tensor cores in TF32 only where allowed "
            "(Tensor.allow_tf32(), ALLOW_TF32=1)"
        )
    return core


def row_major(value: UOp, rows: UOp, columns: UOp) -> bool:
    """Whether an input tile is copied along its columns (row-major): unless the input moves by one element along
    its rows in memory and by more along its columns (a transposed matrix), so that neighbouring threads copy
    neighbouring memory."""
    indices = [node.src[1] for node in value.toposort if node.op is Ops.LOAD and node.src[0].op is Ops.DEFINE_GLOBAL]
    along_rows = any(stride(index, rows) == 1 for index in indices)
    return not along_rows or any(stride(index, columns) == 1 for index in indices)


def stage(
    value: UOp,
    tile: tuple[tuple[UOp, UOp], tuple[UOp, UOp]],
    shape: tuple[int, int],
    layout: str,
    thread: UOp,
    threads: int,
    shared: UOp,
    start: UOp | int = 0,
    gate: UOp | None = None,
) -> list[UOp]:
    """The copy of input `value` into `shared` (from element `start` on) by the block's threads: the tile of `shape`
    (rows, columns) that `tile` gives as (the input's loop, which tile of it) for its rows and its columns, laid out
    along its rows (`layout` "row") or its columns, each line of it `padded_line` elements apart; made where `gate`
    holds (always where None). Each thread copies 16 bytes at once where the input is read straight from memory, in
    order along the layout and 16-byte aligned (`wide_copy_width`; 8 or 4 where the tile is too small for every
    thread to copy 16), else one element at a time; every `threads`-th piece from its own on."""
    (row_loop, row_start), (column_loop, column_start) = tile
    rows, columns = shape
    line = columns if layout == "row" else rows
    width = wide_copy_width(value, column_loop if layout == "row" else row_loop, line)
    while rows * columns % (threads * width):  # (a small tile: fewer elements to a piece, every thread copying)
        width //= 2
    stores = []
    for copy in range(rows * columns // (threads * width)):
        element = (thread + copy * threads) * width
        along, across = element % line, element // line
        row, column = (across, along) if layout == "row" else (along, across)
        position = {row_loop: row_start * rows + row, column_loop: column_start * columns + column}
        place = simplify(across * padded_line(line, value.dtype) + along + start)
        gates = () if gate is None else (gate,)
        if width == 1:
            copied = replace_ranges(value, position, {})
            if gate is not None:  # (a copy gated off reads nothing: past the last copy is past the input's end)
                loads = [
                    node for node in copied.toposort if node.op is Ops.LOAD and node.src[0].op is Ops.DEFINE_GLOBAL
                ]
                copied = replace_ranges(copied, {load: gated_load(load, gate) for load in loads}, {})
            stores.append(UOp(Ops.STORE, src=(shared, place, copied, *gates)))
        else:
            index = simplify(replace_ranges(value.src[1], position, {}))
            stores.append(UOp(Ops.WIDE_COPY, src=(shared, place, value.src[0], index, *gates), arg=width))
    return stores


def padded_line(line: int, dtype: DType) -> int:
    """The elements from one line (row or column, as laid out) of a tile in shared memory to the next: the line and
    16 bytes more, so that the rows a warp's tensor-core load reads at once start in different memory banks (a
    line of 128 bytes would put them all in the same ones)."""
    return line + 16 // dtype.itemsize


def wide_copy_width(value: UOp, inner: UOp, inner_size: int) -> int:
    """How many elements a thread copies at once from input `value` to a tile whose memory order runs along loop
    `inner` (`inner_size` elements to a row of it): 16 bytes' worth where `value` is an unmasked load, contiguous
    along `inner` and 16-byte aligned wherever a piece starts (every other loop moving it by whole pieces), else 1."""
    width = 16 // value.dtype.itemsize
    if value.op is not Ops.LOAD or value.src[0].op is not Ops.DEFINE_GLOBAL or len(value.src) != 2:
        return 1
    index = value.src[1]
    if inner_size % width or stride(index, inner) != 1 or constant_term(index) % width:
        return 1
    loops = {node for node in index.toposort if node.op is Ops.RANGE and node is not inner}
    if any((step := stride(index, loop)) is None or step % width for loop in loops):
        return 1
    return width


@dataclass(frozen=True)
class _Product:
    """What a TC action finds in a kernel before choosing its copies: the product, its tensor core, the output loops
    its block tiles, and how the block's warps share them."""

    name: str
    core: TensorCore
    dtype: DType  # the inputs'
    reduce: UOp
    first: UOp
    second: UOp
    row: UOp  # the output loops along which the first input moves and the second not, and the other way round
    column: UOp
    tiles: int
    warps: int  # along each side of the block
    layout_a: str  # how each input's tile lies in shared memory ("row": along its rows)
    layout_b: str
    shared: tuple[UOp, ...]  # the shared memory the kernel defines already (DEFINE_LOCAL)

    @property
    def block(self) -> tuple[int, int]:
        """The block's rows and columns of outputs."""
        (m, n, _), tiles = self.core.dims, self.tiles
        return tiles * m, tiles * n


@dataclass(frozen=True)
class _Copies:
    """How a TC block copies its inputs: tensor-core `steps` along the reduce a copy, `stages` tiles of each input
    (two: the next copy goes into one while the block computes on the other), each tile's lines `ldm_*` elements
    apart and `size_*` elements in all."""

    steps: int
    stages: int
    ldm_a: int
    ldm_b: int
    size_a: int
    size_b: int

    def memory(self, product: _Product) -> int:
        """The bytes of shared memory the kernel takes with these copies: the tiles and the block's accumulators."""
        rows, columns = product.block
        tiles = self.stages * (self.size_a + self.size_b) * product.dtype.itemsize
        taken = sum(shared_bytes(node.dtype) * node.arg[1] for node in product.shared)
        return taken + tiles + rows * columns * product.core.accumulator.itemsize


def _product(sink: UOp, loop: UOp, target: Target | None, allow_tf32: bool, tiles: int) -> _Product:
    """The product a TC(loop, tiles) action would run on tensor cores; KernelOptError where it cannot."""
    name = f"TC({loop.arg[0]}{f', {tiles}' if tiles > 1 else ''})"
    if target is None or not target.tensor_cores:
        raise KernelOptError(f"{name}: the device has no tensor cores")
    if tiles not in TILES:
        raise KernelOptError(f"{name}: a block computes 1, 2, 4 or 8 tensor-core tiles along each side, not {tiles}")
    if loop.arg[1] is not LoopKind.REDUCE:
        raise KernelOptError(f"{name}: loop {loop.arg[0]} is a {loop.arg[1].name.lower()} loop, not a reduce loop")
    if any(node.arg[1] is not LoopKind.GLOBAL for node in output_loops(sink)):
        raise KernelOptError(
            f"{name}: the block's threads are its own: TC comes before any thread action (LOCAL, LOOP)"
        )
    reduces = [node for node in kernel_nodes(sink) if node.op is Ops.RANGE_REDUCE]
    if len(reduces) != 1 or reduces[0].src[1:] != (loop,):
        raise KernelOptError(f"{name}: the kernel must have one reduce, over loop {loop.arg[0]} alone")
    (reduce,) = reduces
    dtype, first, second = product_operands(name, reduce)
    if any(node.op is Ops.RANGE_REDUCE for node in reduce.src[0].toposort):
        raise KernelOptError(f"{name}: the product holds another reduce")
    core = choose_core(name, dtype, reduce, target, allow_tf32)
    (m, n, k), warp = core.dims, core.threads
    used = loops_used(sink)
    global_loops = output_loops(sink)
    rows = [node for node in global_loops if node in used[first] and node not in used[second]]
    columns = [node for node in global_loops if node in used[second] and node not in used[first]]
    if not rows or not columns:
        raise KernelOptError(f"{name}: not a matrix product: no output loop along which one input moves, the other not")
    row, column = rows[-1], columns[-1]
    for what, node, size in (("rows", row, tiles * m), ("columns", column, tiles * n), ("reduce", loop, k)):
        if node.src[0].arg % size:
            raise KernelOptError(
                f"{name}: a block takes {size} {what} at a time; loop {node.arg[0]} has {node.src[0].arg}"
            )
    # warps along each side of the block (one where the target's blocks hold fewer than four), and the tensor-core
    # tiles along each side of a warp's part
    warps = 2 if tiles > 1 and 4 * warp <= target.max_threads else 1
    if warp * warps * warps > target.max_threads or warp % n or m % (warp // n):
        raise KernelOptError(f"{name}: a warp of {warp} threads does not fit this target's blocks")
    # each input's tile laid out as the input lies in memory (neighbouring threads copy neighbouring elements)
    layout_a = "row" if row_major(first, row, loop) else "col"
    layout_b = "row" if row_major(second, loop, column) else "col"
    shared = tuple(node for node in kernel_nodes(sink) if node.op is Ops.DEFINE_LOCAL)
    return _Product(name, core, dtype, reduce, first, second, row, column, tiles, warps, layout_a, layout_b, shared)


def _layout(product: _Product, steps: int, stages: int) -> _Copies:
    """The tiles of a copy of `steps` tensor-core steps along the reduce, `stages` of them per input: each
    line padded (the row length a tensor-core load takes, ldm, is that of the padded lines)."""
    depth, dtype = product.core.dims[2] * steps, product.dtype
    block_rows, block_columns = product.block
    ldm_a = padded_line(depth if product.layout_a == "row" else block_rows, dtype)
    ldm_b = padded_line(block_columns if product.layout_b == "row" else depth, dtype)
    size_a = ldm_a * (block_rows if product.layout_a == "row" else depth)
    size_b = ldm_b * (depth if product.layout_b == "row" else block_columns)
    return _Copies(steps, stages, ldm_a, ldm_b, size_a, size_b)


def _copies(product: _Product, loop: UOp, target: Target) -> list[_Copies]:
    """The ways a block of `product` can copy its inputs into shared memory that fit the target, best first: up to
    K_STEPS tensor-core steps along the reduce a copy, more first (fewer barriers, and more multiply-accumulates for
    each wait on memory); then two tiles of each input before one, where the target copies without waiting
    (`Target.async_copies`) and the reduce takes several copies (the block computes on one while the next copy goes
    into the other)."""
    length, k = loop.src[0].arg, product.core.dims[2]
    layouts = [
        _layout(product, steps, stages)
        for steps in range(K_STEPS, 0, -1)
        if length % (k * steps) == 0
        for stages in (2, 1)
        if stages == 1 or (target.async_copies and length // (k * steps) >= 2)
    ]
    return [copies for copies in layouts if copies.memory(product) <= target.shared_memory]


def pipelines(sink: UOp, loop: UOp, target: Target | None, allow_tf32: bool, tiles: int = 1) -> list[tuple[int, int]]:
    """The (steps per copy, tiles per input) a TC(loop, tiles) action may take for this kernel (its fourth and fifth
    numbers), best first: the first is what it takes where the action names none. KernelOptError where TC does not
    apply."""
    fitting = _copies(_product(sink, loop, target, allow_tf32, tiles), loop, target)
    return [(copies.steps, copies.stages) for copies in fitting]


def tensor_core(
    sink: UOp, loop: UOp, target: Target | None, allow_tf32: bool, tiles: int = 1, pipeline: tuple[int, ...] = ()
) -> UOp:
    """`sink` with the sum of products over reduce loop `loop` made on the target's tensor cores, a block computing
    tiles × tiles tensor-core tiles (see above), copying its inputs `pipeline` = (steps per copy, tiles per input)
    at a time where given, else the best way that fits (`pipelines`)."""
    product = _product(sink, loop, target, allow_tf32, tiles)
    name, core, dtype, reduce = product.name, product.core, product.dtype, product.reduce
    first, second, row, column = product.first, product.second, product.row, product.column
    fitting = _copies(product, loop, target)
    if pipeline:
        chosen = next((copies for copies in fitting if (copies.steps, copies.stages) == pipeline), None)
        if chosen is None:
            offered = ", ".join(f"({copies.steps}, {copies.stages})" for copies in fitting) or "none"
            raise KernelOptError(
                f"{name}: copies {pipeline} (tensor-core steps per copy, tiles per input) do not fit this product "
                f"on this device; those that do: {offered}"
            )
    elif fitting:
        chosen = fitting[0]
    else:
        smallest = _layout(product, 1, 1)
        raise KernelOptError(
            f"{name}: the tiles need {smallest.memory(product)} bytes of shared memory, the device has "
            f"{target.shared_memory}"
        )
    (m, n, k), warp = core.dims, core.threads
    block_rows, block_columns = product.block
    warps, per_warp = product.warps, tiles // product.warps
    threads = warp * warps * warps
    steps, stages = chosen.steps, chosen.stages
    ldm_a, ldm_b, size_a, size_b = chosen.ldm_a, chosen.ldm_b, chosen.size_a, chosen.size_b
    layout_a, layout_b = product.layout_a, product.layout_b
    depth = k * steps
    # the block's threads: warps × warps warps, each `down` rows of `n` lanes (the lanes' order in a warp)
    top = max(loops_by_axis(sink))
    numbers = itertools.count(top + 1)
    zero = UOp.const(loop.dtype, 0)

    def local(size: int) -> UOp:
        return UOp(Ops.RANGE, loop.dtype, (UOp.const(loop.dtype, size),), (next(numbers), LoopKind.LOCAL))

    warp_row, warp_column = (local(warps), local(warps)) if warps > 1 else (zero, zero)
    down = warp // n
    lane_row, lane_column = local(down), local(n)
    thread = ((warp_row * warps + warp_column) * down + lane_row) * n + lane_column
    row_tile = new_loop(row, row.src[0].arg // block_rows)
    column_tile = new_loop(column, column.src[0].arg // block_columns)
    copies = loop.src[0].arg // depth
    step = new_loop(loop, copies)
    inner = UOp(Ops.RANGE, loop.dtype, (UOp.const(loop.dtype, depth // k),), (next(numbers), LoopKind.REDUCE))
    number = len(product.shared)
    shared_a = UOp(Ops.DEFINE_LOCAL, dtype, (), (number, stages * size_a))
    shared_b = UOp(Ops.DEFINE_LOCAL, dtype, (), (number + 1, stages * size_b))
    shared_c = UOp(Ops.DEFINE_LOCAL, core.accumulator, (), (number + 2, block_rows * block_columns))

    tile_a = ((block_rows, depth), layout_a, thread, threads, shared_a)  # (the shape and place of each copy)
    tile_b = ((depth, block_columns), layout_b, thread, threads, shared_b)

    def copy(at: UOp, tile: UOp | int = 0, gate: UOp | None = None) -> list[UOp]:
        """The block's copies of both inputs' tiles for the copy `at` along the reduce, into tile `tile` of each."""
        return [
            *stage(first, ((row, row_tile), (loop, at)), *tile_a, tile * size_a, gate),
            *stage(second, ((loop, at), (column, column_tile)), *tile_b, tile * size_b, gate),
        ]

    if stages == 1:  # each iteration copies, waits at a barrier, computes (and the linearizer ends it at another)
        copied, tile = UOp(Ops.BARRIER, src=tuple(copy(step))), zero
    else:
        # the first copy before the loop; each iteration starts the next copy into the other tile (the last none),
        # then computes on this one: the linearizer ends it at a barrier, where the next copy has landed
        ready = UOp(Ops.BARRIER, src=tuple(copy(zero)))
        ahead = copy(step + 1, (step + 1) % 2, step.alu(Ops.CMPLT, UOp.const(step.dtype, copies - 1)))
        copied, tile = UOp(Ops.PREFETCH, src=(ready, *ahead)), step % 2
    # each warp's tiles: at tensor-core step `inner` of a copy, the WMMA of tile (i, j) reads that tile's rows of the
    # A copy and its columns of the B copy (elements along a copy's lines are 1 apart, across them a padded line),
    # and its accumulator goes to the m·n values of shared memory numbered by the tile's place in the block
    row_step_a, depth_step_a = (ldm_a, 1) if layout_a == "row" else (1, ldm_a)
    depth_step_b, column_step_b = (ldm_b, 1) if layout_b == "row" else (1, ldm_b)
    arg = (m, n, k, layout_a, layout_b, ldm_a, ldm_b)
    stores_c = []
    for i, j in itertools.product(range(per_warp), repeat=2):
        tile_row, tile_column = warp_row * per_warp + i, warp_column * per_warp + j
        offset_a = tile * size_a + tile_row * m * row_step_a + inner * k * depth_step_a
        offset_b = tile * size_b + inner * k * depth_step_b + tile_column * n * column_step_b
        wmma = UOp(
            Ops.WMMA, core.accumulator, (shared_a, shared_b, simplify(offset_a), simplify(offset_b), copied), arg
        )
        accumulated = UOp(Ops.RANGE_REDUCE, core.accumulator, (wmma, step, inner), Ops.ADD)
        offset_c = simplify((tile_row * tiles + tile_column) * (m * n))
        stores_c.append(UOp(Ops.STORE, src=(shared_c, offset_c, accumulated)))
    stored = UOp(Ops.BARRIER, src=tuple(stores_c))
    # each thread reads back every `threads`-th value of the block's outputs (row-major) from its own on
    part = UOp(
        Ops.RANGE,
        loop.dtype,
        (UOp.const(loop.dtype, block_rows * block_columns // threads),),
        (next(numbers), LoopKind.LOOP),
    )
    output = thread + part * threads
    output_row, output_column = output // block_columns, output % block_columns
    index = ((output_row // m) * tiles + output_column // n) * (m * n) + (output_row % m) * n + output_column % n
    value = UOp(Ops.LOAD, core.accumulator, (shared_c, simplify(index), stored))
    replacements = {
        reduce: value,
        row: row_tile * block_rows + output_row,
        column: column_tile * block_columns + output_column,
    }
    sink = replace_ranges(sink, replacements, {})
    return upcast(sink, part, part.src[0].arg)


TILES = (1, 2, 4, 8)  # tensor-core tiles along each side of a block
K_STEPS = 4  # the most tensor-core steps along the reduce per copy into shared memory
