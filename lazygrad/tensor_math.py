"""Elementwise math composed from the primitive ops: exponentials, powers, activations."""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING

import numpy as np

from lazygrad.dtype import bfloat16_to_float32, dtypes, least_upper_dtype, round_bfloat16, scalar_dtype
from lazygrad.tensor_elementwise import NARROW_FLOATS, broadcast_const, is_number
from lazygrad.uop.ops import Ops, UOp

if TYPE_CHECKING:
    from lazygrad.tensor import Tensor

LOG2_E = 1 / math.log(2)
LN_2 = math.log(2)
ATAN_SMALL, ATAN_LARGE = math.tan(math.pi / 8), math.tan(3 * math.pi / 8)
# atan(t) = t + t z P(z), z = t^2, on |t| <= tan(pi/8): a least-squares fit for float32 (1e-9 absolute)
ATAN_SERIES = (-0.3333333248, 0.1999962504, -0.1426605796, 0.1076171455, -0.0650150964)
# the same for float64: a least-squares fit of degree 9 in z (2.3e-16 relative)
ATAN_SERIES_FLOAT64 = (
    -0.33333333333324516,
    0.1999999999807424,
    -0.14285714126837684,
    0.11111104282563078,
    -0.09090734535167358,
    0.07689472551951215,
    -0.06636488468026612,
    0.056706003206105464,
    -0.04301220505268397,
    0.020607720327692914,
)
# erfc(a) = t exp(-a^2 + P(t)), t = 1 / (1 + a/2), a >= 0: a least-squares fit over [0, 10]
ERFC_SERIES = (
    -1.265570686,
    1.001627704,
    0.3553098918,
    0.2197799945,
    -0.684914037,
    1.589802169,
    -3.408038874,
    4.066195882,
    -2.660632697,
    0.9186638755,
    -0.1322231987,
)


# Taylor's coefficients of sinh(x) = x + x (c0 + c1 x^2 + ...) (cn = 1 / (2n+1)!, c0 = 0) and of erf (cn =
# 2/sqrt(pi) (-1)^n / (n! (2n+1)), c0 less the leading 1), for |x| < 1 and < 0.75, where exp(x) - exp(-x) and
# 1 - erfc(x) cancel. float32 takes the terms until the first left out is below 2e-8 of the sum there; float64 all
# of sinh's (below 1e-17)
SINH_TAYLOR = tuple(1 / math.factorial(2 * n + 1) if n else 0.0 for n in range(9))
ERF_TAYLOR = tuple(2 / math.sqrt(math.pi) * (-1) ** n / (math.factorial(n) * (2 * n + 1)) - (n == 0) for n in range(8))
# float64 erf: erf(a) = a P(a^2) below 1, and erfc(a) = exp(-a^2) Q(t), t = 1 / (1 + a/3), from 1 to 6 (erf is 1
# beyond), lowest power first: Chebyshev fits (mpmath.chebyfit, 50 digits) within 7e-18 of erf(a) / a and 4e-18 of
# erfc(a); evaluated in float64, erf is within 2 ulp of the exactly rounded value
ERF_FLOAT64 = (
    1.1283791670955126,
    -0.37612638903183543,
    0.11283791670945006,
    -0.02686617064323777,
    0.0052239776071164225,
    -0.0008548325975389692,
    0.00012055294904839707,
    -1.492473690741966e-05,
    1.6447424703317362e-06,
    -1.6208483801871705e-07,
    1.3720064546777686e-08,
    -7.795898827002142e-10,
)
ERFC_FLOAT64 = (
    3.7809408605387703e-07,
    0.18805132677476255,
    0.18823627493257508,
    0.17605997733145118,
    0.16634344697146503,
    0.08371352177739089,
    0.2394437056056354,
    -0.3240273441347353,
    0.7827870956144349,
    -1.1403447661861297,
    1.2845213284110484,
    -1.0544846624326085,
    0.5521248987909749,
    -0.16339979786477143,
    0.020974634373878025,
)


def _edge_slope(x: Tensor, direction, where: Tensor) -> Tensor:
    """0 in value, with slope `direction` * inf in x where `where` holds (finite x) and 0 elsewhere: the infinite or
    (times 0) nan gradients torch gives pow at the edges of its domain, added to a value that stays as it was."""
    shifted = x * direction
    # shifted - shifted is +0 with slope 1, and sqrt's slope at +0 is +inf
    return (where & x.isfinite()).where(shifted - shifted.detach(), 0.0).sqrt()


def _is_negative(x: Tensor) -> Tensor:
    """Where the float x has its sign bit set: -0.0 too (NaN by its sign bit). float32 and float64 read the bit as a
    signed int's; a narrower float by the reciprocal, which tells -0.0 from 0.0 (-inf, not inf)."""
    if x.dtype in (dtypes.float32, dtypes.float64):
        return x.bitcast(dtypes.int32 if x.dtype == dtypes.float32 else dtypes.int64) < 0
    return (x < 0) | ((x == 0) & (x.reciprocal() < 0))


def _keep_zero_sign(x: Tensor, result: Tensor, slope: float = 1.0) -> Tensor:
    """`result` of an odd function f of x, with f(-0.0) = -0.0 as torch's (a formula that adds a constant, or terms
    of both signs, gives +0.0 there); `slope` is f'(0), which the gradient at 0 keeps."""
    return (x == 0).where(x * slope if slope != 1 else x, result)


def _in_float32(method):
    """`method` computed in float32 for float16 and bfloat16 tensors and rounded once, as torch computes them: rounded
    after every op it lost digits, and its squares overflowed float16 past 256 (asinh(300) was inf)."""

    @functools.wraps(method)
    def wrapper(self: Tensor, *args, **kwargs) -> Tensor:
        if self.dtype in NARROW_FLOATS:
            return method(self.float(), *args, **kwargs).cast(self.dtype)
        return method(self, *args, **kwargs)

    return wrapper


def _rounded_to(value, dtype) -> float:
    """A Python number rounded to a float16 or bfloat16 `dtype`, as torch rounds a number beside such a tensor in
    `**` (one too large: inf with its sign)."""
    try:
        value = float(value)
    except OverflowError:  # (an int beyond float64's range)
        return math.copysign(math.inf, value)
    if dtype == dtypes.bfloat16:
        return round_bfloat16(value)
    with np.errstate(over="ignore"):
        return float(np.float16(value))


def _horner(x: Tensor, coefficients) -> Tensor:
    """c0 + c1 x + c2 x^2 + ... by Horner's rule (`coefficients` lowest power first). Its partial sums are what a
    gradient reads: for a long series in a gradient's path, `_odd_series`."""
    total = coefficients[-1]
    for coefficient in coefficients[-2::-1]:
        total = total * x + coefficient
    return total


def _odd_series(x: Tensor, coefficients) -> Tensor:
    """x + x (c0 + c1 z + c2 z^2 + ...) with z = x^2, summed term by term from the smallest, each power of z the
    product of two smaller ones: a gradient reads only those powers, cheap to compute again. (It would read every
    partial sum of Horner's rule, each costlier than the last, and the scheduler stores those in kernels of their
    own: sinh's forward and backward took 5 kernels rather than 2.)"""
    powers = [None, x * x]
    for k in range(2, len(coefficients)):
        # z^k as z^(2^j) z^(k - 2^j), 2^j the largest power of two below k: the fewest products under each power
        split = 1 << ((k - 1).bit_length() - 1)
        powers.append(powers[split] * powers[k - split])
    total = None
    for k in range(len(coefficients) - 1, -1, -1):
        if coefficients[k]:
            term = coefficients[k] * (x * powers[k] if k else x)
            total = term if total is None else total + term
    return x + total


def _largest_finite(dtype) -> float:
    """The largest finite value of a float dtype (bfloat16's from its bits: NumPy has no bfloat16)."""
    if dtype == dtypes.bfloat16:
        return float(bfloat16_to_float32(np.array(0x7F7F, dtype=np.uint16)))
    return float(np.finfo(dtype.np).max)


class MathMixin:
    """Elementwise functions of a Tensor, each a composition of primitives (so each has a gradient for free)."""

    __slots__ = ()

    def exp(self: Tensor) -> Tensor:
        if self.dtype == dtypes.bfloat16:  # x * log2(e) rounded to 8 bits would cost exp(x) |x| bits: one rounding
            return self.float().exp().cast(dtypes.bfloat16)
        x = self._to_float()
        # (on the nodes, as the product is written for float32: a half x times log2(e) in half is what the code
        # generator computes in float32 from x, rounded once; `x * LOG2_E` of a half is a float32 product now)
        return x._new(UOp(Ops.EXP2, x.dtype, (x.uop.alu(Ops.MUL, broadcast_const(x.dtype, LOG2_E, x.shape)),)))

    def exp2(self: Tensor) -> Tensor:
        return self._to_float()._unary(Ops.EXP2)

    @_in_float32
    def log(self: Tensor) -> Tensor:
        return self._to_float()._unary(Ops.LOG2) * LN_2

    def log2(self: Tensor) -> Tensor:
        return self._to_float()._unary(Ops.LOG2)

    def sqrt(self: Tensor) -> Tensor:
        return self._to_float()._unary(Ops.SQRT)

    @_in_float32
    def rsqrt(self: Tensor) -> Tensor:
        return self.sqrt().reciprocal()

    def sin(self: Tensor) -> Tensor:
        return self._to_float()._unary(Ops.SIN)

    def cos(self: Tensor) -> Tensor:
        return self._to_float()._unary(Ops.COS)

    @_in_float32
    def tan(self: Tensor) -> Tensor:
        return self.sin() / self.cos()

    def abs(self: Tensor) -> Tensor:
        if self.dtype == dtypes.bool or self.dtype.is_unsigned:  # (-x of an unsigned int wraps around)
            return self
        # max(x, -x): at 0 the tie splits the gradient into +1/2 and -1/2, so it is 0 there, as in torch
        magnitude = self.maximum(-self)
        if not self.dtype.is_float:
            return magnitude
        # a tie gives MAX's second operand in C, OpenCL, CUDA and the emulator: -0.0 for +0.0. A max with +0.0 makes
        # either zero +0.0 (as LLVM's maximum does) and keeps NaN; at 0 its tie passes half the gradient to max(x,
        # -x), whose slope there is 0. (`x + 0.0` would do too, but the simplifier takes it for x)
        return magnitude.maximum(0.0)

    def sign(self: Tensor) -> Tensor:
        if self.dtype == dtypes.bool:
            return self
        # -1, 0 or 1 for infinities too, and 0 for NaN, as in torch; the last term keeps a path of slope 0 to x
        return (self > 0).cast(self.dtype) - (self < 0).cast(self.dtype) + self.isfinite().where(self, 0) * 0

    def square(self: Tensor) -> Tensor:
        """x * x; a bool tensor's square is the default int (int64 in torch, whose default int that is)."""
        source = self.cast(dtypes.default_int) if self.dtype == dtypes.bool else self
        return source * source

    def floor(self: Tensor) -> Tensor:
        """Rounded down; ints and bools are whole already, and come back as they are (torch refuses bools)."""
        if not self.dtype.is_float:
            return self
        # through an integer wide enough for every value with a fraction (float64 has them up to 2**52): the larger
        # ones are whole numbers already
        integer, limit = (dtypes.int64, 2**52) if self.dtype.itemsize == 8 else (dtypes.int32, 2**31 - 1)
        truncated = self.cast(integer).cast(self.dtype)
        # a whole number is its own floor: -0.0 stays -0.0, as in torch (through the integer it became +0.0, and
        # frac(-0.0), x - trunc(x), was -0.0 where torch's is +0.0)
        has_fraction = (self.abs() < limit) & (truncated != self)
        whole = has_fraction.where((truncated > self).where(truncated - 1, truncated), self.detach())
        # the slope is 0 everywhere (the large values too, which are their own floor): x < x is never true, so this
        # select is a path of slope 0 to x, and x's gradient is 0 rather than absent
        return (self < self).where(self, whole)

    def ceil(self: Tensor) -> Tensor:
        """Rounded up; ints and bools come back as they are, as from `floor` (torch refuses bools)."""
        if not self.dtype.is_float:
            return self
        return -((-self).floor())

    def round(self: Tensor, decimals: int = 0) -> Tensor:
        """Round half to even, like NumPy and PyTorch; to `decimals` places (negative: tens, hundreds, ...) as
        torch does, the value scaled by 10**decimals, rounded and scaled back. (The scaled value is exact where the
        kernel fuses it into a multiply-add: float32 -2.345, a hair further from zero than -2.345, rounds to -2.35,
        where torch and NumPy first round the scaled value to -234.5 and then to -2.34.)"""
        if decimals:
            if not isinstance(decimals, int):
                raise TypeError(f"round: decimals must be an int, got {decimals!r}")
            if not self.dtype.is_float:
                raise TypeError(f"round: decimals needs a float tensor, got {self.dtype} (ints are whole already)")
            scale = 10.0**decimals
            return (self * scale).round() / scale
        if not self.dtype.is_float:  # ints and bools are whole already, as for `floor` (torch refuses bools)
            return self
        down = self.floor()
        fraction = self - down
        is_even = (down * 0.5).floor() * 2 == down
        rounded = (fraction > 0.5).where(down + 1, (fraction < 0.5).where(down, is_even.where(down, down + 1)))
        # a zero takes the input's sign, as torch's (-0.4 rounds to -0.0; down + 1 gave +0.0)
        return (rounded == 0).where(self * 0, rounded)

    def trunc(self: Tensor) -> Tensor:
        """Rounded toward zero; ints and bools come back as they are, as from `floor` (torch refuses bools)."""
        if not self.dtype.is_float:
            return self
        return (self < 0).where(self.ceil(), self.floor())

    def pow(self: Tensor, exponent, reverse: bool = False) -> Tensor:
        """`self ** exponent`; small integer exponents multiply exactly, others use exp2(y * log2(|x|)) with the
        sign of the base restored for odd integer exponents (and nan for a negative base otherwise). The dtype is
        torch's: an int or bool tensor to a Python float is the default float (`uint8 ** 2.0` is float32, not a
        wrapped uint8), to a Python int stays int (a bool tensor: the default int), and to a negative Python int is
        an error, as in torch."""
        if isinstance(exponent, np.generic):  # (np.int64(-1) as -1: the same rules as a Python number)
            exponent = exponent.item()
        narrow = self._narrow_pow_dtype(exponent)
        if narrow is not None:
            # a float16 or bfloat16 power is computed in float32 and rounded once, as torch computes it (rounded after
            # every op, bfloat16 10**10 was 2% off). As in torch, the operands are first the result's dtype: an int
            # tensor's values, and a Python number, base or exponent, rounded to it
            if hasattr(exponent, "uop"):
                return self.cast(narrow).float().pow(exponent.cast(narrow).float(), reverse).cast(narrow)
            return self.float().pow(_rounded_to(exponent, narrow), reverse).cast(narrow)
        number = exponent if isinstance(exponent, (int, float)) and not isinstance(exponent, bool) else None
        source = self
        if number is not None and not reverse and not self.dtype.is_float:
            if isinstance(number, int) and number < 0:
                # torch refuses this too. A negative exponent tensor gives the truncated power (0 but for bases 1
                # and -1, the README's rule), but a negative number written in code almost always means a
                # reciprocal, which truncated is a silent 0: an error naming the fix is better than either value
                raise ValueError(
                    f"pow: an integer tensor ({self.dtype}, shape {self.shape}) to a negative integer power "
                    f"({number}) is not allowed, as in torch; for the reciprocal power use a float exponent "
                    f"(x ** {float(number)!r}) or cast first (x.float() ** {number})"
                )
            # the dtype torch computes in: the default float for a Python float, the default int for a bool base
            source = self.cast(scalar_dtype("pow", number, self.dtype))
        if number is not None and not reverse and abs(number) <= 8 and float(number).is_integer():
            if number == 0:
                # 1 everywhere (nan and inf bases too), with slope 0 rather than no gradient: x < x is always false
                return (source < source).where(source, 1) if source.dtype.is_float else source.ones_like()
            # a negative power multiplies reciprocals, so at 0 the slope is -inf rather than 0 * inf
            result, base, power = None, source.reciprocal() if number < 0 else source, abs(int(number))
            while power:
                if power & 1:
                    result = base if result is None else result * base
                base, power = base * base, power >> 1
            return result
        base, exp = source._operands(exponent, "pow", reverse)
        if base.dtype == dtypes.bool:  # (both bools: x ** True is x, x ** False is True, as torch's bool ** bool)
            return base | ~exp
        if base.dtype.is_int and not exp.dtype.is_float:
            return base._integer_pow(exp, number if isinstance(number, int) and not reverse else None)
        base, exp = base._to_float(), exp._to_float()
        if number is not None and math.isfinite(number) and (abs(number) != 1 if reverse else number != 0):
            # a finite number as the base (not +-1) or the exponent (not 0) has none of the cases below: a smaller
            # graph; a positive base none of `_finite_pow`'s either (Adam's b1 ** steps)
            if reverse:
                power = (exp * math.log2(number)).exp2() if number > 0 else base._finite_pow(exp)
            else:
                power = base._power_above_one(number) if number > 1 else base._finite_pow(exp)
            return power.cast(base.dtype)  # (the selects' float constants are float32: a half base stays half)
        # x**0 for an infinite or NaN x, 1**y for an infinite or NaN y and (-1)**+-inf are 1 (C's pow, as in
        # torch), where exp2(y * log2|x|) would meet 0 * inf; the rest computes 1**1 there, so its slopes stay finite
        power_zero = (exp == 0) & ~base.isfinite()
        unit_base = ((base == 1) & ~exp.isfinite()) | ((base == -1) & exp.isinf())
        special = power_zero | unit_base
        finite = special.where(1.0, base)._finite_pow(special.where(1.0, exp))
        # torch's slopes there: ln(x) in y (inf, or nan for -inf and NaN), y * x**(y-1) in x (+-inf as y is, or nan
        # for a NaN y); the slope in an infinite y cannot be made from finite values, so it is 0
        slope_exp = _edge_slope(exp, 1, power_zero & (base > 0)) + _edge_slope(exp, 1, power_zero & ~(base > 0)) * 0
        exp_direction = (exp > 0).where(1.0, -1.0)
        slope_base = (
            _edge_slope(base, exp_direction, unit_base & ~exp.isnan())
            + _edge_slope(base, 1, unit_base & exp.isnan()) * 0
        )
        return special.where(slope_exp + slope_base + 1, finite).cast(base.dtype)

    def _narrow_pow_dtype(self: Tensor, exponent):
        """float16 or bfloat16 where `self ** exponent` (or `exponent ** self`) is a power of that dtype computed
        from a tensor of it, else None."""
        if hasattr(exponent, "uop"):
            dtype = least_upper_dtype(self.dtype, exponent.dtype, op_name="pow")
            return dtype if dtype in NARROW_FLOATS else None
        return self.dtype if self.dtype in NARROW_FLOATS and is_number(exponent) else None

    def _integer_pow(base: Tensor, exp: Tensor, number: int | None) -> Tensor:
        """base**exp for integers, exact and wrapping as the dtype does (torch's integer pow; a float power is exact
        only below 2**24): a multiply per bit of the exponent, squaring the base between. A negative exponent tensor
        gives 1 / base**|exp| truncated, as torch: 0 but for bases 1 and -1 (a negative number, `pow` refuses)."""
        bits = 8 * base.dtype.itemsize
        if number is not None:
            number = int(number)
            if number >= bits:
                # the same power modulo 2**bits in fewer multiplies: from the exponent `bits` on, an even base's
                # power is 0 and an odd one's repeats every 2**(bits-2)
                number = bits + (number - bits) % (1 << (bits - 2))
        magnitude = exp.abs() if number is None else None
        result, square = base.ones_like(), base
        for bit in range(number.bit_length() if number is not None else bits):
            if bit:
                square = square * square
            if number is None:
                result = ((magnitude >> bit) & 1).bool().where(result * square, result)
            elif number >> bit & 1:
                result = result * square
        if number is None:
            result = (exp < 0).where((base.abs() == 1).where(result, 0), result)
        return result

    def _finite_pow(base: Tensor, exp: Tensor) -> Tensor:
        """base**exp for float tensors, except the non-finite cases `pow` settles first."""
        is_zero, negative = base == 0, base < 0
        exp_is_int = exp.floor() == exp
        exp_is_odd = exp_is_int & ((exp * 0.5).floor() * 2 != exp)
        # (-inf)**y is |x|**y for a non-integer y too (C's pow, as in torch)
        undefined = negative & ~exp_is_int & base.isfinite()
        # |x|**y where x is nonzero and the power is real; elsewhere a base of 1 keeps log2 from 0 and negatives
        safe_base = (is_zero | undefined).where(1.0, base.abs())
        magnitude = (exp * safe_base.log2()).exp2()
        # the exponent's gradient is x**y * ln(x), nan for any negative base as in torch (|x| gave the value)
        defined = (negative & exp_is_odd).where(-magnitude, magnitude) + _edge_slope(exp, 1, negative & exp_is_int) * 0
        # a negative base to a non-integer power: nan, and so are both gradients (the log of a negative number), as
        # in torch; the selects keep that nan from the other elements' gradients
        nan_power = (undefined.where(exp, 0.0) * undefined.where(base, -1.0).log2()).exp2()
        return is_zero.where(base._pow_at_zero(exp, exp_is_int, exp_is_odd), undefined.where(nan_power, defined))

    def _power_above_one(base: Tensor, number: float) -> Tensor:
        """base**number for a float tensor and a finite Python number above 1 (not a small whole one, which `pow`
        multiplies out), with torch's slope n * x**(n-1). |x|**n is |x| * |x|**(n-1): exp2(n * log2|x|) passed its
        slope through the power itself (times n ln 2, then over x ln 2), so it was inf where the power overflows
        (float32 1e20 ** 2.5: torch's slope is 2.5e30) and lost its digits where the power is below the normal range
        (float32 9e-19 ** 2.5: 2.5 times too large). Where the product's way would leave the normal range, the way
        through |x|**(n-1) is cut and |x| carries the whole slope, as a value of constant slope n (there the second
        derivative is 0, not torch's). The exponent being known, its kind (whole, odd) picks the graph."""
        is_zero, negative = base == 0, base < 0
        whole = float(number).is_integer()
        odd = whole and int(number) % 2 == 1
        # a negative base to a non-integer power is nan, and so is its slope, as in torch ((-inf)**y is inf, C's pow)
        undefined = None if whole else negative & base.isfinite()
        outside = is_zero if undefined is None else is_zero | undefined
        magnitude_base = outside.where(1.0, base.abs())
        # the product's way: the power, times ln 2 and n - 1, in the normal range (float16 and bfloat16 powers are
        # computed in float32)
        factor = math.log2((number - 1) * LN_2)
        largest = math.log2(_largest_finite(base.dtype)) - 1 - max(factor, 0.0)
        smallest = math.log2(float(np.finfo(base.dtype.np).tiny)) + 1 - min(factor, 0.0)
        # (an infinite base keeps the product's way: its slope term below would be inf - inf)
        cut = (magnitude_base > 2.0 ** (largest / number)) & (magnitude_base < math.inf)
        cut = cut | (magnitude_base < 2.0 ** (smallest / number))
        log_base = cut.where(magnitude_base.detach(), magnitude_base).log2()
        # magnitude_base - its detached copy is 0 with slope 1
        slope_base = magnitude_base + cut.where((magnitude_base - magnitude_base.detach()) * (number - 1), 0.0)
        magnitude = slope_base * ((number - 1) * log_base).exp2()
        power = negative.where(-magnitude, magnitude) if odd else magnitude
        if undefined is not None:
            power = undefined.where(undefined.where(base, -1.0).sqrt(), power)
        # at either zero +0 with slope 0, or -0 at -0 for an odd power, as C's pow (at_zero * at_zero is +0 there)
        at_zero = is_zero.where(base, 0.0)
        return is_zero.where(at_zero * 0 if odd else at_zero * at_zero * 0, power)

    def _pow_at_zero(base: Tensor, exp: Tensor, exp_is_int: Tensor, exp_is_odd: Tensor) -> Tensor:
        """base**exp where the base is +0 or -0: for each kind of exponent an expression worth 0**y at 0 whose slope
        there is torch's y * 0**(y-1) (0 for y > 1 or y == 0, 1 for y == 1, inf for 0 < y < 1, -inf for y < 0, but
        +inf at -0 for even y < 0), and whose slope in y is torch's 0**y * ln(0): 0 for y >= 0, -0**y * inf below.
        Each input is the base only where its expression is chosen, so an unchosen sqrt(0) or 1/0 adds no 0 * inf."""
        is_zero = base == 0
        negative_zero = is_zero & (is_zero.where(base, 1.0).reciprocal() < 0)
        at_zero = is_zero.where(base, 0.0)
        # +0 at either zero, with slope 1 (base - base is +0 for -0 too)
        plus_zero = is_zero.where(base - base.detach(), 0.0)
        root = (is_zero & (exp > 0) & (exp < 1)).where(plus_zero, 1.0).sqrt()
        # 1/x for odd y (-inf at -0), and for even y at -0 1/(-x) (+inf, rising as the even power does)
        negative_power = is_zero & (exp < 0)
        denominator = exp_is_odd.where(at_zero, (negative_zero & exp_is_int).where(-at_zero, plus_zero))
        inverse = negative_power.where(denominator, 1.0).reciprocal()
        inverse = inverse + _edge_slope(exp, (inverse < 0).where(1.0, -1.0), negative_power)
        negative_or_nan = (exp < 0).where(inverse, float("nan"))
        below_one = (exp > 0).where(root, (exp == 0).where(at_zero * 0 + 1, negative_or_nan))
        # above 1: -0 only for odd y at -0, as C's pow (at_zero * at_zero is +0 at either zero), slope 0 either way;
        # for y = 2 x * x itself, whose second slope is torch's 2
        square = at_zero * at_zero
        above_one = exp_is_odd.where(at_zero * 0, (exp == 2).where(square, square * 0))
        return (exp > 1).where(above_one, (exp == 1).where(at_zero, below_one))

    # ---- hyperbolic, inverse trigonometric and special functions ----------------------------------------------------

    @_in_float32
    def sinh(self: Tensor) -> Tensor:
        """(exp(x) - exp(-x)) / 2, and its Taylor series for |x| < 1, where the difference cancels (sinh(1e-8) was 0)."""
        source = self._to_float()
        small = source.abs() < 1
        near = small.where(source, 0.0)  # (the series of a large x would be inf: its slope times 0, nan)
        series = _odd_series(near, SINH_TAYLOR[: 9 if source.dtype == dtypes.float64 else 6])
        # exp(x - ln 2) is exp(x) / 2 without overflowing where exp(x) alone would (88.7 < x < 89.4)
        return small.where(series, (source - LN_2).exp() - (-source - LN_2).exp())

    @_in_float32
    def cosh(self: Tensor) -> Tensor:
        """(exp(x) + exp(-x)) / 2, of an int or bool tensor's values as floats (-x of int8 -128 wrapped)."""
        source = self._to_float()
        return (source - LN_2).exp() + (-source - LN_2).exp()

    def _odd(self: Tensor, function, slope: float = 1.0) -> Tensor:
        """An odd function from its values at x >= 0: f(x) = -f(-x), with f'(0) = `slope`. The magnitude is a
        select, not `abs`, so the gradient at 0 is f's slope there (`abs` would split it into +1/2 and -1/2)."""
        source = self._to_float()
        negative = source < 0
        result = function(negative.where(-source, source))
        return _keep_zero_sign(source, negative.where(-result, result), slope)

    @_in_float32
    def atan(self: Tensor) -> Tensor:
        """The arctangent, in (-pi/2, pi/2)."""
        return self._odd(type(self)._atan_of_magnitude)

    @_in_float32
    def _atan_of_magnitude(a: Tensor) -> Tensor:
        """atan(a) for a >= 0 (at -0.0: +0.0)."""
        # reduce a >= 0 into |t| <= tan(pi/8): atan(a) = pi/2 + atan(-1/a) above tan(3pi/8) and
        # pi/4 + atan((a-1)/(a+1)) between; each select sees a safe input so no branch makes inf or nan gradients
        large, middle = a > ATAN_LARGE, (a > ATAN_SMALL) & (a <= ATAN_LARGE)
        between = middle.where(a, 0)
        t = large.where(-1 / large.where(a, 1), middle.where((between - 1) / (between + 1), a))
        # (beside a tensor of a's dtype the numbers are constants of that dtype: float64 pi/4, not float32's)
        offset = large.where(math.pi / 2, middle.where(math.pi / 4, a.zeros_like()))
        z = t * t
        if a.dtype == dtypes.float64:  # (term by term: Horner's partial sums of a long series cost kernels)
            return offset + _odd_series(t, (0.0, *ATAN_SERIES_FLOAT64))
        return offset + t + t * z * _horner(z, ATAN_SERIES)

    def atan2(self: Tensor, other) -> Tensor:
        """The angle of the point (other, self) in [-pi, pi], as torch.atan2(self, other): signed zeros and
        infinities as IEEE's (atan2(0, -0) is pi, atan2(inf, inf) pi/4), NaN where either is NaN."""
        y, x = self._operands(other, "atan2")
        y, x = y._to_float(), x._to_float()
        # magnitudes by the sign bits, as the signs given at the end read them (at -0.0 a select by `< 0` took +y:
        # the gradient's sign there was wrong)
        below, behind = _is_negative(y), _is_negative(x)  # (x = -0 counts as behind: atan2(0, -0) is pi)
        ay, ax = below.where(-y, y), behind.where(-x, x)
        # the smaller magnitude over the larger, so the ratio is in [0, 1]; selects (not max/min, whose gradient
        # splits a tie) pick which, so the gradient follows the branch taken
        steep = ay > ax
        smaller, larger = steep.where(ax, ay), steep.where(ay, ax)
        zero, infinite = larger == 0, smaller == math.inf  # (0/0 and inf/inf: the angle of the axes, of a diagonal)
        ratio = zero.where(0.0, infinite.where(1.0, smaller / (zero | infinite).where(1.0, larger)))
        angle = ratio._atan_of_magnitude()  # (the ratio is a magnitude: a ratio of -0.0 makes an angle of +0.0)
        angle = steep.where(math.pi / 2 - angle, angle)
        # the sign of y by a select (angle >= 0): copysign's slope at a zero angle is 0, atan2's is not
        angle = behind.where(math.pi - angle, angle)
        angle = below.where(-angle, angle)
        return (x.isnan() | y.isnan()).where(math.nan, angle)

    @_in_float32
    def asin(self: Tensor) -> Tensor:
        """The arcsine, in [-pi/2, pi/2]; nan outside [-1, 1]."""
        # 2 atan(x / (1 + sqrt(1 - x^2))), the half angle's tangent, in [-1, 1]: atan(x / sqrt(1 - x^2)) met atan's
        # slope 0 at inf times inf at |x| = 1, a nan gradient where torch's is inf. 1 - x*x is one fused multiply-add,
        # exact before its rounding (sqrt((1 - x)(1 + x)), as precise, passed the root's infinite slope at +-1 to a
        # factor 0: nan; two roots, sqrt(1 - x) sqrt(1 + x), cost a large tensor's forward and backward a kernel
        # more). Where a device rounds the product first (the PYTHON emulator, a CPU without FMA), 1 - x*x loses up
        # to half its digits near |x| = 1 (asin there: 7 ulp off in float32, 1000 in float64). Of an int's value as
        # a float (1 - x of uint8 2 wrapped to 255)
        x = self._to_float()
        return 2 * (x / (1 + (1 - x * x).sqrt())).atan()  # (atan keeps a zero's sign: asin(-0.0) is -0.0)

    @_in_float32
    def acos(self: Tensor) -> Tensor:
        """The arccosine, in [0, pi]; nan outside [-1, 1]."""
        # 2 atan(sqrt(1 - x) / sqrt(1 + x)) is accurate near both ends, where pi/2 - asin(x) cancels. Two roots, not
        # sqrt((1 - x) / (1 + x)): at 1 the numerator's root alone carries the infinite slope (the quotient's passed
        # it to the divisor times 0: nan). At -1 the quotient is inf, and atan's slope 0 there times inf is nan: that
        # one point is pi - sqrt(1 + x), whose slope is torch's -inf
        x = self._to_float()
        behind, ahead = (1 - x).sqrt(), (1 + x).sqrt()
        edge = x == -1
        angle = 2 * (behind / edge.where(1.0, ahead)).atan()
        return edge.where(math.pi - ahead, angle)

    @_in_float32
    def asinh(self: Tensor) -> Tensor:
        """The inverse hyperbolic sine: log(u), u = x + sqrt(x^2 + 1), plus what rounding u lost (log1p's correction:
        log(u) alone lost a small x's digits, asinh(1e-6) was 4.6% off and asinh(1e-8) 0)."""

        def asinh_of_magnitude(a: Tensor) -> Tensor:
            # past 2**26, sqrt(a^2 + 1) is a in float32 (and a^2 overflows past 1e19): log(2a)
            huge = a > 2.0**26
            safe = huge.where(1.0, a)
            root = (safe * safe + 1).sqrt()
            u = safe + root
            # u - 1 is exact where u rounded, and a + a^2 / (root + 1) is what it should be: their difference over
            # u (root - a is 1 / u) is what log(u) lacks (log1p's correction). Its slope is 0: the gradient reads only
            # what log(u)'s does, as before
            correction = (((safe + safe * safe / (root + 1)) - (u - 1)) * (root - safe)).detach()
            return huge.where(huge.where(a, 1.0).log() + LN_2, u.log() + correction)

        return self._odd(asinh_of_magnitude)

    @_in_float32
    def acosh(self: Tensor) -> Tensor:
        """The inverse hyperbolic cosine: 2 log(v), v = (sqrt(x + 1) + sqrt(x - 1)) / sqrt(2) (v^2 is x + sqrt(x^2 - 1)),
        plus what rounding v lost (log(v) alone was up to 1000 ulp off near 1); nan below 1, as torch. At 1 its slope is
        torch's inf: the sum passes the root's (log(x + sqrt((x - 1)(x + 1))) passed it to a factor 0 of the product,
        nan). Neither root is costly, so a large tensor's forward and backward recompute them rather than store them."""
        source = self._to_float()
        d = source + -1.0  # (exact near 1; `- 1` would be a negation node more for the scheduler to count)
        plus, minus = (source + 1).sqrt(), d.sqrt()
        # a quotient, not a product by sqrt(1/2): v - 1 below must be the rounded v's, which a fused multiply-add
        # would skip (v is then 1 exactly at 1)
        v = (plus + minus) / math.sqrt(2)
        # v - 1 should be h / (a + 1) + b, with a = plus / sqrt(2), b = minus / sqrt(2), h = (x - 1) / 2 (log1p's
        # correction); none at inf (inf - inf), and below 1 the value is nan already (a root of a negative number)
        half = d * 0.5
        exact = half / (plus / math.sqrt(2) + 1) + minus / math.sqrt(2)
        correction = (half < math.inf).where((exact - (v - 1)) / v, 0.0).detach()
        return 2 * (v.log() + correction)

    @_in_float32
    def atanh(self: Tensor) -> Tensor:
        """The inverse hyperbolic tangent: (log(1 + x) - log(1 - x)) / 2, each log plus what rounding its argument
        lost (log1p's correction: log((1 + x) / (1 - x)) alone lost a small x's digits, atanh(1e-6) was 1.3% off);
        ±inf at ±1, where the slope is torch's inf (the quotient's read 0 * inf there), nan beyond."""
        source = self._to_float()
        up, down = 1 + source, 1 - source
        # log1p(x) is log(up) + (x - (up - 1)) / up, and -log1p(-x) is -log(down) + (x + (down - 1)) / down (x, not -x,
        # there: a negation read by the correction as well as by down is one more value a large tensor's forward and
        # backward store). At +-1 one argument is 0 and its correction 0 / 0: none is needed there, nor beyond, where
        # the value is nan
        inside = (source > -1) & (source < 1)
        correction = inside.where((source - (up - 1)) / up + (source + (down - 1)) / down, 0.0).detach()
        return _keep_zero_sign(source, (up.log() - down.log() + correction) * 0.5)

    @_in_float32
    def log1p(self: Tensor) -> Tensor:
        """log(1 + x), accurate for small x where log(1 + x) loses x's digits to the rounding of 1 + x."""
        source = self._to_float()
        u = 1 + source
        # u = 1 + x rounds; log(u) + (x - (u - 1)) / u adds back what the rounding lost (u - 1 is exact). -1 and inf
        # take log(u) itself (the correction would be 0/0 or inf - inf there)
        edge = (u == 0) | u.isinf()
        safe_u, safe_x = edge.where(1.0, u), edge.where(0.0, source)
        return _keep_zero_sign(source, edge.where(u.log(), safe_u.log() + (safe_x - (safe_u - 1)) / safe_u))

    @_in_float32
    def expm1(self: Tensor) -> Tensor:
        """exp(x) - 1, accurate for small x where exp(x) - 1 cancels."""
        source = self._to_float()
        small = source.abs() <= 0.5
        x = small.where(source, 0.0)
        u = x.exp()
        # u = exp(x) rounds; x - log(u) is that rounding (relative to u), added back: exp(x) = u * exp(x - log(u))
        return _keep_zero_sign(source, small.where((u - 1) + u * (x - u.log()), source.exp() - 1))

    def logaddexp(self: Tensor, other) -> Tensor:
        """log(exp(x) + exp(y)) without overflow: max(x, y) + log1p(exp(-|x - y|)) (torch.logaddexp)."""
        x, y = self._operands(other, "logaddexp")
        x, y = x._to_float(), y._to_float()
        same_infinity = (x == y) & x.isinf()  # x - y would be nan; the answer is that infinity
        distance = same_infinity.where(0.0, (x - y).abs())
        return x.maximum(y) + same_infinity.where(0.0, (-distance).exp().log1p())

    def _erfc_of_magnitude(a: Tensor) -> Tensor:
        """erfc(a) for a >= 0 (or nan), from a fit of t exp(-a^2 + P(t)) with t = 1 / (1 + a/2) (within 3e-8 relative
        in float64, so about float32's rounding)."""
        t = 1 / (1 + 0.5 * a)
        series = _horner(t, ERFC_SERIES)
        # erfc underflows to 0 past a ~ 10 (and a^2 overflows past 1e19)
        beyond = a > 10
        bounded = beyond.where(0.0, a)
        return beyond.where(0.0, t * (series - bounded * bounded).exp())

    @_in_float32
    def erf(self: Tensor) -> Tensor:
        """The error function: its Taylor series below 0.75 in magnitude, 1 - erfc beyond (which cancels near 0:
        erf(0) was -1.2e-7). float64's is `_erf_float64`'s."""
        if self.dtype == dtypes.float64:
            return self._erf_float64()

        def erf_of_magnitude(a: Tensor) -> Tensor:
            small = a < 0.75
            return small.where(_odd_series(small.where(a, 0.0), ERF_TAYLOR), 1 - a._erfc_of_magnitude())

        return self._odd(erf_of_magnitude, 2 / math.sqrt(math.pi))

    def _erf_float64(self: Tensor) -> Tensor:
        """erf of a float64 tensor within 2 ulp (the float32 fit beyond 0.75 was 3e-8 off): fits of erf(a) / a below 1
        and of erfc(a) exp(a^2) from 1 to 6 (ERF_FLOAT64, ERFC_FLOAT64), as a value without a slope, plus a term worth
        -0 whose slope is erf's, 2/sqrt(pi) exp(-x^2), exactly (and its second derivative too). The gradient reads
        x alone, not the fits' partial sums, which a large tensor's forward and backward would store."""
        x = self.detach()
        negative = x < 0
        magnitude = negative.where(-x, x)
        small = magnitude < 1
        near = small.where(magnitude, 0.0)
        series = _horner(near * near, ERF_FLOAT64)
        # (a NaN stays NaN through the minimum)
        far = small.where(1.0, magnitude.minimum(6.0))
        t = 1 / (1 + far * (1 / 3))
        tail = _horner(t, ERFC_FLOAT64)
        value = small.where(near * series, 1 - (-far * far).exp() * tail)
        value = negative.where(-value, value)
        # the slope term: with d = x - x.detach() (0 with slope 1), d G (1 + d x) for G = 2/sqrt(pi) exp(-x^2) has
        # slope G and second derivative G' = -2x G at d = 0 (erf(x) - erf(x - d), to second order in d). Written
        # with e = -d, x.detach() - x, which is +0: the term is -0, so erf(-0.0) stays -0.0. An infinite x is 0
        # here (inf - inf and 0 * inf would be nan), so its slope is 0, as torch's; a NaN's is NaN
        inside = self.abs() != math.inf
        finite = inside.where(self, 0.0)
        e = finite.detach() - finite
        slope = (2 / math.sqrt(math.pi)) * (-finite * finite).exp()
        return value - e * slope * (1 - e * finite)

    # ---- interpolation, signs and classification -----------------------------------------------------------------

    def lerp(self: Tensor, end, weight) -> Tensor:
        """self + weight * (end - self); `end` and `weight` are tensors or numbers that broadcast with self."""
        start, end = self._operands(end, "lerp")
        start, weight = start._operands(weight, "lerp")
        return start + (end._broadcast_to(start.shape) - start) * weight

    def copysign(self: Tensor, other) -> Tensor:
        """|self| with the sign of `other` (-0.0 counts as negative); always a float tensor."""
        x, y = self._operands(other, "copysign")
        x, y = x._to_float(), y._to_float()
        # +0 for either zero, with slope 0 there as torch's
        magnitude = (x < 0).where(-x, (x == 0).where(0.0, x))
        return _is_negative(y).where(-magnitude, magnitude)

    def isnan(self: Tensor) -> Tensor:
        """True where the value is NaN (never for ints and bools)."""
        return self != self if self.dtype.is_float else self.full_like(False, dtype=dtypes.bool)

    def isinf(self: Tensor, detect_positive: bool = True, detect_negative: bool = True) -> Tensor:
        """True where the value is +inf (if detect_positive) or -inf (if detect_negative)."""
        if not self.dtype.is_float:
            return self.full_like(False, dtype=dtypes.bool)
        infinities = [value for value, wanted in ((math.inf, detect_positive), (-math.inf, detect_negative)) if wanted]
        if not infinities:
            return self.full_like(False, dtype=dtypes.bool)
        return (self == infinities[0]) | (self == infinities[-1])

    def isfinite(self: Tensor) -> Tensor:
        """True where the value is neither inf nor NaN."""
        if not self.dtype.is_float:
            return self.full_like(True, dtype=dtypes.bool)
        return (self < math.inf) & (self > -math.inf)  # NaN compares false with everything

    def nan_to_num(self: Tensor, nan=0.0, posinf=None, neginf=None) -> Tensor:
        """NaN replaced by `nan`, +inf by `posinf` and -inf by `neginf`, by default the dtype's largest and lowest
        finite values (torch.nan_to_num); int and bool tensors hold none of them and come back as they are."""
        for name, value in (("nan", nan), ("posinf", posinf), ("neginf", neginf)):
            if value is not None and not isinstance(value, (int, float, np.integer, np.floating)):
                raise TypeError(f"nan_to_num: {name} must be a number or None, got {type(value).__name__}")
        if not self.dtype.is_float:
            return self
        largest = _largest_finite(self.dtype)
        # each replacement is rounded to the dtype, as torch does (posinf=1e10 in half is inf)
        result = self.isnan().where(nan, self)
        result = (self == math.inf).where(largest if posinf is None else posinf, result)
        return (self == -math.inf).where(-largest if neginf is None else neginf, result)

    def isclose(self: Tensor, other, rtol: float = 1e-05, atol: float = 1e-08, equal_nan: bool = False) -> Tensor:
        """|self - other| <= atol + rtol * |other| elementwise; equal infinities are close, NaN only with equal_nan."""
        if rtol < 0 or atol < 0:
            raise ValueError(f"isclose: rtol and atol must be non-negative, got rtol={rtol}, atol={atol}")
        x, y = self._operands(other, "isclose")
        x, y = x._to_float(), y._to_float()
        close = (x == y) | (x.isfinite() & y.isfinite() & ((x - y).abs() <= atol + rtol * y.abs()))
        return close | (x.isnan() & y.isnan()) if equal_nan else close
