"""Elementwise math composed from the primitive ops: exponentials, powers, activations."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from lazygrad.dtype import dtypes
from lazygrad.uop.ops import Ops

if TYPE_CHECKING:
    from lazygrad.tensor import Tensor

LOG2_E = 1 / math.log(2)
LN_2 = math.log(2)


class MathMixin:
    """Elementwise functions of a Tensor, each a composition of primitives (so each has a gradient for free)."""

    __slots__ = ()

    def exp(self: Tensor) -> Tensor:
        return (self._to_float() * LOG2_E)._unary(Ops.EXP2)

    def exp2(self: Tensor) -> Tensor:
        return self._to_float()._unary(Ops.EXP2)

    def log(self: Tensor) -> Tensor:
        return self._to_float()._unary(Ops.LOG2) * LN_2

    def log2(self: Tensor) -> Tensor:
        return self._to_float()._unary(Ops.LOG2)

    def sqrt(self: Tensor) -> Tensor:
        return self._to_float()._unary(Ops.SQRT)

    def rsqrt(self: Tensor) -> Tensor:
        return self.sqrt().reciprocal()

    def sin(self: Tensor) -> Tensor:
        return self._to_float()._unary(Ops.SIN)

    def cos(self: Tensor) -> Tensor:
        return self._to_float()._unary(Ops.COS)

    def tan(self: Tensor) -> Tensor:
        return self.sin() / self.cos()

    def abs(self: Tensor) -> Tensor:
        if self.dtype == dtypes.bool:
            return self
        # max(x, -x): at 0 the tie splits the gradient into +1/2 and -1/2, so it is 0 there, as in torch
        return self.maximum(-self)

    def sign(self: Tensor) -> Tensor:
        if self.dtype == dtypes.bool:
            return self
        return (self > 0).cast(self.dtype) - (self < 0).cast(self.dtype) + self * 0

    def square(self: Tensor) -> Tensor:
        return self * self

    def floor(self: Tensor) -> Tensor:
        if not self.dtype.is_float:
            return self
        truncated = self.cast(dtypes.int32).cast(self.dtype)
        # values too large for int32 are already whole numbers
        whole = (self.abs() < 2**31 - 1).where((truncated > self).where(truncated - 1, truncated), self)
        return whole

    def ceil(self: Tensor) -> Tensor:
        return -((-self).floor())

    def round(self: Tensor) -> Tensor:
        """Round half to even, like NumPy and PyTorch."""
        down = self.floor()
        fraction = self - down
        is_even = (down * 0.5).floor() * 2 == down
        return (fraction > 0.5).where(down + 1, (fraction < 0.5).where(down, is_even.where(down, down + 1)))

    def trunc(self: Tensor) -> Tensor:
        return (self < 0).where(self.ceil(), self.floor())

    def pow(self: Tensor, exponent, reverse: bool = False) -> Tensor:
        """`self ** exponent`; small integer exponents multiply exactly, others use exp2(y * log2(|x|)) with the
        sign of the base restored for odd integer exponents (and nan for a negative base otherwise)."""

        if (
            not reverse
            and isinstance(exponent, (int, float))
            and not isinstance(exponent, bool)
            and float(exponent).is_integer()
            and abs(exponent) <= 8
        ):
            result, base, power = None, self, abs(int(exponent))
            while power:
                if power & 1:
                    result = base if result is None else result * base
                base, power = base * base, power >> 1
            result = self.ones_like() if result is None else result
            return result.reciprocal() if exponent < 0 else result
        base, exp = self._operands(exponent, "pow", reverse)
        if base.dtype.is_int and not exp.dtype.is_float:
            return base._to_float().pow(exp._to_float()).round().cast(base.dtype)
        base, exp = base._to_float(), exp._to_float()
        # a zero base is handled apart (0**y is 0, 1 or inf) so log2(0) never reaches a gradient
        is_zero = base == 0
        safe_base = is_zero.where(1.0, base.abs())
        zero_power = (exp > 0).where(0.0, (exp == 0).where(1.0, float("inf")))
        magnitude = is_zero.where(zero_power, (exp * safe_base.log2()).exp2())
        exp_is_int = exp.floor() == exp
        exp_is_odd = exp_is_int & ((exp * 0.5).floor() * 2 != exp)
        negative = base < 0
        result = (negative & exp_is_odd).where(-magnitude, magnitude)
        return (negative & ~exp_is_int).where(float("nan"), result)

    # ---- activations ---------------------------------------------------------------------------------------------

    def relu(self: Tensor) -> Tensor:
        positive = self > 0
        if self.dtype.is_float:
            positive = positive | (self != self)  # NaN passes through, with its gradient, as in torch
        return positive.where(self, 0)

    def leaky_relu(self: Tensor, neg_slope: float = 0.01) -> Tensor:
        return (self > 0).where(self, self * neg_slope)

    def sigmoid(self: Tensor) -> Tensor:
        # exp(-|x|) never overflows, so neither the value nor the gradient meets inf (or 0 * inf)
        decay = (-self.abs()).exp()
        return (self >= 0).where(1 / (1 + decay), decay / (1 + decay))

    def tanh(self: Tensor) -> Tensor:
        return 2.0 * (2.0 * self).sigmoid() - 1.0

    def gelu(self: Tensor) -> Tensor:
        """GELU with the tanh approximation."""
        return 0.5 * self * (1 + (math.sqrt(2 / math.pi) * (self + 0.044715 * self * self * self)).tanh())

    def quick_gelu(self: Tensor) -> Tensor:
        return self * (self * 1.702).sigmoid()

    def silu(self: Tensor) -> Tensor:
        return self * self.sigmoid()

    def swish(self: Tensor) -> Tensor:
        return self.silu()

    def softplus(self: Tensor, beta: float = 1.0) -> Tensor:
        """log(1 + exp(beta*x)) / beta, written so large inputs do not overflow."""
        scaled = self * beta
        return (scaled.relu() + (1 + (-scaled.abs()).exp()).log()) * (1 / beta)

    def elu(self: Tensor, alpha: float = 1.0) -> Tensor:
        negative_part = (self > 0).where(0, self)  # keeps exp finite where x is large
        return (self > 0).where(self, alpha * (negative_part.exp() - 1))

    def relu6(self: Tensor) -> Tensor:
        # a select, not relu(x) - relu(x - 6): that is inf - inf at inf
        return (self >= 6).where(6, self.relu())

    def hardtanh(self: Tensor, min_val: float = -1.0, max_val: float = 1.0) -> Tensor:
        return self.clip(min_val, max_val)

    def clip(self: Tensor, min_=None, max_=None) -> Tensor:
        """Values limited to [min_, max_] (either may be None)."""
        if min_ is None and max_ is None:
            raise ValueError("clip: give at least one of min_ and max_")
        # selects rather than max/min, so a value on a bound passes its whole gradient (as in torch)
        result = self
        if min_ is not None:
            result = (result < min_).where(min_, result)
        if max_ is not None:
            result = (result > max_).where(max_, result)
        return result

    def clamp(self: Tensor, min_=None, max_=None) -> Tensor:
        return self.clip(min_, max_)
