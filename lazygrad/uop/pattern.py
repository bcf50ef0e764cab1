"""Pattern matching over UOps (`UPat`, `PatternMatcher`) and `graph_rewrite`, which applies rules to a fixed point."""

from __future__ import annotations

import inspect
import itertools
from typing import Any, Callable

from lazygrad.dtype import DType
from lazygrad.uop.ops import Ops, UOp


class UPat:
    """A pattern: which op(s), dtype(s), sources and arg a UOp must have; `name` binds the match for the rule."""

    def __init__(
        self,
        op: Ops | tuple[Ops, ...] | set[Ops] | None = None,
        dtype: DType | tuple[DType, ...] | None = None,
        src: tuple[UPat, ...] | list[UPat] | UPat | None = None,
        arg: Any = None,
        name: str | None = None,
        allow_any_len: bool = False,
    ):
        self.ops = None if op is None else (frozenset([op]) if isinstance(op, Ops) else frozenset(op))
        self.dtypes = None if dtype is None else (frozenset([dtype]) if isinstance(dtype, DType) else frozenset(dtype))
        self.arg, self.name, self.allow_any_len = arg, name, allow_any_len
        # a tuple matches in order, a list in any order (for commutative ops), a single UPat matches every source
        if src is None or isinstance(src, UPat):
            self.src_options = src
        elif isinstance(src, list):
            self.src_options = [tuple(order) for order in itertools.permutations(src)]
        else:
            self.src_options = [tuple(src)]
        # for sources in a fixed order: which ops each must have, checked before anything is bound (most nodes a
        # rule is tried on fail here, and a rewrite tries every rule of a node's op)
        self.required: tuple[tuple[int, frozenset[Ops]], ...] = ()
        if isinstance(src, tuple):
            self.required = tuple((i, pattern.ops) for i, pattern in enumerate(src) if pattern.ops is not None)
        # sources that are all leaves (an op set and a name at most: most rules' shape): each source's op set, and
        # the names of the node and its sources; checked, then bound, in one pass (`_match_leaves`), without a match
        # call and a list of partial bindings per source
        self.leaf_ops: tuple[frozenset[Ops] | None, ...] | None = None
        if isinstance(src, tuple) and not allow_any_len and all(pattern.is_leaf for pattern in src):
            self.leaf_ops = tuple(pattern.ops for pattern in src)
            self.names = (name, *(pattern.name for pattern in src))

    @property
    def is_leaf(self) -> bool:
        """Whether this pattern checks a node's op at most, and names it (no dtype, arg or sources)."""
        return self.dtypes is None and self.arg is None and self.src_options is None

    @staticmethod
    def var(name: str | None = None, dtype: DType | tuple[DType, ...] | None = None) -> UPat:
        return UPat(dtype=dtype, name=name)

    @staticmethod
    def cvar(name: str | None = None, dtype: DType | tuple[DType, ...] | None = None) -> UPat:
        return UPat(Ops.CONST, dtype=dtype, name=name)

    def _match_leaves(self, node: UOp, bindings: dict[str, UOp]) -> list[dict[str, UOp]]:
        """`match` for a pattern whose sources are all leaves: at most one way."""
        if len(node.src) != len(self.leaf_ops):
            return []
        for ops, source in zip(self.leaf_ops, node.src):
            if ops is not None and source.op not in ops:
                return []
        bound = dict(bindings)
        for name, value in zip(self.names, (node, *node.src)):
            if name is not None and bound.setdefault(name, value) is not value:
                return []
        return [bound]

    def match(self, node: UOp, bindings: dict[str, UOp]) -> list[dict[str, UOp]]:
        """All ways `node` matches, each as the extended bindings."""
        if self.ops is not None and node.op not in self.ops:
            return []
        if self.dtypes is not None and node.dtype not in self.dtypes:
            return []
        if self.arg is not None and node.arg != self.arg:
            return []
        if self.leaf_ops is not None:
            return self._match_leaves(node, bindings)
        for position, ops in self.required:
            if position >= len(node.src) or node.src[position].op not in ops:
                return []
        if self.name is not None:
            if self.name in bindings and bindings[self.name] is not node:
                return []
            bindings = {**bindings, self.name: node}
        if self.src_options is None:
            return [bindings]
        if isinstance(self.src_options, UPat):
            results = [bindings]
            for source in node.src:
                results = [out for partial in results for out in self.src_options.match(source, partial)]
            return results
        results = []
        for option in self.src_options:
            if len(option) != len(node.src) and not (self.allow_any_len and len(option) <= len(node.src)):
                continue
            partials = [bindings]
            for pattern, source in zip(option, node.src):
                partials = [out for partial in partials for out in pattern.match(source, partial)]
                if not partials:
                    break
            results.extend(partials)
        return results


class PatternMatcher:
    """An ordered table of (pattern, rule). A rule gets the named matches (and `ctx` if it asks) and returns a
    replacement UOp or None."""

    def __init__(self, rules: list[tuple[UPat, Callable]]):
        self.rules = rules
        self.by_op: dict[Ops, list[tuple[UPat, Callable, bool]]] = {}
        for pattern, rule in rules:
            wants_ctx = "ctx" in inspect.signature(rule).parameters
            for op in pattern.ops if pattern.ops is not None else Ops:
                self.by_op.setdefault(op, []).append((pattern, rule, wants_ctx))

    def __add__(self, other: PatternMatcher) -> PatternMatcher:
        return PatternMatcher(self.rules + other.rules)

    def rewrite(self, node: UOp, ctx: Any = None) -> UOp | None:
        """The first rule's replacement for `node`, or None when no rule applies."""
        for pattern, rule, wants_ctx in self.by_op.get(node.op, ()):
            for bindings in pattern.match(node, {}):
                result = rule(**bindings, ctx=ctx) if wants_ctx else rule(**bindings)
                if result is not None and result is not node:
                    return result
        return None


def graph_rewrite(root: UOp, matcher: PatternMatcher, ctx: Any = None, done: dict[UOp, UOp] | None = None) -> UOp:
    """Rewrite every node of the graph bottom-up until no rule applies anywhere; iterative, so deep graphs are fine.
    `done` (node -> its rewrite) may carry what earlier rewrites with the same rules and no `ctx` found."""
    if done is None:
        done = {}
    # stack entries: (node, stage); stage 0 visits sources, stage 1 rewrites, stage 2 links a node to its rewrite
    stack: list[tuple[UOp, int, UOp | None]] = [(root, 0, None)]
    while stack:
        node, stage, target = stack.pop()
        if node in done:
            continue
        if stage == 0:
            stack.append((node, 1, None))
            stack.extend([(source, 0, None) for source in reversed(node.src) if source not in done])
        elif stage == 1:
            new_src = tuple([done[source] for source in node.src])
            rebuilt = node if new_src == node.src else UOp(node.op, node.dtype, new_src, node.arg)
            replacement = matcher.rewrite(rebuilt, ctx)
            if replacement is None:
                done[node] = done[rebuilt] = rebuilt
            else:
                # the replacement is new: rewrite it too, then let `node` stand for the result
                stack.append((node, 2, replacement))
                stack.append((replacement, 0, None))
        elif target in done:
            done[node] = done[target]
        else:  # the rewrite led back to a node still in progress: keep what was built
            done[node] = target
    return done[root]


def substitute(root: UOp, replacements: dict[UOp, UOp]) -> UOp:
    """`root` with some nodes replaced (no rules, one pass, iterative). The graph below a replaced node is not
    visited, so cutting a kernel out of a long graph costs the kernel's size, not the graph's."""
    done: dict[UOp, UOp] = {}
    stack: list[tuple[UOp, bool]] = [(root, False)]
    while stack:
        node, sources_done = stack.pop()
        if node in done:
            continue
        if node in replacements:
            done[node] = replacements[node]
        elif sources_done:
            new_src = tuple([done[source] for source in node.src])
            done[node] = node if new_src == node.src else node.replace(src=new_src)
        else:
            stack.append((node, True))
            stack.extend((source, False) for source in node.src if source not in done)
    return done[root]
