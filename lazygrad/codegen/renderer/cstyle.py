"""C-style renderers: one table-driven base for C, OpenCL C and CUDA C.

A linear program becomes one function. Every non-constant value gets its own variable (`v12`), declared where the
linear program computes it, so templates may repeat an operand without recomputing it; constants are written inline.
Loops become `for` loops and accumulators plain variables. The three languages differ only in a few attributes:
how a kernel and its buffers are declared, the type names, the math function names, how half is loaded, stored and
rounded, and (for the GPU-style languages) the thread index builtin.

Semantics follow the LLVM renderer and the PYTHON device:

- integers follow lazygrad/uop/alu.py: signed ADD, MUL and NEG that may overflow are computed in the unsigned type
  of the same width (which wraps; C leaves signed overflow undefined), a signed SHL always is, a shift whose amount
  may be out of range selects the result of shifting every bit out, and a division that may divide by zero (giving 0) or the most negative
  value by -1 (giving that value back) is guarded, all decided from the operands' ranges, so index math stays plain;
- MAX on floats propagates NaN; CMPNE on floats is unordered-not-equal (true when either side is NaN);
- a cast to bool is `!= 0`; bools are stored as one byte;
- a cast from float to a 32- or 64-bit integer is defined out of range too, as PYTHON's: a value int64 cannot hold
  becomes int64's most negative value (C leaves it undefined; NVIDIA's GPUs saturate), and a 32-bit integer is
  taken from the 64-bit one, so it wraps;
- float constants are written as exact hexadecimal literals, inf and nan included;
- half values are held in `float` registers and rounded to half after every operation, so every language computes
  what PYTHON computes, including on devices without half arithmetic (PoCL has no cl_khr_fp16). Memory holds
  real halves.

C kernels take the range [start, end) of their outermost global loop, so the CPU runtime can split it across cores,
and the buffers' addresses as one array.
GPU-style languages (OpenCL and CUDA) only spell what the program holds (codegen/threads.py decides it): the block
and thread indices (SPECIAL), memory the threads of a block share (DEFINE_LOCAL), barriers, reads of another
thread's value in the warp (SHUFFLE, CUDA's `__shfl_sync`), and stores under a gate. OpenCL on CPU drivers also
computes a loop in vector types (see opencl.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

import numpy as np

from lazygrad.codegen.renderer import TEAM, WARP, Renderer, Target, TensorCore
from lazygrad.codegen.transcendental import exp_rules, transcendental_rules
from lazygrad.codegen.vectorize import (
    Lanes,
    StoreVector,
    WideAccess,
    accumulator_vectors,
    lanes_of,
    replaced_by_vectors,
    store_vectors,
    wide_accesses,
)
from lazygrad.dtype import DType, dtypes
from lazygrad.uop.alu import division_hazards, may_wrap, shift_in_range
from lazygrad.uop.ops import OUTPUT_KINDS, WMMA_SOURCES, LoopKind, Ops, UOp

# op -> template per operand kind ("float", "int" for signed, "uint", "bool"); {a} {b} {c} are the operands, which
# are always variable names or constants, so no template needs extra parentheses around them.
ALU_TEMPLATES: dict[Ops, dict[str, str]] = {
    Ops.ADD: {"float": "{a} + {b}", "int": "{a} + {b}", "uint": "{a} + {b}", "bool": "{a} | {b}"},
    Ops.MUL: {"float": "{a} * {b}", "int": "{a} * {b}", "uint": "{a} * {b}", "bool": "{a} & {b}"},
    Ops.NEG: {"float": "-{a}", "int": "-{a}", "uint": "-{a}", "bool": "!{a}"},
    Ops.MAX: {
        "float": "({a} > {b} || {a} != {a}) ? {a} : {b}",
        "int": "{a} > {b} ? {a} : {b}",
        "uint": "{a} > {b} ? {a} : {b}",
        "bool": "{a} | {b}",
    },
    Ops.CMPLT: {kind: "{a} < {b}" for kind in ("float", "int", "uint", "bool")},
    Ops.CMPNE: {kind: "{a} != {b}" for kind in ("float", "int", "uint", "bool")},
    Ops.AND: {kind: "{a} & {b}" for kind in ("int", "uint", "bool")},
    Ops.OR: {kind: "{a} | {b}" for kind in ("int", "uint", "bool")},
    Ops.XOR: {kind: "{a} ^ {b}" for kind in ("int", "uint", "bool")},
    Ops.SHL: {"int": "{a} << {b}", "uint": "{a} << {b}"},
    Ops.SHR: {"int": "{a} >> {b}", "uint": "{a} >> {b}"},
    Ops.IDIV: {"int": "{a} / {b}", "uint": "{a} / {b}"},
    Ops.MOD: {"int": "{a} % {b}", "uint": "{a} % {b}", "float": "{fmod}({a}, {b})"},
    Ops.WHERE: {kind: "{a} ? {b} : {c}" for kind in ("float", "int", "uint", "bool")},
    Ops.RECIP: {"float": "1.0f / {a}"},
    Ops.FDIV: {"float": "{a} / {b}"},
    Ops.SQRT: {"float": "{sqrt}({a})"},
    Ops.EXP2: {"float": "{exp2}({a})"},
    Ops.LOG2: {"float": "{log2}({a})"},
    Ops.SIN: {"float": "{sin}({a})"},
    Ops.COS: {"float": "{cos}({a})"},
}
# signed integer ops computed in the unsigned type {u} of the same width, which wraps, then read back as signed {s}
WRAPPING_TEMPLATES: dict[Ops, str] = {
    Ops.ADD: "({s})(({u}){a} + ({u}){b})",
    Ops.MUL: "({s})(({u}){a} * ({u}){b})",
    Ops.NEG: "({s})(-({u}){a})",
    Ops.SHL: "({s})(({u}){a} << {b})",
}


class CStyleRenderer(Renderer):
    """Renders a linear program as a C function `void name(buffers...)`; subclasses change the dialect."""

    kernel_prefix = ""
    buffer_prefix = ""
    restrict = "restrict"
    # the block and thread indices (GPU-style languages)
    special_indices: dict[str, str] = {}
    # C kernels take (start, end) of their outermost global loop, so the runtime can split it across threads
    split_outer_loop = True
    # and the buffers' addresses as one array (see `render_entry`); GPU kernels take a parameter per buffer
    buffer_array = True
    # libm's exp2f/log2f/sinf are scalar calls that stop gcc vectorizing a loop: use polynomials, as LLVM does
    rewrites = transcendental_rules
    preamble = (
        "#include <math.h>\n"
        "#if defined(__FMA__) || defined(__ARM_FEATURE_FMA)\n"
        "#define lg_fmaf(a, b, c) __builtin_fmaf(a, b, c)\n#define lg_fma(a, b, c) __builtin_fma(a, b, c)\n"
        "#else\n"
        "#define lg_fmaf(a, b, c) ((a) * (b) + (c))\n#define lg_fma(a, b, c) ((a) * (b) + (c))\n"
        "#endif\n"
    ) + "".join(
        f"static inline {t} {name}({t} a, {t} b) {{\n"
        f"  {t} m = a > b ? a : b;\n"
        f"  {u} bits_a, bits_m, nan = -({u})(a != a);\n"
        "  __builtin_memcpy(&bits_a, &a, sizeof a);\n"
        "  __builtin_memcpy(&bits_m, &m, sizeof m);\n"
        "  bits_m = (bits_a & nan) | (bits_m & ~nan);\n"
        "  __builtin_memcpy(&m, &bits_m, sizeof m);\n"
        "  return m;\n"
        "}\n"
        for t, u, name in (("float", "unsigned int", "lg_maxf"), ("double", "unsigned long long", "lg_max"))
    )
    # the float max of two values, a NaN in `a` or `b` the result, for the types that compute floats: gcc compiles
    # the template's `(a > b || a != a) ? a : b` to compares and jumps, which also stop it vectorizing a loop
    # (ResNet18's max-pool on CPU=1, one core: 1.4 -> 0.13 ms); the preamble's functions select the NaN with bit masks
    float_max = {"float": "lg_maxf", "double": "lg_max"}
    # the function of each type that a fused multiply-add (see Renderer.fused_product) is written with
    fused_multiply_add = {"float": "lg_fmaf", "double": "lg_fma"}
    # The C device leaves accumulator updates to gcc (-ffp-contract=fast), which vectorizes a block of scalar
    # accumulators as a group of sums (not of fused multiply-adds) and fuses them after.
    fuses_accumulator_updates = False
    half_preamble = ""
    can_join = True  # several kernels compile as one translation unit: one run of the compiler (see `join`)
    # a register block's accumulators as vectors of GCC's vector extensions (see codegen/vectorize.py), which gcc
    # does not find by itself
    vector_accumulators = True
    # a reduce loop codegen left to the compiler's vectorizer (VECTORIZE) says, by `#pragma omp simd reduction`,
    # that its sums and products may be reassociated (what LLVM's `reassoc` flags say to LLVM): gcc vectorizes no
    # float reduction otherwise, and no flag allows it for these loops alone; loops whose float sums stay in order
    # say `if(0)` where gcc 12 would vectorize them wrongly (see `simd_reduction_clauses`)
    simd_reductions = True
    register_types = {
        dtypes.bool: "_Bool",
        dtypes.int8: "signed char",
        dtypes.uint8: "unsigned char",
        dtypes.int16: "short",
        dtypes.uint16: "unsigned short",
        dtypes.uint64: "unsigned long long",
        dtypes.bfloat16: "unsigned short",  # memory only: codegen/narrow_dtypes.py computes it in float32
        dtypes.int32: "int",
        dtypes.uint32: "unsigned int",
        dtypes.int64: "long long",
        dtypes.float16: "float",
        dtypes.float32: "float",
        dtypes.float64: "double",
    }
    memory_types = register_types | {dtypes.bool: "unsigned char", dtypes.float16: "_Float16"}
    int64_suffix = "ll"
    infinity = "INFINITY"
    nan = "NAN"
    unsigned_types = {dtypes.int32: "unsigned int", dtypes.int64: "unsigned long long"}
    math_functions = {"sqrt": "sqrtf", "exp2": "exp2f", "log2": "log2f", "sin": "sinf", "cos": "cosf", "fmod": "fmodf"}
    double_math_functions = {"sqrt": "sqrt", "exp2": "exp2", "log2": "log2", "sin": "sin", "cos": "cos", "fmod": "fmod"}
    half_load = "(float){buffer}[{index}]"
    half_store = "{buffer}[{index}] = (_Float16){value};"
    half_round = "(float)(_Float16)({a})"
    shared_prefix = ""
    barrier = ""

    # ---- values -------------------------------------------------------------------------------------------------

    def render_const(self, value, dtype: DType) -> str:
        """A constant as a literal of `dtype`'s register type; negative literals are parenthesized."""
        if dtype == dtypes.bool:
            return "1" if value else "0"
        if dtype.is_int:
            return self.render_int(int(value), dtype)
        if dtype == dtypes.float16:
            value = float(np.float16(value))
        double = dtype.itemsize == 8
        if math.isnan(value) or math.isinf(value):
            # (a double's as a double: fmod and other overloaded functions would find a float argument ambiguous)
            special = self.nan if math.isnan(value) else self.infinity if value > 0 else f"(-{self.infinity})"
            return f"(({self.register_types[dtype]}){special})" if double else special
        mantissa, exponent = float.hex(float(value) if double else float(np.float32(value))).split("p")
        text = f"{mantissa.rstrip('0').rstrip('.')}p{exponent}{'' if double else 'f'}"  # exact: 0x1.8p+1f is 3.0f
        return f"({text})" if text.startswith("-") else text

    def render_int(self, value: int, dtype: DType) -> str:
        if dtype.is_unsigned:
            return f"{value}u"
        suffix = self.int64_suffix if dtype.bits == 64 else ""
        if value == -(1 << (dtype.bits - 1)):  # the most negative value has no literal of its own
            return f"(-{(1 << (dtype.bits - 1)) - 1}{suffix}-1{suffix})"
        return f"({value}{suffix})" if value < 0 else f"{value}{suffix}"

    def value(self, node: UOp) -> str:
        return self.render_const(node.arg, node.dtype) if node.op is Ops.CONST else self.names[node]

    # ---- the function -------------------------------------------------------------------------------------------

    def render(self, name: str, program: list[UOp]) -> str:
        self.names: dict[UOp, str] = {}
        self.lines: list[str] = []
        self.depth = 1
        self.uses_half = any(node.dtype == dtypes.float16 for node in program)
        outer_loop = next((node for node in program if node.op is Ops.RANGE and node.arg[1] is LoopKind.GLOBAL), None)
        self.split_loop = outer_loop if self.split_outer_loop else None
        self.vector_loop, self.varying, self.strides = None, set(), {}
        self.find_vector_loop(program)
        self.choose_accumulator_vectors(program)
        accesses = wide_accesses(program, self.target.wide_bytes) if self.target.wide_bytes and self.wide_load else []
        self.wide_lanes = {node: (access, lane) for access in accesses for lane, node in enumerate(access.nodes)}
        self.wide_names: dict[WideAccess, str] = {}  # a wide load -> the vector it read into
        self.reductions = self.simd_reduction_clauses(program) if self.simd_reductions else {}
        # the op that combines two partial results of each accumulator: the update stored into it
        self.combine_ops = {node.src[0]: node.src[1].op for node in program if node.op is Ops.STORE}
        written = {node.src[0] for node in program if node.op is Ops.STORE and node.src[0].op is Ops.DEFINE_GLOBAL}
        parameters = sorted((node for node in program if node.op is Ops.DEFINE_GLOBAL), key=lambda node: node.arg[0])
        for position, node in enumerate(program):
            self.render_node(position, node)
        signature = [self.render_parameter(node, node in written) for node in parameters]
        if self.split_outer_loop:
            index = self.register_types[dtypes.index]
            signature += [f"{index} start", f"{index} end"]
        header = self.preamble + (self.render_half_preamble() if self.uses_half else "")
        header += "".join(sorted({self.vector_typedef(*shape) for shape in self.vector_shapes}))
        body = "\n".join(self.lines)
        if not self.buffer_array:
            return f"{header}{self.kernel_prefix}void {name}({', '.join(signature)}) {{\n{body}\n}}\n"
        # the body keeps restrict parameters (so loops vectorize without overlap checks) behind the entry point
        entry = self.render_entry(name, [(node, node in written) for node in parameters])
        return f"{header}static void {name}_body({', '.join(signature)}) {{\n{body}\n}}\n{entry}"

    def join(self, sources: list[str]) -> str:
        """One translation unit: the preamble once, then each kernel's functions (every kernel's names differ)."""
        return self.preamble + "".join(source.removeprefix(self.preamble) for source in sources)

    def render_kernel_runner(self, name: str) -> str:
        """`void name(void **table, int64 team, int64 count)` and `void name_worker(void *unused, int64 team,
        int64 number)`: the LLVM renderer's kernel runner and worker (see `LLVMRenderer.render_kernel_runner`), in
        C with the compiler's atomic builtins."""
        index, t = self.register_types[dtypes.index], TEAM
        return f"""typedef void (*lg_kernel)(void **, {index}, {index});
#if defined(__x86_64__) || defined(__i386__)
#define lg_pause() __builtin_ia32_pause()
#else
#define lg_pause() ((void)0)
#endif
int sched_yield(void);
static void lg_wait({index} *spins) {{
  if ((*spins)++ < {t.spins}) lg_pause(); else sched_yield();
}}
static void {name}_chunks({index} *next, lg_kernel function, void **buffers, {index} outer, {index} chunk) {{
  for (;;) {{
    {index} start = __atomic_fetch_add(next, chunk, __ATOMIC_RELAXED);
    if (start >= outer) return;
    function(buffers, start, start + chunk < outer ? start + chunk : outer);
  }}
}}
void {name}(void **table, {index} team_address, {index} count) {{
  {index} *team = ({index} *)team_address, epoch = __atomic_load_n(&team[{t.state}], __ATOMIC_ACQUIRE) / {t.epoch_unit};
  for ({index} i = 0; i < count; i++) {{
    lg_kernel function = (lg_kernel)table[{t.table} * i];
    void **buffers = (void **)table[{t.table} * i + 1];
    {index} outer = ({index})table[{t.table} * i + 2], chunk = ({index})table[{t.table} * i + 3];
    if (chunk == 0) {{
      function(buffers, 0, outer);
      continue;
    }}
    team[{t.job}] = ({index})function;
    team[{t.job} + 1] = ({index})buffers;
    team[{t.job} + 2] = outer;
    team[{t.job} + 3] = chunk;
    team[{t.next}] = 0;
    __atomic_store_n(&team[{t.state}], ++epoch * {t.epoch_unit}, __ATOMIC_RELEASE);
    {name}_chunks(&team[{t.next}], function, buffers, outer, chunk);
    __atomic_fetch_or(&team[{t.state}], {t.closed}, __ATOMIC_ACQ_REL);
    for ({index} spins = 0; __atomic_load_n(&team[{t.state}], __ATOMIC_ACQUIRE) & {t.closed - 1};) lg_wait(&spins);
  }}
}}
void {name}_worker(void *unused, {index} team_address, {index} number) {{
  {index} *team = ({index} *)team_address, last = 0, spins = 0, lingered = 0;
  for (;;) {{
    {index} state = __atomic_load_n(&team[{t.state}], __ATOMIC_ACQUIRE), epoch = state / {t.epoch_unit};
    if ((state & {t.closed}) || epoch == last) {{
      if (!__atomic_load_n(&team[{t.idle}], __ATOMIC_RELAXED)) lingered = 0;
      else if (lingered++ >= {t.linger}) return;
      lg_wait(&spins);
      continue;
    }}
    if (!__atomic_compare_exchange_n(&team[{t.state}], &state, state + 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
      continue;
    {name}_chunks(&team[{t.next}], (lg_kernel)team[{t.job}], (void **)team[{t.job} + 1], team[{t.job} + 2],
                  team[{t.job} + 3]);
    __atomic_fetch_sub(&team[{t.state}], 1, __ATOMIC_RELEASE);
    last = epoch, spins = 0, lingered = 0;
  }}
}}
"""

    def render_entry(self, name: str, parameters: list[tuple[UOp, bool]]) -> str:
        """The function the runtime calls, `void name(void **buffers, int64 start, int64 end)`: it passes the
        addresses in the array to the body. One array, not a parameter per buffer, because a call through ctypes
        takes at most 1024 arguments."""
        index = self.register_types[dtypes.index]
        addresses = [f"({self.parameter_type(node, written)})buffers[{node.arg[0]}]" for node, written in parameters]
        call = ", ".join([*addresses, "start", "end"])
        return f"void {name}(void **buffers, {index} start, {index} end) {{\n  {name}_body({call});\n}}\n"

    def render_half_preamble(self) -> str:
        """Definitions a kernel that uses half needs."""
        return self.half_preamble

    def render_parameter(self, node: UOp, written: bool) -> str:
        return f"{self.parameter_type(node, written)} data{node.arg[0]}"

    def parameter_type(self, node: UOp, written: bool) -> str:
        constant = "" if written else "const "
        return f"{self.buffer_prefix}{constant}{self.memory_types[node.dtype]}* {self.restrict}"

    def emit(self, line: str) -> None:
        self.lines.append("  " * self.depth + line)

    def declare(self, node: UOp, name: str, expression: str) -> None:
        self.names[node] = name
        self.emit(f"{self.register_types[node.dtype]} {name} = {expression};")

    def render_node(self, position: int, node: UOp) -> None:
        op, src = node.op, node.src
        if op is Ops.DEFINE_GLOBAL:
            self.names[node] = f"data{node.arg[0]}"
        elif op is Ops.ENDRANGE:
            self.depth -= 1
            self.emit("}")
            # (the vectors read inside the loop are out of scope after it: the same loop opened again, as a reduce
            # run before the loops around its twin, reads them anew)
            self.vector_reads = self.reads_before_loops.pop()
        elif op is Ops.SPECIAL:
            index = self.register_types[node.dtype]
            self.declare(node, f"{node.arg[0][0]}idx{position}", f"({index}){self.special_indices[node.arg[0]]}")
        elif op is Ops.DEFINE_LOCAL:
            self.render_shared(node)
        elif op is Ops.BARRIER:
            self.emit(self.barrier)
        elif op is Ops.PREFETCH:  # (its copies are rendered: what it adds is where the linearizer put them)
            pass
        elif node in self.varying:
            self.render_vector_node(position, node)
        elif op is Ops.RANGE:
            self.render_range(position, node)
        elif node in self.stored_at:
            self.render_store_vector(position, self.stored_at[node])
        elif node in self.lane_of or (op is Ops.LOAD and src and src[0] in self.lane_of):
            if not (node in self.replaced and len(src) == 1):  # (a read after the loop only vector stores used)
                self.render_vector_accumulator(position, node)
        elif node in self.replaced:
            pass  # (its vector's update stands in for it)
        elif op is Ops.DEFINE_ACC:
            self.declare(node, self.accumulator_name(node), self.render_const(node.arg[0], node.dtype))
        elif op is Ops.LOAD and src[0].op is Ops.DEFINE_ACC:
            self.render_accumulator_read(f"v{position}", node)
        elif op is Ops.STORE and src[0].op is Ops.DEFINE_ACC:
            self.emit(f"{self.names[src[0]]} = {self.value(src[1])};")
        elif node in self.wide_lanes:
            self.render_wide_lane(position, node, *self.wide_lanes[node])
        elif op is Ops.LOAD:
            self.render_load(position, node)
        elif op is Ops.STORE:
            self.render_store(node)
        elif op is Ops.CAST:
            self.declare(node, f"v{position}", self.render_cast(self.value(src[0]), src[0].dtype, node.dtype))
        elif op is Ops.BITCAST:
            self.declare(node, f"v{position}", self.render_bitcast(self.value(src[0]), src[0].dtype, node.dtype))
        else:
            self.declare(node, f"v{position}", self.render_alu(node))

    @staticmethod
    def accumulator_name(accumulator: UOp) -> str:
        """The variable of an accumulator (a DEFINE_ACC) rendered as a scalar (or a tensor-core fragment)."""
        return f"acc{accumulator.arg[1]}"

    def simd_reduction_clauses(self, program: list[UOp]) -> dict[int, str]:
        """The `#pragma omp simd` clauses of the reduce loops, by the loop's position in `program` (the same loop node
        can open twice: a reduce computed once before the outputs' loops, and again inside them).

        A reduce loop left to the compiler's vectorizer whose accumulators all add or multiply, as scalars, names
        them in reduction clauses (a promise that they are its only dependences from one iteration to the next,
        which may be reassociated). Any other reduce loop that carries a float accumulator updated more than once
        an iteration (an unrolled reduce, or a loop inside it) says `if(0)`: gcc 12 must not vectorize it. Its
        in-order vectorization of such a chain of updates merges the order of the chain's reads into the chain
        and adds some elements twice (GCC bug 110381: the sum of a flipped (25, 6) array came out 120 too large).
        A loop whose accumulators are updated once an iteration each (a register block) stays gcc's to vectorize:
        each accumulator is a lane of its own, still added up in order."""
        updates: dict[int, dict[str, list[str]]] = {}
        in_order: set[int] = set()
        updated: set[tuple[int, UOp]] = set()  # (a loop, an accumulator it carries updated in its own body)
        open_loops: list[int] = []
        end_of: dict[int, int] = {}  # a loop's position -> its ENDRANGE's
        defined_at: dict[UOp, int] = {}  # an accumulator -> its DEFINE_ACC's position
        for number, node in enumerate(program):
            if node.op is Ops.RANGE:
                open_loops.append(number)
            elif node.op is Ops.ENDRANGE:
                end_of[open_loops.pop()] = number
            elif node.op is Ops.DEFINE_ACC:
                defined_at[node] = number
            elif node.op is Ops.STORE and node.src[0].op is Ops.DEFINE_ACC:
                accumulator = node.src[0]
                scalar = accumulator not in self.lane_of  # (a vector accumulator adds lane by lane: no clause)
                for opened in open_loops:
                    kind = program[opened].arg[1]
                    if kind is LoopKind.VECTOR_REDUCE:
                        symbol = {Ops.ADD: "+", Ops.MUL: "*"}.get(node.src[1].op, "") if scalar else ""
                        names = updates.setdefault(opened, {}).setdefault(symbol, [])
                        if (name := self.accumulator_name(accumulator)) not in names:
                            names.append(name)
                    elif kind is LoopKind.REDUCE and scalar and accumulator.dtype.is_float:
                        if defined_at[accumulator] < opened:  # (one defined inside starts again each iteration)
                            if opened != open_loops[-1] or (opened, accumulator) in updated:
                                in_order.add(opened)
                            updated.add((opened, accumulator))
        clauses = {
            opened: " ".join(f"reduction({symbol}:{','.join(names)})" for symbol, names in by_op.items())
            for opened, by_op in updates.items()
            if "" not in by_op
        }
        # A short loop's vectors of partial sums are added up across their lanes at each exit. Where it is the
        # innermost of reduce loops with nothing else between them (a convolution's window), the pragma collapses
        # them into one loop, whose sums are added up once (ResNet18's stem weight gradient: 8.4 -> 5.3 ms).
        collapsed = {}
        for opened, clause in clauses.items():
            outermost, count = opened, 1
            loop = program[opened]
            if loop.src[0].op is Ops.CONST and loop.src[0].arg <= 4 * self.target.vector_width:
                while outermost > 0:
                    before = program[outermost - 1]
                    if not (
                        before.op is Ops.RANGE
                        and before.arg[1] is LoopKind.REDUCE
                        and before.src[0].op is Ops.CONST
                        and end_of[outermost - 1] == end_of[outermost] + 1
                    ):
                        break
                    outermost, count = outermost - 1, count + 1
            in_order.difference_update(range(outermost, opened))  # (their sums are the collapsed loop's)
            collapsed[outermost] = clause if count == 1 else f"collapse({count}) {clause}"
        return collapsed | {opened: "if(0)" for opened in in_order}

    def render_range(self, position: int, node: UOp) -> None:
        self.reads_before_loops.append(dict(self.vector_reads))
        end = self.value(node.src[0])
        index = self.register_types[node.dtype]
        if position in self.reductions:
            self.emit(f"#pragma omp simd {self.reductions[position]}")
        if node is self.split_loop:
            name = f"gidx{position}"
            self.names[node] = name
            self.emit(f"for ({index} {name} = start; {name} < end; {name}++) {{")
        else:
            name = f"{'gidx' if node.arg[1] in OUTPUT_KINDS else 'ridx'}{position}"
            self.names[node] = name
            self.emit(f"for ({index} {name} = 0; {name} < {end}; {name}++) {{")
        self.depth += 1

    def render_accumulator_read(self, name: str, node: UOp) -> None:
        self.declare(node, name, self.names[node.src[0]])

    def combine(self, accumulator: UOp, a: str, b: str) -> str:
        """The expression combining two partial results `a` and `b` of an accumulator (sums of ints wrap)."""
        op, dtype = self.combine_ops[accumulator], accumulator.dtype
        signed = dtype.is_int and not dtype.is_unsigned
        template = self.wrapping(op, dtype) if signed and op in WRAPPING_TEMPLATES else ALU_TEMPLATES[op][dtype.kind]
        expression = template.format(a=a, b=b)
        return self.half_round.format(a=expression) if dtype == dtypes.float16 else expression

    # ---- threads ------------------------------------------------------------------------------------------------

    def render_shared(self, node: UOp) -> None:
        """Memory the threads of a block share, declared at the top of the function (OpenCL requires it there); it
        holds register values (float for half, int for bool)."""
        element = self.register_types[dtypes.int32 if node.dtype == dtypes.bool else node.dtype]
        self.names[node] = f"shared{node.arg[0]}"
        self.lines.insert(0, f"  {self.shared_prefix}{element} shared{node.arg[0]}[{node.arg[1]}];")

    # ---- accumulators in vectors (C: GCC's vector extensions) ---------------------------------------------------

    def choose_accumulator_vectors(self, program: list[UOp]) -> None:
        """Set `accumulator_vectors`, `lane_of` (accumulator -> (its vector's number, its lane)), `stored_at` (the
        last store of each group of stores written as one vector store -> the group), `vector_shapes` (the vector
        types these use, as (dtype, lanes)) and `replaced` (the scalar updates and stores the vectors stand in for,
        and the values only those read)."""
        width = self.target.vector_width if self.vector_accumulators else 1
        # (with the vectors that add a computation's lanes, a sum of products, where C's vector operators compute it)
        vectors = accumulator_vectors(program, width, trees=True, strided=True) if width > 1 else []
        self.accumulator_vectors = [v for v in vectors if v.value is None or self.renders_lanes(v.value)]
        self.lane_of = lanes_of(self.accumulator_vectors)
        # the stores after them (a block's outputs, a copy's elements) as vector stores: gcc stores a block's lanes
        # one by one, each taken out of its vector
        stored = store_vectors(program, width, self.accumulator_vectors) if width > 1 else []
        stored = [group for group in stored if self.renders_lanes(group.value)]
        self.stored_at = {group.last: group for group in stored}
        self.vector_shapes = {(v.accumulators[0].dtype, len(v.accumulators)) for v in self.accumulator_vectors}
        self.vector_shapes |= {(group.value.nodes[0].dtype, len(group.stores)) for group in stored}
        self.replaced = replaced_by_vectors(program, self.accumulator_vectors, stored)
        # the first load of a vector (with the loops of a computation's lanes that read it) -> the vector's name
        self.vector_reads: dict[object, str] = {}
        self.reads_before_loops: list[dict[object, str]] = []  # (those of the loops open now, outermost first)

    def vector_type(self, dtype: DType, lanes: int) -> str:
        return f"lg_{self.register_types[dtype]}{lanes}"

    def vector_typedef(self, dtype: DType, lanes: int) -> str:
        """A vector type's declaration (C allows the same typedef again: kernels compiled together each have it)."""
        vector_size = f"__attribute__((vector_size({dtype.itemsize * lanes})))"
        scalar, vector = self.register_types[dtype], self.vector_type(dtype, lanes)
        typedef = f"typedef {scalar} {vector} {vector_size};\n"
        if scalar not in self.fused_multiply_add:
            return typedef
        # the fused multiply-add of vectors, lane by lane (gcc makes it one vector FMA); kernels compiled together
        # each define it
        guard, fused = f"{vector.upper()}_FMA", self.fused_multiply_add[scalar]
        return typedef + (
            f"#ifndef {guard}\n#define {guard}\n"
            f"static inline {vector} {vector}_fma({vector} a, {vector} b, {vector} c) {{\n"
            f"  {vector} r;\n  for (int i = 0; i < {lanes}; i++) r[i] = {fused}(a[i], b[i], c[i]);\n  return r;\n}}\n"
            "#endif\n"
        )

    def render_vector_accumulator(self, position: int, node: UOp) -> None:
        """An accumulator of a vector: lane 0 declares the vector, lane 0's read in the loop updates it (every value
        it adds is computed by then: the linearizer emits a block's values before its updates), and the read after
        the loop takes the lane out."""
        accumulator = node if node.op is Ops.DEFINE_ACC else node.src[0]
        number, lane = self.lane_of[accumulator]
        vector, name = self.accumulator_vectors[number], f"vacc{number}"
        vector_type = self.vector_type(accumulator.dtype, len(vector.accumulators))
        if node.op is Ops.DEFINE_ACC:
            if lane == 0:
                start = ", ".join(self.render_const(a.arg[0], a.dtype) for a in vector.accumulators)
                self.emit(f"{vector_type} {name} = {{{start}}};")
        elif len(node.src) == 1:
            self.declare(node, f"v{position}", f"{name}[{lane}]")
        elif lane == 0 and vector.value is not None:  # (a computation's lanes, added as each lane's was)
            added = self.render_lanes(vector.value, vector_type, position, vector.loops)
            self.emit(f"{name} += {added};")
        elif lane == 0:
            first = vector.loads[0]
            read = self.vector_reads.get((first, vector.stride))
            if read is None:
                read = self.vector_reads[(first, vector.stride)] = f"vread{position}"
                self.emit_vector_read(read, vector_type, first, vector.stride, len(vector.loads))
            product = read if vector.common is None else f"{read} * {self.value(vector.common)}"
            self.emit(f"{name} += {product};")

    def emit_vector_read(self, read: str, vector_type: str, first: UOp, stride: int, lanes: int) -> None:
        """Declare `read`: the `lanes` elements `stride` apart from where the load `first` reads (one copy where
        they are consecutive, else a gather)."""
        address = f"&{self.names[first.src[0]]}[{self.value(first.src[1])}]"
        if stride == 1:
            self.emit(f"{vector_type} {read};")
            self.emit(f"__builtin_memcpy(&{read}, {address}, sizeof({read}));")
            return
        self.emit(f"const {self.register_types[first.dtype]}* {read}_at = {address};")
        elements = ", ".join(f"{read}_at[{lane * stride}]" for lane in range(lanes))
        self.emit(f"{vector_type} {read} = {{{elements}}};")

    # the ops of a computation's lanes that C's vector operators compute as each lane did
    LANE_OPERATORS = {Ops.ADD: "({a} + {b})", Ops.MUL: "({a} * {b})", Ops.NEG: "(-{a})"}

    def renders_lanes(self, lanes: Lanes) -> bool:
        """Whether `render_lanes` computes `lanes` (loads, values the same in every lane, constants, the lanes of an
        accumulator vector or scalar accumulators, and the LANE_OPERATORS on them)."""
        if lanes.kind == "op":
            return lanes.nodes[0].op in self.LANE_OPERATORS and all(map(self.renders_lanes, lanes.sources))
        return lanes.kind in ("same", "constants", "load", "accumulators", "scalars")

    def render_lanes(self, lanes: Lanes, vector_type: str, position: int, loops: tuple[UOp, ...]) -> str:
        """`lanes` as an expression of `vector_type` (a value the same in every lane stays a scalar: C converts it);
        a load is one read of the first lane's address, shared by the vectors in the same `loops` that read it."""
        first = lanes.nodes[0]
        if lanes.kind == "same":
            return self.value(first)
        if lanes.kind == "constants":
            return f"({vector_type}){{{', '.join(self.render_const(n.arg, n.dtype) for n in lanes.nodes)}}}"
        if lanes.kind == "accumulators":
            return f"vacc{lanes.vector}"
        if lanes.kind == "scalars":
            return f"({vector_type}){{{', '.join(map(self.value, lanes.nodes))}}}"
        if lanes.kind == "load":
            key = (loops, first, lanes.stride)  # (one load may start a vector of each stride)
            read = self.vector_reads.get(key)
            if read is None:
                read = self.vector_reads[key] = f"vread{position}_{len(self.vector_reads)}"
                self.emit_vector_read(read, vector_type, first, lanes.stride, len(lanes.nodes))
            return read
        if (fused := self.fused_lanes(lanes)) is not None:  # (as the scalar code does, see render_fused)
            zero = f"({vector_type}){{}}"  # (x - 0 puts a scalar in every lane, and is x, even -0: unlike 0 + x)
            a, b, c = (f"{self.render_lanes(part, vector_type, position, loops)} - {zero}" for part in fused[:3])
            return f"{vector_type}_fma({'-' if fused[3] else ''}({a}), {b}, {c})"
        operands = [self.render_lanes(source, vector_type, position, loops) for source in lanes.sources]
        return self.LANE_OPERATORS[first.op].format(**dict(zip("ab", operands)))

    def render_store_vector(self, position: int, group: StoreVector) -> None:
        """The stores of `group` as one vector store of its value's lanes, computed with C's vector operators (a
        value the same in every lane is put in each)."""
        first, value = group.stores[0], group.value
        vector_type = self.vector_type(value.nodes[0].dtype, len(group.stores))
        if value.kind == "same":
            stored = f"({vector_type}){{{', '.join([self.value(value.nodes[0])] * len(group.stores))}}}"
        else:
            stored = self.render_lanes(value, vector_type, position, ("stores", *group.loops))
        self.emit(f"{vector_type} vstore{position} = {stored};")
        address = f"&{self.names[first.src[0]]}[{self.value(first.src[1])}]"
        self.emit(f"__builtin_memcpy({address}, &vstore{position}, sizeof(vstore{position}));")

    # ---- vectors (only languages with vector types render them) -------------------------------------------------

    def find_vector_loop(self, program: list[UOp]) -> None:
        """Set `vector_loop`, the loop an action (VECTORIZE) made one whose iterations are computed together as vector
        lanes, where this language spells it so (None: scalar code), and `varying`, the nodes whose value depends on
        it."""

    def render_vector_node(self, position: int, node: UOp) -> None:
        """Render a node computed in vector lanes; only reached when `find_vector_loop` found a loop."""
        raise RuntimeError(f"{type(self).__name__} found no vector loop, so it has no vector nodes to render")

    # ---- memory -------------------------------------------------------------------------------------------------

    def read_memory(self, buffer: str, index: str, dtype: DType, shared: bool = False) -> str:
        if shared:  # (register values)
            return f"{buffer}[{index}] != 0" if dtype == dtypes.bool else f"{buffer}[{index}]"
        if dtype == dtypes.float16:
            return self.half_load.format(buffer=buffer, index=index)
        if dtype == dtypes.bool:
            return f"{buffer}[{index}] != 0"
        return f"{buffer}[{index}]"

    def render_load(self, position: int, node: UOp) -> None:
        buffer, index = self.names[node.src[0]], self.value(node.src[1])
        name = f"v{position}"
        if node.src[0].op is Ops.DEFINE_LOCAL:  # (its third source is the barrier it waits for)
            self.declare(node, name, self.read_memory(buffer, index, node.dtype, shared=True))
            return
        if len(node.src) == 2:
            self.declare(node, name, self.read_memory(buffer, index, node.dtype))
            return
        # A gated load reads element 0 when invalid, then selects zero: no branch, so loops still vectorize. The index
        # is masked, not selected: gcc 12 turns a load whose index is chosen by the gate into a load under the gate
        # and vectorizes groups of those as masked loads, giving each later vector of a group the first vector's
        # mask (lanes zeroed or read past the buffer). Unconditional reads from valid addresses cannot go wrong so.
        valid = self.value(node.src[2])
        safe_index = f"{index} & -({self.register_types[node.src[1].dtype]}){valid}"
        self.declare(node, f"{name}_raw", self.read_memory(buffer, safe_index, node.dtype))
        self.declare(node, name, f"{valid} ? {name}_raw : {self.render_const(0, node.dtype)}")

    def render_wide_lane(self, position: int, node: UOp, access: WideAccess, lane: int) -> None:
        """A lane of a wide access (`wide_accesses`): a load's leading lane reads every lane's element as one vector,
        whose fields the lanes' values are; a store's last lane writes all of their values."""
        lanes, leader = len(access.nodes), access.nodes[access.leader]
        dtype = node.dtype if node.op is Ops.LOAD else node.src[2].dtype
        vector = f"{self.wide_types[dtype]}{lanes}"
        # (from the index of the lane that comes first, rendered by now: the vector starts that many lanes before it)
        address = f"{self.names[node.src[0]]} + {self.value(leader.src[1])}"
        address = f"{address} - {access.leader}" if access.leader else address
        if node.op is Ops.LOAD:
            if node is leader:
                self.wide_names[access] = f"w{position}"
                self.emit(f"{vector} w{position} = {self.wide_load.format(vector=vector, address=address)};")
            self.declare(node, f"v{position}", f"{self.wide_names[access]}.{'xyzw'[lane]}")
        elif lane == lanes - 1:
            values = ", ".join(self.value(store.src[2]) for store in access.nodes)
            self.emit(self.wide_store.format(vector=vector, address=address, values=values))

    # a wide access in the language: the read of a `vector` at an `address` aligned to its size, and the statement
    # writing its `values` there (empty: the renderer makes none, whatever its target allows); the vector types by
    # their lanes' type, the lane count after the name (OpenCL's names; CUDA's 64-bit integers differ)
    wide_load = ""
    wide_store = ""
    wide_types = {
        dtypes.float32: "float",
        dtypes.int32: "int",
        dtypes.uint32: "uint",
        dtypes.float64: "double",
        dtypes.int64: "long",
        dtypes.uint64: "ulong",
    }

    def render_store(self, node: UOp) -> None:
        buffer, index, value = self.names[node.src[0]], self.value(node.src[1]), node.src[2]
        if value.dtype == dtypes.float16 and node.src[0].op is Ops.DEFINE_GLOBAL:
            statement = self.half_store.format(buffer=buffer, index=index, value=self.value(value))
        else:
            statement = f"{buffer}[{index}] = {self.value(value)};"
        self.emit(f"if ({self.value(node.src[3])}) {statement}" if len(node.src) > 3 else statement)

    # ---- arithmetic ---------------------------------------------------------------------------------------------

    def render_cast(self, value: str, from_dtype: DType, to_dtype: DType) -> str:
        if to_dtype == dtypes.bool:
            return f"{value} != 0"
        if to_dtype == dtypes.float16:
            return self.half_round.format(a=f"(float){value}")
        if from_dtype.is_float and to_dtype.is_int and to_dtype.bits >= 32:
            # C leaves a float that the integer cannot hold undefined (x86 gives int64's most negative value, NVIDIA's
            # GPUs saturate): such values, NaN and infinities become int64's most negative value everywhere, and a
            # 32-bit result is taken from the 64-bit one, so values outside its range wrap
            wide = self.register_types[dtypes.int64]
            inside = f"({value}) >= -9223372036854775808.0f && ({value}) < 9223372036854775808.0f"
            whole = f"({inside} ? ({wide})({value}) : ({wide})(-9223372036854775807L - 1))"
            return whole if to_dtype.bits == 64 else f"({self.register_types[to_dtype]}){whole}"
        return f"({self.register_types[to_dtype]}){value}"

    def render_bitcast(self, value: str, from_dtype: DType, to_dtype: DType) -> str:
        """The same bits read as another type of the same size (a union: C's defined way to reinterpret)."""
        from_type, to_type = self.register_types[from_dtype], self.register_types[to_dtype]
        return f"((union {{ {from_type} from; {to_type} to; }}){{.from = {value}}}).to"

    def render_alu(self, node: UOp) -> str:
        if (fused := self.render_fused(node, self.value)) is not None:
            return fused
        operand_dtype = node.src[-1].dtype
        operands = dict(zip("abc", (self.value(source) for source in node.src)))
        template = self.integer_template(node) or ALU_TEMPLATES[node.op][operand_dtype.kind]
        if node.op is Ops.MAX and (function := self.float_max.get(self.register_types.get(operand_dtype, ""))):
            template = function + "({a}, {b})"
        functions = self.double_math_functions if operand_dtype.itemsize == 8 else self.math_functions
        expression = template.format(**operands, **functions)
        if node.dtype == dtypes.float16:
            return self.half_round.format(a=expression)
        return expression

    def render_fused(self, node: UOp, operand: Callable[[UOp], str]) -> str | None:
        """The float sum `node`, c + a*b (or c - a*b), as one fused multiply-add (`fused_multiply_add`) of its
        operands rendered by `operand`; None where `node` is no such sum."""
        if (fused := self.fused_operands(node)) is None:
            return None
        a, b, c = map(operand, fused[:3])
        return f"{self.fused_multiply_add[self.register_types[node.dtype]]}({'-' if fused[3] else ''}{a}, {b}, {c})"

    def wrapping(self, op: Ops, dtype: DType) -> str:
        """The template of a signed op computed in the unsigned type of the same width."""
        template = WRAPPING_TEMPLATES[op].replace("{s}", self.register_types[dtype])
        return template.replace("{u}", self.unsigned_types[dtype])

    def integer_template(self, node: UOp) -> str | None:
        """For an integer op whose plain C form is undefined for some inputs it may see, a template that is defined
        for all of them; None where the plain form is (floats, bools, and ints whose ranges rule the hazard out)."""
        dtype = node.dtype
        if not dtype.is_int:
            return None
        if node.op in (Ops.IDIV, Ops.MOD):
            return self.division_template(node)
        if node.op in (Ops.SHL, Ops.SHR):
            return self.shift_template(node)
        return self.wrapping(node.op, dtype) if node.op in WRAPPING_TEMPLATES and may_wrap(node) else None

    def shift_template(self, node: UOp) -> str:
        """A shift, with a signed SHL computed unsigned (shifting a negative value left is undefined in C), and an
        amount that may be out of range (undefined in C) replaced by the result of shifting every bit out."""
        signed, bits = not node.dtype.is_unsigned, node.dtype.bits
        shifted = (
            self.wrapping(Ops.SHL, node.dtype) if signed and node.op is Ops.SHL else ALU_TEMPLATES[node.op]["uint"]
        )
        if shift_in_range(node):
            return shifted
        in_range = f"{{b}} >= 0 && {{b}} < {bits}" if signed else f"{{b}} < {bits}u"
        if node.op is Ops.SHR and signed:  # the sign fills every bit: shift by bits - 1
            return f"{{a}} >> (({in_range}) ? {{b}} : {bits - 1})"
        return f"({in_range}) ? {shifted} : 0"

    def division_template(self, node: UOp) -> str | None:
        """Division and modulo guarded where the divisor may be 0 (the result is 0) or the most negative value may
        be divided by -1 (the quotient wraps to that value, the remainder is 0)."""
        may_be_zero, may_overflow = division_hazards(node)
        plain = ALU_TEMPLATES[node.op][node.dtype.kind]
        if may_overflow and node.op is Ops.IDIV:
            zero_guard = "{b} == 0 ? 0 : " if may_be_zero else ""
            return f"{{b}} == -1 ? {self.wrapping(Ops.NEG, node.dtype)} : ({zero_guard}{plain})"
        if may_overflow:
            return f"({{b}} == -1{' || {b} == 0' if may_be_zero else ''}) ? 0 : {plain}"
        return f"{{b}} == 0 ? 0 : {plain}" if may_be_zero else None


WMMA = "nvcuda::wmma::"
# a tensor core's input type: its name in shared memory, as a fragment's element, and how its memory is read (bfloat16
# values are stored as their bits)
MATRIX_TYPES = {
    dtypes.float16: ("half", "half", "{}"),
    dtypes.bfloat16: ("unsigned short", "__nv_bfloat16", "(const __nv_bfloat16*){}"),
    dtypes.float32: ("float", WMMA + "precision::tf32", "{}"),
}


# the PTX type of a tensor core's input whose tiles a warp loads by the load from shared memory (`wmma.load` with
# `.shared`, in LOAD_MATRIX: four registers a fragment): mma.h loads bfloat16 and TF32 tiles through generic
# addresses, and NVVM then keeps a 64-bit address per tile live and leaves the tensor-core steps a loop (a bfloat16
# 4096³ product: 64 mma in the PTX of fp16's, 16 in bfloat16's)
SHARED_LOADS = {dtypes.bfloat16: "bf16", dtypes.float32: "tf32"}
LOAD_MATRIX = """#ifndef LAZYGRAD_LOAD_MATRIX
#define LAZYGRAD_LOAD_MATRIX(use, layout, shape, type, fragment, tile, ldm) do { \\
  unsigned int* registers = reinterpret_cast<unsigned int*>(&(fragment).x[0]); \\
  asm volatile("wmma.load." #use ".sync.aligned." #layout "." #shape ".shared." #type " {%0, %1, %2, %3}, [%4], %5;" \\
    : "=r"(registers[0]), "=r"(registers[1]), "=r"(registers[2]), "=r"(registers[3]) \\
    : "r"((unsigned int)__cvta_generic_to_shared(tile)), "r"(ldm)); \\
} while (0)
#endif
"""


# the most shared memory a CUDA kernel may declare; a block that needs more asks for it at launch (dynamic shared
# memory, up to the device's opt-in limit: `Target.shared_memory`)
STATIC_SHARED_BYTES = 48 * 1024
MOST_THREADS_UNBOUNDED = 256  # a block of more gets __launch_bounds__ (see CUDARenderer.render)
SHARED_ALIGNMENT = 32  # (load/store_matrix_sync want 32-byte aligned tiles)
DYNAMIC_SHARED = """#ifndef LAZYGRAD_DYNAMIC_SHARED
#define LAZYGRAD_DYNAMIC_SHARED(bytes) extern __shared__ __align__(32) unsigned char lazygrad_shared[]
#endif
LAZYGRAD_DYNAMIC_SHARED({bytes});
"""


# a thread's access of 16 consecutive bytes of device memory as one vector (float4: one instruction, where four
# loads of a float make four); the CUDA shim checks its address is aligned, as a GPU requires
WIDE_ACCESSES = """#ifndef LAZYGRAD_WIDE
#define LAZYGRAD_WIDE(type, address) (*(type*)(address))
#endif
"""


# cp.async: a thread's copy of 4, 8 or 16 bytes from device to shared memory that goes on while the thread does;
# the thread waits for all of its copies before a barrier (the CUDA shim copies at once, and waits for nothing)
ASYNC_COPY_ARCHITECTURE = 80
ASYNC_COPIES = """#ifndef LAZYGRAD_COPY_ASYNC
#define LAZYGRAD_COPY_ASYNC(cache, to, start, bytes) asm volatile("cp.async." #cache ".shared.global [%0], [%1], " \\
  #bytes ";\\n" :: "r"((unsigned int)__cvta_generic_to_shared(to)), "l"(start))
#define LAZYGRAD_WAIT_COPIES() asm volatile("cp.async.wait_all;\\n" ::: "memory")
#endif
"""


def shuffle_mask(threads: int) -> str:
    """The lanes of a thread's warp that take part in a shuffle (all its block's threads there): every lane of a
    whole warp; the first `threads % 32` of a block's last warp where the block ends inside it."""
    if threads % WARP == 0:
        return "0xffffffffu"
    if threads < WARP:
        return f"{(1 << threads) - 1:#x}u"
    return f"(threadIdx.x < {threads - threads % WARP} ? 0xffffffffu : {(1 << threads % WARP) - 1:#x}u)"


def tensor_core_steps(program: list[UOp]) -> set[int]:
    """The positions of the loops of `program` over the tensor-core steps of one copy of the tiles (WMMAs inside, and
    no loop or barrier), which the CUDA renderer asks NVRTC to unroll, so that a warp's next tiles load while its
    tensor cores work on the last (NVRTC does so by itself for half tiles, not for bfloat16 or TF32 ones)."""
    steps, open_loops = set(), []  # (each open loop's position, whether it holds a WMMA, whether a loop or barrier)
    for position, node in enumerate(program):
        if node.op is Ops.RANGE or node.op is Ops.BARRIER:
            if open_loops:
                open_loops[-1][2] = True
            if node.op is Ops.RANGE:
                open_loops.append([position, False, False])
        elif node.op is Ops.ENDRANGE:
            start, holds_wmma, holds_more = open_loops.pop()
            if holds_wmma and not holds_more:
                steps.add(start)
        elif node.op is Ops.WMMA and open_loops:
            open_loops[-1][1] = True
    return steps


def reusable_shared(program: list[UOp]) -> set[frozenset[UOp]]:
    """The pairs of DEFINE_LOCALs of `program` that may lie in the same memory: every use of one comes before every
    use of the other (a use inside a loop spans the whole loop: the next iteration uses it again), with a barrier
    between them that runs wherever the earlier's last use does (in no loop that use is not in)."""
    loops: dict[int, int] = {}  # RANGE position -> its ENDRANGE's
    enclosing: list[frozenset[int]] = []  # per position, the RANGE positions of the loops open there
    open_loops: list[int] = []
    for position, node in enumerate(program):
        if node.op is Ops.RANGE:
            open_loops.append(position)
        elif node.op is Ops.ENDRANGE:
            loops[open_loops.pop()] = position
        enclosing.append(frozenset(open_loops))
    spans: dict[UOp, tuple[int, int, int, int]] = {}  # (first and last position spanned, first and last use)
    for position, node in enumerate(program):
        for source in node.src:
            if source.op is Ops.DEFINE_LOCAL:
                outer = min(enclosing[position], default=None)
                start, end = (position, position) if outer is None else (outer, loops[outer])
                first, last, first_use, _ = spans.get(source, (start, end, position, position))
                spans[source] = (min(first, start), max(last, end), min(first_use, position), position)
    barriers = [position for position, node in enumerate(program) if node.op is Ops.BARRIER]

    def before(earlier: tuple[int, int, int, int], later: tuple[int, int, int, int]) -> bool:
        last_use = earlier[3]
        return earlier[1] < later[0] and any(
            last_use < at < later[2] and enclosing[at] <= enclosing[last_use] for at in barriers
        )

    return {frozenset((one, other)) for one in spans for other in spans if before(spans[one], spans[other])}


class CUDARenderer(CStyleRenderer):
    """CUDA C. Half is `half` from cuda_fp16.h in memory; values are computed in float and rounded to half.
    Tensor cores (WMMA) through `nvcuda::wmma` from mma.h: a fragment accumulator is a DEFINE_ACC whose update is a
    WMMA, declared as an accumulator fragment and updated in place by mma_sync; the tiles and the accumulator's
    store go through shared memory of the matrix types, 32-byte aligned as load/store_matrix_sync require. A block
    whose shared memory passes STATIC_SHARED_BYTES gets it as one dynamic array (`dynamic_shared_bytes`), each
    DEFINE_LOCAL a pointer into it."""

    can_join = False  # (its runtime builds a program per kernel)
    vector_accumulators = False
    simd_reductions = False
    restrict = "__restrict__"
    split_outer_loop = False
    buffer_array = False
    # CUDA's exp2f/log2f/sinf/cosf are fast on the GPU, and sinf/cosf within 2 ulp everywhere; exp takes exp2f of
    # its reduced argument
    rewrites = exp_rules
    special_indices = {"block": "blockIdx.x", "thread": "threadIdx.x"}
    target = Target(
        vector_width=1,
        max_threads=1024,
        block_threads=256,
        shared_memory=STATIC_SHARED_BYTES,
        shuffle_lanes=WARP,
        wide_bytes=16,
    )
    shared_prefix = "__shared__ "
    barrier = "__syncthreads();"
    preamble = ""
    float_max: dict[str, str] = {}  # (a select of floats costs no branch on a GPU)
    fused_multiply_add = {"float": "fmaf", "double": "fma"}  # (NVRTC compiles with --fmad=false)
    fuses_accumulator_updates = True
    half_preamble = "#include <cuda_fp16.h>\n"
    register_types = CStyleRenderer.register_types | {dtypes.bool: "bool"}
    memory_types = register_types | {dtypes.bool: "unsigned char", dtypes.float16: "half"}
    infinity = "__int_as_float(0x7f800000)"
    nan = "__int_as_float(0x7fc00000)"
    half_load = "__half2float({buffer}[{index}])"
    wide_load = "LAZYGRAD_WIDE(const {vector}, {address})"  # (see WIDE_ACCESSES)
    wide_store = "LAZYGRAD_WIDE({vector}, {address}) = {vector}{{{values}}};"
    wide_types = CStyleRenderer.wide_types | {dtypes.int64: "longlong", dtypes.uint64: "ulonglong"}
    half_store = "{buffer}[{index}] = __float2half({value});"
    half_round = "__half2float(__float2half({a}))"
    bitcasts = {
        ("float32", "int32"): "__float_as_int",
        ("int32", "float32"): "__int_as_float",
        ("float32", "uint32"): "__float_as_uint",
        ("uint32", "float32"): "__uint_as_float",
        ("float64", "int64"): "__double_as_longlong",
        ("int64", "float64"): "__longlong_as_double",
    }

    # tensor cores: the minimum compute capability (major*10 + minor) of each input type's
    tensor_core_architectures = {dtypes.float16: 70, dtypes.bfloat16: 80, dtypes.float32: 80}
    tensor_cores = (
        TensorCore((16, 16, 16), dtypes.float16),
        TensorCore((16, 16, 16), dtypes.bfloat16),
        TensorCore((16, 16, 8), dtypes.float32),  # TF32
    )

    @classmethod
    def for_architecture(
        cls, architecture: int, multiprocessors: int = 1, shared_memory: int = STATIC_SHARED_BYTES
    ) -> CUDARenderer:
        """A renderer for code compiled for compute capability `architecture` (major*10 + minor; 0: without
        mma.h, so without tensor cores) on a GPU with `multiprocessors` and `shared_memory` bytes of it a block may
        have: its target has the tensor cores that architecture has."""
        tensor_cores = tuple(c for c in cls.tensor_cores if architecture >= cls.tensor_core_architectures[c.input])
        target = replace(
            cls.target,
            tensor_cores=tensor_cores,
            cores=multiprocessors,
            shared_memory=shared_memory,
            async_copies=architecture >= ASYNC_COPY_ARCHITECTURE,
        )
        return cls(target)

    @staticmethod
    def fragments_of(program: list[UOp]) -> tuple[dict[UOp, UOp], set[UOp], set[UOp]]:
        """The fragment accumulators (each with the WMMA that updates it), the values that are fragments (their reads,
        and a WMMA that is a whole reduce: it adds into an accumulator of its own), and the shared memory of matrix
        types (what WMMAs read and fragments are stored into)."""
        fragments = {
            node.src[0]: node.src[1] for node in program if node.op is Ops.STORE and node.src[1].op is Ops.WMMA
        }
        values = {node for node in program if node.op is Ops.LOAD and node.src[0] in fragments}
        values |= {node for node in program if node.op is Ops.WMMA and len(node.src) == WMMA_SOURCES}
        matrix_memory = {source for node in program if node.op is Ops.WMMA for source in node.src[:2]}
        stores = [node for node in program if node.op is Ops.STORE and len(node.src) > 2]
        matrix_memory |= {node.src[0] for node in stores if node.src[2] in values}
        return fragments, values, matrix_memory

    def shared_element(self, node: UOp, matrix_memory: set[UOp]) -> tuple[str, int]:
        """The C type and size of an element of the shared memory `node`: a matrix type, or the register type of the
        values it holds (float for half, int for bool)."""
        if node in matrix_memory and node.dtype in MATRIX_TYPES:
            return MATRIX_TYPES[node.dtype][0], node.dtype.itemsize
        held = {dtypes.bool: dtypes.int32, dtypes.float16: dtypes.float32}.get(node.dtype, node.dtype)
        return self.register_types[held], held.itemsize

    def shared_layout(self, program: list[UOp], matrix_memory: set[UOp]) -> tuple[dict[UOp, int], int] | None:
        """For a block whose shared memory passes STATIC_SHARED_BYTES (None for one under it: each DEFINE_LOCAL an
        array of its own), where each DEFINE_LOCAL lies in one dynamic array (byte offsets, aligned), and the bytes of
        that array: memory whose last use the block has passed a barrier since is reused (`reusable_shared`), as a
        tensor-core product's accumulators read back through the memory its input tiles were copied to."""
        sizes = {
            node: -(-node.arg[1] * self.shared_element(node, matrix_memory)[1] // SHARED_ALIGNMENT) * SHARED_ALIGNMENT
            for node in program
            if node.op is Ops.DEFINE_LOCAL
        }
        if sum(sizes.values()) <= STATIC_SHARED_BYTES:
            return None
        reusable = reusable_shared(program)
        offsets: dict[UOp, int] = {}
        for node, size in sizes.items():
            taken = sorted(
                (offsets[other], offsets[other] + sizes[other])
                for other in offsets
                if frozenset((node, other)) not in reusable
            )
            offset = 0  # (the lowest place clear of the memory in use beside it)
            for start, end in taken:
                if offset + size <= start:
                    break
                offset = max(offset, end)
            offsets[node] = offset
        return offsets, max(offsets[node] + size for node, size in sizes.items())

    def dynamic_shared_bytes(self, program: list[UOp]) -> int:
        layout = self.shared_layout(program, self.fragments_of(program)[2])
        return 0 if layout is None else layout[1]

    def render(self, name: str, program: list[UOp]) -> str:
        threads = next((node.arg[1] for node in program if node.op is Ops.SPECIAL and node.arg[0] == "thread"), 1)
        self.lanes = shuffle_mask(threads)
        # A block of more than 256 threads (BEAM's larger ones) is told to ptxas, so that it gives a thread no more
        # registers than a block of them can have: a kernel of over 64 a thread does not launch in a block of 1,024
        # (ptxas spills instead). Smaller blocks always fit (255 registers a thread at most): ptxas allocates as it
        # sees fit, bounds would change that (it gave a 32-thread block's reduce twice the registers).
        bounds = f"__launch_bounds__({threads}) " if threads > MOST_THREADS_UNBOUNDED else ""
        self.kernel_prefix = f'extern "C" __global__ {bounds}'
        self.fragments, self.fragment_values, self.matrix_memory = self.fragments_of(program)
        self.loaded_fragments: dict[tuple, str] = {}  # the tiles loaded since the last barrier or loop boundary
        layout = self.shared_layout(program, self.matrix_memory)
        self.dynamic_offsets = None if layout is None else layout[0]
        self.copies_async = self.target.async_copies and any(node.op is Ops.WIDE_COPY for node in program)
        self.unrolled = tensor_core_steps(program)
        source = super().render(name, program)
        if self.wide_lanes:
            source = WIDE_ACCESSES + source
        if layout is not None:
            source = DYNAMIC_SHARED.format(bytes=layout[1]) + source
        if self.copies_async:
            source = ASYNC_COPIES + source
        if not self.fragments:
            return source
        bfloat16 = any(node.dtype == dtypes.bfloat16 for node in self.matrix_memory)
        if any(tile.dtype in SHARED_LOADS for node in program if node.op is Ops.WMMA for tile in node.src[:2]):
            source = LOAD_MATRIX + source
        return "#include <mma.h>\n" + ("#include <cuda_bf16.h>\n" if bfloat16 else "") + source

    def render_node(self, position: int, node: UOp) -> None:
        op, src = node.op, node.src
        if op in (Ops.BARRIER, Ops.RANGE, Ops.ENDRANGE):
            self.loaded_fragments = {}
        if position in self.unrolled:
            self.emit("#pragma unroll")
        if op is Ops.DEFINE_ACC and node in self.fragments:
            m, n, k = self.fragments[node].arg[:3]
            name = self.names[node] = self.accumulator_name(node)
            self.emit(f"{WMMA}fragment<{WMMA}accumulator, {m}, {n}, {k}, float> {name};")
            self.emit(f"{WMMA}fill_fragment({name}, {self.render_const(node.arg[0], node.dtype)});")
        elif node in self.fragment_values and op is Ops.LOAD:
            self.names[node] = self.names[src[0]]
        elif op is Ops.STORE and src[0] in self.fragments:  # (the WMMA updated the accumulator in place)
            pass
        elif op is Ops.WMMA:
            self.render_wmma(position, node)
        elif op is Ops.SHUFFLE:  # (CUDA shuffles 32- and 64-bit values: a bool goes as an int)
            value = self.value(src[0]) if node.dtype != dtypes.bool else f"(int){self.value(src[0])}"
            self.declare(node, f"v{position}", f"__shfl_sync({self.lanes}, {value}, {self.value(src[1])})")
        elif op is Ops.WIDE_COPY:
            shared, buffer = self.names[src[0]], self.names[src[2]]
            to, start = f"{shared} + {self.value(src[1])}", f"{buffer} + {self.value(src[3])}"
            size = node.arg * src[0].dtype.itemsize
            if self.target.async_copies:  # (16 bytes go past the L1 cache: each block reads its tiles once)
                copy = f"LAZYGRAD_COPY_ASYNC({'cg' if size == 16 else 'ca'}, {to}, {start}, {size});"
            else:
                piece = {16: "uint4", 8: "uint2", 4: "unsigned int"}[size]
                copy = f"*({piece}*)({to}) = *(const {piece}*)({start});"
            self.emit(copy if len(src) < 5 else f"if ({self.value(src[4])}) {copy}")
        elif op is Ops.BARRIER and self.copies_async:  # (the thread's copies land first)
            self.emit(f"LAZYGRAD_WAIT_COPIES(); {self.barrier}")
        elif op is Ops.STORE and len(src) > 2 and src[2] in self.fragment_values:
            n = self.fragments[src[2].src[0]].arg[1]
            target = f"{self.names[src[0]]} + {self.value(src[1])}"
            self.emit(f"{WMMA}store_matrix_sync({target}, {self.names[src[2]]}, {n}, {WMMA}mem_row_major);")
        else:
            super().render_node(position, node)

    def render_wmma(self, position: int, node: UOp) -> None:
        """d = a·b + c on the warp's tensor cores: the tiles loaded from shared memory into fragments (TF32 ones
        rounded as the tensor core expects), then the multiply-accumulate into the accumulator c, in place (a new
        one, zero, where the WMMA has none: a reduce of one step)."""
        m, n, k, layout_a, layout_b, ldm_a, ldm_b = node.arg
        if len(node.src) > WMMA_SOURCES:
            accumulator = self.names[node.src[WMMA_SOURCES]]
        else:
            accumulator = f"product{position}"
            self.emit(f"{WMMA}fragment<{WMMA}accumulator, {m}, {n}, {k}, float> {accumulator};")
            self.emit(f"{WMMA}fill_fragment({accumulator}, 0.0f);")
        memory_a, memory_b, offset_a, offset_b = node.src[:4]
        fragments: dict[str, str] = {}
        for use, source, offset, layout, ldm in (
            ("a", memory_a, offset_a, layout_a, ldm_a),
            ("b", memory_b, offset_b, layout_b, ldm_b),
        ):
            # a tile that a warp's other WMMAs of this step loaded already is used again (its row or column of tiles)
            key = (use, source, offset, layout, ldm, m, n, k)
            if key in self.loaded_fragments:
                fragments[use] = self.loaded_fragments[key]
                continue
            _, element, address = MATRIX_TYPES[source.dtype]
            fragment, kind = f"{use}{position}", "matrix_a" if use == "a" else "matrix_b"
            fragments[use] = self.loaded_fragments[key] = fragment
            tile = address.format(self.names[source]) + (
                "" if offset.op is Ops.CONST and offset.arg == 0 else f" + {self.value(offset)}"
            )
            self.emit(f"{WMMA}fragment<{WMMA}{kind}, {m}, {n}, {k}, {element}, {WMMA}{layout}_major> {fragment};")
            if source.dtype in SHARED_LOADS:  # (the form of load mma.h gives these tiles reads generic addresses)
                shape, kind = f"m{m}n{n}k{k}", SHARED_LOADS[source.dtype]
                self.emit(f"LAZYGRAD_LOAD_MATRIX({use}, {layout}, {shape}, {kind}, {fragment}, {tile}, {ldm});")
            else:
                self.emit(f"{WMMA}load_matrix_sync({fragment}, {tile}, {ldm});")
            if source.dtype == dtypes.float32:
                self.emit(f"for (int i = 0; i < {fragment}.num_elements; i++) {{")
                self.emit(f"  {fragment}.x[i] = {WMMA}__float_to_tf32({fragment}.x[i]);")
                self.emit("}")
        self.emit(f"{WMMA}mma_sync({accumulator}, {fragments['a']}, {fragments['b']}, {accumulator});")
        self.names[node] = accumulator

    def render_shared(self, node: UOp) -> None:
        element = self.shared_element(node, self.matrix_memory)[0]
        name = self.names[node] = f"shared{node.arg[0]}"
        if self.dynamic_offsets is not None:
            self.lines.insert(0, f"  {element}* {name} = ({element}*)(lazygrad_shared + {self.dynamic_offsets[node]});")
        elif node in self.matrix_memory:
            self.lines.insert(0, f"  __shared__ __align__(32) {element} {name}[{node.arg[1]}];")
        else:
            super().render_shared(node)

    def render_store(self, node: UOp) -> None:
        buffer, value = node.src[0], node.src[2]
        if buffer in self.matrix_memory and value.dtype == dtypes.float16:  # (a half tile holds halves)
            index = self.value(node.src[1])
            self.emit(self.half_store.format(buffer=self.names[buffer], index=index, value=self.value(value)))
            return
        super().render_store(node)

    def render_bitcast(self, value: str, from_dtype: DType, to_dtype: DType) -> str:
        if from_dtype.is_int and to_dtype.is_int:
            return f"({self.register_types[to_dtype]}){value}"
        return f"{self.bitcasts[(from_dtype.name, to_dtype.name)]}({value})"
