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


class CStyleRenderer(Renderer):
    """Renders a linear program as a C function `void name(buffers...)`; subclasses change the dialect."""

    kernel_prefix = ""
    buffer_prefix = ""
    restrict = "restrict"
    gpu_style = False
    thread_index = ""
    preamble = "#include <math.h>\n"
    half_preamble = ""
    register_types = {
        dtypes.bool: "_Bool",
        dtypes.int32: "int",
        dtypes.uint32: "unsigned int",
        dtypes.int64: "long long",
        dtypes.float16: "float",
        dtypes.float32: "float",
    }
    memory_types = register_types | {dtypes.bool: "unsigned char", dtypes.float16: "_Float16"}
    int64_suffix = "ll"
    infinity = "INFINITY"
    nan = "NAN"
    math_functions = {"sqrt": "sqrtf", "exp2": "exp2f", "log2": "log2f", "sin": "sinf"}
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
        mantissa, exponent = float.hex(float(np.float32(value))).split("p")
        text = f"{mantissa.rstrip('0').rstrip('.')}p{exponent}f"  # exact: 0x1.8p+1f is 3.0f
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
        self.thread_loop = next(
            (node for node in program if node.op is Ops.RANGE and node.arg[1] == "global" and self.gpu_style), None
        )
        written = {node.src[0] for node in program if node.op is Ops.STORE and node.src[0].op is Ops.DEFINE_GLOBAL}
        parameters = sorted((node for node in program if node.op is Ops.DEFINE_GLOBAL), key=lambda node: node.arg[0])
        for position, node in enumerate(program):
            self.render_node(position, node)
        signature = ", ".join(self.render_parameter(node, node in written) for node in parameters)
        header = self.preamble + (self.half_preamble if self.uses_half else "")
        body = "\n".join(self.lines)
        return f"{header}{self.kernel_prefix}void {name}({signature}) {{\n{body}\n}}\n"

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
        elif op is Ops.RANGE:
            self.render_range(position, node)
        elif op is Ops.ENDRANGE:
            self.depth -= 1
            self.emit("}")
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
        else:
            name = f"{'gidx' if node.arg[1] == 'global' else 'ridx'}{position}"
            self.names[node] = name
            self.emit(f"for ({index} {name} = 0; {name} < {end}; {name}++) {{")
        self.depth += 1

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

    def render_alu(self, node: UOp) -> str:
        operand_dtype = node.src[-1].dtype
        template = ALU_TEMPLATES[node.op][operand_dtype.kind]
        operands = dict(zip("abc", (self.value(source) for source in node.src)))
        if node.op in (Ops.IDIV, Ops.MOD):
            divisor = node.src[1]
            if not (divisor.op is Ops.CONST and divisor.arg != 0):
                template = SAFE_DIVISION.replace("{division}", template)
        expression = template.format(**operands, **self.math_functions)
        if node.dtype == dtypes.float16:
            return self.half_round.format(a=expression)
        return expression


class OpenCLRenderer(CStyleRenderer):
    """OpenCL C. Half is a storage type only (vload_half/vstore_half): PoCL has no cl_khr_fp16."""

    kernel_prefix = "__kernel "
    buffer_prefix = "__global "
    gpu_style = True
    thread_index = "get_global_id(0)"
    preamble = ""
    # private `half` variables need cl_khr_fp16, but a pointer to half does not: round through a 16-bit slot
    half_preamble = (
        "float round_to_half(float value) {\n"
        "  ushort bits;\n"
        "  vstore_half(value, 0, (__private half*)&bits);\n"
        "  return vload_half(0, (__private half*)&bits);\n"
        "}\n"
    )
    register_types = CStyleRenderer.register_types | {dtypes.bool: "bool", dtypes.int64: "long"}
    memory_types = register_types | {dtypes.bool: "uchar", dtypes.float16: "half"}
    int64_suffix = "l"
    math_functions = {"sqrt": "sqrt", "exp2": "exp2", "log2": "log2", "sin": "sin"}
    half_load = "vload_half({index}, {buffer})"
    half_store = "vstore_half({value}, {index}, {buffer});"
    half_round = "round_to_half({a})"


class CUDARenderer(CStyleRenderer):
    """CUDA C. Half is `half` from cuda_fp16.h in memory; values are computed in float and rounded to half."""

    kernel_prefix = 'extern "C" __global__ '
    restrict = "__restrict__"
    gpu_style = True
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
