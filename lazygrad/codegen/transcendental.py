"""exp2, log2, sin and cos as polynomials built from plain arithmetic, for renderers whose built-in versions are
scalar library calls (LLVM lowers llvm.exp2/log2/sin/cos to libm calls that never vectorize).

exp2: 2^x = 2^n · 2^f with n = round(x), |f| ≤ 1/2, 2^f = e^(f·ln2) by its Taylor series to degree 7 (relative
error below 1e-8), and 2^n built from exponent bits in two halves so overflow gives inf and tiny results are
denormal. exp (Tensor.exp's EXP2(y·log2 e)): e^y = 2^n · e^r with n = round(y·log2 e) and r = y - n·ln2 exact,
e^r by its series; renderers whose exp2 is good take that of r·log2 e instead (`exp_rules`). log2: x = m · 2^e
with m in [√½, √2) read from the bits, ln m = 2·atanh((m-1)/(m+1)) by its series.
sin and cos: |x| = (n + f)·π/2 with n an integer and |f| ≤ 1/2, computed exactly enough for every float32 (a
Payne–Hanek reduction in integer arithmetic, below), then sin or cos of f·π/2 by their series, chosen and signed by
n mod 4. Everything is straight-line code with selects, so loops of it vectorize; results are within 1 ulp of the
exact values (checked over the whole float32 range, near multiples of π/2 included).
"""

from __future__ import annotations

import math

import numpy as np

from lazygrad.dtype import dtypes
from lazygrad.uop.ops import Ops, UOp
from lazygrad.uop.pattern import PatternMatcher, UPat

F16, F32, F64, I32, I64 = dtypes.float16, dtypes.float32, dtypes.float64, dtypes.int32, dtypes.int64


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


# a float's int of its size, its exponent bias and where its exponent bits start
EXPONENT_BITS = {F32: (I32, 127, 23), F64: (I64, 1023, 52)}


def power_of_two(n: UOp, dtype=F32) -> UOp:
    """2^n as a float32 (an int32 n in [-126, 127]) or float64 (an int64 n in [-1022, 1023]), from the exponent
    bits."""
    int_type, bias, shift = EXPONENT_BITS[dtype]
    return UOp(Ops.BITCAST, dtype, ((n + bias).alu(Ops.SHL, UOp.const(int_type, shift)),))


def exp2_float32(x: UOp) -> UOp:
    # clamp so the exponent halves stay in range; nan is routed around the integer conversion
    safe = select(is_nan(x), const(x, 0.0), clamp(x, -151.0, 129.0))
    rounded = nearest_integer(safe)
    # e^(f·ln2) = Σ (f·ln2)^k / k!, with ln2^k folded into the coefficients
    series = polynomial(safe - rounded, [math.log(2) ** k / math.factorial(k) for k in range(8)])
    return select(is_nan(x), x, times_power_of_two(series, rounded))


# ln 2 in two parts: the first with 16 significant bits, so n·LN2_HIGH is exact for every |n| < 256; log2 e in two
LN2_HIGH, LN2_LOW = 0.693145751953125, 1.4286068203094173e-06
LOG2_E_HIGH = float(np.float32(1 / math.log(2)))
LOG2_E_LOW = float(np.float32(1 / math.log(2) - LOG2_E_HIGH))


def exp_float32(y: UOp) -> UOp:
    """e^y, for EXP2(y·log2 e), by the series: see `reduce_for_exp`."""
    rounded, reduced = reduce_for_exp(y)
    series = polynomial(reduced, [1 / math.factorial(k) for k in range(8)])
    return select(is_nan(y), y, times_power_of_two(series, rounded))


def exp_by_exp2(y: UOp) -> UOp:
    """e^y, for EXP2(y·log2 e), by the device's own exp2 of the reduced argument (see `reduce_for_exp`): within its
    exp2's error. The product r·log2 e is taken in two parts (the sum then matches no rule)."""
    rounded, reduced = reduce_for_exp(y)
    scaled = UOp(Ops.EXP2, y.dtype, (reduced * LOG2_E_HIGH + reduced * LOG2_E_LOW,))
    return select(is_nan(y), y, times_power_of_two(scaled, rounded))


# the same in float64: ln 2 in two parts, the first with its low 32 bits zero (n·LN2_HIGH_64 is exact for every
# |n| < 2^20), and log2 e in two (its high part a float32's)
LN2_HIGH_64, LN2_LOW_64 = 6.93147180369123816490e-01, 1.90821492927058770002e-10
LOG2_E_64 = 1 / math.log(2)
LOG2_E_64_HIGH = float(np.float32(LOG2_E_64))
LOG2_E_64_LOW = LOG2_E_64 - LOG2_E_64_HIGH


def exp_float64(y: UOp) -> UOp:
    """e^y for a float64 EXP2(y·log2 e), as `exp_by_exp2` for float32: y = n·ln2 + r (Cody and Waite), the device's
    exp2 of r·log2 e, times 2^n in two halves (inf past the largest double, denormal below the smallest normal).
    Rounding y·log2 e first cost |y·log2 e| ulp: 393 near y = -507."""
    safe = select(is_nan(y), const(y, 0.0), clamp(y, -1076.0 * math.log(2), 1025.0 * math.log(2)))
    rounded = nearest_integer(safe * LOG2_E_64)
    reduced = (safe - rounded * LN2_HIGH_64) - rounded * LN2_LOW_64
    scaled = UOp(Ops.EXP2, F64, (reduced * LOG2_E_64_HIGH + reduced * LOG2_E_64_LOW,))
    return select(is_nan(y), y, times_power_of_two(scaled, rounded))


def reduce_for_exp(y: UOp) -> tuple[UOp, UOp]:
    """y = n·ln2 + r with n = round(y·log2 e) and |r| ≤ ln2/2, r reduced in two steps (Cody and Waite), for float32 y
    clamped to where e^y is finite and not zero (NaN as 0): (n as a float, r). Rounding the product
    y·log2 e first, as EXP2(y·log2 e) does, would cost e^y |y·log2 e| bits of its last place (64 ulp near y = 88)."""
    safe = select(is_nan(y), const(y, 0.0), clamp(y, -151.0 * math.log(2), 129.0 * math.log(2)))
    rounded = nearest_integer(safe * (1 / math.log(2)))
    return rounded, (safe - rounded * LN2_HIGH) - rounded * LN2_LOW


def clamp(x: UOp, low: float, high: float) -> UOp:
    return select(x.lt(const(x, low)), const(x, low), select(const(x, high).lt(x), const(x, high), x))


def nearest_integer(x: UOp) -> UOp:
    """round(x) as a float, for |x| far below 2^22 (2^51 in float64): adding and taking away 1.5·2^23 (1.5·2^52)
    rounds away the fraction bits, cheaper than a compare, a select and two conversions."""
    magic = 6755399441055744.0 if x.dtype == F64 else 12582912.0
    return (x + const(x, magic)) - const(x, magic)


def times_power_of_two(x: UOp, rounded: UOp) -> UOp:
    """x·2^n for an integer n held in a float32 in [-151, 129] (a float64 in [-1076, 1025]): x times two powers built
    from exponent bits, one after the other, so a result past the largest float is inf and one below the smallest
    normal is denormal."""
    int_type = EXPONENT_BITS[x.dtype][0]
    n = rounded.cast(int_type)
    low_half = n.alu(Ops.SHR, UOp.const(int_type, 1))
    return x * power_of_two(low_half, x.dtype) * power_of_two(n - low_half, x.dtype)


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


# 2/π in binary, its first 224 bits after the point: enough for the largest float32 exponent plus 96 bits to keep
TWO_OVER_PI_BITS = 0xA2F9836E_4E441529_FC2757D1_F534DDC0_DB629599_3C439041_FE5163AB
# the same bits as 32-bit words, after two zero words, so a window may start up to 64 bits before the point
TWO_OVER_PI_WORDS = (0, 0, *((TWO_OVER_PI_BITS >> (32 * (6 - i))) & 0xFFFFFFFF for i in range(7)))


def select_constant(index: UOp, values: list[int], dtype) -> UOp:
    """values[index] for a small integer index, as a chain of selects (a kernel has no constant tables)."""
    result = UOp.const(dtype, values[0])
    for position, value in enumerate(values[1:], start=1):
        result = select(index.ne(UOp.const(index.dtype, position)), result, UOp.const(dtype, value))
    return result


def quarter_turns(bits: UOp) -> tuple[UOp, UOp]:
    """|x| = (4k + n + f)·π/2 for a finite float32 |x| ≥ 2^-12 given by its bits (an int32): f·π/2 as a float32 in
    [-π/4, π/4], and n as an int64 in 0..3.

    |x| = m·2^e with m the 24-bit integer significand. Bits of 2/π worth 2^-j with j ≤ e - 2 add multiples of 4 to
    |x|·2/π, which do not change sin or cos, so only the 96 bits after them matter: the window w. m·w is |x|·2/π
    mod 4 in fixed point with 94 bits after the point, of which the 64 from the point's second bit above down are
    enough: the closest a float32 comes to a multiple of π/2 is 2^-29.9 quarter turns (16367173·2^72), so f keeps
    at least 30 of its bits. The window's words are chosen by selects and shifted into place in 64-bit integers; all
    products fit in 64 bits."""
    mantissa = bits.alu(Ops.AND, UOp.const(I32, 0x7FFFFF)).alu(Ops.OR, UOp.const(I32, 0x800000)).cast(I64)
    # where the window starts, counted in bits from the first of TWO_OVER_PI_WORDS (64 bits before the point):
    # |x| = m·2^(biased exponent - 150), and the window starts two bits later
    start = bits.alu(Ops.SHR, UOp.const(I32, 23)) + (64 - 152)
    word, shift = start.alu(Ops.SHR, UOp.const(I32, 5)), start.alu(Ops.AND, UOp.const(I32, 31)).cast(I64)
    windows = []
    for offset in range(3):  # the window's words, most significant first: each from a pair of table words
        pairs = [(TWO_OVER_PI_WORDS[i + offset] << 32) | TWO_OVER_PI_WORDS[i + offset + 1] for i in range(6)]
        pair = select_constant(word, pairs, I64)
        windows.append(pair.alu(Ops.SHL, shift).alu(Ops.SHR, UOp.const(I64, 32)).alu(Ops.AND, const(pair, 0xFFFFFFFF)))
    high, middle, low = (mantissa * window for window in windows)
    # |x|·2/π mod 4 with 62 bits after the point (wrapping in 64 bits drops the multiples of 4)
    fixed = high.alu(Ops.SHL, UOp.const(I64, 32)) + middle + low.alu(Ops.SHR, UOp.const(I64, 32))
    # round to the nearest quarter turn: n is the top two bits after adding one half, f the rest less one half
    rounded = fixed + (1 << 61)
    quadrant = rounded.alu(Ops.SHR, UOp.const(I64, 62)).alu(Ops.AND, UOp.const(I64, 3))
    fraction = rounded.alu(Ops.AND, UOp.const(I64, (1 << 62) - 1)) + -(1 << 61)
    return (fraction.cast(F64) * (math.pi / 2 * 2.0**-62)).cast(F32), quadrant


def sin_cos_float32(x: UOp, cosine: bool) -> UOp:
    """sin(x), or cos(x) when `cosine`: the sine or cosine series of the remainder, by the quadrant."""
    bits = UOp(Ops.BITCAST, I32, (x,)).alu(Ops.AND, UOp.const(I32, 0x7FFFFFFF))  # those of |x|
    remainder, quadrant = quarter_turns(bits)
    square = remainder * remainder
    # Taylor series to degree 9 and 10: on [-π/4, π/4] the next terms are below 2.5e-9 and 1.1e-10 of the value
    sine_series = polynomial(square, [(-1) ** k / math.factorial(2 * k + 1) for k in range(1, 5)])
    sine_of_remainder = remainder + remainder * square * sine_series
    cosine_series = polynomial(square, [(-1) ** k / math.factorial(2 * k) for k in range(1, 6)])
    cosine_of_remainder = const(x, 1.0) + square * cosine_series
    # cos(x) = sin(x + π/2): a quarter turn further; sin is odd, cos even
    quadrant = quadrant + 1 if cosine else quadrant
    odd_quadrant = quadrant.alu(Ops.AND, UOp.const(I64, 1)).ne(UOp.const(I64, 0))
    value = select(odd_quadrant, cosine_of_remainder, sine_of_remainder)
    negative = quadrant.alu(Ops.AND, UOp.const(I64, 2)).ne(UOp.const(I64, 0))
    if not cosine:
        negative = negative.alu(Ops.XOR, x.lt(const(x, 0.0)))
    value = select(negative, -value, value)
    # below 2^-12 (exponent bits 115), sin(x) rounds to x and cos(x) to 1 (and the reduction would lose bits to the
    # fixed point); sin and cos of inf or nan (exponent bits 255) are nan
    tiny = bits.lt(UOp.const(I32, 115 << 23))
    value = select(tiny, const(x, 1.0) if cosine else x, value)
    return select(UOp.const(I32, (255 << 23) - 1).lt(bits), const(x, math.nan), value)


def via_float32(op: Ops, x: UOp) -> UOp:
    return UOp(op, F32, (x.cast(F32),)).cast(x.dtype)


# Tensor.exp writes e^y as EXP2(y·log2 e): rounding that product first would cost e^y |y·log2 e| bits of its last
# place, so these rules take y itself
def exp_of_product(dtype) -> UPat:
    return UPat(Ops.EXP2, dtype=dtype, src=(UPat(Ops.MUL, src=[UPat.var("y"), UPat.cvar("c")]),))


LOG2_E_HALF = float(np.float16(1 / math.log(2)))


def half_exp(y: UOp, c: UOp) -> UOp | None:
    """A half e^y in float32 from y, rounded once (log2 e and the product rounded to 11 bits cost exp(10) 10 ulp)."""
    return UOp(Ops.EXP2, F32, (y.cast(F32) * LOG2_E_HIGH,)).cast(F16) if c.arg == LOG2_E_HALF else None


# for languages whose exp2 is good
exp_rules = PatternMatcher(
    [
        (exp_of_product(F32), lambda y, c: exp_by_exp2(y) if c.arg == LOG2_E_HIGH else None),
        (exp_of_product(F64), lambda y, c: exp_float64(y) if c.arg == LOG2_E_64 else None),
        (exp_of_product(F16), half_exp),
    ]
)

# sin and cos alone, for languages whose exp2 and log2 are good but whose sin and cos are not to be trusted
sin_cos_rules = PatternMatcher(
    [
        (UPat(Ops.SIN, dtype=F32, src=(UPat.var("x"),)), lambda x: sin_cos_float32(x, cosine=False)),
        (UPat(Ops.COS, dtype=F32, src=(UPat.var("x"),)), lambda x: sin_cos_float32(x, cosine=True)),
        (UPat(Ops.SIN, dtype=dtypes.float16, src=(UPat.var("x"),)), lambda x: via_float32(Ops.SIN, x)),
        (UPat(Ops.COS, dtype=dtypes.float16, src=(UPat.var("x"),)), lambda x: via_float32(Ops.COS, x)),
    ]
)
transcendental_rules = (
    PatternMatcher(
        [
            (exp_of_product(F32), lambda y, c: exp_float32(y) if c.arg == LOG2_E_HIGH else None),
            (exp_of_product(F64), lambda y, c: exp_float64(y) if c.arg == LOG2_E_64 else None),
            (exp_of_product(F16), half_exp),
            (UPat(Ops.EXP2, dtype=F32, src=(UPat.var("x"),)), exp2_float32),
            (UPat(Ops.LOG2, dtype=F32, src=(UPat.var("x"),)), log2_float32),
            (UPat(Ops.EXP2, dtype=dtypes.float16, src=(UPat.var("x"),)), lambda x: via_float32(Ops.EXP2, x)),
            (UPat(Ops.LOG2, dtype=dtypes.float16, src=(UPat.var("x"),)), lambda x: via_float32(Ops.LOG2, x)),
        ]
    )
    + sin_cos_rules
)
