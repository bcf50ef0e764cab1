"""OpenCL C: the C-style renderer plus vector types.

On a CPU driver (PoCL), loops are computed several iterations at a time in vector types (float8 ...): PoCL
vectorizes straight-line kernels across work-items by itself, but a loop inside a work-item stays scalar there, and
its exp2/log2 are vectorized only when called on vectors. Which loop is vectorized is an action of the kernel's list
(VECTORIZE, chosen by codegen/heuristic.py's `vector_loop`): an output loop kept inside each work-item (kind VECTOR),
or a reduce loop outside every other (VECTOR_REDUCE), whose vector accumulators are combined lane by lane after it.
This renderer only spells that loop in vectors, as wide as the device's vectors allow for its values. A GPU driver
prefers a vector width of 1, which turns vectors off. Vector bools are signed integer vectors (-1 true, 0 false), as
OpenCL's vector comparisons return them.
"""

from __future__ import annotations

from lazygrad.codegen.opt import stride
from lazygrad.codegen.renderer import Target
from lazygrad.codegen.renderer.cstyle import ALU_TEMPLATES, CStyleRenderer
from lazygrad.codegen.transcendental import exp_rules, sin_cos_rules
from lazygrad.dtype import DType, dtypes
from lazygrad.uop.alu import division_hazards, may_wrap, shift_in_range
from lazygrad.uop.ops import OUTPUT_KINDS, LoopKind, Ops, UOp


def find_varying(program: list[UOp], loop: UOp) -> set[UOp]:
    """The nodes whose value depends on `loop`'s index; an accumulator is varying when a varying value is stored
    into it (found by repeating the pass until nothing changes, since the accumulator is read before it is
    written). The final read of an accumulator of a reduce loop is not: it combines the lanes."""
    varying = {loop}
    changed = True
    while changed:
        changed = False
        for node in program:
            if node in varying or node.op in (Ops.ENDRANGE, Ops.DEFINE_GLOBAL, Ops.RANGE):
                continue
            if (
                loop.arg[1] not in OUTPUT_KINDS
                and node.op is Ops.LOAD
                and node.src[0].op is Ops.DEFINE_ACC
                and len(node.src) == 1
            ):
                continue
            if any(source in varying for source in node.src):
                varying.add(node)
                changed = True
                if node.op is Ops.STORE and node.src[0].op is Ops.DEFINE_ACC:
                    varying.add(node.src[0])
    return varying


# vector bools are signed integer vectors (-1 true, 0 false), as OpenCL's vector comparisons return them
VECTOR_BOOL_TEMPLATES: dict[Ops, str] = {
    Ops.ADD: "{a} | {b}",
    Ops.MUL: "{a} & {b}",
    Ops.MAX: "{a} | {b}",
    Ops.OR: "{a} | {b}",
    Ops.AND: "{a} & {b}",
    Ops.XOR: "{a} ^ {b}",
    Ops.CMPNE: "{a} ^ {b}",
    Ops.CMPLT: "~{a} & {b}",
    Ops.NEG: "~{a}",
}
# signed ops that may overflow, in vectors: the lanes reinterpreted as unsigned {u}, which wraps, and back as {s}
# (vector types convert only through as_ and convert_ functions)
VECTOR_WRAPPING_TEMPLATES: dict[Ops, str] = {
    Ops.ADD: "as_{s}(as_{u}({a}) + as_{u}({b}))",
    Ops.MUL: "as_{s}(as_{u}({a}) * as_{u}({b}))",
    Ops.NEG: "as_{s}(-as_{u}({a}))",
    Ops.SHL: "as_{s}(as_{u}({a}) << as_{u}({b}))",
}


class OpenCLRenderer(CStyleRenderer):
    """OpenCL C. Half is a storage type only (vload_half/vstore_half): PoCL has no cl_khr_fp16.

    Loads and stores whose index moves by one per iteration of the vectorized loop become vload/vstore; other
    indices gather and scatter lane by lane.
    """

    kernel_prefix = "__kernel "
    can_join = False  # (its runtime builds a program per kernel)
    vector_accumulators = False
    simd_reductions = False
    buffer_prefix = "__global "
    split_outer_loop = False
    buffer_array = False
    # exp2 and log2 are built in (PoCL's work on vectors, a GPU's are hardware); sin and cos are not: PoCL's vector
    # versions return garbage for denormal lanes when another lane of the vector is large
    rewrites = exp_rules + sin_cos_rules
    special_indices = {"block": "get_group_id(0)", "thread": "get_local_id(0)"}
    shared_prefix = "__local "
    barrier = "barrier(CLK_LOCAL_MEM_FENCE);"
    preamble = "#pragma OPENCL FP_CONTRACT OFF\n"  # (the fused multiply-adds are written: see fused_multiply_add)
    float_max: dict[str, str] = {}  # (a select of floats costs no branch on a GPU)
    fused_multiply_add = {"float": "fma", "double": "fma"}
    fuses_accumulator_updates = True
    # private `half` variables need cl_khr_fp16, but a pointer to half does not: round through 16-bit slots
    half_rounding = (
        "float{width} round_to_half{width}(float{width} value) {{\n"
        "  ushort{width} bits;\n"
        "  vstore_half{width}(value, 0, (__private half*)&bits);\n"
        "  return vload_half{width}(0, (__private half*)&bits);\n"
        "}}\n"
    )
    register_types = CStyleRenderer.register_types | {
        dtypes.bool: "bool",
        dtypes.int8: "char",
        dtypes.uint8: "uchar",
        dtypes.int16: "short",
        dtypes.uint16: "ushort",
        dtypes.uint32: "uint",
        dtypes.int64: "long",
        dtypes.uint64: "ulong",
        dtypes.bfloat16: "ushort",
    }
    unsigned_types = {dtypes.int32: "uint", dtypes.int64: "ulong"}
    memory_types = register_types | {dtypes.bool: "uchar", dtypes.float16: "half"}
    int64_suffix = "l"
    math_functions = CStyleRenderer.double_math_functions  # overloaded for float, double and their vectors
    half_load = "vload_half({index}, {buffer})"
    half_store = "vstore_half({value}, {index}, {buffer});"
    # (a pointer to a vector type is aligned to its size: the compiler makes one access, where vload4 may make four)
    wide_load = "*(__global const {vector}*)({address})"
    wide_store = "*(__global {vector}*)({address}) = ({vector})({values});"
    half_round = "round_to_half({a})"
    smallest_vector = 4  # narrower vectors do not pay for their gathers

    def __init__(
        self, target: Target = Target(vector_width=8, max_threads=256, block_threads=64, shared_memory=1 << 15)
    ):
        """`target.vector_width`: the widest vector to compute in (the device's preferred float vector width; 1:
        none)."""
        super().__init__(target)
        self.widest_vector = target.vector_width
        self.vector_width = 1

    def lanes_for(self, iterations: int, element_bits: int = 32) -> int:
        """The vector width for a loop of this many iterations over elements of up to `element_bits`: the widest
        allowed one that divides it, else 1. A vector is never wider than the device's (its preferred float width of
        32-bit lanes): PoCL's built-ins taking or giving wider ones (convert_long8, fmod of double8 on an AVX2
        target) returned garbage or crashed."""
        width = self.widest_vector * 32 // max(element_bits, 32)
        while width >= self.smallest_vector and iterations % width:
            width //= 2
        return width if width >= self.smallest_vector else 1

    def convert(self, value: str, to_type: str, wide: bool, through: str | None = None) -> str:
        """`convert_<to_type><width>(value)` (by way of `through`'s vector type if given), or lane by lane with C
        casts where `wide` (a vector with 64-bit lanes) makes a vector wider than the device's: PoCL's built-ins on
        those broke (see lanes_for). Index math that may not fit in 32 bits is 64-bit (codegen/index_width.py), so
        its selects and compares meet this in any loop of 8."""
        width = self.vector_width
        if wide and width * 64 > self.widest_vector * 32:
            cast = f"({to_type})" + (f"({through})" if through else "")
            return f"({to_type}{width})({', '.join(f'{cast}({value}).s{lane:x}' for lane in range(width))})"
        if through:
            value = f"convert_{through}{width}({value})"
        return f"convert_{to_type}{width}({value})"

    def find_vector_loop(self, program: list[UOp]) -> None:
        """The loop an action made a vector loop (VECTORIZE: an output loop, or a reduce loop outside every other),
        computed as many iterations at a time as the device's vectors hold of the widest value the kernel loads,
        accumulates or casts to, where that divides the loop (else in scalars)."""
        self.vector_width = 1
        loops = [node for node in program if node.op is Ops.RANGE]
        candidate = next((node for node in loops if node.arg[1] is LoopKind.VECTOR), None)
        if candidate is None and loops and loops[0].arg[1] is LoopKind.VECTOR_REDUCE:
            candidate = loops[0]
        if candidate is None:
            return
        # (the values' widths: what the kernel loads, accumulates and casts to; index math needs no built-ins)
        values = [node.dtype.bits for node in program if node.op in (Ops.LOAD, Ops.DEFINE_ACC, Ops.CAST)]
        self.vector_width = self.lanes_for(candidate.src[0].arg, max(values, default=32))
        if self.vector_width > 1:
            self.vector_loop = candidate
            self.varying = find_varying(program, candidate)

    def render_accumulator_read(self, name: str, node: UOp) -> None:
        """After a vectorized reduce loop, the lanes of its accumulator are combined into one value."""
        accumulator = node.src[0]
        if accumulator not in self.varying or node in self.varying:
            return super().render_accumulator_read(name, node)
        self.declare(node, name, f"{self.names[accumulator]}.s0")
        for lane in range(1, self.vector_width):
            self.emit(f"{name} = {self.combine(accumulator, name, f'{self.names[accumulator]}.s{lane:x}')};")

    def render(self, name: str, program: list[UOp]) -> str:
        source = super().render(name, program)
        if any(node.dtype == dtypes.float64 for node in program):
            return "#pragma OPENCL EXTENSION cl_khr_fp64 : enable\n" + source
        return source

    def render_bitcast(self, value: str, from_dtype: DType, to_dtype: DType) -> str:
        return f"as_{self.register_types[to_dtype]}({value})"

    def render_half_preamble(self) -> str:
        widths = sorted({1, self.vector_width})
        return "".join(self.half_rounding.format(width=width if width > 1 else "") for width in widths)

    # ---- vector values ------------------------------------------------------------------------------------------

    def vector_type(self, dtype: DType) -> str:
        return f"int{self.vector_width}" if dtype == dtypes.bool else f"{self.register_types[dtype]}{self.vector_width}"

    def lanes(self, node: UOp) -> str:
        """A node's value as a vector: varying values are vectors already, the others are broadcast."""
        if node in self.varying:
            return self.names[node]
        if node.dtype == dtypes.bool:
            return f"({self.vector_type(node.dtype)})({self.value(node)} ? -1 : 0)"
        return f"({self.vector_type(node.dtype)})({self.value(node)})"

    def lane(self, node: UOp, lane: int) -> str:
        """One lane of a node's value (a uniform value is the same in every lane)."""
        return f"{self.names[node]}.s{lane:x}" if node in self.varying else self.value(node)

    def condition(self, node: UOp, operand_dtype: DType) -> str:
        """A bool as the condition of `?:` between vectors of `operand_dtype`: lanes of the same bit width."""
        if node not in self.varying:
            return self.value(node)
        if operand_dtype != dtypes.bool and operand_dtype.bits == 64:
            return self.convert(self.names[node], "long", wide=True)
        # (bools are int vectors; 8- and 16-bit lanes, as loaded from memory, take a char or short condition)
        narrow = {"char": "char", "uchar": "char", "short": "short", "ushort": "short"}
        if (lanes := narrow.get(self.register_types.get(operand_dtype, ""))) is not None:
            return self.convert(self.names[node], lanes, wide=False)
        return self.names[node]

    def stride(self, node: UOp) -> int | None:
        """How much an integer value grows from one lane to the next (codegen's `stride` along the vector loop), or
        None when that is not a constant."""
        if node not in self.varying:
            return 0
        if node not in self.strides:
            self.strides[node] = stride(node, self.vector_loop)
        return self.strides[node]

    def declare_vector(self, node: UOp, name: str, expression: str) -> None:
        self.names[node] = name
        self.emit(f"{self.vector_type(node.dtype)} {name} = {expression};")

    def render_vector_node(self, position: int, node: UOp) -> None:
        op, src, name = node.op, node.src, f"v{position}"
        if op is Ops.RANGE:
            self.render_vector_range(position, node)
        elif op is Ops.DEFINE_ACC:
            self.declare_vector(node, f"acc{node.arg[1]}", self.lanes(UOp.const(node.dtype, node.arg[0])))
        elif op is Ops.LOAD and src[0].op is Ops.DEFINE_ACC:
            self.declare_vector(node, name, self.names[src[0]])
        elif op is Ops.STORE and src[0].op is Ops.DEFINE_ACC:
            self.emit(f"{self.names[src[0]]} = {self.lanes(src[1])};")
        elif op is Ops.LOAD:
            self.render_vector_load(name, node)
        elif op is Ops.STORE:
            self.render_vector_store(node)
        elif op is Ops.CAST:
            self.declare_vector(node, name, self.render_vector_cast(src[0], node.dtype))
        elif op is Ops.BITCAST:
            self.declare_vector(node, name, f"as_{self.vector_type(node.dtype)}({self.lanes(src[0])})")
        else:
            self.declare_vector(node, name, self.render_vector_alu(node))

    def render_vector_range(self, position: int, node: UOp) -> None:
        self.reads_before_loops.append(dict(self.vector_reads))
        prefix = "gidx" if node.arg[1] in OUTPUT_KINDS else "ridx"
        end, first, width = self.value(node.src[0]), f"{prefix}{position}_first", self.vector_width
        index = self.register_types[node.dtype]
        self.emit(f"for ({index} {first} = 0; {first} < {end}; {first} += {width}) {{")
        self.depth += 1
        offsets = ", ".join(str(lane) for lane in range(width))
        self.declare_vector(node, f"{prefix}{position}", f"{first} + ({index}{width})({offsets})")

    # ---- vector memory ------------------------------------------------------------------------------------------

    def read_contiguous(self, buffer: str, first: str, dtype: DType) -> str:
        width = self.vector_width
        if dtype == dtypes.float16:
            return f"vload_half{width}(0, {buffer} + {first})"
        if dtype == dtypes.bool:
            return f"convert_int{width}(vload{width}(0, {buffer} + {first}) != (uchar)0)"
        return f"vload{width}(0, {buffer} + {first})"

    def read_lanes(self, buffer: str, index: str, dtype: DType) -> str:
        """A gather: lane k reads element index.sk."""
        lanes = [f"{index}.s{lane:x}" for lane in range(self.vector_width)]
        if dtype == dtypes.float16:
            return f"(float{self.vector_width})({', '.join(f'vload_half({i}, {buffer})' for i in lanes)})"
        if dtype == dtypes.bool:
            gathered = f"(uchar{self.vector_width})({', '.join(f'{buffer}[{i}]' for i in lanes)})"
            return f"convert_int{self.vector_width}({gathered} != (uchar)0)"
        return f"({self.vector_type(dtype)})({', '.join(f'{buffer}[{i}]' for i in lanes)})"

    def render_vector_load(self, name: str, node: UOp) -> None:
        buffer, index = self.names[node.src[0]], node.src[1]
        valid = node.src[2] if len(node.src) == 3 else None
        zero = self.lanes(UOp.const(node.dtype, 0))
        contiguous = index in self.varying and self.stride(index) == 1
        if contiguous and (valid is None or valid not in self.varying):
            read = self.read_contiguous(buffer, f"{self.names[index]}.s0", node.dtype)
            self.declare_vector(node, name, read if valid is None else f"{self.value(valid)} ? {read} : {zero}")
            return
        # a gather; a gated one reads element 0 in invalid lanes, then selects zero there
        index_text = self.lanes(index)
        if valid is not None:
            index_type = self.vector_type(index.dtype)
            safe_index = f"{self.condition(valid, index.dtype)} ? {index_text} : ({index_type})(0)"
            self.emit(f"{index_type} {name}_index = {safe_index};")
            index_text = f"{name}_index"
        self.declare_vector(
            node, f"{name}_raw" if valid is not None else name, self.read_lanes(buffer, index_text, node.dtype)
        )
        if valid is not None:
            self.declare_vector(node, name, f"{self.condition(valid, node.dtype)} ? {name}_raw : {zero}")

    def render_vector_store(self, node: UOp) -> None:
        buffer, index, value = self.names[node.src[0]], node.src[1], node.src[2]
        width, dtype = self.vector_width, value.dtype
        gate = node.src[3] if len(node.src) > 3 else None
        if gate is not None and gate not in self.varying:  # (the same in every lane: one branch around the store)
            self.emit(f"if ({self.value(gate)}) {{")
            self.depth += 1
            self.render_vector_store(node.replace(src=node.src[:3]))
            self.depth -= 1
            self.emit("}")
            return
        if gate is None and index in self.varying and self.stride(index) == 1:
            first, values = f"{self.names[index]}.s0", self.lanes(value)
            if dtype == dtypes.float16:
                self.emit(f"vstore_half{width}({values}, 0, {buffer} + {first});")
            elif dtype == dtypes.bool:
                self.emit(f"vstore{width}(convert_uchar{width}(-{values}), 0, {buffer} + {first});")
            else:
                self.emit(f"vstore{width}({values}, 0, {buffer} + {first});")
            return
        # a scatter, lane by lane in order; with a uniform index the last lane's value is the one left
        # (a gate that varies: each lane's store under its own condition, and every lane stores)
        for lane in range(width) if index in self.varying or gate is not None else [width - 1]:
            element, stored = self.lane(index, lane), self.lane(value, lane)
            if dtype == dtypes.float16:
                statement = f"vstore_half({stored}, {element}, {buffer});"
            elif dtype == dtypes.bool:
                statement = f"{buffer}[{element}] = {stored} != 0;"
            else:
                statement = f"{buffer}[{element}] = {stored};"
            self.emit(statement if gate is None else f"if ({self.lane(gate, lane)}) {statement}")

    # ---- vector arithmetic --------------------------------------------------------------------------------------

    def render_vector_cast(self, source: UOp, to_dtype: DType) -> str:
        value, from_dtype, width = self.lanes(source), source.dtype, self.vector_width
        if to_dtype == dtypes.bool:
            compared = f"{value} != 0"
            return (
                compared if from_dtype == dtypes.bool or from_dtype.bits < 64 else self.convert(compared, "int", True)
            )
        if from_dtype == dtypes.bool:
            value = f"(-{value})"  # -1/0 lanes become 1/0
        if to_dtype == dtypes.float16:
            return f"round_to_half{width}({self.convert(value, 'float', from_dtype.bits == 64)})"
        if from_dtype.is_float and to_dtype.is_int and to_dtype.bits == 32:
            # through 64 bits, so values outside the 32-bit range wrap instead of being undefined
            return self.convert(value, self.register_types[to_dtype], True, through="long")
        if from_dtype.is_int and to_dtype.is_int and from_dtype.bits == to_dtype.bits:
            return f"as_{self.vector_type(to_dtype)}({value})"
        return self.convert(value, self.register_types[to_dtype], max(from_dtype.bits, to_dtype.bits) == 64)

    def render_vector_alu(self, node: UOp) -> str:
        op, src = node.op, node.src
        operand_dtype = src[-1].dtype
        if op is Ops.WHERE:
            return f"{self.condition(src[0], node.dtype)} ? {self.lanes(src[1])} : {self.lanes(src[2])}"
        if (fused := self.render_fused(node, self.lanes)) is not None:
            return fused
        operands = dict(zip("abc", (self.lanes(source) for source in src)))
        if operand_dtype == dtypes.bool:
            return VECTOR_BOOL_TEMPLATES[op].format(**operands)
        if node.dtype.is_int and op in (Ops.IDIV, Ops.MOD):
            return self.render_vector_division(node, operands)
        if op is Ops.MOD and node.dtype.bits == 64 and self.vector_width > 4:
            # lane by lane: PoCL's fmod of double8 and double16 is wrong for some lanes (28.0 fmod 0.9158... gave
            # 0.875), while its scalar fmod, and that of narrower vectors, is exact
            remainders = (
                f"fmod({self.lane(src[0], lane)}, {self.lane(src[1], lane)})" for lane in range(self.vector_width)
            )
            return f"({self.vector_type(node.dtype)})({', '.join(remainders)})"
        if op in (Ops.SHL, Ops.SHR):
            return self.render_vector_shift(node, operands)
        if node.dtype.is_int and not node.dtype.is_unsigned and op in VECTOR_WRAPPING_TEMPLATES and may_wrap(node):
            return self.vector_wrapping(op, node.dtype).format(**operands)
        expression = ALU_TEMPLATES[op][operand_dtype.kind].format(**operands, **self.double_math_functions)
        if op in (Ops.CMPLT, Ops.CMPNE) and operand_dtype.bits == 64:
            expression = self.convert(expression, "int", wide=True)
        if node.dtype == dtypes.float16:
            expression = f"round_to_half{self.vector_width}({expression})"
        return expression

    def vector_wrapping(self, op: Ops, dtype: DType) -> str:
        template = VECTOR_WRAPPING_TEMPLATES[op].replace("{s}", self.vector_type(dtype))
        return template.replace("{u}", f"{self.unsigned_types[dtype]}{self.vector_width}")

    def render_vector_shift(self, node: UOp, operands: dict[str, str]) -> str:
        """A shift of lanes; where the amount may be out of range (OpenCL would take it modulo the bit width), the
        result of shifting every bit out is selected instead."""
        signed, bits, t = not node.dtype.is_unsigned, node.dtype.bits, self.vector_type(node.dtype)
        a, b = operands["a"], operands["b"]
        if node.op is Ops.SHL:
            shifted = self.vector_wrapping(Ops.SHL, node.dtype).format(a=a, b=b) if signed else f"{a} << {b}"
        else:
            shifted = f"{a} >> {b}"
        if shift_in_range(node):
            return shifted
        in_range = f"({b} < ({t})({bits}))" + (f" & ({b} >= ({t})(0))" if signed else "")
        if node.op is Ops.SHR and signed:  # the sign fills every bit: shift by bits - 1
            return f"{a} >> (({in_range}) ? {b} : ({t})({bits - 1}))"
        return f"({in_range}) ? ({shifted}) : ({t})(0)"

    def render_vector_division(self, node: UOp, operands: dict[str, str]) -> str:
        """Lanes divide by a safe divisor (1 where theirs may be 0 or -1: both are undefined for some dividends and
        may trap), then take the defined results there: 0 for a zero divisor, -a and 0 for a divisor of -1."""
        may_be_zero, may_overflow = division_hazards(node)
        plain = f"{operands['a']} {'/' if node.op is Ops.IDIV else '%'} "
        if not (may_be_zero or may_overflow):
            return plain + operands["b"]
        t, b = self.vector_type(node.dtype), operands["b"]
        zero, minus_one = f"({b} == ({t})(0))", f"({b} == ({t})(-1))"
        hazard = " | ".join([zero] * may_be_zero + [minus_one] * may_overflow)
        result = f"({hazard}) ? ({t})(0) : {plain}(({hazard}) ? ({t})(1) : {b})"
        if may_overflow and node.op is Ops.IDIV:
            result = f"{minus_one} ? {self.vector_wrapping(Ops.NEG, node.dtype).format(a=operands['a'])} : ({result})"
        return result
