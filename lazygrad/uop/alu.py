"""What each ALU op computes on Python scalars, with the kernels' semantics (used for constant folding and by the
PYTHON device), and the facts renderers need to give every integer op that same, defined, result.

Integer ops are defined for every input, on every device:

- ADD, MUL and NEG wrap around (two's complement), as NumPy and PyTorch do;
- IDIV truncates toward zero and MOD takes the dividend's sign, like C; dividing by zero gives 0 for both (as NumPy
  does: kernels cannot raise), and the most negative value divided by -1 wraps to itself with remainder 0;
- SHR of a signed value is arithmetic; a shift by an amount outside [0, bit width) shifts every bit out (SHL gives 0,
  SHR 0 or -1 by the sign), as NumPy and PyTorch do.

MOD of floats is C's fmod: the exact remainder of the truncated quotient, with the dividend's sign (NaN for a zero
divisor or an infinite dividend), which every language has as a function.

C, OpenCL C and CUDA C leave signed overflow, division by zero, that one overflowing division and out-of-range shifts
undefined (and LLVM IR makes them poison or a trap), so renderers compute what may overflow through unsigned types and
guard what may divide by zero or by -1 and shifts whose amount may be out of range; `may_wrap`, `division_hazards`
and `shift_in_range` say which nodes need it, from their ranges.
"""

from __future__ import annotations

import math
import operator
from typing import Any, Callable

import numpy as np

from lazygrad.dtype import DType, dtypes
from lazygrad.uop.ops import Ops, UOp, cast_python, dtype_limits, wrap_int


def _truncating_div(a: int, b: int) -> int:
    if b == 0:
        return 0
    quotient = abs(a) // abs(b)
    return quotient if (a >= 0) == (b >= 0) else -quotient


def _truncating_mod(a: int, b: int) -> int:
    return a - _truncating_div(a, b) * b if b != 0 else 0


def _float_remainder(a: float, b: float) -> float:
    """MOD of floats: C's fmod, the exact remainder of a truncated division, with the dividend's sign; NaN for a
    zero divisor or an infinite dividend (Python's math.fmod raises there)."""
    if b == 0 or math.isinf(a) or math.isnan(a) or math.isnan(b):
        return math.nan
    return math.fmod(a, b)


def _exp2(x: float) -> float:
    try:
        return math.pow(2.0, x)
    except OverflowError:
        return math.inf


def _log2(x: float) -> float:
    if math.isnan(x) or x < 0:
        return math.nan
    if x == 0:
        return -math.inf
    return math.log2(x)


def _sqrt(x: float) -> float:
    return math.nan if math.isnan(x) or x < 0 else math.sqrt(x)


def _recip(x: float) -> float:
    if x == 0:
        return math.copysign(math.inf, x)
    return 1.0 / x


def _fdiv(a: float, b: float) -> float:
    """IEEE division (Python's raises for a zero divisor): x / 0 is inf signed by both operands, 0 / 0 is nan."""
    if b == 0:
        return math.nan if a == 0 or math.isnan(a) else math.copysign(math.inf, a) * math.copysign(1.0, b)
    return a / b


def _sin(x: float) -> float:
    return math.nan if math.isinf(x) else math.sin(x)


def _fmax(a: float, b: float) -> float:
    return a if (math.isnan(a) or a > b) else b if not math.isnan(b) else b


def _cos(x: float) -> float:
    return math.nan if math.isinf(x) else math.cos(x)


ALU_FUNCTIONS: dict[Ops, Callable[..., Any]] = {
    Ops.EXP2: _exp2,
    Ops.LOG2: _log2,
    Ops.SIN: _sin,
    Ops.COS: _cos,
    Ops.SQRT: _sqrt,
    Ops.RECIP: _recip,
    Ops.NEG: operator.neg,
    Ops.ADD: operator.add,
    Ops.MUL: operator.mul,
    Ops.MAX: max,
    Ops.CMPLT: operator.lt,
    Ops.CMPNE: operator.ne,
    Ops.IDIV: _truncating_div,
    Ops.FDIV: _fdiv,
    Ops.MOD: _truncating_mod,
    Ops.AND: operator.and_,
    Ops.OR: operator.or_,
    Ops.XOR: operator.xor,
    Ops.SHL: operator.lshift,
    Ops.SHR: operator.rshift,
    Ops.WHERE: lambda cond, a, b: a if cond else b,
}


def exec_alu(op: Ops, dtype: DType, operands: list[Any]) -> Any:
    """The value of `op` applied to Python scalars, rounded/wrapped to the result `dtype`."""
    if op in (Ops.CMPLT, Ops.CMPNE):
        return bool(ALU_FUNCTIONS[op](*operands))
    if op is Ops.MAX and dtype.is_float:
        return cast_python(_fmax(*operands), dtype)
    if op is Ops.RECIP and dtype.is_int:
        return 0
    if op is Ops.MOD and dtype.is_float:
        return cast_python(_float_remainder(*operands), dtype)
    if op is Ops.MUL and dtype.is_float:
        # inf * 0 is nan, as in IEEE arithmetic
        a, b = operands
        if (math.isinf(a) and b == 0) or (math.isinf(b) and a == 0):
            return math.nan
    if op is Ops.ADD and dtype.is_float:
        a, b = operands
        if math.isinf(a) and math.isinf(b) and a != b:
            return math.nan
    if dtype.is_float and op in (Ops.ADD, Ops.MUL, Ops.NEG, Ops.RECIP, Ops.FDIV):
        # round the exact Python result the way the dtype would (a quotient too: a float64 quotient rounded to a
        # narrower float is that float's correctly rounded quotient, as float64 has more than twice its bits)
        with np.errstate(all="ignore"):
            return cast_python(ALU_FUNCTIONS[op](*operands), dtype)
    if dtype == dtypes.bool and op in (Ops.ADD, Ops.MUL, Ops.MAX):
        return bool({Ops.ADD: operator.or_, Ops.MUL: operator.and_, Ops.MAX: operator.or_}[op](*operands))
    if op in (Ops.SHL, Ops.SHR):
        # shifting by the bit width itself moves every bit out (Python's shifts never wrap the amount)
        value, amount = operands
        return cast_python(ALU_FUNCTIONS[op](value, amount if 0 <= amount < dtype.bits else dtype.bits), dtype)
    result = ALU_FUNCTIONS[op](*operands)
    return cast_python(result, dtype)


INT64_MIN = -(1 << 63)


def _float_to_int64(value: float) -> int:
    """A float truncated toward zero to int64, as x86's conversion does it: a value int64 cannot hold (NaN,
    infinities, beyond +-2**63) becomes int64's most negative value."""
    if math.isfinite(value) and INT64_MIN <= math.trunc(value) < -INT64_MIN:
        return math.trunc(value)
    return INT64_MIN


def cast_value(value: Any, dtype: DType) -> Any:
    """A scalar converted to `dtype` the way a kernel's cast does it. Float to int truncates toward zero into int64
    (see `_float_to_int64`), then wraps to the dtype's width, so every device agrees out of range too (NaN and
    infinities give 0 in ints narrower than 64 bits); float to uint64 takes values from 2**63 up through
    value - 2**63 (lowered so in codegen/narrow_dtypes.py)."""
    if dtype.is_int and isinstance(value, float):
        if dtype == dtypes.uint64 and not value < 2.0**63:
            return wrap_int(_float_to_int64(value - 2.0**63) + (1 << 63), dtype)
        return wrap_int(_float_to_int64(value), dtype)
    with np.errstate(all="ignore"):
        return cast_python(value, dtype)


def may_wrap(node: UOp) -> bool:
    """Whether a signed integer ADD, MUL or NEG may leave its dtype's range (then a kernel must compute it wrapping
    around); an index, whose range is known and fits, never does."""
    if not node.dtype.is_int or node.dtype.is_unsigned:
        return False
    lowest = dtype_limits(node.dtype)[0]
    if node.op is Ops.NEG:
        return node.src[0].vmin == lowest
    # ranges are clamped to the dtype's limits when they might overflow, and unknown values have those limits too
    return node.bounds == dtype_limits(node.dtype)


def division_hazards(node: UOp) -> tuple[bool, bool]:
    """For an integer IDIV or MOD: whether its divisor may be 0, and whether it may divide the most negative value by
    -1 (the one quotient that overflows); either makes C and LLVM undefined and traps on x86."""
    dividend, divisor = node.src
    may_be_zero = divisor.vmin <= 0 <= divisor.vmax
    overflow = not node.dtype.is_unsigned and divisor.vmin <= -1 <= divisor.vmax
    return may_be_zero, overflow and dividend.vmin == dtype_limits(node.dtype)[0]


def shift_in_range(node: UOp) -> bool:
    """Whether a SHL or SHR's amount is known to lie in [0, bit width), where every language shifts the same way."""
    amount = node.src[1]
    return 0 <= amount.vmin and amount.vmax < node.dtype.bits


# ---- the same semantics on NumPy arrays: the PYTHON device runs every thread of a launch at once ----------------

_ARRAY_FUNCTIONS: dict[Ops, Callable[..., Any]] = {
    Ops.NEG: np.negative,
    Ops.ADD: np.add,
    Ops.MUL: np.multiply,
    Ops.FDIV: np.divide,
    Ops.MAX: np.maximum,
    Ops.AND: np.bitwise_and,
    Ops.OR: np.bitwise_or,
    Ops.XOR: np.bitwise_xor,
}
_ARRAY_TRANSCENDENTAL: dict[Ops, Callable[..., Any]] = {
    Ops.EXP2: np.exp2,
    Ops.LOG2: np.log2,
    Ops.SIN: np.sin,
    Ops.COS: np.cos,
    Ops.SQRT: np.sqrt,
}
_BOOL_FUNCTIONS: dict[Ops, Callable[..., Any]] = {
    Ops.ADD: np.logical_or,
    Ops.MAX: np.logical_or,
    Ops.OR: np.logical_or,
    Ops.MUL: np.logical_and,
    Ops.AND: np.logical_and,
    Ops.XOR: np.logical_xor,
}


def exec_alu_array(op: Ops, dtype: DType, operands: list[Any]) -> Any:
    """`exec_alu` on NumPy arrays or scalars (of the operands' dtypes), element by element: the same value for every
    element as `exec_alu` gives for it, as a NumPy value of `dtype`."""
    out = dtype.np
    with np.errstate(all="ignore"):
        if op is Ops.CMPLT:
            return np.less(*operands)
        if op is Ops.CMPNE:
            return np.not_equal(*operands)
        if op is Ops.WHERE:
            return np.where(*operands).astype(out, copy=False)
        if dtype == dtypes.bool:
            if op is Ops.NEG:  # (as `exec_alu`: -True is true)
                return np.asarray(operands[0], np.bool_)
            return _BOOL_FUNCTIONS[op](*operands)
        if dtype.is_float:
            if op in _ARRAY_TRANSCENDENTAL:  # computed in float64 and rounded, as on Python floats
                return _ARRAY_TRANSCENDENTAL[op](np.asarray(operands[0], np.float64)).astype(out)
            if op is Ops.RECIP:
                return np.divide(out.type(1), operands[0], dtype=out)
            if op is Ops.MOD:  # (exact: computed in float64 from the operands' values, it rounds to itself)
                return np.fmod(np.asarray(operands[0], np.float64), operands[1]).astype(out)
            if op is Ops.MAX:
                a, b = operands
                return np.where(np.isnan(a) | (a > b), a, b).astype(out, copy=False)
            return np.asarray(_ARRAY_FUNCTIONS[op](*operands, dtype=out))
        values = [np.asarray(operand, out) for operand in operands]
        if op is Ops.RECIP:
            return np.zeros_like(values[0])
        if op in (Ops.IDIV, Ops.MOD):
            return _truncating_division_array(op, *values)
        if op in (Ops.SHL, Ops.SHR):
            return _shift_array(op, dtype, *values)
        return _ARRAY_FUNCTIONS[op](*values, dtype=out)


def _truncating_division_array(op: Ops, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IDIV or MOD as `_truncating_div`/`_truncating_mod` do them: toward zero, 0 for a zero divisor, and the most
    negative value divided by -1 wrapping to itself (remainder 0)."""
    zero = b == 0
    unsafe = zero | ((a == np.iinfo(a.dtype).min) & (b == -1)) if a.dtype.kind == "i" else zero
    divisor = np.where(unsafe, np.ones_like(b), b)
    quotient = a // divisor  # (floored; `unsafe` divides by 1)
    remainder = a - quotient * divisor
    if a.dtype.kind == "i":  # a floored quotient of operands of opposite signs is one below the truncated one
        rounded = (remainder != 0) & ((a < 0) != (divisor < 0))
        quotient = np.where(rounded, quotient + 1, quotient)
        remainder = np.where(rounded, remainder - divisor, remainder)
    result = quotient if op is Ops.IDIV else remainder
    return np.where(zero, np.zeros_like(result), result)


def _shift_array(op: Ops, dtype: DType, value: np.ndarray, amount: np.ndarray) -> np.ndarray:
    """SHL or SHR as `exec_alu` does them: an amount outside [0, bit width) shifts every bit out."""
    in_range = (amount >= 0) & (amount < dtype.bits)
    unsigned = np.dtype(f"u{dtype.itemsize}")
    steps = np.where(in_range, amount, 0).astype(unsigned)
    if op is Ops.SHL:  # (shifted as unsigned bits: the bits shifted out are dropped)
        shifted = np.left_shift(value.view(unsigned), steps).view(dtype.np)
        return np.where(in_range, shifted, np.zeros_like(shifted))
    shifted = np.right_shift(value, steps.astype(dtype.np))  # (arithmetic for signed values)
    return np.where(in_range, shifted, np.where(value < 0, -1, 0).astype(dtype.np))


def _float_to_int64_array(values: np.ndarray) -> np.ndarray:
    """`_float_to_int64` element by element."""
    truncated = np.trunc(values)
    fits = np.isfinite(values) & (truncated >= -(2.0**63)) & (truncated < 2.0**63)
    return np.where(fits, np.where(fits, truncated, 0).astype(np.int64), np.int64(INT64_MIN))


def cast_array(values: Any, dtype: DType) -> Any:
    """`cast_value` on a NumPy array or scalar, element by element."""
    values = np.asarray(values)
    with np.errstate(all="ignore"):
        if dtype.is_int and values.dtype.kind == "f":
            wide = values.astype(np.float64)
            if dtype == dtypes.uint64:
                low = _float_to_int64_array(wide).view(np.uint64)
                high = _float_to_int64_array(wide - 2.0**63).view(np.uint64) + np.uint64(1 << 63)
                return np.where(wide < 2.0**63, low, high)
            return _float_to_int64_array(wide).astype(dtype.np)
        return values.astype(dtype.np)
