"""Elementwise primitives of a Tensor: casts, the binary ops with dtype promotion and broadcasting, selects,
comparisons, bitwise ops and the Python operators."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from lazygrad.device import Device
from lazygrad.dtype import DType, beside_zero_dim, dtypes, least_upper_dtype, python_type_dtype, scalar_dtype, to_dtype
from lazygrad.uop.ops import Ops, UOp, _const_key, cast_python

if TYPE_CHECKING:
    from lazygrad.tensor import Scalar, Tensor


def broadcast_node(node: UOp, shape: tuple[int, ...]) -> UOp:
    """`node` broadcast to `shape` (which `broadcast_shape` checked): leading ones added, then expanded."""
    current = node.shape
    if current == shape:
        return node
    if len(current) < len(shape):
        current = (1,) * (len(shape) - len(current)) + current
        node = UOp(Ops.RESHAPE, node.dtype, (node,), current)
    return node if current == shape else UOp(Ops.EXPAND, node.dtype, (node,), shape)


_broadcast_consts: dict[tuple, UOp] = {}
BROADCAST_CONSTS_KEPT = 1024


def broadcast_const(dtype: DType, value: Scalar, shape: tuple[int, ...]) -> UOp:
    """The constant `value` of `dtype` broadcast to `shape`: its three nodes kept, as a scalar operand of a tensor
    of one shape (a learning rate, `x * 0.999 + 0.001`) is built again on every op."""
    key = (dtype, _const_key(value), shape)
    node = _broadcast_consts.get(key)
    if node is None:
        if len(_broadcast_consts) >= BROADCAST_CONSTS_KEPT:
            _broadcast_consts.clear()
        node = _broadcast_consts[key] = broadcast_node(UOp.const(dtype, value), shape)
    return node


def broadcast_shape(op_name: str, *shapes: tuple[int, ...]) -> tuple[int, ...]:
    """NumPy broadcasting: shapes are right-aligned, and each dimension must match or be 1."""
    first = shapes[0]
    if len(shapes) == 2:  # (the common cases first: two equal shapes, or one a scalar's; then any two, by plain loops)
        second = shapes[1]
        if second == first or second == ():
            return tuple(first)
        if first == ():
            return tuple(second)
        missing = len(first) - len(second)
        first, second = (1,) * -missing + tuple(first), (1,) * missing + tuple(second)
        result = []
        for size, other in zip(first, second):
            if size == other or other == 1:
                result.append(size)
            elif size == 1:
                result.append(other)
            else:
                break  # (the general loop below names the mismatch)
        else:
            return tuple(result)
    elif all(shape == first or shape == () for shape in shapes[1:]):
        return tuple(first)
    ndim = max(len(shape) for shape in shapes)
    padded = [(1,) * (ndim - len(shape)) + tuple(shape) for shape in shapes]
    result = []
    for sizes in zip(*padded):
        others = {size for size in sizes if size != 1}
        if len(others) > 1:
            raise ValueError(
                f"{op_name}: shapes {' and '.join(str(tuple(s)) for s in shapes)} cannot be broadcast together "
                "(each dimension must be equal or 1); reshape or expand one operand"
            )
        result.append(others.pop() if others else 1)
    return tuple(result)


def check_same_device(op_name: str, *tensors) -> None:
    """An error naming the op where its tensors (other arguments are skipped) live on different devices."""
    devices = list(dict.fromkeys(tensor.device for tensor in tensors if isinstance(tensor, ElementwiseMixin)))
    if len(devices) > 1:
        raise ValueError(
            f"{op_name}: tensors are on different devices ({' and '.join(devices)}); move them to one with .to()"
        )


def type_name(value) -> str:
    """A value's type for an error message, with its module where it is not lazygrad's (torch.Tensor, not Tensor: a
    torch tensor mixed in by mistake reads "expected a Tensor, got Tensor" otherwise), and how to convert it."""
    kind = type(value)
    if kind.__module__.split(".")[0] in ("lazygrad", "builtins"):
        return kind.__name__
    return f"{kind.__module__.split('.')[0]}.{kind.__name__} (convert it with Tensor(value))"


def check_device_has(dtype: DType, device: str, op_name: str) -> None:
    """An error naming the op when `device` cannot compute in `dtype` (an OpenCL device without doubles)."""
    if dtype in Device[device].unsupported_dtypes:
        raise TypeError(
            f"{op_name}: {device} cannot compute in {dtype} ({Device[device].unsupported_dtypes[dtype]}); "
            "cast to a narrower dtype or use another device"
        )


# half and bfloat16: memory formats whose kernels compute in float32 and round each result
NARROW_FLOATS = (dtypes.float16, dtypes.bfloat16)


def is_number(value) -> bool:
    """Whether `value` is a Python (or NumPy) int or float, not a bool."""
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))


def needs_float32(dtype: DType, value) -> bool:
    """Whether a Python number beside a tensor of `dtype` in `*`, `/` or `//` is computed in float32, as torch computes
    it: beside a float16 or bfloat16 tensor, where the number is not one of the dtype's values (one that is gives the
    same result in the tensor's own dtype, whose ops round each result from float32, with no casts more to fuse)."""
    if dtype not in NARROW_FLOATS or not is_number(value):
        return False
    value = float32_value(value)
    return not math.isfinite(value) or cast_python(value, dtype) != value


def float32_value(value) -> float:
    """A Python number as the float32 it becomes in a float32 computation (one too large: inf with its sign)."""
    value = value.item() if isinstance(value, np.generic) else value
    try:
        value = float(value)
    except OverflowError:  # (an int beyond float64's range)
        return math.copysign(math.inf, value)
    with np.errstate(over="ignore"):
        return float(np.float32(value))


class ElementwiseMixin:
    """Ops on one, two or three tensors that act value by value. Results are built with `self._new`, so this module
    never needs the Tensor class itself (isinstance checks use this mixin, which every Tensor is)."""

    __slots__ = ()

    def _unary(self: Tensor, op: Ops) -> Tensor:
        return self._new(UOp(op, self.dtype, (self.uop,)))

    def cast(self: Tensor, dtype: DType | str) -> Tensor:
        """The values converted to `dtype` (floats to ints truncate toward zero)."""
        dtype = to_dtype(dtype)
        if dtype.itemsize == 8 and dtype != self.dtype:
            check_device_has(dtype, self.device, "cast")
        return self if dtype == self.dtype else self._new(UOp(Ops.CAST, dtype, (self.uop,)))

    def float(self: Tensor) -> Tensor:
        return self.cast(dtypes.float32)

    def half(self: Tensor) -> Tensor:
        return self.cast(dtypes.float16)

    def bfloat16(self: Tensor) -> Tensor:
        return self.cast(dtypes.bfloat16)

    def double(self: Tensor) -> Tensor:
        return self.cast(dtypes.float64)

    def int(self: Tensor) -> Tensor:
        return self.cast(dtypes.int32)

    def long(self: Tensor) -> Tensor:
        return self.cast(dtypes.int64)

    def short(self: Tensor) -> Tensor:
        return self.cast(dtypes.int16)

    def char(self: Tensor) -> Tensor:
        return self.cast(dtypes.int8)

    def byte(self: Tensor) -> Tensor:
        return self.cast(dtypes.uint8)

    def bool(self: Tensor) -> Tensor:
        return self.cast(dtypes.bool)

    def _to_float(self: Tensor) -> Tensor:
        return self if self.dtype.is_float else self.cast(dtypes.default_float)

    def _operand_nodes(self: Tensor, other: Tensor | Scalar, op_name: str, reverse: bool = False) -> tuple[UOp, UOp]:
        """The nodes of both operands of a binary op, promoted to one dtype and broadcast to one shape."""
        node = self.uop
        if type(other) is type(self):  # (the common case first: a tensor of the same dtype and shape, on one device)
            other_node = other.uop
            if other_node.dtype is node.dtype and other_node.shape == node.shape and other.device == self.device:
                return (other_node, node) if reverse else (node, other_node)
        if isinstance(other, ElementwiseMixin):
            if other.device != self.device:
                check_same_device(op_name, self, other)
            other_node = other.uop
            if other_node.dtype is node.dtype:
                dtype = node.dtype
            elif (node.shape == ()) != (other_node.shape == ()):
                zero, dimensioned = (node, other_node) if node.shape == () else (other_node, node)
                dtype = beside_zero_dim(dimensioned.dtype, zero.dtype)
            else:
                dtype = least_upper_dtype(node.dtype, other.dtype, op_name=op_name)
        elif isinstance(other, (int, float, bool, np.generic)):
            other = other.item() if isinstance(other, np.generic) else other
            # the tensor's dtype, unless the number needs a wider kind (a float) or a wider int (see scalar_dtype)
            dtype = scalar_dtype(op_name, other, node.dtype)
            if dtype == dtypes.int64 and node.dtype != dtypes.int64:
                check_device_has(dtype, self.device, op_name)
            x = node if node.dtype == dtype else UOp(Ops.CAST, dtype, (node,))
            y = broadcast_const(dtype, other, node.shape)
            return (y, x) if reverse else (x, y)
        elif isinstance(other, np.ndarray):  # (as torch: a tensor of the array's dtype, on this tensor's device)
            return self._operand_nodes(type(self)(other, device=self.device, requires_grad=False), op_name, reverse)
        else:
            raise TypeError(f"{op_name}: unsupported operand type {type_name(other)}; use a Tensor or a Python number")
        x, y = (other_node, node) if reverse else (node, other_node)
        x = x if x.dtype == dtype else UOp(Ops.CAST, dtype, (x,))
        y = y if y.dtype == dtype else UOp(Ops.CAST, dtype, (y,))
        shape = broadcast_shape(op_name, x.shape, y.shape)
        return broadcast_node(x, shape), broadcast_node(y, shape)

    def _operands(self: Tensor, other: Tensor | Scalar, op_name: str, reverse: bool = False) -> tuple[Tensor, Tensor]:
        """Both operands of a binary op as tensors, promoted to one dtype and broadcast to one shape."""
        x, y = self._operand_nodes(other, op_name, reverse)
        tensors = (other, self) if reverse else (self, other)
        return tuple(
            t if isinstance(t, ElementwiseMixin) and t.uop is node else self._new(node)
            for t, node in zip(tensors, (x, y))
        )

    def _broadcast_to(self: Tensor, shape: tuple[int, ...]) -> Tensor:
        return self if self.shape == shape else self._new(broadcast_node(self.uop, shape))

    def _binary(
        self: Tensor, op: Ops, other: Tensor | Scalar, reverse: bool = False, op_name: str | None = None
    ) -> Tensor:
        x, y = self._operand_nodes(other, op_name or op.name.lower(), reverse)
        return self._new(x.alu(op, y))

    def add(self: Tensor, other, reverse: bool = False, *, alpha=1) -> Tensor:
        """self + other (PyTorch's `alpha` scales other first)."""
        return self._binary(Ops.ADD, other if alpha == 1 else other * alpha, reverse, "add")

    def mul(self: Tensor, other, reverse: bool = False) -> Tensor:
        if needs_float32(self.dtype, other):
            return self._beside_float32_number(Ops.MUL, other, reverse)
        return self._binary(Ops.MUL, other, reverse, "mul")

    def _beside_float32_number(self: Tensor, op: Ops, number, reverse: bool = False) -> Tensor:
        """A half or bfloat16 tensor times or divided by a Python number, as torch's `*` and `/` compute it: in
        float32, with the number in float32 (not first rounded to the tensor's dtype, where 1e5 was inf and 1e-8
        0), rounded once to the tensor's dtype."""
        x = UOp(Ops.CAST, dtypes.float32, (self.uop,))
        y = broadcast_const(dtypes.float32, float32_value(number), x.shape)
        x, y = (y, x) if reverse else (x, y)
        # (x / y by a power of two is the multiply by its reciprocal, as for every float division)
        return self._new(UOp(Ops.CAST, self.dtype, (x.alu(Ops.MUL, y) if op is Ops.MUL else x / y,)))

    def sub(self: Tensor, other, reverse: bool = False, *, alpha=1) -> Tensor:
        """self - other (PyTorch's `alpha` scales other first)."""
        # (on the nodes: a tensor per operand and per step costs more than the op's own node)
        x, y = self._operand_nodes(other if alpha == 1 else other * alpha, "sub", reverse)
        if y.dtype == dtypes.bool:
            raise TypeError("sub: cannot subtract bool tensors; use ^ (logical xor), or cast them to int first")
        return self._new(x.alu(Ops.ADD, UOp(Ops.NEG, y.dtype, (y,))))

    def neg(self: Tensor) -> Tensor:
        if self.dtype == dtypes.bool:
            raise TypeError("neg: cannot negate a bool tensor; use ~ (logical not) instead")
        return self._unary(Ops.NEG)

    def div(self: Tensor, other, reverse: bool = False, rounding_mode: str | None = None) -> Tensor:
        """Division. rounding_mode None: true division (integers are divided as floats); "trunc": rounded toward
        zero; "floor": rounded down. The rounded modes keep the operands' dtype, as in PyTorch."""
        if rounding_mode == "trunc" and not reverse and self.dtype in NARROW_FLOATS and is_number(other):
            # in float32 with the number unrounded, truncated and rounded once, as torch's division by a number (the
            # quotient rounded first to bfloat16 could round up to the next integer: 1000 / 7 was 143)
            return self.float().div(float32_value(other), rounding_mode="trunc").cast(self.dtype)
        if rounding_mode == "trunc":
            x, y = self._operands(other, "div", reverse)
            return x.div(y).trunc() if x.dtype.is_float else x.idiv(y)
        if rounding_mode == "floor":
            return self.floordiv(other, reverse)
        if rounding_mode is not None:
            raise ValueError(f'div: rounding_mode must be None, "trunc" or "floor", got {rounding_mode!r}')
        if needs_float32(self.dtype, other):
            return self._beside_float32_number(Ops.FDIV, other, reverse)
        x, y = self._operand_nodes(other, "div", reverse)
        if not x.dtype.is_float:  # integers are divided as floats
            if dtypes.default_float.itemsize == 8:
                check_device_has(dtypes.default_float, self.device, "div")
            x, y = UOp(Ops.CAST, dtypes.default_float, (x,)), UOp(Ops.CAST, dtypes.default_float, (y,))
        # correctly rounded, as NumPy's and PyTorch's: x * (1/y) is off by an ulp for a quarter of all quotients
        # (21 / 7 gave 3.0000002). A half or bfloat16 quotient is computed in float32 and rounded once, which is the
        # correctly rounded one (float32 has more than twice their bits).
        if x.dtype in (dtypes.bfloat16, dtypes.float16):
            narrow, x, y = x.dtype, UOp(Ops.CAST, dtypes.float32, (x,)), UOp(Ops.CAST, dtypes.float32, (y,))
            return self._new(UOp(Ops.CAST, narrow, (x / y,)))
        return self._new(x / y)

    def idiv(self: Tensor, other, reverse: bool = False) -> Tensor:
        """Integer division rounded toward zero (C's `/`); `x idiv 0` is 0. Floats must use div(rounding_mode=...)."""
        x, y = self._operands(other, "idiv", reverse)
        if not x.dtype.is_int:
            raise TypeError(
                f"idiv: needs int tensors, got {x.dtype}; use div(other, rounding_mode='trunc') for floats, or cast"
            )
        return x._new(x.uop.alu(Ops.IDIV, y.uop))

    def floordiv(self: Tensor, other, reverse: bool = False) -> Tensor:
        """Division rounded down (Python's `//`). For floats, from the exact remainder, as Python and PyTorch compute
        it: exact while the quotient is an integer the dtype holds (below 2**51 for float64), else within an ulp or
        two (as `/` is); `x // 0.0` is x / 0.0. For ints, `x // 0` is 0 (as in NumPy) and the most negative value
        divided by -1 wraps to itself."""
        if not reverse and needs_float32(self.dtype, other):
            # a half or bfloat16 tensor by a Python number: in float32 with the number unrounded, as torch
            return self.float().floordiv(float32_value(other)).cast(self.dtype)
        x, y = self._operands(other, "floordiv", reverse)
        if x.dtype == dtypes.bool:
            raise TypeError("floordiv: not defined for bool tensors; cast to int first")
        if x.dtype.is_float:
            return x._floored_quotient(y)
        quotient = x._new(x.uop.alu(Ops.IDIV, y.uop))
        # the kernel truncates toward zero: step down where a remainder is left and its sign differs from y's
        return x._truncated_remainder_off(y).where(quotient - 1, quotient)

    def _floored_quotient(self: Tensor, divisor: Tensor) -> Tensor:
        # (x - fmod(x, y)) / y is the truncated quotient, an integer, up to rounding: it is divided in float64, where
        # x - fmod(x, y) of narrower floats holds every bit and the division's error stays far below 0.5, rounded to
        # the nearest integer, then stepped down as for ints
        wide = self.dtype
        if self.dtype.itemsize < 8 and dtypes.float64 not in Device[self.device].unsupported_dtypes:
            wide = dtypes.float64
        x, y = self.cast(wide), divisor.cast(wide)
        truncated = ((x - self.fmod(divisor).cast(wide)) / y).round().cast(self.dtype)
        floored = self._truncated_remainder_off(divisor).where(truncated - 1, truncated)
        quotient = self / divisor
        # a zero takes the sign of the true quotient; a zero divisor gives the IEEE quotient (inf or nan)
        floored = (floored == 0).where(quotient * 0, floored)
        return (divisor == 0).where(quotient, floored)

    def mod(self: Tensor, other, reverse: bool = False) -> Tensor:
        """Remainder with the divisor's sign (Python's `%`, PyTorch's `remainder`), exact for floats too (`1e10 % 3.0`
        is 1.0). `x % 0.0` is NaN; for ints, `x % 0` is 0 (as in NumPy)."""
        x, y = self._operands(other, "mod", reverse)
        if x.dtype == dtypes.bool:
            raise TypeError("mod: not defined for bool tensors; cast to int first")
        remainder = x._new(x.uop.alu(Ops.MOD, y.uop))
        return x._truncated_remainder_off(y).where(remainder + y, remainder)

    remainder = mod

    def fmod(self: Tensor, other) -> Tensor:
        """Remainder with the dividend's sign (C's `fmod`, PyTorch's `fmod`), exact. `x fmod 0.0` is NaN; for ints,
        it is 0 (as in NumPy)."""
        x, y = self._operands(other, "fmod")
        if x.dtype == dtypes.bool:
            raise TypeError("fmod: not defined for bool tensors; cast to int first")
        return x._new(x.uop.alu(Ops.MOD, y.uop))

    def _truncated_remainder_off(self: Tensor, divisor: Tensor) -> Tensor:
        """Where the truncating remainder of self / divisor is nonzero with the sign opposite to the divisor's: there
        floor division is one less than the truncating quotient."""
        remainder = self._new(self.uop.alu(Ops.MOD, divisor.uop))
        return (remainder != 0) & ((remainder < 0) != (divisor < 0))

    def reciprocal(self: Tensor) -> Tensor:
        return self._to_float()._unary(Ops.RECIP)

    def maximum(self: Tensor, other) -> Tensor:
        return self._binary(Ops.MAX, other, op_name="maximum")

    def minimum(self: Tensor, other) -> Tensor:
        x, y = self._operands(other, "minimum")
        return x._order_reversed().maximum(y._order_reversed())._order_reversed()

    def where(self: Tensor, true_value: Tensor | Scalar, false_value: Tensor | Scalar) -> Tensor:
        """`true_value` where this (bool) tensor is true, else `false_value` (tinygrad's order; torch's
        `x.where(cond, y)` is `cond.where(x, y)` here, or `Tensor.where(cond, x, y)` as `torch.where`)."""
        if (
            self.dtype != dtypes.bool
            and isinstance(true_value, ElementwiseMixin)
            and true_value.dtype == dtypes.bool
            and not (isinstance(false_value, bool) or getattr(false_value, "dtype", None) == dtypes.bool)
        ):
            # torch's `x.where(x > 1, 0.0)` read as this order selected between the mask and 0 where x is nonzero
            raise TypeError(
                f"where: the condition is this tensor ({self.dtype}, shape {self.shape}) and the values are a bool "
                f"mask {true_value.shape} and {type(false_value).__name__}: that is torch's `x.where(cond, y)` order; "
                "here the condition comes first, as in tinygrad: write `cond.where(x, y)`, or `Tensor.where(cond, x, "
                "y)` as torch.where"
            )
        condition = self.uop if self.dtype == dtypes.bool else self.cast(dtypes.bool).uop
        # (on the nodes: a tensor per operand and per step costs more than the op's own node)
        if isinstance(true_value, ElementwiseMixin):
            owner, (a, b) = true_value, true_value._operand_nodes(false_value, "where")
        elif isinstance(false_value, ElementwiseMixin):
            owner, (b, a) = false_value, false_value._operand_nodes(true_value, "where")
        else:
            dtype = least_upper_dtype(python_type_dtype(true_value), python_type_dtype(false_value))
            owner = type(self)(UOp.const(scalar_dtype("where", true_value, dtype), true_value), device=self.device)
            a, b = owner._operand_nodes(false_value, "where")
        if owner.device != self.device:
            check_same_device("where", self, owner)
        shape = broadcast_shape("where", condition.shape, a.shape)
        condition, a, b = broadcast_node(condition, shape), broadcast_node(a, shape), broadcast_node(b, shape)
        return owner._new(condition.alu(Ops.WHERE, a, b))

    # comparisons and bitwise ops
    def __lt__(self: Tensor, other):
        return self._binary(Ops.CMPLT, other, op_name="<")

    def __gt__(self: Tensor, other):
        return self._binary(Ops.CMPLT, other, reverse=True, op_name=">")

    # (None or a string is no operand: Python's own answer, as torch's, so `t in [None, t]` and `t == None` work)
    # (== and != with what is neither a tensor, a number nor an array (None, a string, a list) are Python's own
    # answer, as torch's `t == [1, 2]` is False)
    def __ne__(self: Tensor, other):  # type: ignore[override]
        if not isinstance(other, (ElementwiseMixin, int, float, bool, np.generic, np.ndarray)):
            return NotImplemented
        return self._binary(Ops.CMPNE, other, op_name="!=")

    def __eq__(self: Tensor, other):  # type: ignore[override]
        if not isinstance(other, (ElementwiseMixin, int, float, bool, np.generic, np.ndarray)):
            return NotImplemented
        return ~self._binary(Ops.CMPNE, other, op_name="==")

    def __le__(self: Tensor, other):
        return (self < other) | (self == other)

    def __ge__(self: Tensor, other):
        return (self > other) | (self == other)

    def _bitwise(self: Tensor, op: Ops, other, reverse: bool, name: str) -> Tensor:
        x, y = self._operand_nodes(other, name, reverse)
        if x.dtype.is_float:
            raise TypeError(
                f"{name}: bitwise ops need int or bool tensors, got {x.dtype} (from {self.dtype} and "
                f"{getattr(other, 'dtype', type(other).__name__)}); cast to an int dtype first, or use .bitcast()"
            )
        if x.dtype == dtypes.bool and op in (Ops.SHL, Ops.SHR):  # (a bool beside an int number or tensor is an int)
            raise TypeError(
                f"{name}: not implemented for two bools, as in torch (from {self.dtype} and "
                f"{getattr(other, 'dtype', type(other).__name__)}); cast to an int dtype first (.int())"
            )
        return self._new(x.alu(op, y))

    def bitwise_and(self: Tensor, other, reverse: bool = False) -> Tensor:
        """Bitwise (bools: logical) and of int or bool tensors."""
        return self._bitwise(Ops.AND, other, reverse, "bitwise_and")

    def bitwise_or(self: Tensor, other, reverse: bool = False) -> Tensor:
        """Bitwise (bools: logical) or of int or bool tensors."""
        return self._bitwise(Ops.OR, other, reverse, "bitwise_or")

    def bitwise_xor(self: Tensor, other, reverse: bool = False) -> Tensor:
        """Bitwise (bools: logical) exclusive or of int or bool tensors."""
        return self._bitwise(Ops.XOR, other, reverse, "bitwise_xor")

    def bitwise_not(self: Tensor) -> Tensor:
        """Every bit flipped (bools: logical not)."""
        return ~self

    def lshift(self: Tensor, other, reverse: bool = False) -> Tensor:
        """Bits shifted left by `other` (ints only); by an amount outside [0, bits) every bit is shifted out (0)."""
        return self._shift(Ops.SHL, other, reverse, "lshift")

    def rshift(self: Tensor, other, reverse: bool = False) -> Tensor:
        """Bits shifted right by `other` (ints only; signed ints shift in copies of the sign bit); by an amount
        outside [0, bits) every bit is shifted out (0, or -1 for a negative signed value)."""
        return self._shift(Ops.SHR, other, reverse, "rshift")

    def _shift(self: Tensor, op: Ops, other, reverse: bool, name: str) -> Tensor:
        if not reverse and isinstance(other, (int, np.integer)) and not isinstance(other, (bool, np.bool_)):
            amount = int(other)
            # the dtype is the tensor's (a bool tensor's: the default int), whatever the amount: an amount outside
            # [0, bits), negative too, shifts every bit out, as a tensor of amounts does and as torch does (torch
            # wraps a Python amount to the dtype first; lazygrad never wraps a number you wrote)
            dtype = dtypes.default_int if self.dtype == dtypes.bool else self.dtype
            if not dtype.is_float and not 0 <= amount < dtype.bits:
                source = self.cast(dtype)
                if op is Ops.SHR and not dtype.is_unsigned:  # the sign fills every bit
                    return source._bitwise(op, dtype.bits - 1, False, name)
                return source.full_like(0)
        return self._bitwise(op, other, reverse, name)

    def bitcast(self: Tensor, dtype: DType | str) -> Tensor:
        """The same bits read as `dtype`, which must have the same size (float32 <-> int32 / uint32, ...)."""
        dtype = to_dtype(dtype)
        if dtype.itemsize != self.dtype.itemsize or dtypes.bool in (dtype, self.dtype):
            raise TypeError(
                f"bitcast: cannot read {self.dtype} ({self.dtype.itemsize} bytes) as {dtype} ({dtype.itemsize} "
                "bytes); bitcast needs two non-bool dtypes of the same size, use .cast() to convert values"
            )
        if dtype.itemsize == 8 and dtype != self.dtype:
            check_device_has(dtype, self.device, "bitcast")
        # BITCAST is a primitive: no composition of value-preserving ops can reinterpret bits (every renderer and the
        # PYTHON device spell it already, for the kernels' own transcendental code)
        return self if dtype == self.dtype else self._new(UOp(Ops.BITCAST, dtype, (self.uop,)))

    def __and__(self: Tensor, other):
        return self._bitwise(Ops.AND, other, False, "&")

    def __rand__(self: Tensor, other):
        return self._bitwise(Ops.AND, other, True, "&")

    def __or__(self: Tensor, other):
        return self._bitwise(Ops.OR, other, False, "|")

    def __ror__(self: Tensor, other):
        return self._bitwise(Ops.OR, other, True, "|")

    def __xor__(self: Tensor, other):
        return self._bitwise(Ops.XOR, other, False, "^")

    def __rxor__(self: Tensor, other):
        return self._bitwise(Ops.XOR, other, True, "^")

    def __lshift__(self, other):
        return self.lshift(other)

    def __rlshift__(self, other):
        return self.lshift(other, True)

    def __rshift__(self, other):
        return self.rshift(other)

    def __rrshift__(self, other):
        return self.rshift(other, True)

    def __invert__(self: Tensor):
        if self.dtype.is_float:
            raise TypeError(f"~: needs a bool or int tensor, got {self.dtype}")
        return self ^ (
            True if self.dtype == dtypes.bool else (1 << self.dtype.bits) - 1 if self.dtype.is_unsigned else -1
        )

    def logical_not(self: Tensor) -> Tensor:
        return self.cast(dtypes.bool) ^ True

    def logical_and(self: Tensor, other) -> Tensor:
        """Both non-zero, as bools (torch.logical_and)."""
        return self.cast(dtypes.bool) & (other.cast(dtypes.bool) if hasattr(other, "uop") else bool(other))

    def logical_or(self: Tensor, other) -> Tensor:
        """Either non-zero, as bools."""
        return self.cast(dtypes.bool) | (other.cast(dtypes.bool) if hasattr(other, "uop") else bool(other))

    def logical_xor(self: Tensor, other) -> Tensor:
        """Exactly one non-zero, as bools."""
        return self.cast(dtypes.bool) ^ (other.cast(dtypes.bool) if hasattr(other, "uop") else bool(other))

    # comparisons by PyTorch's names
    def eq(self: Tensor, other) -> Tensor:
        """self == other, elementwise."""
        return self == other

    def ne(self: Tensor, other) -> Tensor:
        """self != other, elementwise."""
        return self != other

    def lt(self: Tensor, other) -> Tensor:
        """self < other, elementwise."""
        return self < other

    def le(self: Tensor, other) -> Tensor:
        """self <= other, elementwise."""
        return self <= other

    def gt(self: Tensor, other) -> Tensor:
        """self > other, elementwise."""
        return self > other

    def ge(self: Tensor, other) -> Tensor:
        """self >= other, elementwise."""
        return self >= other

    # arithmetic operators
    def __add__(self: Tensor, other):
        return self.add(other)

    def __radd__(self: Tensor, other):
        return self.add(other, True)

    def __sub__(self: Tensor, other):
        return self.sub(other)

    def __rsub__(self: Tensor, other):
        return self.sub(other, True)

    def __mul__(self: Tensor, other):
        return self.mul(other)

    def __rmul__(self: Tensor, other):
        return self.mul(other, True)

    def __truediv__(self: Tensor, other):
        return self.div(other)

    def __rtruediv__(self: Tensor, other):
        return self.div(other, True)

    def __floordiv__(self: Tensor, other):
        return self.floordiv(other)

    def __rfloordiv__(self: Tensor, other):
        return self.floordiv(other, True)

    def __mod__(self: Tensor, other):
        return self.mod(other)

    def __rmod__(self: Tensor, other):
        return self.mod(other, True)

    def __pow__(self: Tensor, other):
        return self.pow(other)

    def __rpow__(self: Tensor, other):
        return self.pow(other, True)

    def __neg__(self: Tensor):
        return self.neg()

    def __matmul__(self: Tensor, other):
        if isinstance(other, np.ndarray):  # (as `array @ t` and torch)
            other = type(self)(other, device=self.device, requires_grad=False)
        return self.matmul(other)

    def __rmatmul__(self: Tensor, other):
        return (
            other.matmul(self)
            if isinstance(other, ElementwiseMixin)
            else type(self)(other, device=self.device).matmul(self)
        )
