"""Narrow dtypes, lowered for every device: rules the kernel graph goes through before a renderer sees it, so no
renderer (nor the PYTHON device) computes in bfloat16 or in an integer narrower than 32 bits.

- bfloat16 values are held in float32 registers and rounded to bfloat16 (to nearest, ties to even; NaN stays NaN)
  after every op that can leave the bfloat16 grid, with integer ops on their bits: no device has bfloat16
  arithmetic that every other device shares. Memory holds real bfloat16 bits, loaded and stored as uint16.
- int8, uint8, int16 and uint16 ops are computed in int32 (signed) or uint32 (unsigned) and cast back, which keeps
  the low bits: arithmetic wraps around at the narrow width, as in NumPy and PyTorch, and the 32-bit op's own
  hazards (overflow, division by 0 or -1, shifts out of range) are handled by the renderers as for int32.
- A float cast to an int goes through a guarded int64 conversion (`cast_value` in uop/alu.py says what out-of-range
  values give), so a narrow or 32-bit result wraps instead of being undefined; float to uint64 takes values from
  2**63 up apart.
- Bitcasts of bfloat16 and float16 are integer ops on float32 bits (C-style languages hold half in float registers).
"""

from __future__ import annotations

from lazygrad.dtype import DType, dtypes, is_small_int
from lazygrad.uop.ops import ALU, COMPARISON, Ops, UOp
from lazygrad.uop.pattern import PatternMatcher, UPat, graph_rewrite

F32, U32, I64, U64, U16 = dtypes.float32, dtypes.uint32, dtypes.int64, dtypes.uint64, dtypes.uint16
BF16 = dtypes.bfloat16
# ops whose float32 result of bfloat16 operands is a bfloat16 already
EXACT_ON_BFLOAT16 = {Ops.MAX, Ops.NEG, Ops.WHERE, Ops.SHUFFLE}
COMPUTED = (*ALU, Ops.SHUFFLE)  # the ops computed in registers (a shuffle reads another thread's register)


def bfloat16_bits32(x: UOp) -> UOp:
    """The float32 `x` rounded to bfloat16, as the uint32 bits whose top half is that bfloat16 (NaN made quiet)."""
    bits = UOp(Ops.BITCAST, U32, (x,))
    lowest_kept = bits.alu(Ops.SHR, UOp.const(U32, 16)).alu(Ops.AND, UOp.const(U32, 1))
    rounded = bits + UOp.const(U32, 0x7FFF) + lowest_kept
    return x.ne(x).where(bits.alu(Ops.OR, UOp.const(U32, 0x400000)), rounded)


def round_to_bfloat16(x: UOp) -> UOp:
    """A float32 value rounded to the nearest bfloat16, still as a float32."""
    kept = bfloat16_bits32(x).alu(Ops.AND, UOp.const(U32, 0xFFFF0000))
    return UOp(Ops.BITCAST, F32, (kept,))


def bfloat16_from_bits(bits: UOp) -> UOp:
    """The float32 value of bfloat16 bits held in a 16-bit int."""
    widened = bits.cast(U16).cast(U32).alu(Ops.SHL, UOp.const(U32, 16))
    return UOp(Ops.BITCAST, F32, (widened,))


def bfloat16_alu(node: UOp) -> UOp:
    computed = node.replace(dtype=F32)
    return computed if node.op in EXACT_ON_BFLOAT16 else round_to_bfloat16(computed)


LOW_HALF_CLEARED = {Ops.AND: 0xFFFF0000, Ops.SHL: 16}  # uint32 ops whose result has its low 16 bits zero


def bfloat16_store(store: UOp) -> UOp | None:
    buffer, index, value = store.src[:3]
    if buffer.dtype != BF16 or value.dtype == U16:
        return None
    value = value.cast(F32)
    # a value on the bfloat16 grid already (rounded by an op, or loaded as bfloat16) is its float32 bits' top half:
    # rounding it again would change nothing, at a dozen integer ops a value
    bits32 = value.src[0] if value.op is Ops.BITCAST else None
    on_grid = bits32 is not None and bits32.op in LOW_HALF_CLEARED and bits32.src[1].op is Ops.CONST
    on_grid = on_grid and bits32.src[1].arg == LOW_HALF_CLEARED[bits32.op]
    bits32 = bits32 if on_grid else bfloat16_bits32(value)
    bits = bits32.alu(Ops.SHR, UOp.const(U32, 16)).cast(U16)
    return store.replace(src=(buffer, index, bits, *store.src[3:]))


def bfloat16_reduce(node: UOp) -> UOp:
    computed = node.replace(dtype=F32, src=(node.src[0].cast(F32), *node.src[1:]))
    return computed if node.arg is Ops.MAX else round_to_bfloat16(computed)


def wide_type(dtype: DType) -> DType:
    return dtypes.uint32 if dtype.is_unsigned else dtypes.int32


def small_int_alu(node: UOp) -> UOp | None:
    """An op on (or giving) an int narrower than 32 bits, computed in 32 bits and cast back."""
    operand = node.src[-1].dtype
    if not is_small_int(operand) and not is_small_int(node.dtype):
        return None
    wide = wide_type(operand if is_small_int(operand) else node.dtype)
    sources = tuple(source.cast(wide) if is_small_int(source.dtype) else source for source in node.src)
    if node.op in COMPARISON:
        return node.replace(src=sources)
    return node.replace(dtype=wide, src=sources).cast(node.dtype)


def small_int_reduce(node: UOp) -> UOp | None:
    if not is_small_int(node.dtype):
        return None
    wide = wide_type(node.dtype)
    return node.replace(dtype=wide, src=(node.src[0].cast(wide), *node.src[1:])).cast(node.dtype)


def cast_rule(node: UOp, ctx: set[UOp]) -> UOp | None:
    """Casts: to bfloat16 rounded; bool to and from narrow ints through 32 bits; float64 to half through float32;
    float to int through a guarded int64 (`ctx` holds the guarded conversions, left as they are)."""
    source, dtype = node.src[0], node.dtype
    if source.dtype == dtype:
        return source
    if dtype == BF16:
        return round_to_bfloat16(source.cast(F32))
    if dtype == dtypes.float16 and source.dtype == dtypes.float64:
        # through float32: exact (24 bits >= 2 * 11 + 2 makes the double rounding innocuous), and LLVM's JIT has no
        # routine for double to half (the call crashed)
        return source.cast(F32).cast(dtype)
    # bool to and from narrow ints through 32 bits: a one-byte bool register is no byte-sized int in every language
    if source.dtype == dtypes.bool and is_small_int(dtype):
        return source.cast(wide_type(dtype)).cast(dtype)
    if dtype == dtypes.bool and is_small_int(source.dtype):
        return source.cast(wide_type(source.dtype)).cast(dtype)
    if not (source.dtype.is_float and dtype.is_int) or node in ctx:
        return None
    value = source.cast(F32) if source.dtype.itemsize < 4 else source
    if dtype == U64:
        # int64 holds values below 2**63; the rest are 2**63 plus what int64 holds of them less 2**63
        low = float_to_int64(value, ctx).cast(U64)
        high = float_to_int64(value - UOp.const(value.dtype, 2.0**63), ctx).cast(U64) + UOp.const(U64, 1 << 63)
        return value.lt(UOp.const(value.dtype, 2.0**63)).where(low, high)
    return float_to_int64(value, ctx).cast(dtype)


def float_to_int64(value: UOp, guarded: set[UOp]) -> UOp:
    """A float truncated to int64, with what x86 gives for values int64 cannot hold (NaN, infinities, from
    +-2**63 on) made explicit: int64's most negative value. Every device then agrees (a GPU's own conversion
    saturates), and LLVM never converts an out-of-range value (poison there)."""
    limit = UOp.const(value.dtype, 2.0**63)
    in_range = UOp.const(value.dtype, -(2.0**63)).lt(value).logical_and(value.lt(limit))
    # the unselected conversion of an out-of-range value is never used (in LLVM a select passes on only the poison
    # of the operand it picks)
    conversion = value.cast(I64)
    guarded.add(conversion)
    return in_range.where(conversion, UOp.const(I64, -(1 << 63)))


def half_bits(x: UOp) -> UOp:
    """The uint16 bits of a float16 value (held as a float32 here), with integer ops on its float32 bits: C-style
    languages hold half in float registers (and OpenCL has no half type to reinterpret without cl_khr_fp16)."""
    bits = UOp(Ops.BITCAST, U32, (x.cast(F32),))

    def u32(value: int) -> UOp:
        return UOp.const(U32, value)

    sign = bits.alu(Ops.SHR, u32(16)).alu(Ops.AND, u32(0x8000))
    exponent = bits.alu(Ops.SHR, u32(23)).alu(Ops.AND, u32(0xFF))
    mantissa = bits.alu(Ops.AND, u32(0x7FFFFF))
    normal = (exponent + u32((1 << 32) - 112)).alu(Ops.SHL, u32(10)).alu(Ops.OR, mantissa.alu(Ops.SHR, u32(13)))
    # below 2**-14 a half is a multiple of 2**-24: its bits count those
    subnormal = (UOp(Ops.BITCAST, F32, (bits.alu(Ops.AND, u32(0x7FFFFFFF)),)) * UOp.const(F32, 2.0**24)).cast(U32)
    special = (
        u32(0x7C00).alu(Ops.OR, mantissa.alu(Ops.SHR, u32(13))).alu(Ops.OR, mantissa.ne(u32(0)).cast(U32) * u32(0x200))
    )
    magnitude = exponent.lt(u32(113)).where(subnormal, exponent.ne(u32(255)).where(normal, special))
    return sign.alu(Ops.OR, magnitude).cast(U16)


def half_from_bits(bits: UOp) -> UOp:
    """The float16 value of uint16 bits (the inverse of `half_bits`), computed in float32 and cast (exactly)."""
    bits = bits.cast(U16).cast(U32)

    def u32(value: int) -> UOp:
        return UOp.const(U32, value)

    sign = bits.alu(Ops.AND, u32(0x8000)).alu(Ops.SHL, u32(16))
    exponent = bits.alu(Ops.SHR, u32(10)).alu(Ops.AND, u32(0x1F))
    mantissa = bits.alu(Ops.AND, u32(0x3FF))
    normal = (exponent + u32(112)).alu(Ops.SHL, u32(23)).alu(Ops.OR, mantissa.alu(Ops.SHL, u32(13)))
    special = u32(0x7F800000).alu(Ops.OR, mantissa.alu(Ops.SHL, u32(13)))
    subnormal = UOp(Ops.BITCAST, U32, (mantissa.cast(F32) * UOp.const(F32, 2.0**-24),))
    magnitude = exponent.ne(u32(0)).where(exponent.ne(u32(31)).where(normal, special), subnormal)
    return UOp(Ops.BITCAST, F32, (sign.alu(Ops.OR, magnitude),)).cast(dtypes.float16)


def bitcast_rule(node: UOp) -> UOp | None:
    """Bitcasts of bfloat16 (a float32 here) and float16 (a float register in C-style languages) through integer
    ops on float32 bits, the same on every device."""
    source, dtype = node.src[0], node.dtype
    if source.dtype == dtypes.float16:
        bits = half_bits(source)
        return bfloat16_from_bits(bits) if dtype == BF16 else bits.cast(dtype)
    if dtype == dtypes.float16:
        if source.dtype == F32:  # a bfloat16 value
            source = bfloat16_bits32(source).alu(Ops.SHR, UOp.const(U32, 16))
        return half_from_bits(source)
    if dtype == BF16:
        return bfloat16_from_bits(source)
    if source.dtype == F32 and dtype.itemsize == 2:  # a bfloat16 value
        return bfloat16_bits32(source).alu(Ops.SHR, UOp.const(U32, 16)).cast(U16).cast(dtype)
    return None


def lower_narrow_dtypes(kernel_graph: UOp) -> UOp:
    """The kernel graph with bfloat16 computed in float32, narrow ints in 32 bits and float-to-int casts defined."""
    if not any(needs_lowering(node) for node in kernel_graph.toposort):  # (most kernels: no rewrite pass at all)
        return kernel_graph
    return graph_rewrite(kernel_graph, narrow_dtype_rules, ctx=set())


def needs_lowering(node: UOp) -> bool:
    """Whether a rule below may apply to `node` or to the nodes around it."""
    return node.dtype == BF16 or is_small_int(node.dtype) or node.op in (Ops.CAST, Ops.BITCAST)


narrow_dtype_rules = PatternMatcher(
    [
        (UPat(Ops.CONST, dtype=BF16, name="node"), lambda node: UOp.const(F32, node.arg)),
        (UPat(Ops.LOAD, dtype=BF16, name="node"), lambda node: bfloat16_from_bits(node.replace(dtype=U16))),
        (UPat(Ops.STORE, name="store"), bfloat16_store),
        (UPat(Ops.CAST, name="node"), cast_rule),
        (UPat(Ops.BITCAST, name="node"), bitcast_rule),
        (UPat(Ops.RANGE_REDUCE, dtype=BF16, name="node"), bfloat16_reduce),
        (UPat(Ops.RANGE_REDUCE, name="node"), small_int_reduce),
        (UPat(COMPUTED, dtype=BF16, name="node"), bfloat16_alu),
        (UPat(COMPUTED, name="node"), small_int_alu),
    ]
)
