"""The UOp graph: nodes, pattern matching and rewriting, and the symbolic simplifier."""

from lazygrad.uop.ops import Ops, UOp  # noqa: F401
from lazygrad.uop.pattern import PatternMatcher, UPat, graph_rewrite  # noqa: F401
