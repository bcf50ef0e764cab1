"""Renderers: a linear program (list of UOps) becomes source text for one language."""

from __future__ import annotations

from lazygrad.uop.ops import Ops, UOp


def kernel_name(program: list[UOp]) -> str:
    """A readable name: `r_` for kernels with a reduce loop, `E_` for elementwise ones, then the loop sizes."""
    loops = [node for node in program if node.op is Ops.RANGE]
    prefix = "r" if any(loop.arg[1] == "reduce" for loop in loops) else "E"
    return "_".join([prefix] + [str(loop.src[0].arg) for loop in loops]) if loops else prefix + "_1"


class Renderer:
    """Turns a linear program into source text; `render` returns (function name, source)."""

    def render(self, name: str, program: list[UOp]) -> str:
        raise NotImplementedError
