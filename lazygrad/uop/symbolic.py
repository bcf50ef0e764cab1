"""The symbolic simplifier: constant folding, canonical sums and products, and `//`/`%` folding from value ranges.

Index arithmetic is what every movement op turns into, so this is performance: a contiguous kernel must end with
the loop index alone, and a reshape of a permute with as few divisions as the math allows.

Integer arithmetic wraps around (lazygrad/uop/alu.py). Rewriting sums and products term by term is exact under
wrapping (it is arithmetic modulo 2^bits); reasoning about a sum's value from its terms (what `//` and `%` folding
and bounds from gates do) is only sound when the sum cannot wrap, which `fits` checks from the terms' ranges.
"""

from __future__ import annotations

import itertools
import math

from lazygrad.dtype import dtypes
from lazygrad.uop.alu import cast_value, exec_alu
from lazygrad.uop.ops import ALU, COMMUTATIVE, Ops, UOp, dtype_limits
from lazygrad.uop.pattern import PatternMatcher, UPat, graph_rewrite

INT_TYPES = (dtypes.int32, dtypes.int64, dtypes.uint32)
FLOAT_TYPES = (dtypes.float16, dtypes.float32, dtypes.float64)


def fold_constants(node: UOp) -> UOp | None:
    if node.op is Ops.CAST:
        if node.src[0].dtype == node.dtype:
            return node.src[0]
        return UOp.const(node.dtype, cast_value(node.src[0].arg, node.dtype)) if node.src[0].op is Ops.CONST else None
    if node.src and all(source.op is Ops.CONST for source in node.src):
        return UOp.const(node.dtype, exec_alu(node.op, node.dtype, [source.arg for source in node.src]))
    return None


def fold_from_bounds(node: UOp) -> UOp | None:
    """An integer or bool node whose range is a single value is that constant."""
    if node.op is not Ops.CONST and (node.dtype in INT_TYPES or node.dtype == dtypes.bool):
        low, high = node.bounds
        if low == high:
            return UOp.const(node.dtype, low)
    return None


def const_to_right(node: UOp) -> UOp | None:
    if node.src[0].op is Ops.CONST and node.src[1].op is not Ops.CONST:
        return node.replace(src=(node.src[1], node.src[0]))
    return None


# ---- sums of terms --------------------------------------------------------------------------------------------


def split_term(term: UOp) -> tuple[UOp | None, int]:
    """A term as (base, coefficient): `x*3` is (x, 3), `7` is (None, 7), `x` is (x, 1)."""
    if term.op is Ops.CONST:
        return None, term.arg
    if term.op is Ops.MUL and term.src[1].op is Ops.CONST:
        return term.src[0], term.src[1].arg
    return term, 1


def sum_terms(node: UOp) -> list[UOp]:
    """The terms of a chain of integer additions, flattened."""
    terms, stack = [], [node]
    while stack:
        current = stack.pop()
        if current.op is Ops.ADD:
            stack.extend(reversed(current.src))
        else:
            terms.append(current)
    return terms


def fits(dtype, terms: list[tuple[UOp | None, int]]) -> bool:
    """Whether a sum of terms stays inside `dtype`'s range for every value of its bases, so it never wraps around
    and its value is the sum of its terms."""
    low = high = 0
    for base, coefficient in terms:
        ends = (coefficient, coefficient) if base is None else (coefficient * base.vmin, coefficient * base.vmax)
        low, high = low + min(ends), high + max(ends)
    lowest, highest = dtype_limits(dtype)
    return lowest <= low and high <= highest


def build_sum(dtype, terms: list[tuple[UOp | None, int]]) -> UOp:
    """A canonical sum: like terms combined, ordered by content hash, the constant last."""
    coefficients: dict[UOp, int] = {}
    constant = 0
    for base, coefficient in terms:
        if base is None:
            constant += coefficient
        else:
            coefficients[base] = coefficients.get(base, 0) + coefficient
    parts = []
    for base in sorted(coefficients, key=lambda base: base.key):
        if coefficients[base] != 0:
            parts.append(base if coefficients[base] == 1 else base.alu(Ops.MUL, UOp.const(dtype, coefficients[base])))
    if constant != 0 or not parts:
        parts.append(UOp.const(dtype, constant))
    result = parts[0]
    for part in parts[1:]:
        result = result.alu(Ops.ADD, part)
    return result


def canonical_sum(node: UOp) -> UOp | None:
    # like terms first combined: a rule below replaces a base's whole coefficient (a sum can hold (x//6)*6 and
    # (x//6)*4 once a term that was itself a sum is flattened into it)
    combined: dict[UOp | None, int] = {}
    for base, coefficient in map(split_term, sum_terms(node)):
        combined[base] = combined.get(base, 0) + coefficient
    terms = list(combined.items())
    # (x//c)*c + x%c is x, whatever x's sign: division truncates toward zero and the remainder takes x's sign
    bases = {base: coefficient for base, coefficient in terms if base is not None and coefficient != 0}
    for base, coefficient in list(bases.items()):
        if base.op is Ops.IDIV and base.src[1].op is Ops.CONST and base.src[1].arg > 0:
            remainder = base.src[0].alu(Ops.MOD, base.src[1])
            divisor = base.src[1].arg
            if coefficient % divisor == 0 and bases.get(remainder) == coefficient // divisor:
                terms = [(b, c) for b, c in terms if b is not base and b is not remainder]
                terms.append((base.src[0], coefficient // divisor))
                return build_sum(node.dtype, terms)
        # ((x // a) % b) * a + x % a is x % (a * b) (for either sign of x, as above)
        if base.op is Ops.MOD and base.src[0].op is Ops.IDIV and base.src[1].op is Ops.CONST:
            inner, outer = base.src[0], base.src[1].arg
            if inner.src[1].op is Ops.CONST and fits_product(node.dtype, inner.src[1], outer):
                a = inner.src[1].arg
                remainder = inner.src[0].alu(Ops.MOD, inner.src[1])
                if coefficient % a == 0 and bases.get(remainder) == coefficient // a:
                    terms = [(b, c) for b, c in terms if b is not base and b is not remainder]
                    terms.append((inner.src[0].alu(Ops.MOD, UOp.const(node.dtype, a * outer)), coefficient // a))
                    return build_sum(node.dtype, terms)
    rebuilt = build_sum(node.dtype, terms)
    return None if rebuilt is node else rebuilt


def distribute_mul(node: UOp, total: UOp, factor: UOp) -> UOp | None:
    """(a + b) * c is a*c + b*c for integers, so a sum stays a flat list of terms."""
    return build_sum(
        node.dtype, [(base, coefficient * factor.arg) for base, coefficient in map(split_term, sum_terms(total))]
    )


def fold_div_mod(node: UOp) -> UOp | None:
    """`x // c` and `x % c` for c > 0 and x >= 0: split x's terms into multiples of c and a remainder; when the
    remainder's range lies in [0, c) the quotient and the remainder are exact."""
    value, divisor_node = node.src
    divisor = divisor_node.arg
    if divisor <= 0 or value.vmin < 0:
        return None
    if value.vmax < divisor:
        return value if node.op is Ops.MOD else UOp.const(node.dtype, 0)
    terms = list(map(split_term, sum_terms(value)))
    if not fits(node.dtype, terms):
        return None
    quotient, remainder = [], []
    for base, coefficient in terms:
        quotient.append((base, coefficient // divisor))
        remainder.append((base, coefficient % divisor))
    remainder_sum = build_sum(node.dtype, remainder)
    if remainder_sum.vmin >= 0 and remainder_sum.vmax < divisor:
        return remainder_sum if node.op is Ops.MOD else build_sum(node.dtype, quotient)
    # terms that are multiples of the divisor leave a remainder of what the others sum to, when that is not negative:
    # (128t + k) % 32 is k % 32 and (128t + k) // 32 is 4t + k // 32
    if remainder_sum.vmin >= 0 and any(coefficient and coefficient % divisor == 0 for _, coefficient in terms):
        if node.op is Ops.MOD:
            return remainder_sum.alu(Ops.MOD, divisor_node)
        return build_sum(node.dtype, quotient).alu(Ops.ADD, remainder_sum.alu(Ops.IDIV, divisor_node))
    # a factor f of the divisor that divides every term but a small remainder: (5a + b) // 30 is a // 6 when
    # 0 <= b < 5, and (5a + b) % 30 is (a % 6) * 5 + b
    for factor in sorted({math.gcd(divisor, coefficient) for _, coefficient in terms}, reverse=True):
        if factor in (1, divisor):
            continue
        small = [(b, c) for b, c in terms if c % factor != 0]
        small_sum = build_sum(node.dtype, small)
        if small and not (small_sum.vmin >= 0 and small_sum.vmax < factor):
            continue
        large = build_sum(node.dtype, [(b, c // factor) for b, c in terms if c % factor == 0])
        if node.op is Ops.IDIV:
            return large.alu(Ops.IDIV, UOp.const(node.dtype, divisor // factor))
        wrapped = large.alu(Ops.MOD, UOp.const(node.dtype, divisor // factor)).alu(
            Ops.MUL, UOp.const(node.dtype, factor)
        )
        return wrapped.alu(Ops.ADD, small_sum) if small else wrapped
    # divide out a factor common to every term and the divisor: (4a + 2b) // 8 is (2a + b) // 4
    common = math.gcd(divisor, *(coefficient for _, coefficient in terms))
    if common > 1:
        reduced = build_sum(node.dtype, [(b, c // common) for b, c in terms])
        if node.op is Ops.IDIV:
            return reduced.alu(Ops.IDIV, UOp.const(node.dtype, divisor // common))
        return reduced.alu(Ops.MOD, UOp.const(node.dtype, divisor // common)).alu(
            Ops.MUL, UOp.const(node.dtype, common)
        )
    # nested division and modulo
    if value.op is Ops.IDIV and value.src[1].op is Ops.CONST and node.op is Ops.IDIV and value.src[0].vmin >= 0:
        if fits_product(node.dtype, value.src[1], divisor):
            return value.src[0].alu(Ops.IDIV, UOp.const(node.dtype, value.src[1].arg * divisor))
    if (
        value.op is Ops.MOD
        and value.src[1].op is Ops.CONST
        and value.src[1].arg != 0
        and value.src[1].arg % divisor == 0
    ):
        if node.op is Ops.MOD:
            return value.src[0].alu(Ops.MOD, divisor_node)
        outer = value.src[1].arg // divisor
        return value.src[0].alu(Ops.IDIV, divisor_node).alu(Ops.MOD, UOp.const(node.dtype, outer))
    return None


def fits_product(dtype, constant: UOp, factor: int) -> bool:
    """Whether a constant and a factor are positive and their product is a value of `dtype`."""
    return constant.arg > 0 and factor > 0 and constant.arg * factor <= dtype_limits(dtype)[1]


def gate_load(c: UOp, load: UOp, zero: UOp) -> UOp | None:
    # (a gated load reads +0.0: where(c, load, -0.0), a pad with -0.0, keeps its select)
    if zero.arg != 0 or math.copysign(1.0, zero.arg) < 0 or load.src[0].op is not Ops.DEFINE_GLOBAL:
        return None
    present = set(gate_clauses(load.src[2])) if len(load.src) == 3 else set()
    missing = [clause for clause in gate_clauses(c) if clause not in present]
    if not missing:  # a load gated by c already reads 0 where c fails
        return load
    # only conditions on indices: a gate that depends on loaded data (relu's gradient) would turn vector loads
    # into masked or gathered ones
    if any(n.op is Ops.LOAD for n in c.toposort):
        return None
    return load.replace(src=(*load.src[:2], _all_of([load.src[2], *missing]) if present else c))


def divide_by_power_of_two(x: UOp, divisor: UOp) -> UOp | None:
    """x / 2**k as x · 2**-k (see UOp.__truediv__), for divisors that became constants in the kernel graph."""
    quotient = x / divisor
    return None if quotient.op is Ops.FDIV else quotient


def fold_compare(node: UOp) -> UOp | None:
    low, high = node.bounds
    return UOp.const(dtypes.bool, low) if low == high else None


symbolic = PatternMatcher(
    [
        (UPat(tuple(ALU | {Ops.CAST}), name="node"), fold_constants),
        (UPat(tuple(ALU), dtype=INT_TYPES + (dtypes.bool,), name="node"), fold_from_bounds),
        (UPat(tuple(COMMUTATIVE), name="node", src=(UPat(), UPat())), const_to_right),
        # identities
        (UPat(Ops.MUL, src=(UPat.var("x"), UPat.cvar("one"))), lambda x, one: x if one.arg == 1 else None),
        (
            UPat(Ops.ADD, dtype=INT_TYPES, src=(UPat.var("x"), UPat.cvar("zero"))),
            lambda x, zero: x if zero.arg == 0 else None,
        ),
        (
            UPat(Ops.MUL, dtype=INT_TYPES, src=(UPat.var("x"), UPat.cvar("zero"))),
            lambda x, zero: zero if zero.arg == 0 else None,
        ),
        (UPat(Ops.IDIV, src=(UPat.var("x"), UPat.cvar("one"))), lambda x, one: x if one.arg == 1 else None),
        (UPat(Ops.FDIV, src=(UPat.var("x"), UPat.cvar("divisor"))), divide_by_power_of_two),
        (UPat(Ops.WHERE, src=(UPat.var(), UPat.var("x"), UPat.var("y"))), lambda x, y: x if x is y else None),
        (UPat(Ops.WHERE, src=(UPat.cvar("c"), UPat.var("x"), UPat.var("y"))), lambda c, x, y: x if c.arg else y),
        # a float plus zero is itself (but for the sign of a zero: -0.0 + 0.0 is 0.0), so the zeros of padding go
        (
            UPat(Ops.ADD, dtype=FLOAT_TYPES, src=(UPat.var("x"), UPat.cvar("zero"))),
            lambda x, zero: x if zero.arg == 0 else None,
        ),
        # where(c, load, 0) for a condition c on indices is the load gated by c too (a gated load reads zero where
        # its gate fails), so the gate's clauses can simplify each other
        (UPat(Ops.WHERE, src=(UPat.var("c"), UPat(Ops.LOAD, name="load"), UPat.cvar("zero"))), gate_load),
        (UPat(Ops.AND, dtype=dtypes.bool, src=(UPat.var("x"), UPat.var("y"))), lambda x, y: x if x is y else None),
        # a load whose gate is known: always made, or never (then it reads zero)
        (
            UPat(Ops.LOAD, name="load", src=(UPat(Ops.DEFINE_GLOBAL), UPat.var(), UPat.cvar("gate"))),
            lambda load, gate: load.replace(src=load.src[:2]) if gate.arg else UOp.const(load.dtype, 0),
        ),
        (UPat(Ops.AND, dtype=dtypes.bool, src=(UPat.var("x"), UPat.cvar("c"))), lambda x, c: x if c.arg else c),
        # integer sums and products
        (UPat(Ops.ADD, dtype=INT_TYPES, name="node"), canonical_sum),
        (
            UPat(Ops.MUL, dtype=INT_TYPES, name="node", src=(UPat(Ops.ADD, name="total"), UPat.cvar("factor"))),
            distribute_mul,
        ),
        (
            UPat(Ops.MUL, dtype=INT_TYPES, src=(UPat(Ops.MUL, src=(UPat.var("x"), UPat.cvar("a"))), UPat.cvar("b"))),
            lambda x, a, b: x.alu(Ops.MUL, UOp.const(x.dtype, a.arg * b.arg)),
        ),
        (UPat((Ops.IDIV, Ops.MOD), dtype=INT_TYPES, name="node", src=(UPat.var(), UPat.cvar())), fold_div_mod),
        (UPat((Ops.CMPLT, Ops.CMPNE), name="node"), fold_compare),
    ]
)


# what simplify found, shared by its calls: lowering and every optimization action simplify index expressions
# that mostly hold parts simplified before. (Code is generated under the realize lock, one kernel at a time, and
# no rule simplifies: entries are dropped only between rewrites.)
_simplified: dict[UOp, UOp] = {}
# (a ResNet18 training step's kernels fill 1 << 18 entries, ~85 MB more at its peak than this, and no faster)
SIMPLIFIED_LIMIT = 1 << 16


def _drop_oldest(table: dict) -> None:
    """Make room in a bounded table by dropping its oldest eighth. (Emptying a full one freed ~65k nodes at once:
    ~40 ms in the generation of whichever kernel found it full, and every entry was lost.)"""
    for key in list(itertools.islice(table, len(table) // 8)):
        del table[key]


def simplify(node: UOp) -> UOp:
    """`node` rewritten with the symbolic rules until none applies."""
    if (found := _simplified.get(node)) is not None:
        return found
    if len(_simplified) > SIMPLIFIED_LIMIT:
        _drop_oldest(_simplified)
    return graph_rewrite(node, symbolic, done=_simplified)


def _sum_bound(clause: UOp) -> tuple[UOp, int | None, int | None] | None:
    """A comparison `c < s` or `s < c` of an integer sum s with a constant, as (s without its constant term, the
    lowest value it allows, the highest)."""
    if clause.op is not Ops.CMPLT or not clause.src[0].dtype.is_int:
        return None
    left, right = clause.src
    for side, const, is_lower in ((right, left, True), (left, right, False)):
        if const.op is not Ops.CONST or side.op is Ops.CONST:
            continue
        terms = [split_term(term) for term in sum_terms(side)]
        if not fits(side.dtype, terms):
            return None  # a sum that may wrap is not bounded by bounding its terms
        offset = sum(coefficient for base, coefficient in terms if base is None)
        expression = build_sum(side.dtype, [(base, coefficient) for base, coefficient in terms if base is not None])
        return (expression, const.arg - offset + 1, None) if is_lower else (expression, None, const.arg - offset - 1)
    return None


# what simplify_given and simplify_gate found: an optimization action copies a kernel's loads, and the actions
# chosen are applied again to render, so the same gates come back many times. Bounded like `_simplified`.
_given: dict[tuple[UOp, UOp], UOp] = {}
_gates: dict[UOp, UOp] = {}


def _remembered(table: dict, key, compute):
    if (found := table.get(key)) is None:
        if len(table) > SIMPLIFIED_LIMIT:
            _drop_oldest(table)
        found = table[key] = compute()
    return found


def simplify_given(index: UOp, valid: UOp) -> UOp:
    """`index` simplified knowing `valid` holds (the index of a load gated by `valid` only matters then), which
    often removes a `%` or `//`. An index that reads memory (a lookup's, see codegen/lookup.py) stays as it is: the
    gates of the loads in it keep them inside their buffers wherever the index is computed, which is everywhere, not
    only where `valid` holds."""
    if any(node.op is Ops.LOAD for node in index.toposort):
        return index
    return _remembered(_given, (index, valid), lambda: _simplify_given(index, valid))


def _simplify_given(index: UOp, valid: UOp) -> UOp:
    """simplify_given, computed.

    Each sum s that `valid` bounds to [lo, hi] becomes a stand-in loop v over that range: one loop r of s (with
    coefficient 1) is rewritten as v - (s - r), which is exact, so the other loops of s cancel wherever the index
    uses s as a whole (a padded window's `h + kh`). After simplifying, v is turned back into s."""
    bounds: dict[UOp, list[int]] = {}
    for clause in gate_clauses(valid):
        if (bound := _sum_bound(clause)) is not None:
            expression, low, high = bound
            current = bounds.setdefault(expression, [expression.vmin, expression.vmax])
            current[0] = max(current[0], low) if low is not None else current[0]
            current[1] = min(current[1], high) if high is not None else current[1]
    replacements, back, used = {}, {}, set()
    for expression, (low, high) in bounds.items():
        if low > high:
            return index  # never valid: the load is never made
        if (low, high) == (expression.vmin, expression.vmax):
            continue
        loops = {base for base in expression.toposort if base.op is Ops.RANGE}
        unit = [b for b, c in map(split_term, sum_terms(expression)) if c == 1 and b is not None and b.op is Ops.RANGE]
        if not unit or loops & used:
            continue  # loops shared with a sum already replaced: keep it simple and leave this clause out
        used |= loops
        stand_in = UOp(
            Ops.RANGE, expression.dtype, (UOp.const(expression.dtype, high - low + 1),), (-1 - len(back), "bound")
        )
        replacements[unit[0]] = (stand_in + low) - (expression - unit[0])
        back[stand_in] = expression - low
    if not replacements:
        return index
    from lazygrad.uop.pattern import substitute

    return simplify(substitute(simplify(substitute(index, replacements)), back))


def gate_clauses(valid: UOp) -> list[UOp]:
    """The conditions a gate ands together."""
    clauses, stack = [], [valid]
    while stack:
        clause = stack.pop()
        if clause.op is Ops.AND and clause.dtype == dtypes.bool:
            stack.extend(clause.src)
        else:
            clauses.append(clause)
    return clauses


def _all_of(clauses: list[UOp]) -> UOp:
    result = clauses[0]
    for clause in clauses[1:]:
        result = result.alu(Ops.AND, clause)
    return result


def simplify_gate(valid: UOp) -> UOp:
    """A gate with each clause simplified knowing the others hold (a padded view of a padded view checks an index
    that is a `%` of the outer one until the outer clauses bound it)."""
    return _remembered(_gates, valid, lambda: _simplify_gate(valid))


def _simplify_gate(valid: UOp) -> UOp:
    # One clause after another, each given the others as they stand: the later ones as they are, the earlier ones
    # as simplified. Given all the others as they were, two clauses that say the same in different forms (a pad's
    # `x - 3 < 9` and an inner pad's `x - 6 < 6`) would each vanish given the other, and the gate lose both.
    clauses = list(dict.fromkeys(gate_clauses(valid)))  # each once: a clause given itself would vanish
    if len(clauses) == 1:
        return clauses[0]
    for position, clause in enumerate(clauses):
        others = [other for other in clauses[:position] + clauses[position + 1 :] if other.op is not Ops.CONST]
        if others:
            clauses[position] = simplify_given(clause, _all_of(others))
    return simplify(_all_of(clauses))


def simplify_gated_loads(sink: UOp) -> UOp:
    """A gated load's index only matters where its gate holds: simplify each one knowing that."""
    from lazygrad.uop.pattern import substitute

    gated = {}
    for node in sink.toposort:
        if node.op is Ops.LOAD and len(node.src) == 3 and node.src[0].op is Ops.DEFINE_GLOBAL:
            gate = simplify_gate(node.src[2])
            gated[node] = node.replace(src=(node.src[0], simplify_given(node.src[1], gate), gate))
    return simplify(substitute(sink, gated)) if gated else sink
