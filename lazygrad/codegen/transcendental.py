"""exp2, log2 and sin as polynomials built from plain arithmetic, for renderers whose built-in versions are scalar
library calls (LLVM lowers llvm.exp2/log2/sin to libm calls that never vectorize).

exp2: 2^x = 2^n · 2^f with n = round(x), |f| ≤ 1/2, 2^f = e^(f·ln2) by its Taylor series to degree 7 (relative
error below 1e-8), and 2^n built from exponent bits in two halves so overflow gives inf and tiny results are
denormal. log2: x = m · 2^e with m in [√½, √2) read from the bits, ln m = 2·atanh((m-1)/(m+1)) by its series.
sin: range reduction in float64 (so |x| up to ~1e9 keeps float32 accuracy), then sin or cos of the remainder in
[-π/4, π/4] by their series, chosen by the quadrant.
"""

from __future__ import annotations

import math

from lazygrad.dtype import dtypes
from lazygrad.uop.ops import Ops, UOp
from lazygrad.uop.pattern import PatternMatcher, UPat

F32, F64, I32, I64 = dtypes.float32, dtypes.float64, dtypes.int32, dtypes.int64


def const(like: UOp, value) -> UOp:
    return UOp.const(like.dtype, value)


def polynomial(x: UOp, coefficients: list[float]) -> UOp:
    """c0 + c1·x + c2·x² + … by Horner's rule."""
    result = const(x, coefficients[-1])
    for coefficient in reversed(coefficients[:-1]):
        result = result * x + const(x, coefficient)
    return result


def is_nan(x: UOp) -> UOp:
    return x.ne(x)


def select(condition: UOp, if_true: UOp, if_false: UOp) -> UOp:
    return condition.where(if_true, if_false)


def round_to_int(x: UOp, dtype) -> UOp:
    """Nearest integer (halves away from zero) of a finite float."""
    half = select(x.lt(const(x, 0.0)), const(x, -0.5), const(x, 0.5))
    return (x + half).cast(dtype)


def power_of_two(n: UOp) -> UOp:
    """2^n for an int32 n in [-126, 127], from the exponent bits."""
    return UOp(Ops.BITCAST, F32, ((n + 127).alu(Ops.SHL, UOp.const(I32, 23)),))


def exp2_float32(x: UOp) -> UOp:
    # clamp so the exponent halves stay in range; nan is routed around the integer conversion
    clamped = select(x.lt(const(x, -151.0)), const(x, -151.0), select(const(x, 129.0).lt(x), const(x, 129.0), x))
    safe = select(is_nan(x), const(x, 0.0), clamped)
    # the nearest integer, as a float: adding and taking away 1.5·2^23 rounds away the fraction bits (|safe| is far
    # below 2^22), cheaper than a compare, a select and two conversions
    rounded = (safe + const(safe, 12582912.0)) - const(safe, 12582912.0)
    n, fraction = rounded.cast(I32), safe - rounded
    # e^(f·ln2) = Σ (f·ln2)^k / k!, with ln2^k folded into the coefficients
    series = polynomial(fraction, [math.log(2) ** k / math.factorial(k) for k in range(8)])
    low_half = n.alu(Ops.SHR, UOp.const(I32, 1))
    result = series * power_of_two(low_half) * power_of_two(n - low_half)
    return select(is_nan(x), x, result)


def log2_float32(x: UOp) -> UOp:
    # denormals: scale up by 2^24 first so the exponent bits are meaningful
    tiny = x.lt(const(x, 1.1754944e-38))
    scaled = select(tiny, x * 16777216.0, x)
    bits = UOp(Ops.BITCAST, I32, (scaled,))
    exponent = (bits.alu(Ops.SHR, UOp.const(I32, 23)).alu(Ops.AND, UOp.const(I32, 0xFF))) - 127
    exponent = exponent - select(tiny, UOp.const(I32, 24), UOp.const(I32, 0))
    mantissa = UOp(
        Ops.BITCAST, F32, (bits.alu(Ops.AND, UOp.const(I32, 0x7FFFFF)).alu(Ops.OR, UOp.const(I32, 0x3F800000)),)
    )
    large = const(mantissa, math.sqrt(2)).lt(mantissa)
    mantissa = select(large, mantissa * 0.5, mantissa)
    exponent = exponent + select(large, UOp.const(I32, 1), UOp.const(I32, 0))
    ratio = (mantissa - 1.0) * (mantissa + 1.0).alu(Ops.RECIP)
    series = polynomial(ratio * ratio, [1 / (2 * k + 1) for k in range(7)])
    result = exponent.cast(F32) + ratio * series * (2 / math.log(2))
    # the edges: log2(0) = -inf, log2(negative) = nan, log2(inf) = inf, nan stays nan
    result = select(x.ne(const(x, math.inf)), result, x)
    result = select(x.ne(const(x, 0.0)), result, const(x, -math.inf))
    return select(x.lt(const(x, 0.0)), const(x, math.nan), select(is_nan(x), x, result))


def sin_float32(x: UOp) -> UOp:
    wide = x.cast(F64)
    # nan, inf and values too large to reduce go through as 0 (the result is replaced below)
    magnitude = wide.alu(Ops.MAX, -wide)
    finite = select(magnitude.lt(const(wide, 1e15)), wide, const(wide, 0.0))
    quarter_turns = round_to_int(finite * (2 / math.pi), I64)
    # π/2 in two parts (fdlibm's): the product with the high part is exact, so the remainder keeps its accuracy
    turns = quarter_turns.cast(F64)
    remainder = (finite - turns * 1.5707963267341256) - turns * 6.077100506506192e-11
    square = remainder * remainder
    sine = remainder * polynomial(square, [(-1) ** k / math.factorial(2 * k + 1) for k in range(7)])
    cosine = polynomial(square, [(-1) ** k / math.factorial(2 * k) for k in range(8)])
    quadrant = quarter_turns.alu(Ops.AND, UOp.const(I64, 3))
    odd = quadrant.alu(Ops.AND, UOp.const(I64, 1)).ne(UOp.const(I64, 0))
    negative = quadrant.alu(Ops.AND, UOp.const(I64, 2)).ne(UOp.const(I64, 0))
    value = select(odd, cosine, sine)
    value = select(negative, -value, value).cast(F32)
    # sin of inf or nan is nan (x - x is nan exactly for those)
    return select(is_nan(x - x), const(x, math.nan), value)


def via_float32(op: Ops, x: UOp) -> UOp:
    return UOp(op, F32, (x.cast(F32),)).cast(x.dtype)


transcendental_rules = PatternMatcher(
    [
        (UPat(Ops.EXP2, dtype=F32, src=(UPat.var("x"),)), exp2_float32),
        (UPat(Ops.LOG2, dtype=F32, src=(UPat.var("x"),)), log2_float32),
        (UPat(Ops.SIN, dtype=F32, src=(UPat.var("x"),)), sin_float32),
        (UPat(Ops.EXP2, dtype=dtypes.float16, src=(UPat.var("x"),)), lambda x: via_float32(Ops.EXP2, x)),
        (UPat(Ops.LOG2, dtype=dtypes.float16, src=(UPat.var("x"),)), lambda x: via_float32(Ops.LOG2, x)),
        (UPat(Ops.SIN, dtype=dtypes.float16, src=(UPat.var("x"),)), lambda x: via_float32(Ops.SIN, x)),
    ]
)
