"""Activation functions, each a composition of primitives (so each has a gradient for free)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from lazygrad.dtype import dtypes
from lazygrad.tensor_elementwise import broadcast_const
from lazygrad.tensor_math import _in_float32, _keep_zero_sign, _odd_series
from lazygrad.tensor_movement import keyword_aliases
from lazygrad.uop.ops import Ops, UOp

if TYPE_CHECKING:
    from lazygrad.tensor import Tensor

# the constants of SELU (Klambauer et al. 2017), as PyTorch uses them
SELU_ALPHA = 1.6732632423543772848170429916717
SELU_SCALE = 1.0507009873554804934193349852946
# tanh(x) = x + x·z·P(z), z = x², for |x| < 0.625: Cephes' tanhf (relative error 2.5e-7 at most, 5e-8 rms)
TANH_SERIES = (-5.70498872745e-3, 2.06390887954e-2, -5.37397155531e-2, 1.33314422036e-1, -3.33332819422e-1)
# tanh(x) = x + x (c0 + c1 z + ...), z = x², for |x| < 0.5 in float64: a Chebyshev fit of (tanh(x) - x) / x (mpmath's
# chebyfit, degree 10 in z: within 2e-17 relative)
TANH_SERIES_64 = (
    0.0,
    -0.3333333333333333,
    0.13333333333329825,
    -0.05396825396361009,
    0.021869488297234514,
    -0.008863229270067843,
    0.0035920334653723926,
    -0.001454959384380466,
    0.0005849653729022644,
    -0.00022107222975864633,
    5.946956589774769e-05,
)


def _or_nan_bound(beyond: Tensor, bound) -> Tensor:
    """Where a value lies beyond `bound`, or the bound is NaN (a NaN compares false with everything)."""
    if isinstance(bound, float):
        return beyond | True if math.isnan(bound) else beyond
    return beyond | bound.isnan() if hasattr(bound, "uop") and bound.dtype.is_float else beyond


class ActivationMixin:
    """Activations of a Tensor, elementwise."""

    __slots__ = ()

    def relu(self: Tensor) -> Tensor:
        """max(x, 0); NaN passes through."""
        if self.dtype == dtypes.bool:
            return (self > 0).where(self, 0)
        # (built on the nodes, as `where(0 < x or x != x, x, 0)` would be: the most used activation)
        x = self.uop
        zero = broadcast_const(x.dtype, 0, x.shape)
        positive = zero.alu(Ops.CMPLT, x)
        if self.dtype.is_float:  # NaN passes through, with its gradient, as in torch
            positive = positive.alu(Ops.OR, x.alu(Ops.CMPNE, x))
        return self._new(positive.alu(Ops.WHERE, x, zero))

    def leaky_relu(self: Tensor, neg_slope: float = 0.01) -> Tensor:
        """x where x > 0, else x * neg_slope."""
        return (self > 0).where(self, self * neg_slope)

    def _negative_magnitude(self: Tensor) -> Tensor:
        """-|x| of a float tensor, with the gradient of the side each value is on (-1 for x >= 0): `abs` splits its
        gradient at 0, which would zero the slope of functions built on exp(-|x|) there."""
        return (self >= 0).where(-self, self)

    @_in_float32
    def sigmoid(self: Tensor) -> Tensor:
        """1 / (1 + exp(-x)); of an int or bool tensor's values as floats, as torch's (-x of uint8 1 wrapped to
        255: sigmoid was 0). Its slope is p (1 - p) of the output p, rounded as it is, as torch's backward takes it:
        a loss that divides by the same rounded values then cancels them exactly (binary cross-entropy's 1/(1 - p)
        against the exact slope gave 0.94 for 1.0 at 16, and 41399 at 17, where p rounds to 1 and the loss takes
        1e12 for 1/(1 - p))."""
        x = self._to_float()
        # exp(-|x|) never overflows, so neither the value nor the gradient meets inf (or 0 * inf)
        decay = x._negative_magnitude().exp()
        p = (x >= 0).where(1 / (1 + decay), decay / (1 + decay))
        # (the slope's own gradient, for a gradient of the gradient, is that of p's formula)
        return p._new(UOp(Ops.SLOPE, p.dtype, (p.uop, x.uop), (p * (1 - p)).uop))

    @_in_float32
    def tanh(self: Tensor) -> Tensor:
        """tanh, within a few float32 ulp everywhere (as torch's): Cephes' tanhf, an odd polynomial below 0.625 and
        (1 - e) / (1 + e) with e = exp(-2|x|) beyond. (2·sigmoid(2x) - 1 lost a small x's digits: tanh(1e-8) was 0.)
        float64 takes a polynomial of its own below 0.5 (with tanhf's, it was 4e-9 off), within 2 ulp."""
        x = self._to_float()
        wide = x.dtype == dtypes.float64
        small = x.abs() < (0.5 if wide else 0.625)  # (false for NaN, which the exp side passes through)
        # the polynomial sees 0 where it is not used: x² of a large x is inf, and its slope times 0 would be NaN
        near = small.where(x, 0.0)
        # (summed by powers, not Horner's rule: the forward and backward of 1024x1024 took 6 kernels, now 3)
        series = _odd_series(near, TANH_SERIES_64 if wide else (0.0, *TANH_SERIES[::-1]))
        negative = x < 0
        # exp(-2|x|) never overflows: no inf, or 0 * inf, in the slope. (-|x| taken by this select kept tanh's
        # forward and backward of 4096x4096 in the kernels 2·sigmoid(2x) - 1 had; _negative_magnitude took more)
        decay = (negative.where(x, -x) * 2).exp()
        far = (1 - decay) / (1 + decay)
        return _keep_zero_sign(x, small.where(series, negative.where(-far, far)))

    @_in_float32
    def gelu(self: Tensor, approximate: str = "tanh") -> Tensor:
        """GELU: with the tanh approximation by default (tinygrad's gelu), or exact with `approximate="none"`
        (PyTorch's default: x * Phi(x), through erfc). A float16 or bfloat16 one is computed in float32 and rounded
        once, as torch's (rounded after every op, float16's was 14 ulp off)."""
        if approximate == "none":
            # x Phi(x) with Phi(x) = erfc(-x / sqrt(2)) / 2 taken from erfc of |x| / sqrt(2): 1 + erf(x / sqrt(2))
            # cancels for a negative x (gelu(-4) was 2.7e-4 off, gelu(-6) 0)
            x = self._to_float()
            negative = x < 0
            tail = 0.5 * (negative.where(-x, x) * (1 / math.sqrt(2)))._erfc_of_magnitude()
            return x * negative.where(tail, 1 - tail)
        if approximate != "tanh":
            raise ValueError(f"gelu: approximate must be 'tanh' or 'none', got {approximate!r}")
        # 0.5·x·(1 + tanh(z)) is x·sigmoid(2z): fewer operations than through tanh, and no cancellation in 1 + tanh(z)
        # for a negative z
        x = self._to_float()
        return x * ((2 * math.sqrt(2 / math.pi)) * (x + 0.044715 * x * x * x)).sigmoid()

    def quick_gelu(self: Tensor) -> Tensor:
        return self * (self * 1.702).sigmoid()

    @_in_float32
    def silu(self: Tensor) -> Tensor:
        """x * sigmoid(x); a float16 or bfloat16 one computed in float32 and rounded once, as torch's."""
        x = self._to_float()
        return x * x.sigmoid()

    def swish(self: Tensor) -> Tensor:
        return self.silu()

    @_in_float32
    def softplus(self: Tensor, beta: float = 1.0, threshold: float = 20.0) -> Tensor:
        """log(1 + exp(beta*x)) / beta, and x itself where beta*x > threshold (as in PyTorch)."""
        if beta == 0:
            raise ValueError("softplus: beta must be nonzero (the result is log(1 + exp(beta*x)) / beta)")
        scaled = self * beta
        # max(s, 0) + log1p(exp(-|s|)) is log(1 + exp(s)) without overflow for large s, and without losing the tail
        # of a very negative s (softplus(-20) is 2e-9, not 0); both terms take the s >= 0 side at 0, so the slope
        # there is 1 - 1/2
        positive_part = (scaled >= 0).where(scaled, 0)
        smooth = (positive_part + scaled._negative_magnitude().exp()._log1p_unit()) * (1 / beta)
        return (scaled > threshold).where(self, smooth)

    def _log1p_unit(self: Tensor) -> Tensor:
        """log(1 + t) for t in [0, 1] (an exp(-|x|)), to float32's precision, for softplus and the losses on logits:
        log(u) of u = 1 + t rounded, plus what the rounding lost, t - (u - 1) (exact, as u is in [1, 2]). The full
        log1p also divides that by u (a change below half an ulp here) and handles u = 0 and inf (impossible here):
        this keeps softplus's forward and backward at 4 slow operations, as log(1 + t) had, where log1p's took 10."""
        u = 1 + self
        return u.log() + (self - (u - 1))

    @_in_float32
    def logsigmoid(self: Tensor) -> Tensor:
        """log(sigmoid(x)), without overflow: -softplus(-x)."""
        return -(-self._to_float()).softplus(threshold=math.inf)

    @_in_float32
    def elu(self: Tensor, alpha: float = 1.0) -> Tensor:
        """x where x > 0, else alpha * (exp(x) - 1), through expm1 (exp(x) - 1 made elu(-1e-8) 0)."""
        negative_part = (self > 0).where(0, self)  # keeps exp finite where x is large
        return (self > 0).where(self, alpha * negative_part.expm1())

    @_in_float32
    def celu(self: Tensor, alpha: float = 1.0) -> Tensor:
        """x where x > 0, else alpha * (exp(x / alpha) - 1)."""
        if alpha == 0:
            raise ValueError("celu: alpha must be nonzero (the negative side is alpha * (exp(x / alpha) - 1))")
        negative_part = (self > 0).where(0, self)
        return (self > 0).where(self, alpha * (negative_part * (1 / alpha)).expm1())

    @_in_float32
    def selu(self: Tensor, alpha: float = SELU_ALPHA, gamma: float = SELU_SCALE) -> Tensor:
        """gamma * elu(x, alpha); the defaults are SELU's self-normalizing constants."""
        return gamma * self.elu(alpha)

    @_in_float32
    def mish(self: Tensor) -> Tensor:
        """x * tanh(softplus(x)), as x · n / (n + 2) with n = e^x (e^x + 2), written in t = exp(-|x|) so nothing
        overflows. (One exp and a division: through softplus and tanh it took twice the kernels on large inputs.)
        A float16 or bfloat16 one is computed in float32 and rounded once, as torch's."""
        x = self._to_float()
        decay = x._negative_magnitude().exp()
        positive = x >= 0
        # n and n + 2, divided by e^2x where x >= 0: 1 + 2t and 1 + 2t + 2t²
        numerator = positive.where(1 + 2 * decay, decay * (decay + 2))
        return x * (numerator / (numerator + positive.where(2 * decay * decay, 2.0)))

    def softsign(self: Tensor) -> Tensor:
        """x / (1 + |x|), of an int tensor's values as floats (1 + |x| of uint8 255 wrapped to 0)."""
        x = self._to_float()
        return x / (1 + x.abs())

    def relu6(self: Tensor) -> Tensor:
        """min(max(x, 0), 6)."""
        # a select, not relu(x) - relu(x - 6): that is inf - inf at inf
        return (self >= 6).where(6, self.relu())

    @_in_float32
    def hardsigmoid(self: Tensor, alpha: float = 1 / 6, beta: float = 0.5) -> Tensor:
        """alpha * x + beta limited to [0, 1]: a piecewise-linear sigmoid (the defaults give PyTorch's). A float16 or
        bfloat16 one is computed in float32 and rounded once, as torch's (x / 6 + 0.5 rounded twice cancels near
        x = -3: float16's was hundreds of ulp off there)."""
        line = self * alpha + beta
        # selects, so the slope is alpha strictly inside and 0 on and past the ends, as in torch (NaN passes through)
        return (line >= 1).where(1.0, ((line > 0) | (line != line)).where(line, 0.0))

    @_in_float32
    def hardswish(self: Tensor) -> Tensor:
        """x * relu6(x + 3) / 6, of an int tensor's values as floats (x + 3 of int8 127 wrapped); a float16 or bfloat16
        one computed in float32 and rounded once, as torch's (x * 6 overflowed float16 from x = 10923 on)."""
        x = self._to_float()
        return x * (x + 3).relu6() * (1 / 6)

    def hardtanh(self: Tensor, min_val: float = -1.0, max_val: float = 1.0) -> Tensor:
        """x limited to [min_val, max_val]; unlike clip, its slope is 0 on the bounds, as torch's."""
        return (self <= min_val).where(min_val, (self >= max_val).where(max_val, self))

    @keyword_aliases(min="min_", max="max_")
    def clip(self: Tensor, min_=None, max_=None) -> Tensor:
        """Values limited to [min_, max_] (either may be None; PyTorch's `min=` and `max=` work too)."""
        if min_ is None and max_ is None:
            raise ValueError("clip: give at least one of min_ and max_ (or min= and max=)")
        # selects rather than max/min, so a value on a bound passes its whole gradient (as in torch); a NaN bound
        # gives NaN, as in torch
        result = self
        if min_ is not None:
            result = _or_nan_bound(result < min_, min_).where(min_, result)
        if max_ is not None:
            result = _or_nan_bound(result > max_, max_).where(max_, result)
        return result

    @keyword_aliases(min="min_", max="max_")
    def clamp(self: Tensor, min_=None, max_=None) -> Tensor:
        """`clip` by PyTorch's name: `clamp(min=0, max=1)`."""
        return self.clip(min_, max_)
