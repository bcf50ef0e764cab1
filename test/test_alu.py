"""The array form of the kernels' ALU semantics (`exec_alu_array`, `cast_array`, which the PYTHON device runs every
thread of a launch with) gives, element by element, what the scalar form (`exec_alu`, `cast_value`) gives."""

import itertools
import math

import numpy as np
import pytest

from lazygrad.dtype import dtypes
from lazygrad.uop.alu import cast_array, cast_value, exec_alu, exec_alu_array
from lazygrad.uop.ops import Ops, dtype_limits

FLOATS = [dtypes.float16, dtypes.float32, dtypes.float64]
INTS = [dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16, dtypes.int32, dtypes.uint32]
INTS += [dtypes.int64, dtypes.uint64]
FLOAT_OPS = [Ops.ADD, Ops.MUL, Ops.FDIV, Ops.MAX, Ops.NEG, Ops.RECIP, Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.COS, Ops.SQRT]
INT_OPS = [Ops.ADD, Ops.MUL, Ops.MAX, Ops.NEG, Ops.RECIP, Ops.IDIV, Ops.MOD, Ops.AND, Ops.OR, Ops.XOR, Ops.SHL, Ops.SHR]
BOOL_OPS = [Ops.ADD, Ops.MUL, Ops.MAX, Ops.NEG, Ops.AND, Ops.OR, Ops.XOR]
UNARY = {Ops.NEG, Ops.RECIP, Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.COS, Ops.SQRT}


def sample(dtype) -> list:
    """Values of `dtype` where its semantics have edges: signs, zeros, limits, infinities, NaN, shift amounts."""
    if dtype == dtypes.bool:
        return [False, True]
    if dtype.is_float:
        values = [0.0, -0.0, 1.0, -1.0, 0.5, 3.7, -2.5, 100.0, -1e-3, 65504.0, 1e30, -1e30]
        values += [math.inf, -math.inf, math.nan]
        return [cast_value(value, dtype) for value in values]
    low, high = dtype_limits(dtype)
    values = [0, 1, -1, 2, -2, 7, -7, 3, -100, 8, dtype.bits - 1, dtype.bits, 64, low, high, low + 1, high - 1]
    return sorted({cast_value(value, dtype) for value in values})


def same(expected, got) -> bool:
    """Equal as the dtype holds them: NaN equals NaN, and 0.0 differs from -0.0."""
    if isinstance(expected, float):
        got = float(got)
        if math.isnan(expected):
            return math.isnan(got)
        return expected == got and math.copysign(1, expected) == math.copysign(1, got)
    return expected == got.item() if isinstance(got, np.generic) else expected == got


def check(op, dtype, operand_dtype, rows):
    """Each row of operands through both forms: as Python scalars one at a time, and as arrays all at once."""
    kinds = [dtypes.bool, dtype, dtype] if op is Ops.WHERE else [operand_dtype] * len(rows[0])
    columns = [np.array(column, kind.np) for column, kind in zip(zip(*rows), kinds)]
    result = exec_alu_array(op, dtype, columns)
    for row, got in zip(rows, np.broadcast_to(result, (len(rows),))):
        expected = exec_alu(op, dtype, list(row))
        assert same(expected, got), f"{op} {dtype} {row}: scalar {expected!r}, array {got!r}"


@pytest.mark.parametrize("dtype", [dtypes.bool, *FLOATS, *INTS], ids=str)
def test_array_alu_matches_the_scalar_semantics(dtype):
    ops = BOOL_OPS if dtype == dtypes.bool else FLOAT_OPS if dtype.is_float else INT_OPS
    values = sample(dtype)
    for op in ops:
        rows = [(value,) for value in values] if op in UNARY else list(itertools.product(values, values))
        check(op, dtype, dtype, rows)
    for op in (Ops.CMPLT, Ops.CMPNE):
        check(op, dtypes.bool, dtype, list(itertools.product(values, values)))
    check(Ops.WHERE, dtype, dtype, [(c, a, b) for c in (False, True) for a in values[:4] for b in values[-4:]])


@pytest.mark.parametrize("source", [dtypes.bool, *FLOATS, *INTS], ids=str)
def test_array_casts_match_the_scalar_casts(source):
    values = sample(source) + ([2.0**63, 2.0**64, -(2.0**63), 1e20, 3e9, -3e9] if source == dtypes.float64 else [])
    for target in [dtypes.bool, *FLOATS, *INTS]:
        got = cast_array(np.array(values, source.np), target)
        for value, element in zip(values, got):
            expected = cast_value(value, target)
            if target.is_float and not source.is_float and abs(value) > 2**53:
                continue  # (Python rounds such an int to float64 first; NumPy and the compiled devices round once)
            assert same(expected, element), f"{source} {value!r} -> {target}: scalar {expected!r}, array {element!r}"
