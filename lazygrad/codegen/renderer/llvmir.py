"""LLVM IR for the LLVM device: one function per kernel, loops with phi counters, accumulators as allocas that
LLVM's mem2reg turns into registers. Rendering is table driven: per op and dtype kind, an instruction template.

Integers follow lazygrad/uop/alu.py: arithmetic carries no `nsw`/`nuw` flags, so it wraps; a shift whose amount may
be out of range (poison in LLVM) selects the result of shifting every bit out; a division that may divide by zero or
the most negative value by -1 (undefined, and a trap on x86) divides by 1 instead and selects the defined result."""

from __future__ import annotations

import math
import platform
import struct

import numpy as np

from lazygrad.codegen.opt import stride
from lazygrad.codegen.renderer import TEAM, Renderer
from lazygrad.codegen.transcendental import transcendental_rules
from lazygrad.codegen.vectorize import (
    Lanes,
    StoreVector,
    accumulator_vectors,
    lanes_of,
    replaced_by_vectors,
    split_offset,
    store_vectors,
)
from lazygrad.dtype import DType, dtypes
from lazygrad.uop.alu import division_hazards, shift_in_range
from lazygrad.uop.ops import LoopKind, Ops, UOp

LLVM_TYPES = {
    dtypes.bool: "i1",
    dtypes.int8: "i8",
    dtypes.uint8: "i8",
    dtypes.int16: "i16",
    dtypes.uint16: "i16",
    dtypes.uint64: "i64",
    dtypes.int32: "i32",
    dtypes.uint32: "i32",
    dtypes.int64: "i64",
    dtypes.float16: "half",
    dtypes.float32: "float",
    dtypes.float64: "double",
}
# bfloat16 is only ever in memory (codegen/narrow_dtypes.py computes it in float32)
MEMORY_TYPES = LLVM_TYPES | {dtypes.bool: "i8", dtypes.bfloat16: "i16"}

# op -> template per kind ("float", "int" for signed, "uint", "bool"); {a} {b} {c} operands, {t} the type
ALU_TEMPLATES: dict[Ops, dict[str, str]] = {
    Ops.ADD: {
        "float": "fadd {t} {a}, {b}",
        "int": "add {t} {a}, {b}",
        "uint": "add {t} {a}, {b}",
        "bool": "or i1 {a}, {b}",
    },
    Ops.MUL: {
        "float": "fmul {t} {a}, {b}",
        "int": "mul {t} {a}, {b}",
        "uint": "mul {t} {a}, {b}",
        "bool": "and i1 {a}, {b}",
    },
    Ops.NEG: {"float": "fneg {t} {a}", "int": "sub {t} 0, {a}", "uint": "sub {t} 0, {a}", "bool": "xor i1 {a}, true"},
    Ops.MAX: {
        "float": "call {t} @llvm.maximum.{tn}({t} {a}, {t} {b})",
        "int": "call {t} @llvm.smax.{tn}({t} {a}, {t} {b})",
        "uint": "call {t} @llvm.umax.{tn}({t} {a}, {t} {b})",
        "bool": "or i1 {a}, {b}",
    },
    Ops.CMPLT: {
        "float": "fcmp olt {t} {a}, {b}",
        "int": "icmp slt {t} {a}, {b}",
        "uint": "icmp ult {t} {a}, {b}",
        "bool": "icmp ult i1 {a}, {b}",
    },
    Ops.CMPNE: {
        "float": "fcmp une {t} {a}, {b}",
        "int": "icmp ne {t} {a}, {b}",
        "uint": "icmp ne {t} {a}, {b}",
        "bool": "icmp ne i1 {a}, {b}",
    },
    Ops.AND: {"int": "and {t} {a}, {b}", "uint": "and {t} {a}, {b}", "bool": "and i1 {a}, {b}"},
    Ops.OR: {"int": "or {t} {a}, {b}", "uint": "or {t} {a}, {b}", "bool": "or i1 {a}, {b}"},
    Ops.XOR: {"int": "xor {t} {a}, {b}", "uint": "xor {t} {a}, {b}", "bool": "xor i1 {a}, {b}"},
    Ops.SHL: {"int": "shl {t} {a}, {b}", "uint": "shl {t} {a}, {b}"},
    Ops.SHR: {"int": "ashr {t} {a}, {b}", "uint": "lshr {t} {a}, {b}"},
    Ops.WHERE: {kind: "select i1 {a}, {t} {b}, {t} {c}" for kind in ("float", "int", "uint", "bool")},
    Ops.MOD: {"float": "frem {t} {a}, {b}"},  # (C's fmod: a call of libm's, which the JIT resolves)
    Ops.RECIP: {"float": "fdiv {t} {one}, {a}"},
    Ops.FDIV: {"float": "fdiv {t} {a}, {b}"},
    Ops.SQRT: {"float": "call {t} @llvm.sqrt.{tn}({t} {a})"},
    Ops.EXP2: {"float": "call {t} @llvm.exp2.{tn}({t} {a})"},
    Ops.LOG2: {"float": "call {t} @llvm.log2.{tn}({t} {a})"},
    Ops.SIN: {"float": "call {t} @llvm.sin.{tn}({t} {a})"},
    Ops.COS: {"float": "call {t} @llvm.cos.{tn}({t} {a})"},
}
INTRINSIC_NAMES = {"half": "f16", "float": "f32", "double": "f64", "i32": "i32", "i64": "i64"}


# a loop that runs fewer times than this in all (its iterations times its enclosing loops') is left scalar: the
# loop vectorizer would save it microseconds and cost its compile tens of milliseconds (a bias, a loss, a count)
VECTORIZED_RUNS = 1 << 14


# The first line of a kernel that leaves nothing to LLVM's vectorizers: no loop to the loop vectorizer (they are too
# short to be worth it, or reduce into a register block) and no block of scalar accumulators to the SLP pass (the
# block's rows are vectors already: see codegen/vectorize.py). The LLVM device compiles such a module with a few
# cleanup passes instead of O3, whose loop passes took 0.1-0.15 s of a register-blocked product's compile and made
# it no faster.
NOTHING_TO_VECTORIZE = "; nothing for LLVM's vectorizers\n"


def render_vector_load(name: str, t: str, lanes: int, stride: int, itemsize: int) -> list[str]:
    """`name` = a vector of `lanes` elements of type `t`, `stride` apart from the address `{name}_ptr`: one load
    where they are consecutive, else a load of the span they cover (no further: the span may end the buffer) and a
    shuffle that picks them."""
    if stride == 1:
        return [f"  {name} = load <{lanes} x {t}>, ptr {name}_ptr, align {itemsize}"]
    span = f"<{(lanes - 1) * stride + 1} x {t}>"
    picked = ", ".join(f"i32 {lane * stride}" for lane in range(lanes))
    return [
        f"  {name}_span = load {span}, ptr {name}_ptr, align {itemsize}",
        f"  {name} = shufflevector {span} {name}_span, {span} poison, <{lanes} x i32> <{picked}>",
    ]


def vectorized_loops(program: list[UOp]) -> set[UOp]:
    """The loops LLVM's loop vectorizer may work on: loops with no reduce inside (every loop of an elementwise
    kernel; the row loop of a softmax after its max and sum), and reduce loops that codegen found contiguous, where
    they run at least VECTORIZED_RUNS times. Elsewhere codegen's upcast has made blocks of accumulators (rendered as
    vectors), and an outer loop around a reduce would only be vectorized with gathers. A PACK's copy is not left to
    the vectorizer either: it copies a few rows of a register block's inputs, and would bring O3 to the product.
    Nor is a loop its stores would be scattered along (see `scatters`)."""
    # open loops: [loop, whether an accumulator is updated inside, its runs, the stores to memory inside]
    vectorized, open_loops = set(), []
    for node in program:
        if node.op is Ops.RANGE:
            size = node.src[0].arg if node.src[0].op is Ops.CONST else VECTORIZED_RUNS
            open_loops.append([node, False, size * (open_loops[-1][2] if open_loops else 1), []])
        elif node.op is Ops.STORE and node.src[0].op is Ops.DEFINE_ACC:
            for entry in open_loops:
                entry[1] = True
        elif node.op is Ops.STORE and node.src[0].op is Ops.DEFINE_GLOBAL:
            for entry in open_loops:
                entry[3].append(node)
        elif node.op is Ops.ENDRANGE:
            loop, has_reduce, runs, stores = open_loops.pop()
            wanted = not has_reduce or loop.arg[1] is LoopKind.VECTOR_REDUCE
            if wanted and runs >= VECTORIZED_RUNS and loop.arg[1] is not LoopKind.PACK and not scatters(loop, stores):
                vectorized.add(loop)
    return vectorized


MAX_INTERLEAVE = 4  # the most stores a step apart that the loop vectorizer writes as shuffled contiguous vectors


def scatters(loop: UOp, stores: list[UOp]) -> bool:
    """Whether vectorizing `loop` would scatter some of `stores` lane by lane: a store that moves by more than one
    element an iteration, unless stores at the other offsets fill its gaps (an interleaved group of up to
    MAX_INTERLEAVE, written with shuffles and contiguous stores: a 2x2 max-pool gradient's). An AVX-512 scatter costs
    more than scalar stores: ResNet18's copy of 3x3 windows into rows of 9 (E_16_8_8_64) took 0.72 ms scattered,
    0.14 ms scalar."""
    residues: dict[tuple, set[int]] = {}
    for store in stores:
        step = stride(store.src[1], loop)
        if step in (0, 1, -1):
            continue
        if step is None or abs(step) > MAX_INTERLEAVE:
            return True
        rest, offset = split_offset(store.src[1])
        residues.setdefault((store.src[0], rest, abs(step)), set()).add(offset % abs(step))
    return any(len(found) < step for (_, _, step), found in residues.items())


def is_accumulator(node: UOp) -> bool:
    return node.op is Ops.LOAD and node.src[0].op is Ops.DEFINE_ACC


def kind_of(dtype: DType) -> str:
    return "bool" if dtype == dtypes.bool else ("float" if dtype.is_float else ("uint" if dtype.is_unsigned else "int"))


def render_const(value, dtype: DType) -> str:
    if dtype == dtypes.bool:
        return "true" if value else "false"
    if dtype.is_int:
        bits = dtype.bits
        value = int(value) & ((1 << bits) - 1)
        return str(value - (1 << bits) if value >= 1 << (bits - 1) else value)
    if dtype == dtypes.float16:
        return "0xH" + np.array(value, dtype=np.float16).view(np.uint16).item().to_bytes(2, "big").hex().upper()
    # float constants are written as the hex of the double holding the exactly-rounded float value
    rounded = float(np.float32(value)) if dtype == dtypes.float32 and not math.isnan(value) else value
    return "0x" + struct.pack(">d", rounded).hex().upper()


def cast_instruction(source: str, from_dtype: DType, to_dtype: DType) -> str:
    a, ft, tt = source, LLVM_TYPES[from_dtype], LLVM_TYPES[to_dtype]
    from_kind, to_kind = kind_of(from_dtype), kind_of(to_dtype)
    if to_kind == "bool":
        return f"fcmp une {ft} {a}, 0.0" if from_kind == "float" else f"icmp ne {ft} {a}, 0"
    if from_kind == "float" and to_kind == "float":
        return f"{'fpext' if to_dtype.itemsize > from_dtype.itemsize else 'fptrunc'} {ft} {a} to {tt}"
    if from_kind == "float":
        return f"{'fptoui' if to_kind == 'uint' else 'fptosi'} {ft} {a} to {tt}"
    if to_kind == "float":
        return f"{'sitofp' if from_kind == 'int' else 'uitofp'} {ft} {a} to {tt}"
    if from_dtype.bits == to_dtype.bits:
        return f"add {tt} {a}, 0"
    if from_dtype.bits > to_dtype.bits:
        return f"trunc {ft} {a} to {tt}"
    return f"{'sext' if from_kind == 'int' else 'zext'} {ft} {a} to {tt}"


class LLVMRenderer(Renderer):
    """Renders a linear program as an LLVM IR module with a function `void name(ptr buffers, i64 start, i64 end)`
    (`buffers`: an array of the buffers' addresses, see `render_entry`); the outermost global loop runs from start
    to end, so the runtime can split it across threads."""

    rewrites = transcendental_rules
    can_join = True
    # (an accumulator's update is written by `render_accumulate`: reassociated in loops left to LLVM's vectorizer)
    fuses_accumulator_updates = False

    def render(self, name: str, program: list[UOp]) -> str:
        names: dict[UOp, str] = {}
        lines: list[str] = []
        allocas: list[str] = []
        declarations: set[str] = set()

        def value(node: UOp) -> str:
            return render_const(node.arg, node.dtype) if node.op is Ops.CONST else names[node]

        parallel = next((n for n in program if n.op is Ops.RANGE and n.arg[1] is LoopKind.GLOBAL), None)
        vectorized = vectorized_loops(program)
        # a register block's accumulators as vectors (outside loops left to the loop vectorizer): LLVM then has a
        # vector per row of the block to keep in a register, not scalars for its SLP pass to pack, and far less IR
        vectors = [
            vector
            for vector in accumulator_vectors(program, self.target.vector_width, trees=True, interleaved=True)
            if not vectorized.intersection(vector.loops)
        ]
        lane_of = lanes_of(vectors)
        # and the stores after them (a block's outputs, a copy's elements, an elementwise kernel's outputs upcast
        # along memory) as vector stores: a loop around such stores is not left to the loop vectorizer, which
        # would vectorize across its iterations, each lane's stores apart in memory
        stored = store_vectors(program, self.target.vector_width, vectors)
        vectorized -= {loop for group in stored for loop in group.loops}
        stored_at = {group.last: group for group in stored}
        replaced, vector_reads = replaced_by_vectors(program, vectors, stored), {}
        reads_before: list[dict] = []  # the vector reads before each loop open now
        block, open_loops = "entry", []  # the basic block the next line goes into; the loops around it
        for position, node in enumerate(program):
            out = f"%v{position}"
            names[node] = out
            op, dtype, src = node.op, node.dtype, node.src
            if node in stored_at:
                lines += self.render_store_vector(out, stored_at[node], value, names, declarations, vector_reads)
                continue
            if node in lane_of or (op is Ops.LOAD and src and src[0] in lane_of):
                if node in replaced and len(src) == 1:
                    continue  # (a read after the loop that only vector stores used)
                accumulator = node if op is Ops.DEFINE_ACC else src[0]
                number, lane = lane_of[accumulator]
                lines += self.render_vector_accumulator(
                    out,
                    node,
                    vectors[number],
                    f"%vacc{number}",
                    lane,
                    value,
                    names,
                    vector_reads,
                    allocas,
                    declarations,
                )
                continue
            if node in replaced:
                continue  # (its vector's update stands in for it)
            if op is Ops.DEFINE_GLOBAL:
                names[node] = f"%data{node.arg[0]}"
            elif op is Ops.RANGE:
                label, start, end = f"L{position}", "0", value(src[0])
                if node is parallel:  # the caller runs [start, end) of this loop, so threads can share it
                    start, end = "%start", "%end"
                names[node] = f"%{label}_i"
                lines += [
                    f"  br label %{label}_pre",
                    f"{label}_pre:",
                    f"  br label %{label}_head",
                    f"{label}_head:",
                    f"  %{label}_i = phi i64 [{start}, %{label}_pre], [%{label}_next, %{label}_latch]",
                    f"  %{label}_go = icmp slt i64 %{label}_i, {end}",
                    f"  br i1 %{label}_go, label %{label}_body, label %{label}_exit",
                    f"{label}_body:",
                ]
                block = f"{label}_body"
                open_loops.append(node)
                # (what the loop's vectors read is defined in its body only: the same loop opened again, as a
                # reduce run before the loops around its twin, reads it anew)
                reads_before.append({key: dict(v) if isinstance(v, dict) else v for key, v in vector_reads.items()})
            elif op is Ops.ENDRANGE:
                label = names[src[0]][1:-2]
                lines += [
                    f"  br label %{label}_latch",
                    f"{label}_latch:",
                    f"  %{label}_next = add nsw i64 %{label}_i, 1",
                    f"  br label %{label}_head{'' if src[0] in vectorized else ', !llvm.loop !0'}",
                    f"{label}_exit:",
                ]
                block = f"{label}_exit"
                open_loops.pop()
                vector_reads = reads_before.pop()
            elif op is Ops.DEFINE_LOCAL:  # a buffer on the stack (codegen's PACK and STASH)
                allocas.append(f"  {out} = alloca [{node.arg[1]} x {MEMORY_TYPES[dtype]}], align 64")
            elif op is Ops.BARRIER:  # (one thread: what it waits for is done once it is emitted)
                continue
            elif op is Ops.DEFINE_ACC:
                allocas.append(f"  {out} = alloca {LLVM_TYPES[dtype]}")
                lines.append(f"  store {LLVM_TYPES[dtype]} {render_const(node.arg[0], dtype)}, ptr {out}")
            elif op is Ops.LOAD and src[0].op is Ops.DEFINE_ACC:
                lines.append(f"  {out} = load {LLVM_TYPES[dtype]}, ptr {names[src[0]]}")
            elif op is Ops.STORE and src[0].op is Ops.DEFINE_ACC:
                lines.append(f"  store {LLVM_TYPES[src[1].dtype]} {value(src[1])}, ptr {names[src[0]]}")
            elif op is Ops.LOAD and src[0].op is Ops.DEFINE_LOCAL:  # (its third source is the copy it waits for)
                lines += self.render_load(out, node.replace(src=src[:2]), value, names[src[0]])
            elif op is Ops.LOAD and len(src) == 3 and open_loops and open_loops[-1] in vectorized:
                lines += self.render_branched_load(out, node, value, block)
                block = f"{out[1:]}_join"
            elif op is Ops.LOAD:
                lines += self.render_load(out, node, value)
            elif op is Ops.STORE:
                memory_type = MEMORY_TYPES[src[2].dtype]
                stored = value(src[2])
                if src[2].dtype == dtypes.bool:
                    lines.append(f"  {out}_byte = zext i1 {stored} to i8")
                    stored = f"{out}_byte"
                if len(src) > 3:  # a gated store (a PAD's iterations past the loop's size): made where the gate holds
                    lines.append(f"  br i1 {value(src[3])}, label %{out[1:]}_store, label %{out[1:]}_join")
                    lines.append(f"{out[1:]}_store:")
                lines.append(
                    f"  {out}_ptr = getelementptr inbounds {memory_type}, ptr {names[src[0]]}, i64 {value(src[1])}"
                )
                lines.append(f"  store {memory_type} {stored}, ptr {out}_ptr")
                if len(src) > 3:
                    lines += [f"  br label %{out[1:]}_join", f"{out[1:]}_join:"]
                    block = f"{out[1:]}_join"
            elif op is Ops.CAST:
                lines.append(f"  {out} = {cast_instruction(value(src[0]), src[0].dtype, dtype)}")
            elif op is Ops.BITCAST:
                lines.append(f"  {out} = bitcast {LLVM_TYPES[src[0].dtype]} {value(src[0])} to {LLVM_TYPES[dtype]}")
            elif op in (Ops.IDIV, Ops.MOD) and dtype.is_int:
                lines += self.render_division(out, node, value)
            elif (fused := self.fused_operands(node)) is not None:
                t = LLVM_TYPES[dtype]
                lines += self.render_fma(out, t, INTRINSIC_NAMES[t], *map(value, fused[:3]), fused[3], declarations)
            else:
                operand_dtype = src[-1].dtype
                t = LLVM_TYPES[operand_dtype]
                template = ALU_TEMPLATES[op][kind_of(operand_dtype)]
                if "@llvm." in template:
                    intrinsic = template.split("@")[1].split("(")[0].replace("{tn}", INTRINSIC_NAMES[t])
                    arity = template.count("{t} {")
                    declarations.add(f"declare {t} @{intrinsic}({', '.join([t] * arity)})")
                operands = dict(zip("abc", (value(s) for s in src)))
                if op in (Ops.SHL, Ops.SHR) and not shift_in_range(node):
                    lines += self.render_shift(out, node, operands["a"], operands["b"])
                    continue
                instruction = template.format(
                    t=t, tn=INTRINSIC_NAMES.get(t, ""), one=render_const(1.0, operand_dtype), **operands
                )
                if len(src) == 2 and is_accumulator(src[0]) and len(src[0].src) > 1 and dtype.is_float:
                    lines += self.render_accumulate(out, node, value, vectorized, declarations)
                    continue
                lines.append(f"  {out} = {instruction}")
        buffers = sorted(node.arg[0] for node in program if node.op is Ops.DEFINE_GLOBAL)
        parameters = ", ".join(
            [f"ptr noalias align 64 %data{number}" for number in buffers] + ["i64 %start", "i64 %end"]
        )
        body = [f"define internal void @{name}_body({parameters}) #1 {{", "entry:", *allocas, *lines, "  ret void", "}"]
        attributes = [
            'attributes #0 = { nounwind "no-trapping-math"="true" "prefer-vector-width"="512" }',
            'attributes #1 = { noinline nounwind "no-trapping-math"="true" "prefer-vector-width"="512" }',
        ]
        metadata = ["!0 = distinct !{!0, !1}", '!1 = !{!"llvm.loop.vectorize.enable", i1 false}']
        scalar_block = sum(node.op is Ops.DEFINE_ACC and node not in lane_of for node in program) > 1
        # (vectors that add a computation, several products a step, keep O3 too: its scheduling ran them 7% faster)
        scalar_block = scalar_block or any(vector.value is not None for vector in vectors)
        first = "" if vectorized or scalar_block else NOTHING_TO_VECTORIZE
        return (
            first
            + "\n".join([*body, *self.render_entry(name, buffers), *sorted(declarations), *attributes, *metadata])
            + "\n"
        )

    @staticmethod
    def render_entry(name: str, buffers: list[int]) -> list[str]:
        """The function the runtime calls, `void name(ptr buffers, i64 start, i64 end)`: it reads the buffers'
        addresses from the array and calls the body with them. One array, not a parameter per buffer, because a
        call through ctypes takes at most 1024 arguments. The body keeps its `noalias` parameters, so vectorized
        loops need no overlap checks, and is not inlined: the inliner would turn them into alias metadata that
        grows with the square of the buffer count (a kernel of 1,000 inputs then takes seconds more to compile)."""
        lines = [f"define void @{name}(ptr %buffers, i64 %start, i64 %end) #0 {{", "entry:"]
        for number in buffers:
            lines.append(f"  %slot{number} = getelementptr inbounds ptr, ptr %buffers, i64 {number}")
            lines.append(f"  %data{number} = load ptr, ptr %slot{number}, align 8")
        arguments = ", ".join([f"ptr %data{number}" for number in buffers] + ["i64 %start", "i64 %end"])
        return [*lines, f"  call void @{name}_body({arguments})", "  ret void", "}"]

    @staticmethod
    def render_kernel_runner(name: str) -> str:
        """`void name(ptr table, i64 team, i64 count)` runs the `count` kernels of a table (TeamLayout.table words
        each) one after another, sharing the outer loop of each kernel with a chunk size with the workers of the
        team at address `team`; `void name_worker(ptr unused, i64 team, i64 number)` is a worker, which returns once
        it has waited `linger` tries with the team's `idle` word set (see TeamLayout)."""
        t = TEAM
        pause = "  call void @llvm.x86.sse2.pause()\n" if platform.machine().lower() in ("x86_64", "amd64") else ""
        declare = "declare void @llvm.x86.sse2.pause()\n" if pause else ""
        team = f"""  %team = inttoptr i64 %team_address to ptr
  %state_at = getelementptr inbounds i64, ptr %team, i64 {t.state}
  %next_at = getelementptr inbounds i64, ptr %team, i64 {t.next}
  %idle_at = getelementptr inbounds i64, ptr %team, i64 {t.idle}
  %job_at = getelementptr inbounds i64, ptr %team, i64 {t.job}
  %job_buffers_at = getelementptr inbounds ptr, ptr %job_at, i64 1
  %job_outer_at = getelementptr inbounds i64, ptr %job_at, i64 2
  %job_chunk_at = getelementptr inbounds i64, ptr %job_at, i64 3"""

        def backoff(label: str, spins: str, back: str) -> str:
            # a pause per try up to `spins` tries, then the core goes to whoever needs it at each
            return f"""  %{label}_more_spins = add i64 {spins}, 1
  %{label}_patient = icmp ult i64 {spins}, {t.spins}
  br i1 %{label}_patient, label %{label}_spin, label %{label}_yield
{label}_spin:
{pause}  br label %{back}
{label}_yield:
  %{label}_yielded = call i32 @sched_yield()
  br label %{back}"""

        return f"""define internal void @{name}_chunks(ptr %next_at, ptr %function, ptr %buffers, i64 %outer, i64 %chunk) {{
entry:
  br label %take
take:
  %start = atomicrmw add ptr %next_at, i64 %chunk monotonic, align 8
  %left = icmp slt i64 %start, %outer
  br i1 %left, label %run, label %exit
run:
  %after = add i64 %start, %chunk
  %past = icmp sgt i64 %after, %outer
  %end = select i1 %past, i64 %outer, i64 %after
  call void %function(ptr %buffers, i64 %start, i64 %end)
  br label %take
exit:
  ret void
}}

define void @{name}(ptr %table, i64 %team_address, i64 %count) {{
entry:
{team}
  %first_state = load atomic i64, ptr %state_at acquire, align 8
  %first_epoch = udiv i64 %first_state, {t.epoch_unit}
  br label %head
head:
  %i = phi i64 [0, %entry], [%next_i, %latch]
  %epoch = phi i64 [%first_epoch, %entry], [%epoch_after, %latch]
  %go = icmp slt i64 %i, %count
  br i1 %go, label %body, label %exit
body:
  %slot = mul i64 %i, {t.table}
  %function_at = getelementptr inbounds ptr, ptr %table, i64 %slot
  %function = load ptr, ptr %function_at
  %buffers_at = getelementptr inbounds ptr, ptr %function_at, i64 1
  %buffers = load ptr, ptr %buffers_at
  %outer_at = getelementptr inbounds i64, ptr %function_at, i64 2
  %outer = load i64, ptr %outer_at
  %chunk_at = getelementptr inbounds i64, ptr %function_at, i64 3
  %chunk = load i64, ptr %chunk_at
  %alone = icmp eq i64 %chunk, 0
  br i1 %alone, label %whole, label %share
whole:
  call void %function(ptr %buffers, i64 0, i64 %outer)
  br label %latch
share:
  store ptr %function, ptr %job_at
  store ptr %buffers, ptr %job_buffers_at
  store i64 %outer, ptr %job_outer_at
  store i64 %chunk, ptr %job_chunk_at
  store i64 0, ptr %next_at
  %new_epoch = add i64 %epoch, 1
  %opened = mul i64 %new_epoch, {t.epoch_unit}
  store atomic i64 %opened, ptr %state_at release, align 8
  call void @{name}_chunks(ptr %next_at, ptr %function, ptr %buffers, i64 %outer, i64 %chunk)
  %closing = atomicrmw or ptr %state_at, i64 {t.closed} acq_rel, align 8
  br label %wait
wait:
  %spins = phi i64 [0, %share], [%wait_more_spins, %wait_spin], [%wait_more_spins, %wait_yield]
  %now = load atomic i64, ptr %state_at acquire, align 8
  %inside = and i64 %now, {t.closed - 1}
  %empty = icmp eq i64 %inside, 0
  br i1 %empty, label %latch, label %wait_more
wait_more:
{backoff("wait", "%spins", "wait")}
latch:
  %epoch_after = phi i64 [%epoch, %whole], [%new_epoch, %wait]
  %next_i = add i64 %i, 1
  br label %head
exit:
  ret void
}}

define void @{name}_worker(ptr %unused, i64 %team_address, i64 %number) {{
entry:
{team}
  br label %look
look:
  %last = phi i64 [0, %entry], [%last, %idle_spin], [%last, %idle_yield], [%last, %join], [%epoch, %work]
  %spins = phi i64 [0, %entry], [%idle_more_spins, %idle_spin], [%idle_more_spins, %idle_yield], [%spins, %join], [0, %work]
  %lingered = phi i64 [0, %entry], [%lingered_next, %idle_spin], [%lingered_next, %idle_yield], [%lingered, %join], [0, %work]
  %state = load atomic i64, ptr %state_at acquire, align 8
  %epoch = udiv i64 %state, {t.epoch_unit}
  %closed_bit = and i64 %state, {t.closed}
  %closed = icmp ne i64 %closed_bit, 0
  %seen = icmp eq i64 %epoch, %last
  %nothing = or i1 %closed, %seen
  br i1 %nothing, label %check, label %join
join:
  %entered = add i64 %state, 1
  %swap = cmpxchg ptr %state_at, i64 %state, i64 %entered acq_rel acquire, align 8
  %swapped = extractvalue {{ i64, i1 }} %swap, 1
  br i1 %swapped, label %work, label %look
work:
  %function = load ptr, ptr %job_at
  %buffers = load ptr, ptr %job_buffers_at
  %outer = load i64, ptr %job_outer_at
  %chunk = load i64, ptr %job_chunk_at
  call void @{name}_chunks(ptr %next_at, ptr %function, ptr %buffers, i64 %outer, i64 %chunk)
  %leaving = atomicrmw sub ptr %state_at, i64 1 release, align 8
  br label %look
check:
  %idle_word = load atomic i64, ptr %idle_at monotonic, align 8
  %between_calls = icmp ne i64 %idle_word, 0
  %lingered_more = add i64 %lingered, 1
  %lingered_next = select i1 %between_calls, i64 %lingered_more, i64 0
  %waited = icmp uge i64 %lingered, {t.linger}
  %leave = and i1 %between_calls, %waited
  br i1 %leave, label %exit, label %idle
idle:
{backoff("idle", "%spins", "look")}
exit:
  ret void
}}

declare i32 @sched_yield()
{declare}"""

    def join_group(self, source: str) -> object:
        """Kernels that leave nothing to LLVM's vectorizers are compiled apart from the others, with the cleanups
        only."""
        return source.startswith(NOTHING_TO_VECTORIZE)

    def join(self, sources: list[str]) -> str:
        """One module: every function, then the declarations, attributes and metadata they share (`render` puts
        those after the last function's closing brace, the same text in every kernel). It is marked as leaving nothing
        to the vectorizers only where all its kernels are."""
        functions, shared = [], {}
        for source in sources:
            end = source.rindex("\n}\n") + 3
            functions.append(source[:end].removeprefix(NOTHING_TO_VECTORIZE))
            shared.update(dict.fromkeys(source[end:].splitlines()))
        first = NOTHING_TO_VECTORIZE if all(source.startswith(NOTHING_TO_VECTORIZE) for source in sources) else ""
        return first + "".join(functions) + "\n".join(shared) + "\n"

    def render_fma(
        self, out: str, t: str, tn: str, a: str, b: str, c: str, negated: bool, declarations: set[str]
    ) -> list[str]:
        """out = a*b + c (c - a*b if `negated`) of type `t` (`tn` its intrinsic suffix), rounded once; on a target
        without the instruction (where llvm.fma is a call of libm's) the product, then the sum."""
        negation = [f"  {out}_neg = fneg {t} {a}"] if negated else []
        a = f"{out}_neg" if negated else a
        if not self.target.fma:
            return [*negation, f"  {out}_product = fmul {t} {a}, {b}", f"  {out} = fadd {t} {out}_product, {c}"]
        if tn.endswith("f16"):
            # in float, then rounded to half: LLVM computes a half FMA in double and rounds it with a call of the
            # runtime library's (__truncdfhf2) that the JIT does not link, so such a kernel jumped to nowhere
            wide, wide_name = t.replace("half", "float"), tn.replace("f16", "f32")
            declarations.add(f"declare {wide} @llvm.fma.{wide_name}({wide}, {wide}, {wide})")
            widened = [f"  {out}_{name} = fpext {t} {operand} to {wide}" for name, operand in zip("abc", (a, b, c))]
            fused = f"  {out}_wide = call {wide} @llvm.fma.{wide_name}({wide} {out}_a, {wide} {out}_b, {wide} {out}_c)"
            return [*negation, *widened, fused, f"  {out} = fptrunc {wide} {out}_wide to {t}"]
        declarations.add(f"declare {t} @llvm.fma.{tn}({t}, {t}, {t})")
        return [*negation, f"  {out} = call {t} @llvm.fma.{tn}({t} {a}, {t} {b}, {t} {c})"]

    def render_accumulate(self, out: str, node: UOp, value, vectorized: set[UOp], declarations: set[str]) -> list[str]:
        """acc = acc (op) x. In a loop left to LLVM's vectorizer, the update may be reassociated (a reduce is computed
        in one kernel only, so this never makes two kernels disagree); elsewhere acc + a*b is one fused
        multiply-add, so a block of accumulators gets vector FMAs."""
        current, update = node.src
        t, tn = LLVM_TYPES[node.dtype], INTRINSIC_NAMES[LLVM_TYPES[node.dtype]]
        product = node.op is Ops.ADD and update.op is Ops.MUL
        if any(loop in vectorized for loop in current.src[1:]):
            flags = "reassoc nsz contract"
            if product:
                a, b = (value(s) for s in update.src)
                return [
                    f"  {out}_product = fmul {flags} {t} {a}, {b}",
                    f"  {out} = fadd {flags} {t} {value(current)}, {out}_product",
                ]
            if node.op is Ops.MAX:
                declarations.add(f"declare {t} @llvm.maximum.{tn}({t}, {t})")
                return [f"  {out} = call {flags} {t} @llvm.maximum.{tn}({t} {value(current)}, {t} {value(update)})"]
            return [
                f"  {out} = {'fadd' if node.op is Ops.ADD else 'fmul'} {flags} {t} {value(current)}, {value(update)}"
            ]
        if product:
            a, b = (value(s) for s in update.src)
            return self.render_fma(out, t, tn, a, b, value(current), False, declarations)
        if node.op is Ops.MAX:
            declarations.add(f"declare {t} @llvm.maximum.{tn}({t}, {t})")
            return [f"  {out} = call {t} @llvm.maximum.{tn}({t} {value(current)}, {t} {value(update)})"]
        return [f"  {out} = {'fadd' if node.op is Ops.ADD else 'fmul'} {t} {value(current)}, {value(update)}"]

    def render_vector_accumulator(
        self, out: str, node: UOp, vector, name: str, lane: int, value, names, reads, allocas, declarations
    ) -> list[str]:
        """An accumulator of a vector: lane 0 declares the vector and its read in the loop updates it (every value
        it adds is computed by then: the linearizer emits a block's values before its updates) with one vector load
        and one fused multiply-add per lane, as the scalar updates did; the read after the loop takes its lane out."""
        dtype = node.dtype
        t, lanes = LLVM_TYPES[dtype], len(vector.accumulators)
        vt = f"<{lanes} x {t}>"
        if node.op is Ops.DEFINE_ACC:
            if lane:
                return []
            allocas.append(f"  {name} = alloca {vt}, align 64")
            start = ", ".join(f"{t} {render_const(a.arg[0], dtype)}" for a in vector.accumulators)
            return [f"  store {vt} <{start}>, ptr {name}"]
        if len(node.src) == 1:
            return [f"  {out}_all = load {vt}, ptr {name}", f"  {out} = extractelement {vt} {out}_all, i64 {lane}"]
        if lane:
            return []
        if vector.value is not None:  # (a computation's lanes, added as the scalar updates added each lane's)
            lines: list[str] = []
            # (the vectors of one loop body share what they read: rows of a block read the same vector of weights)
            rendered = reads.setdefault(vector.loops, {})
            added = self.render_lanes(out, vector.value, value, names, declarations, lines, rendered)
            return [
                *lines,
                f"  {out}_sum = load {vt}, ptr {name}",
                f"  {out}_new = fadd {vt} {out}_sum, {added}",
                f"  store {vt} {out}_new, ptr {name}",
            ]
        lines, first = [], vector.loads[0]
        read = reads.get((first, vector.stride))  # (one load may start a vector of each stride)
        if read is None:
            read = reads[(first, vector.stride)] = f"{out}_read"
            lines.append(
                f"  {read}_ptr = getelementptr inbounds {t}, ptr {names[first.src[0]]}, i64 {value(first.src[1])}"
            )
            lines += render_vector_load(read, t, lanes, vector.stride, dtype.itemsize)
        lines.append(f"  {out}_sum = load {vt}, ptr {name}")
        if vector.common is None:
            lines.append(f"  {out}_new = fadd {vt} {out}_sum, {read}")
        else:
            tn = f"v{lanes}{INTRINSIC_NAMES[t]}"
            lines.append(f"  {out}_one = insertelement {vt} poison, {t} {value(vector.common)}, i64 0")
            lines.append(f"  {out}_all = shufflevector {vt} {out}_one, {vt} poison, <{lanes} x i32> zeroinitializer")
            lines += self.render_fma(f"{out}_new", vt, tn, read, f"{out}_all", f"{out}_sum", False, declarations)
        return [*lines, f"  store {vt} {out}_new, ptr {name}"]

    def render_lanes(
        self, out: str, lanes: Lanes, value, names, declarations: set[str], lines: list[str], rendered
    ) -> str:
        """`lanes` computed as one vector (see codegen/vectorize.py: `Lanes`): its instructions go to `lines`, named
        after `out`; returns the operand (a register's name, or a constant). `rendered` holds what is computed."""
        if (found := rendered.get(lanes.nodes)) is not None:
            return found
        first, count = lanes.nodes[0], len(lanes.nodes)
        t = LLVM_TYPES[first.dtype]
        fused = self.fused_lanes(lanes)
        parts = lanes.sources if fused is None else fused[:3]
        operands = [self.render_lanes(out, s, value, names, declarations, lines, rendered) for s in parts]
        vt, name = f"<{count} x {t}>", f"{out}_{len(rendered)}"
        if lanes.kind == "constants" or (lanes.kind == "same" and first.op is Ops.CONST):
            name = "<" + ", ".join(f"{t} {render_const(node.arg, node.dtype)}" for node in lanes.nodes) + ">"
        elif lanes.kind == "same":
            lines.append(f"  {name}_one = insertelement {vt} poison, {t} {value(first)}, i64 0")
            lines.append(f"  {name} = shufflevector {vt} {name}_one, {vt} poison, <{count} x i32> zeroinitializer")
        elif lanes.kind == "load":
            address = names[first.src[0]]
            lines.append(f"  {name}_ptr = getelementptr inbounds {t}, ptr {address}, i64 {value(first.src[1])}")
            lines += render_vector_load(name, t, count, lanes.stride, first.dtype.itemsize)
        elif lanes.kind == "accumulators":
            lines.append(f"  {name} = load {vt}, ptr %vacc{lanes.vector}")
        elif lanes.kind == "scalars":
            built = "poison"
            for lane, node in enumerate(lanes.nodes):
                lines.append(f"  {name}_{lane} = insertelement {vt} {built}, {t} {value(node)}, i64 {lane}")
                built = f"{name}_{lane}"
            name = built
        elif fused is not None:
            lines += self.render_fma(name, vt, f"v{count}{INTRINSIC_NAMES[t]}", *operands, fused[3], declarations)
        else:
            operand_dtype = first.src[-1].dtype
            ot = LLVM_TYPES[operand_dtype]
            ovt, otn = f"<{count} x {ot}>", f"v{count}{INTRINSIC_NAMES.get(ot, '')}"
            template = ALU_TEMPLATES[first.op][kind_of(operand_dtype)].replace("i1", f"<{count} x i1>")
            if "@llvm." in template:
                intrinsic = template.split("@")[1].split("(")[0].replace("{tn}", otn)
                declarations.add(f"declare {ovt} @{intrinsic}({', '.join([ovt] * template.count('{t} {'))})")
            one = "<" + ", ".join([f"{ot} {render_const(1.0, operand_dtype)}"] * count) + ">"
            lines.append(f"  {name} = " + template.format(t=ovt, tn=otn, one=one, **dict(zip("abc", operands))))
        rendered[lanes.nodes] = name
        return name

    def render_store_vector(
        self, out: str, group: StoreVector, value, names, declarations: set[str], reads
    ) -> list[str]:
        """The stores of `group` as one vector store of its value's lanes, computed as vectors (those of one loop
        nest share what they compute: the rows of a block add the same vector of biases)."""
        lines: list[str] = []
        rendered = reads.setdefault(("stores", group.loops), {})
        stored = self.render_lanes(out, group.value, value, names, declarations, lines, rendered)
        first = group.stores[0]
        dtype = first.src[2].dtype
        t = MEMORY_TYPES[dtype]
        return [
            *lines,
            f"  {out}_ptr = getelementptr inbounds {t}, ptr {names[first.src[0]]}, i64 {value(first.src[1])}",
            f"  store <{len(group.stores)} x {t}> {stored}, ptr {out}_ptr, align {dtype.itemsize}",
        ]

    @staticmethod
    def render_load(out: str, node: UOp, value, address: str | None = None) -> list[str]:
        """A load from a buffer (or the stack buffer at `address`)."""
        buffer, index = node.src[0], node.src[1]
        address = address or f"%data{buffer.arg[0]}"
        memory_type, register_type = MEMORY_TYPES[node.dtype], LLVM_TYPES[node.dtype]
        lines, index_text = [], value(index)
        if len(node.src) == 3:  # a gated load reads element 0 when invalid, then selects zero
            lines.append(f"  {out}_index = select i1 {value(node.src[2])}, i64 {index_text}, i64 0")
            index_text = f"{out}_index"
        loaded = out if len(node.src) == 2 and node.dtype != dtypes.bool else f"{out}_raw"
        lines.append(f"  {out}_ptr = getelementptr inbounds {memory_type}, ptr {address}, i64 {index_text}")
        lines.append(f"  {loaded} = load {memory_type}, ptr {out}_ptr")
        if node.dtype == dtypes.bool:
            target = out if len(node.src) == 2 else f"{out}_bool"
            lines.append(f"  {target} = trunc i8 {loaded} to i1")
            loaded = target
        if len(node.src) == 3:
            lines.append(
                f"  {out} = select i1 {value(node.src[2])}, {register_type} {loaded}, {register_type} {render_const(0, node.dtype)}"
            )
        return lines

    @staticmethod
    def render_branched_load(out: str, node: UOp, value, block: str) -> list[str]:
        """A gated load in a loop left to LLVM's vectorizer: a load only where the gate holds, which the vectorizer
        turns into a masked vector load (a select of the index, as `render_load` does, would make it a gather)."""
        buffer, index, gate = node.src
        memory_type, register_type = MEMORY_TYPES[node.dtype], LLVM_TYPES[node.dtype]
        label = out[1:]
        lines = [
            f"  {out}_ptr = getelementptr {memory_type}, ptr %data{buffer.arg[0]}, i64 {value(index)}",
            f"  br i1 {value(gate)}, label %{label}_load, label %{label}_join",
            f"{label}_load:",
            f"  {out}_raw = load {memory_type}, ptr {out}_ptr",
        ]
        loaded = f"{out}_raw"
        if node.dtype == dtypes.bool:
            lines.append(f"  {out}_bool = trunc i8 {loaded} to i1")
            loaded = f"{out}_bool"
        zero = render_const(0, node.dtype)
        return lines + [
            f"  br label %{label}_join",
            f"{label}_join:",
            f"  {out} = phi {register_type} [{loaded}, %{label}_load], [{zero}, %{block}]",
        ]

    @staticmethod
    def render_shift(out: str, node: UOp, a: str, b: str) -> list[str]:
        """A shift whose amount may be outside [0, bits) (poison in LLVM): there, every bit is shifted out (0, or
        the sign in every bit for an arithmetic shift right). The poison of the unused shift never reaches a select's
        result."""
        t, bits = LLVM_TYPES[node.dtype], node.dtype.bits
        signed = not node.dtype.is_unsigned
        lines = [f"  {out}_in_range = icmp ult {t} {b}, {bits}"]  # unsigned: a negative amount is out of range too
        if node.op is Ops.SHR and signed:
            return lines + [
                f"  {out}_amount = select i1 {out}_in_range, {t} {b}, {t} {bits - 1}",
                f"  {out} = ashr {t} {a}, {out}_amount",
            ]
        instruction = "shl" if node.op is Ops.SHL else "lshr"
        return lines + [
            f"  {out}_shifted = {instruction} {t} {a}, {b}",
            f"  {out} = select i1 {out}_in_range, {t} {out}_shifted, {t} 0",
        ]

    @staticmethod
    def render_division(out: str, node: UOp, value) -> list[str]:
        a, b = node.src
        t = LLVM_TYPES[node.dtype]
        signed = not node.dtype.is_unsigned
        instruction = ("sdiv" if signed else "udiv") if node.op is Ops.IDIV else ("srem" if signed else "urem")
        may_be_zero, may_overflow = division_hazards(node)
        if not (may_be_zero or may_overflow):
            return [f"  {out} = {instruction} {t} {value(a)}, {value(b)}"]
        # where the divisor is 0, or -1 with a dividend that may be the most negative value, divide by 1 instead and
        # select the defined result: 0 for a zero divisor; -a (wrapping) and remainder 0 for -1
        hazards = [(f"{out}_zero", 0)] * may_be_zero + [(f"{out}_minus_one", -1)] * may_overflow
        lines = [f"  {name} = icmp eq {t} {value(b)}, {divisor}" for name, divisor in hazards]
        hazard = hazards[0][0]
        if len(hazards) == 2:
            lines.append(f"  {out}_hazard = or i1 {out}_zero, {out}_minus_one")
            hazard = f"{out}_hazard"
        lines += [
            f"  {out}_divisor = select i1 {hazard}, {t} 1, {t} {value(b)}",
            f"  {out}_quotient = {instruction} {t} {value(a)}, {out}_divisor",
        ]
        if may_overflow and node.op is Ops.IDIV:
            lines += [
                f"  {out}_negated = sub {t} 0, {value(a)}",
                f"  {out}_defined = select i1 {out}_minus_one, {t} {out}_negated, {t} 0",
            ]
            return lines + [f"  {out} = select i1 {hazard}, {t} {out}_defined, {t} {out}_quotient"]
        return lines + [f"  {out} = select i1 {hazard}, {t} 0, {t} {out}_quotient"]
