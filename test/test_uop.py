"""The UOp core: interning, pattern rewriting to a fixed point, the symbolic simplifier, deep graphs, and the
index math that reaches real kernels."""

import copy
import gc
import pickle
import weakref

import numpy as np
import pytest

from lazygrad import Tensor
from lazygrad.codegen.heuristic import heuristic_opts
from lazygrad.codegen.linearize import linearize
from lazygrad.codegen.lower import lower_kernel
from lazygrad.codegen.opt import apply_opts, prepare
from lazygrad.codegen.renderer import Target
from lazygrad.dtype import dtypes
from lazygrad.uop.ops import LoopKind, Ops, UOp
from lazygrad.uop.pattern import PatternMatcher, UPat, graph_rewrite, substitute
from lazygrad.uop.symbolic import simplify

INDEX = dtypes.index


def loop(size: int, axis: int = 0) -> UOp:
    return UOp(Ops.RANGE, INDEX, (UOp.const(INDEX, size),), (axis, LoopKind.GLOBAL))


# ---- interning ------------------------------------------------------------------------------------------------------


def test_equal_structure_is_same_object():
    a = UOp.const(dtypes.float32, 2.0)
    b = UOp.const(dtypes.float32, 2.0)
    assert a is b
    assert (a + a) is (b + b)


def test_constants_keep_sign_type_and_dtype_apart():
    assert UOp.const(dtypes.float32, 0.0) is not UOp.const(dtypes.float32, -0.0)
    assert UOp.const(dtypes.int32, 1) is not UOp.const(dtypes.bool, True)
    assert UOp.const(dtypes.float32, 1) is UOp.const(dtypes.float32, 1.0)


def test_uop_is_immutable():
    node = UOp.const(dtypes.int32, 3)
    with pytest.raises(AttributeError):
        node.arg = 4


def test_interned_nodes_are_freed():
    from lazygrad.uop import ops

    node = UOp(Ops.CONST, dtypes.float32, (), 123.456)
    ref, entries = weakref.ref(node), len(ops._interned)
    del node
    gc.collect()
    assert ref() is None and len(ops._interned) == entries - 1  # the table forgets it too


def test_content_key_is_structural():
    x = loop(8)
    assert (x * 2 + 1).key == (x * 2 + 1).key
    assert (x * 2 + 1).key != (x * 2 + 2).key


# ---- rewriting --------------------------------------------------------------------------------------------------------


def test_rewrite_runs_to_fixed_point():
    # x + 0 -> x, applied repeatedly through a chain
    matcher = PatternMatcher(
        [(UPat(Ops.ADD, src=(UPat.var("x"), UPat.cvar("c"))), lambda x, c: x if c.arg == 0 else None)]
    )
    x = loop(4)
    chain = ((x + 0) + 0) + 0
    assert graph_rewrite(chain, matcher) is x


def test_rewrite_deep_graph_without_recursion_limit():
    x = UOp(Ops.CONST, dtypes.float32, (), 1.0)
    node = x
    for _ in range(20000):
        node = node.alu(Ops.NEG)
    matcher = PatternMatcher([(UPat(Ops.NEG, src=(UPat(Ops.NEG, src=(UPat.var("x"),)),)), lambda x: x)])
    assert graph_rewrite(node, matcher) is x
    assert len(node.toposort) == 20001


def test_deep_tensor_graph_realizes():
    t = Tensor([1.0, 2.0])
    for _ in range(3000):
        t = t + 1
    np.testing.assert_allclose(t.numpy(), [3001.0, 3002.0])


def test_commutative_pattern_matches_either_order():
    matcher = PatternMatcher(
        [(UPat(Ops.MUL, src=[UPat.cvar("c"), UPat.var("x")]), lambda c, x: x if c.arg == 1 else None)]
    )
    x = loop(4)
    assert graph_rewrite(UOp(Ops.MUL, INDEX, (UOp.const(INDEX, 1), x)), matcher) is x
    assert graph_rewrite(UOp(Ops.MUL, INDEX, (x, UOp.const(INDEX, 1))), matcher) is x


# ---- the symbolic simplifier ---------------------------------------------------------------------------------------


def test_constant_folding():
    two, three = UOp.const(INDEX, 2), UOp.const(INDEX, 3)
    assert simplify(two * three + 1) is UOp.const(INDEX, 7)
    assert simplify(UOp.const(dtypes.float32, 1.5) * 2.0) is UOp.const(dtypes.float32, 3.0)


def test_identities_and_canonical_order():
    x = loop(10)
    assert simplify(x * 1 + 0) is x
    assert simplify(x * 0) is UOp.const(INDEX, 0)
    assert simplify(3 + x) is simplify(x + 3)
    assert simplify(x + 2 + 3) is simplify(x + 5)
    assert simplify(x * 2 * 3) is simplify(x * 6)
    assert simplify((x + 1) * 2) is simplify(x * 2 + 2)


def test_div_mod_from_ranges():
    x, y = loop(4, 0), loop(5, 1)
    assert simplify((x * 5 + y) // 5) is x
    assert simplify((x * 5 + y) % 5) is y
    assert simplify(y // 5) is UOp.const(INDEX, 0)
    assert simplify(y % 5) is y
    assert simplify((x * 4 + 3) // 4) is x


def test_div_mod_drop_multiples_of_the_divisor():
    k, t = loop(128, 0), loop(6, 1)
    assert simplify((t * 128 + k) % 32) is simplify(k % 32)
    assert simplify((t * 128 + k) // 32) is simplify(t * 4 + k // 32)
    assert simplify((t * 128 + k) // 32 % 4) is simplify(k // 32)


def test_div_mod_recombine():
    r = loop(20)
    assert simplify((r // 5) * 5 + r % 5) is r
    assert simplify((r // 4) // 5) is simplify(r // 20)


def test_div_mod_recombine_below_zero():
    # division truncates toward zero and a remainder takes the sign of what is divided, so the identities hold below
    # zero too (a padded tap's index)
    from lazygrad.uop.pattern import substitute as replace

    r = loop(20)
    x = r - 17
    for expression, expected in [((x // 4) * 4 + x % 4, x), (((x // 4) % 5) * 4 + x % 4, x % 20)]:
        assert simplify(expression) is simplify(expected)
        for value in range(20):  # the same value at every point, constants folded as the devices compute them
            point = {r: UOp.const(INDEX, value)}
            assert simplify(replace(expression, point)).arg == simplify(replace(expected, point)).arg


def test_div_mod_recombine_only_the_whole_coefficient_of_a_term():
    """(f//6)*6 + f%6 for f = (k//6)*10 + k%6 + 12: the quotient splits into k//6 + 2 + (4(k//6) + k%6)//6, so the
    flattened sum holds (k//6)*6 and, inside the remainder's sum, (k//6)*4. The recombining rule matched k//6 by the
    coefficient of one of its terms and dropped both: k + 12 instead of f (a (5, 6) array reshaped to (3, 10),
    shrunk to (2, 6) and reshaped to (3, 4) read the wrong rows on every device)."""
    from lazygrad.uop.pattern import substitute as replace

    k = loop(3, 0) * 4 + loop(4, 1)
    f = (k // 6) * 10 + k % 6 + 12
    for expression in ((f // 6) * 6 + f % 6, ((f // 6) % 5) * 6 + f % 6):
        simplified = simplify(expression)
        assert simplified is simplify(f)
        for i in range(3):
            for j in range(4):
                point = {loop(3, 0): UOp.const(INDEX, i), loop(4, 1): UOp.const(INDEX, j)}
                assert simplify(replace(simplified, point)).arg == 12 + (4 * i + j) % 6 + 10 * ((4 * i + j) // 6)
    b = np.arange(30, dtype=np.float32).reshape(5, 6)
    got = Tensor(b).reshape(3, 10)[1:3, 2:8].reshape(3, 4).numpy()
    np.testing.assert_array_equal(got, b.reshape(3, 10)[1:3, 2:8].reshape(3, 4))


def test_comparisons_from_ranges():
    r = loop(8)
    assert simplify(r.lt(8)) is UOp.const(dtypes.bool, True)
    assert simplify(r.lt(0)) is UOp.const(dtypes.bool, False)
    assert simplify(r.lt(4)).op is Ops.CMPLT


@pytest.mark.parametrize("value", [0, 1, 7, 19])
def test_simplified_index_keeps_its_value(value):
    r = loop(20)
    expression = ((r // 5) * 5 + r % 5) * 3 + (r // 4) % 5
    simplified = simplify(expression)
    substitute = {r: UOp.const(INDEX, value)}
    from lazygrad.uop.pattern import substitute as replace

    assert simplify(replace(simplified, substitute)).arg == value * 3 + (value // 4) % 5


# ---- indices of real kernels ----------------------------------------------------------------------------------------


def program_of(tensor: Tensor) -> list[UOp]:
    (item,) = tensor.schedule()
    kernel = prepare(lower_kernel(item.ast))
    return linearize(apply_opts(kernel, heuristic_opts(kernel, Target())))


def divisions(program: list[UOp]) -> int:
    return sum(node.op in (Ops.IDIV, Ops.MOD) for node in program)


def test_contiguous_elementwise_indexes_with_loop_counter_alone():
    a = Tensor(np.ones((4, 6, 5), np.float32))
    b = Tensor(np.ones((4, 6, 5), np.float32))
    program = program_of((a * b + 1).reshape(24, 5))
    loops = [node for node in program if node.op is Ops.RANGE]
    assert len(loops) == 1
    assert divisions(program) == 0
    for node in program:
        if node.op in (Ops.LOAD, Ops.STORE) and node.src[0].op is Ops.DEFINE_GLOBAL:
            assert node.src[1] is loops[0]


def test_reduce_over_last_axis_has_no_divisions():
    a = Tensor(np.ones((8, 16), np.float32))
    assert divisions(program_of(a.sum(1))) == 0


def test_reshape_of_permute_needs_few_divisions():
    a = Tensor(np.ones((4, 6), np.float32))
    assert divisions(program_of(a.T.contiguous())) == 0
    assert divisions(program_of((a.T + 1).reshape(24))) <= 2


def test_reshape_lowers_each_run_of_axes_apart():
    """A reshape splits and merges runs of neighbouring axes; an axis it keeps (or a unit axis it adds or drops) is
    indexed by its own loop, with no division, even beside a padded axis; the runs it splits or merges give the
    values NumPy gives, padding included."""
    from lazygrad.codegen.lower import reshaped_indices

    rows, cols = loop(6, 0), loop(10, 1)
    shifted = simplify(cols - 2)  # a padded axis's index: negative where the pad's validity fails
    assert reshaped_indices((rows, UOp.const(INDEX, 0), shifted), (6, 1, 10), (6, 10)) == (rows, shifted)
    assert reshaped_indices((rows, shifted), (6, 10), (6, 1, 10)) == (rows, UOp.const(INDEX, 0), shifted)
    merged = reshaped_indices((loop(60, 2),), (60,), (6, 10))
    assert [node.op for node in merged] == [Ops.IDIV, Ops.MOD]
    x = np.arange(2 * 3 * 4 * 5, dtype=np.float32).reshape(2, 3, 4, 5)
    padded = Tensor(x).pad(((0, 0), (0, 0), (1, 1), (2, 0)))  # (2, 3, 6, 7)
    view = (padded + 1).reshape(6, 1, 6, 7).permute(2, 3, 0, 1).reshape(42, 6) * 2
    expected = ((np.pad(x, ((0, 0), (0, 0), (1, 1), (2, 0))) + 1).reshape(6, 1, 6, 7).transpose(2, 3, 0, 1)) * 2
    np.testing.assert_array_equal(view.numpy(), expected.reshape(42, 6))
    program = program_of(Tensor(x).pad(((0, 0), (0, 0), (1, 1), (2, 0))).reshape(2, 3, 1, 6, 7) + 1)
    assert divisions(program) == 0


def test_index_simplified_under_its_gate():
    from lazygrad.uop.symbolic import simplify_given

    row, col = loop(8, 0), loop(8, 1)
    # a padded window reads (row - 1) * 8 + col - 1 only where row >= 1 and col >= 1: there it is never negative,
    # so the modulo by the buffer size folds away
    index = simplify((row * 8 + col - 9) % 64)
    gate = simplify(UOp.const(INDEX, -1).lt(row - 1).logical_and(UOp.const(INDEX, -1).lt(col - 1)))
    assert index.op is Ops.MOD
    simplified = simplify_given(index, gate)
    assert all(node.op not in (Ops.MOD, Ops.IDIV) for node in simplified.toposort)
    from lazygrad.uop.pattern import substitute

    for r, c in [(1, 1), (3, 5), (7, 7)]:
        value = simplify(substitute(simplified, {row: UOp.const(INDEX, r), col: UOp.const(INDEX, c)}))
        assert value.arg == (r * 8 + c - 9) % 64


def test_gate_keeps_one_of_two_clauses_that_say_the_same():
    """A pad inside a pad checks one bound twice in different forms (`x - 3 < 9` and `x - 6 < 6`): simplified, the
    gate keeps one of them (each alone would vanish given the other) and holds exactly where the original does."""
    from lazygrad.uop.pattern import substitute
    from lazygrad.uop.symbolic import simplify_gate

    x, minus_one = loop(15), UOp.const(INDEX, -1)
    outer, inner = x - 3, x - 6
    gate = simplify(
        minus_one.lt(outer)
        .logical_and(outer.lt(UOp.const(INDEX, 9)))
        .logical_and(minus_one.lt(inner))
        .logical_and(inner.lt(UOp.const(INDEX, 6)))
    )
    simplified = simplify_gate(gate)
    for value in range(15):
        bound = {x: UOp.const(INDEX, value)}
        assert simplify(substitute(simplified, bound)).arg == (0 <= value - 6 < 6), value


def test_index_simplified_under_a_gate_on_sums():
    from itertools import product

    from lazygrad.uop.pattern import substitute
    from lazygrad.uop.symbolic import simplify_given

    # a 3x3 window over a padded 8x8 image: the gate bounds the sums h + kh - 1 and w + kw - 1, not single loops
    h, w, kh, kw = loop(8, 0), loop(8, 1), loop(3, 2), loop(3, 3)
    index = simplify((h * 8 + kh * 8 + w + kw - 9) % 64)
    row, col = h + kh - 1, w + kw - 1
    minus_one, eight = UOp.const(INDEX, -1), UOp.const(INDEX, 8)
    gate = simplify(
        minus_one.lt(row).logical_and(row.lt(eight)).logical_and(minus_one.lt(col)).logical_and(col.lt(eight))
    )
    simplified = simplify_given(index, gate)
    assert all(node.op not in (Ops.MOD, Ops.IDIV) for node in simplified.toposort)
    for values in product(range(8), range(8), range(3), range(3)):
        if 0 <= values[0] + values[2] - 1 < 8 and 0 <= values[1] + values[3] - 1 < 8:
            bound = {var: UOp.const(INDEX, value) for var, value in zip((h, w, kh, kw), values)}
            expected = (values[0] * 8 + values[2] * 8 + values[1] + values[3] - 9) % 64
            assert simplify(substitute(simplified, bound)).arg == expected


def test_matrix_products_are_register_blocked():
    def accumulators(tensor: Tensor) -> int:
        return sum(node.op is Ops.DEFINE_ACC for node in program_of(tensor))

    a, b = Tensor(np.ones((32, 64), np.float32)), Tensor(np.ones((64, 32), np.float32))
    # x @ w: 8 vector accumulators, a block of 32 outputs along the row (contiguous in w) by 4 rows; 16 by 8 where
    # the row is 16 long
    assert accumulators(a @ b) == 128
    assert accumulators(Tensor(np.ones((32, 64), np.float32)) @ Tensor(np.ones((64, 16), np.float32))) == 128
    # a large product: 32 outputs along the row times 8 rows
    big = Tensor(np.ones((1024, 1024), np.float32))
    assert accumulators(big @ big) == 256
    # x @ wᵀ: both inputs contiguous along the reduce, which the compiler vectorizes; a 4x4 block of outputs
    program = program_of(a @ a.T)
    assert sum(node.op is Ops.DEFINE_ACC for node in program) == 16
    assert any(node.op is Ops.RANGE and node.arg[1] is LoopKind.VECTOR_REDUCE for node in program)
    np.testing.assert_allclose((a @ b).numpy(), np.full((32, 32), 64.0))


def test_reduce_of_a_value_constant_along_the_loop_is_a_product():
    x = Tensor(np.arange(4, dtype=np.float32))
    total = x.reshape(4, 1).expand(4, 64).sum(1)
    assert not any(node.op is Ops.RANGE and node.arg[1] is not LoopKind.GLOBAL for node in program_of(total))
    np.testing.assert_array_equal(total.numpy(), np.arange(4, dtype=np.float32) * 64)


def test_gate_with_a_repeated_clause_keeps_it():
    from lazygrad.uop.symbolic import simplify_gate

    row = loop(3, 0)
    above, below = UOp.const(INDEX, -1).lt(row - 1), (row - 1).lt(UOp.const(INDEX, 1))  # together: row == 1
    gate = simplify_gate(above.logical_and(below).logical_and(above).logical_and(below))
    for value in range(3):
        assert simplify(substitute(gate, {row: UOp.const(INDEX, value)})).arg == (value == 1)


def test_only_index_conditions_gate_loads():
    def gated_loads(tensor: Tensor) -> int:
        return sum(node.op is Ops.LOAD and len(node.src) == 3 for node in program_of(tensor))

    x, g = Tensor(np.linspace(-1, 1, 32, dtype=np.float32)), Tensor(np.ones(32, np.float32))
    assert gated_loads((x > 0).where(g, 0)) == 0  # relu's gradient: a select on data, loads stay plain
    assert gated_loads(g.pad(((2, 2),))) == 1  # padding: a condition on the index gates the load


def test_nan_constants_are_one_node():
    # NaN equals nothing, not even itself: without care every NaN constant would be a new node and a new kernel
    assert UOp.const(dtypes.float32, float("nan")) is UOp.const(dtypes.float32, float("nan"))
    assert UOp.const(dtypes.float32, float("nan")) is not UOp.const(dtypes.float64, float("nan"))


def test_kinds_behave_as_the_enums_they_stand_for():
    assert Ops["ADD"] is Ops.ADD and Ops.ADD.name == "ADD"
    assert str(Ops.ADD) == f"{Ops.ADD}" == "Ops.ADD" and repr(Ops.ADD) == f"<Ops.ADD: {Ops.ADD.value}>"
    assert [op.value for op in Ops] == list(range(1, len(Ops) + 1)) and list(Ops)[0] is Ops.BUFFER
    assert pickle.loads(pickle.dumps(LoopKind.REDUCE)) is LoopKind.REDUCE and copy.deepcopy(Ops.MUL) is Ops.MUL
    assert isinstance(Ops.ADD, Ops) and not isinstance(Ops.ADD, LoopKind) and Ops.ADD != Ops.MUL
    with pytest.raises(TypeError, match="members are fixed"):
        Ops(3)
