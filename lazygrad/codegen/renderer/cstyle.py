"""C-style renderers: one table-driven base for C, OpenCL C and CUDA C.

A linear program becomes one function. Every non-constant value gets its own variable (`v12`), declared where the
linear program computes it, so templates may repeat an operand without recomputing it; constants are written inline.
Loops become `for` loops and accumulators plain variables. The three languages differ only in a few attributes:
how a kernel and its buffers are declared, the type names, the math function names, how half is loaded, stored and
rounded, and (for the GPU-style languages) the thread index builtin.

Semantics follow the LLVM renderer and the PYTHON device:

- integer division and modulo truncate like C; dividing by a non-constant zero gives 0;
- MAX on floats propagates NaN; CMPNE on floats is unordered-not-equal (true when either side is NaN);
- a cast to bool is `!= 0`; bools are stored as one byte;
- a cast from float to a 32-bit integer goes through a 64-bit integer, so out-of-range values wrap like PYTHON's;
- float constants are written as exact hexadecimal literals, inf and nan included;
- half values are held in `float` registers and rounded to half after every operation, so every language computes
  what PYTHON computes, including on devices without half arithmetic (PoCL has no cl_khr_fp16). Memory holds
  real halves.

GPU-style languages (OpenCL and CUDA) map the outermost global loop to the thread index, with a bounds check; the
other loops stay loops. A program without a global loop runs on one thread.
"""

from __future__ import annotations

import math

import numpy as np

from lazygrad.codegen.renderer import Renderer
from lazygrad.codegen.transcendental import transcendental_rules
from lazygrad.dtype import DType, dtypes
from lazygrad.uop.ops import Ops, UOp

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
    Ops.MOD: {"int": "{a} % {b}", "uint": "{a} % {b}"},
    Ops.WHERE: {kind: "{a} ? {b} : {c}" for kind in ("float", "int", "uint", "bool")},
    Ops.RECIP: {"float": "1.0f / {a}"},
    Ops.SQRT: {"float": "{sqrt}({a})"},
    Ops.EXP2: {"float": "{exp2}({a})"},
    Ops.LOG2: {"float": "{log2}({a})"},
    Ops.SIN: {"float": "{sin}({a})"},
}
# division by a divisor that is not a known non-zero constant: 0 instead of a trap, like the PYTHON device
SAFE_DIVISION = "{b} == 0 ? 0 : {division}"


def find_varying(program: list[UOp], loop: UOp) -> set[UOp]:
    """The nodes whose value depends on `loop`'s index; an accumulator is varying when a varying value is stored
    into it (found by repeating the pass until nothing changes, since the accumulator is read before it is
    written)."""
    varying = {loop}
    changed = True
    while changed:
        changed = False
        for node in program:
            if node in varying or node.op in (Ops.ENDRANGE, Ops.DEFINE_GLOBAL, Ops.RANGE):
                continue
            if any(source in varying for source in node.src):
                varying.add(node)
                changed = True
                if node.op is Ops.STORE and node.src[0].op is Ops.DEFINE_ACC:
                    varying.add(node.src[0])
    return varying


class CStyleRenderer(Renderer):
    """Renders a linear program as a C function `void name(buffers...)`; subclasses change the dialect."""

    kernel_prefix = ""
    buffer_prefix = ""
    restrict = "restrict"
    gpu_style = False
    thread_index = ""
    # C kernels take (start, end) of their outermost global loop, so the runtime can split it across threads
    split_outer_loop = True
    # libm's exp2f/log2f/sinf are scalar calls that stop gcc vectorizing a loop: use polynomials, as LLVM does
    rewrites = transcendental_rules
    preamble = "#include <math.h>\n"
    half_preamble = ""
    register_types = {
        dtypes.bool: "_Bool",
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
    math_functions = {"sqrt": "sqrtf", "exp2": "exp2f", "log2": "log2f", "sin": "sinf"}
    double_math_functions = {"sqrt": "sqrt", "exp2": "exp2", "log2": "log2", "sin": "sin"}
    half_load = "(float){buffer}[{index}]"
    half_store = "{buffer}[{index}] = (_Float16){value};"
    half_round = "(float)(_Float16)({a})"

    # ---- values -------------------------------------------------------------------------------------------------

    def render_const(self, value, dtype: DType) -> str:
        """A constant as a literal of `dtype`'s register type; negative literals are parenthesized."""
        if dtype == dtypes.bool:
            return "1" if value else "0"
        if dtype.is_int:
            return self.render_int(int(value), dtype)
        if dtype == dtypes.float16:
            value = float(np.float16(value))
        if math.isnan(value):
            return self.nan
        if math.isinf(value):
            return self.infinity if value > 0 else f"(-{self.infinity})"
        double = dtype.itemsize == 8
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
        outer_loop = next((node for node in program if node.op is Ops.RANGE and node.arg[1] == "global"), None)
        self.thread_loop = outer_loop if self.gpu_style else None
        self.split_loop = outer_loop if self.split_outer_loop else None
        self.vector_loop, self.varying, self.strides = None, set(), {}
        self.choose_vector_loop(program)
        written = {node.src[0] for node in program if node.op is Ops.STORE and node.src[0].op is Ops.DEFINE_GLOBAL}
        parameters = sorted((node for node in program if node.op is Ops.DEFINE_GLOBAL), key=lambda node: node.arg[0])
        for position, node in enumerate(program):
            self.render_node(position, node)
        signature = ", ".join(self.render_parameter(node, node in written) for node in parameters)
        if self.split_outer_loop:
            index = self.register_types[dtypes.index]
            signature += f"{', ' if parameters else ''}{index} start, {index} end"
        header = self.preamble + (self.render_half_preamble() if self.uses_half else "")
        body = "\n".join(self.lines)
        return f"{header}{self.kernel_prefix}void {name}({signature}) {{\n{body}\n}}\n"

    def render_half_preamble(self) -> str:
        """Definitions a kernel that uses half needs."""
        return self.half_preamble

    def render_parameter(self, node: UOp, written: bool) -> str:
        constant = "" if written else "const "
        return f"{self.buffer_prefix}{constant}{self.memory_types[node.dtype]}* {self.restrict} data{node.arg[0]}"

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
        elif node in self.varying:
            self.render_vector_node(position, node)
        elif op is Ops.RANGE:
            self.render_range(position, node)
        elif op is Ops.DEFINE_ACC:
            self.declare(node, f"acc{node.arg[1]}", self.render_const(node.arg[0], node.dtype))
        elif op is Ops.LOAD and src[0].op is Ops.DEFINE_ACC:
            self.declare(node, f"v{position}", self.names[src[0]])
        elif op is Ops.STORE and src[0].op is Ops.DEFINE_ACC:
            self.emit(f"{self.names[src[0]]} = {self.value(src[1])};")
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

    def render_range(self, position: int, node: UOp) -> None:
        end = self.value(node.src[0])
        index = self.register_types[dtypes.index]
        if node is self.thread_loop:
            name = f"gidx{position}"
            self.names[node] = name
            self.emit(f"{index} {name} = {self.thread_index};")
            self.emit(f"if ({name} < {end}) {{")
        elif node is self.split_loop:
            name = f"gidx{position}"
            self.names[node] = name
            self.emit(f"for ({index} {name} = start; {name} < end; {name}++) {{")
        else:
            name = f"{'gidx' if node.arg[1] == 'global' else 'ridx'}{position}"
            self.names[node] = name
            self.emit(f"for ({index} {name} = 0; {name} < {end}; {name}++) {{")
        self.depth += 1

    # ---- vectors (only languages with vector types render them) -------------------------------------------------

    def choose_vector_loop(self, program: list[UOp]) -> None:
        """Set `vector_loop`, the loop whose iterations are computed together as vector lanes (None: scalar code),
        and `varying`, the nodes whose value depends on it."""

    def render_vector_node(self, position: int, node: UOp) -> None:
        raise NotImplementedError(f"{type(self).__name__} renders no vectors")

    def launch_threads(self, global_loops: tuple[int, ...]) -> int:
        """How many threads a GPU-style kernel with these global loop sizes is launched with."""
        return max(global_loops[0], 1) if global_loops else 1

    # ---- memory -------------------------------------------------------------------------------------------------

    def read_memory(self, buffer: str, index: str, dtype: DType) -> str:
        if dtype == dtypes.float16:
            return self.half_load.format(buffer=buffer, index=index)
        if dtype == dtypes.bool:
            return f"{buffer}[{index}] != 0"
        return f"{buffer}[{index}]"

    def render_load(self, position: int, node: UOp) -> None:
        buffer, index = self.names[node.src[0]], self.value(node.src[1])
        name = f"v{position}"
        if len(node.src) == 2:
            self.declare(node, name, self.read_memory(buffer, index, node.dtype))
            return
        # a gated load reads element 0 when invalid, then selects zero: no branch, so loops still vectorize
        valid = self.value(node.src[2])
        self.declare(node, f"{name}_raw", self.read_memory(buffer, f"{valid} ? {index} : 0", node.dtype))
        self.declare(node, name, f"{valid} ? {name}_raw : {self.render_const(0, node.dtype)}")

    def render_store(self, node: UOp) -> None:
        buffer, index, value = self.names[node.src[0]], self.value(node.src[1]), node.src[2]
        if value.dtype == dtypes.float16:
            self.emit(self.half_store.format(buffer=buffer, index=index, value=self.value(value)))
        else:
            self.emit(f"{buffer}[{index}] = {self.value(value)};")

    # ---- arithmetic ---------------------------------------------------------------------------------------------

    def render_cast(self, value: str, from_dtype: DType, to_dtype: DType) -> str:
        if to_dtype == dtypes.bool:
            return f"{value} != 0"
        if to_dtype == dtypes.float16:
            return self.half_round.format(a=f"(float){value}")
        if from_dtype.is_float and to_dtype.is_int and to_dtype.bits == 32:
            # through 64 bits, so values outside the 32-bit range wrap instead of being undefined
            wide = self.register_types[dtypes.int64]
            return f"({self.register_types[to_dtype]})({wide}){value}"
        return f"({self.register_types[to_dtype]}){value}"

    def render_bitcast(self, value: str, from_dtype: DType, to_dtype: DType) -> str:
        """The same bits read as another type of the same size (a union: C's defined way to reinterpret)."""
        from_type, to_type = self.register_types[from_dtype], self.register_types[to_dtype]
        return f"((union {{ {from_type} from; {to_type} to; }}){{.from = {value}}}).to"

    def render_alu(self, node: UOp) -> str:
        operand_dtype = node.src[-1].dtype
        template = ALU_TEMPLATES[node.op][operand_dtype.kind]
        operands = dict(zip("abc", (self.value(source) for source in node.src)))
        if node.op in (Ops.IDIV, Ops.MOD):
            divisor = node.src[1]
            if not (divisor.op is Ops.CONST and divisor.arg != 0):
                template = SAFE_DIVISION.replace("{division}", template)
        functions = self.double_math_functions if operand_dtype.itemsize == 8 else self.math_functions
        expression = template.format(**operands, **functions)
        if node.dtype == dtypes.float16:
            return self.half_round.format(a=expression)
        return expression


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
# every lane divides by a non-zero number (integer division by zero traps), then lanes dividing by zero give 0
VECTOR_SAFE_DIVISION = "({b} == 0) ? ({t})(0) : {a} {operator} (({b} == 0) ? ({t})(1) : {b})"


class OpenCLRenderer(CStyleRenderer):
    """OpenCL C. Half is a storage type only (vload_half/vstore_half): PoCL has no cl_khr_fp16.

    The innermost global loop is computed `vector_width` iterations at a time in vector types (float8 ...), so
    PoCL's CPU driver runs SIMD code even where a work-item loops (its own vectorizer only vectorizes across
    work-items of straight-line kernels). Loads and stores whose index moves by one per iteration become
    vload/vstore; other indices gather and scatter lane by lane. When the kernel has only that one global loop, a
    work-item computes `vector_width` of its iterations (see `launch_threads`).
    """

    kernel_prefix = "__kernel "
    buffer_prefix = "__global "
    gpu_style = True
    split_outer_loop = False
    rewrites = None  # PoCL's exp2/log2/sin work on vectors, a GPU's are hardware
    thread_index = "get_global_id(0)"
    preamble = ""
    # private `half` variables need cl_khr_fp16, but a pointer to half does not: round through 16-bit slots
    half_rounding = (
        "float{width} round_to_half{width}(float{width} value) {{\n"
        "  ushort{width} bits;\n"
        "  vstore_half{width}(value, 0, (__private half*)&bits);\n"
        "  return vload_half{width}(0, (__private half*)&bits);\n"
        "}}\n"
    )
    register_types = CStyleRenderer.register_types | {dtypes.bool: "bool", dtypes.uint32: "uint", dtypes.int64: "long"}
    memory_types = register_types | {dtypes.bool: "uchar", dtypes.float16: "half"}
    int64_suffix = "l"
    math_functions = CStyleRenderer.double_math_functions  # overloaded for float, double and their vectors
    half_load = "vload_half({index}, {buffer})"
    half_store = "vstore_half({value}, {index}, {buffer});"
    half_round = "round_to_half({a})"
    smallest_vector = 4  # narrower vectors do not pay for their gathers

    def __init__(self, vector_width: int = 8):
        """`vector_width`: the widest vector to compute in (the device's preferred float vector width; 1: none)."""
        self.widest_vector = vector_width
        self.vector_width = 1

    def lanes_for(self, iterations: int) -> int:
        """The vector width for a loop of this many iterations: the widest allowed one that divides it, else 1."""
        width = self.widest_vector
        while width >= self.smallest_vector and iterations % width:
            width //= 2
        return width if width >= self.smallest_vector else 1

    def choose_vector_loop(self, program: list[UOp]) -> None:
        """The innermost global loop, when its size allows. A loop inside a work-item is vectorized only when every
        store moves by one element per iteration (a kernel whose loop was upcast is left to scalar code); the
        thread loop always is, since `launch_threads` knows only the loop sizes."""
        global_loops = [node for node in program if node.op is Ops.RANGE and node.arg[1] == "global"]
        self.vector_width = self.lanes_for(global_loops[-1].src[0].arg) if global_loops else 1
        if self.vector_width == 1:
            return
        self.vector_loop = global_loops[-1]
        self.varying = find_varying(program, self.vector_loop)
        stores = [node for node in program if node.op is Ops.STORE and node.src[0].op is Ops.DEFINE_GLOBAL]
        if self.vector_loop is not self.thread_loop and any(self.stride(store.src[1]) != 1 for store in stores):
            self.vector_loop, self.varying, self.strides, self.vector_width = None, set(), {}, 1

    def launch_threads(self, global_loops: tuple[int, ...]) -> int:
        if len(global_loops) == 1 and self.lanes_for(global_loops[0]) > 1:
            return max(global_loops[0] // self.lanes_for(global_loops[0]), 1)
        return super().launch_threads(global_loops)

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
            return f"convert_long{self.vector_width}({self.names[node]})"
        return self.names[node]

    def stride(self, node: UOp) -> int | None:
        """How much an integer value grows from one lane to the next, or None when it is not affine in the loop."""
        if node not in self.varying:
            return 0
        if node not in self.strides:
            strides = [self.stride(source) for source in node.src]
            if node is self.vector_loop:
                stride = 1
            elif node.op is Ops.ADD and None not in strides:
                stride = strides[0] + strides[1]
            elif node.op is Ops.MUL and node.src[1].op is Ops.CONST and strides[0] is not None:
                stride = strides[0] * node.src[1].arg
            elif node.op is Ops.MUL and node.src[0].op is Ops.CONST and strides[1] is not None:
                stride = strides[1] * node.src[0].arg
            else:
                stride = None
            self.strides[node] = stride
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
        end, first, width = self.value(node.src[0]), f"gidx{position}_first", self.vector_width
        if node is self.thread_loop:
            self.emit(f"long {first} = {self.thread_index} * {width};")
            self.emit(f"if ({first} < {end}) {{")
        else:
            self.emit(f"for (long {first} = 0; {first} < {end}; {first} += {width}) {{")
        self.depth += 1
        offsets = ", ".join(f"{lane}l" for lane in range(width))
        self.declare_vector(node, f"gidx{position}", f"{first} + (long{width})({offsets})")

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
            safe_index = f"{self.condition(valid, dtypes.index)} ? {index_text} : (long{self.vector_width})(0)"
            self.emit(f"long{self.vector_width} {name}_index = {safe_index};")
            index_text = f"{name}_index"
        self.declare_vector(
            node, f"{name}_raw" if valid is not None else name, self.read_lanes(buffer, index_text, node.dtype)
        )
        if valid is not None:
            self.declare_vector(node, name, f"{self.condition(valid, node.dtype)} ? {name}_raw : {zero}")

    def render_vector_store(self, node: UOp) -> None:
        buffer, index, value = self.names[node.src[0]], node.src[1], node.src[2]
        width, dtype = self.vector_width, value.dtype
        if index in self.varying and self.stride(index) == 1:
            first, values = f"{self.names[index]}.s0", self.lanes(value)
            if dtype == dtypes.float16:
                self.emit(f"vstore_half{width}({values}, 0, {buffer} + {first});")
            elif dtype == dtypes.bool:
                self.emit(f"vstore{width}(convert_uchar{width}(-{values}), 0, {buffer} + {first});")
            else:
                self.emit(f"vstore{width}({values}, 0, {buffer} + {first});")
            return
        # a scatter, lane by lane in order; with a uniform index the last lane's value is the one left
        for lane in range(width) if index in self.varying else [width - 1]:
            element, stored = self.lane(index, lane), self.lane(value, lane)
            if dtype == dtypes.float16:
                self.emit(f"vstore_half({stored}, {element}, {buffer});")
            elif dtype == dtypes.bool:
                self.emit(f"{buffer}[{element}] = {stored} != 0;")
            else:
                self.emit(f"{buffer}[{element}] = {stored};")

    # ---- vector arithmetic --------------------------------------------------------------------------------------

    def render_vector_cast(self, source: UOp, to_dtype: DType) -> str:
        value, from_dtype, width = self.lanes(source), source.dtype, self.vector_width
        if to_dtype == dtypes.bool:
            compared = f"{value} != 0"
            return compared if from_dtype == dtypes.bool or from_dtype.bits < 64 else f"convert_int{width}({compared})"
        if from_dtype == dtypes.bool:
            value = f"(-{value})"  # -1/0 lanes become 1/0
        if to_dtype == dtypes.float16:
            return f"round_to_half{width}(convert_float{width}({value}))"
        if from_dtype.is_float and to_dtype.is_int and to_dtype.bits == 32:
            # through 64 bits, so values outside the 32-bit range wrap instead of being undefined
            return f"convert_{self.vector_type(to_dtype)}(convert_long{width}({value}))"
        if from_dtype.is_int and to_dtype.is_int and from_dtype.bits == to_dtype.bits:
            return f"as_{self.vector_type(to_dtype)}({value})"
        return f"convert_{self.vector_type(to_dtype)}({value})"

    def render_vector_alu(self, node: UOp) -> str:
        op, src = node.op, node.src
        operand_dtype = src[-1].dtype
        if op is Ops.WHERE:
            return f"{self.condition(src[0], node.dtype)} ? {self.lanes(src[1])} : {self.lanes(src[2])}"
        operands = dict(zip("abc", (self.lanes(source) for source in src)))
        if operand_dtype == dtypes.bool:
            return VECTOR_BOOL_TEMPLATES[op].format(**operands)
        if op in (Ops.IDIV, Ops.MOD) and not (src[1].op is Ops.CONST and src[1].arg != 0):
            operator = "/" if op is Ops.IDIV else "%"
            t = self.vector_type(node.dtype)
            return VECTOR_SAFE_DIVISION.format(t=t, operator=operator, **operands)
        expression = ALU_TEMPLATES[op][operand_dtype.kind].format(**operands, **self.double_math_functions)
        if op in (Ops.CMPLT, Ops.CMPNE) and operand_dtype.bits == 64:
            expression = f"convert_int{self.vector_width}({expression})"
        if node.dtype == dtypes.float16:
            expression = f"round_to_half{self.vector_width}({expression})"
        return expression


class CUDARenderer(CStyleRenderer):
    """CUDA C. Half is `half` from cuda_fp16.h in memory; values are computed in float and rounded to half."""

    kernel_prefix = 'extern "C" __global__ '
    restrict = "__restrict__"
    gpu_style = True
    split_outer_loop = False
    rewrites = None  # CUDA's exp2f/log2f/sinf are fast on the GPU
    thread_index = "(long long)blockIdx.x * blockDim.x + threadIdx.x"
    preamble = ""
    half_preamble = "#include <cuda_fp16.h>\n"
    register_types = CStyleRenderer.register_types | {dtypes.bool: "bool"}
    memory_types = register_types | {dtypes.bool: "unsigned char", dtypes.float16: "half"}
    infinity = "__int_as_float(0x7f800000)"
    nan = "__int_as_float(0x7fc00000)"
    half_load = "__half2float({buffer}[{index}])"
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

    def render_bitcast(self, value: str, from_dtype: DType, to_dtype: DType) -> str:
        if from_dtype.is_int and to_dtype.is_int:
            return f"({self.register_types[to_dtype]}){value}"
        return f"{self.bitcasts[(from_dtype.name, to_dtype.name)]}({value})"
