"""Multi-root backward, in the style of `paddle.autograd.backward`."""

from __future__ import annotations

import os
from typing import Any, Sequence

from lazygrad.engine.buffers import with_history
from lazygrad.gradient import compute_gradients
from lazygrad.tensor import Tensor
from lazygrad.uop.ops import Ops, UOp
from lazygrad.viz import graph_dot


def backward(
    tensors: Tensor | Sequence[Tensor],
    grad_tensors: Any | Sequence[Any] | None = None,
    retain_graph: bool = False,
    *,
    dump_backward_graph_path: str | None = None,
) -> None:
    """Accumulate gradients of several roots at once into `.grad`. A `grad_tensors` entry of None (or no
    `grad_tensors` at all) seeds ones of the root's shape. `retain_graph` is accepted for compatibility: graphs are
    immutable and never freed. With `dump_backward_graph_path`, the backward graph is written there as DOT, with a
    text file naming the forward op behind each gradient node."""
    roots = [tensors] if isinstance(tensors, Tensor) else list(tensors)
    if len({id(t) for t in roots}) != len(roots):
        raise ValueError("backward: the same tensor appears twice in `tensors`; pass each root once")
    if grad_tensors is None:
        grad_tensors = [None] * len(roots)
    elif isinstance(grad_tensors, Tensor) or not isinstance(grad_tensors, (list, tuple)):
        grad_tensors = [grad_tensors]
    if len(grad_tensors) != len(roots):
        raise ValueError(
            f"backward: got {len(roots)} tensors but {len(grad_tensors)} grad_tensors; give one per tensor (None for ones)"
        )
    seeds = [
        root._seed(root.ones_like() if grad is None else grad, "backward") for root, grad in zip(roots, grad_tensors)
    ]
    Tensor._backward(roots, seeds)
    if dump_backward_graph_path is not None:
        dump_backward_graph(roots, seeds, dump_backward_graph_path)


def dump_backward_graph(roots: list[Tensor], seeds: list[UOp], directory: str) -> None:
    """Write backward_graph.dot and backward_graph.txt (each gradient node and the forward op it came from)."""
    os.makedirs(directory, exist_ok=True)
    # the graph backward differentiates: realized tensors replaced by the computations behind them (see
    # Tensor._backward); the roots' own graphs stopped at every realized intermediate
    nodes = [root.uop for root in roots]
    expanded = with_history(nodes)
    forward = [expanded[node] for node in nodes]
    leaves = [
        node for node in UOp(Ops.SINK, src=tuple(forward)).toposort if node.op is Ops.BUFFER and node.dtype.is_float
    ]
    grads, made_by = compute_gradients(dict(zip(forward, seeds)), leaves)
    names = {grad: f"d/d buffer {leaf.arg[0]}" for leaf, grad in grads.items()}
    with open(os.path.join(directory, "backward_graph.dot"), "w") as file:
        file.write(graph_dot(forward, list(grads.values()), names=names, kernels=False))
    with open(os.path.join(directory, "backward_graph.txt"), "w") as file:
        for gradient_node, forward_node in made_by.items():
            file.write(
                f"{gradient_node.op.name} {gradient_node.shape} <- gradient of {forward_node.op.name} {forward_node.shape}\n"
            )
