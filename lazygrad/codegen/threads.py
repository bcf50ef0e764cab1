"""Mapping a kernel's loops onto a device's index space, between optimizing and linearizing.

On a device with threads, the output loops left as GLOBAL become the block index and the LOCAL ones the thread
index within a block (one index each, the loops read back from it by division and modulo); the loops that remain are
loops inside every thread. The launch size — how many blocks of how many threads — is read back from the linear
program, so it travels with the program to the runtime. On a CPU there is nothing to map: the outermost output loop
is what the runtime splits across its cores, and its size is the launch's "blocks".
"""

from __future__ import annotations

from lazygrad.codegen.opt import loops_of_kind, replace_ranges
from lazygrad.codegen.renderer import Renderer, Target
from lazygrad.helpers import prod
from lazygrad.uop.ops import LoopKind, Ops, UOp


def map_threads(sink: UOp, target: Target) -> UOp:
    """`sink` with its GLOBAL and LOCAL loops replaced by block and thread indices, where the target has threads."""
    if not target.max_threads:
        return sink
    replacements: dict[UOp, UOp] = {}
    for name, kind in (("block", LoopKind.GLOBAL), ("thread", LoopKind.LOCAL)):
        loops = loops_of_kind(sink, kind)
        if not loops:
            continue
        stride = prod(loop.src[0].arg for loop in loops)
        index = UOp(Ops.SPECIAL, loops[0].dtype, (), (name, stride))
        for loop in loops:  # outermost first: the innermost loop moves fastest through the index
            stride //= loop.src[0].arg
            replacements[loop] = (index // stride) % loop.src[0].arg
    return replace_ranges(sink, replacements, {}) if replacements else sink


def launch_size(program: list[UOp], target: Target) -> tuple[int, int]:
    """(blocks, threads per block) of a linear program for `target`: the sizes of its block and thread indices on a
    device with threads; on a CPU, the outermost output loop's iterations (what it splits across its cores)."""
    if target.max_threads:
        specials = {node.arg[0]: node.arg[1] for node in program if node.op is Ops.SPECIAL}
        return specials.get("block", 1), specials.get("thread", 1)
    outer = next((node for node in program if node.op is Ops.RANGE and node.arg[1] is LoopKind.GLOBAL), None)
    return (outer.src[0].arg if outer is not None else 1), 1


def kernel_launch(program: list[UOp], renderer: Renderer) -> tuple[int, int, int]:
    """What a runtime launches a linear program with: its `launch_size`, then the bytes of shared memory each block
    asks for at launch (see `Renderer.dynamic_shared_bytes`)."""
    return (*launch_size(program, renderer.target), renderer.dynamic_shared_bytes(program))
