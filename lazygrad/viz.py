"""Graph pictures: the forward and backward UOp graph as DOT (and SVG/PNG through graphviz), with the kernels the
scheduler would make drawn as clusters, so a reader sees what fused."""

from __future__ import annotations

import os
import shutil
import subprocess

from lazygrad.engine.buffers import with_history
from lazygrad.engine.fusion import kernel_roots
from lazygrad.uop.ops import Ops, UOp


def _label(node: UOp) -> str:
    shape = "" if node.shape is None else f"\\n{node.shape}"
    arg = ""
    if node.op is Ops.CONST:
        arg = f" {node.arg}"
    elif node.op is Ops.REDUCE:
        arg = f" {node.arg[0].name} {node.arg[1]}"
    elif node.op in (Ops.PERMUTE, Ops.FLIP):
        arg = f" {node.arg}"
    return f"{node.op.name}{arg}{shape}\\n{node.dtype.name}"


def graph_dot(
    forward: list[UOp], backward: list[UOp] = (), names: dict[UOp, str] | None = None, kernels: bool = True
) -> str:
    """DOT text for the graphs of `forward` and `backward` roots. Backward-only nodes are drawn in orange; with
    `kernels`, each kernel the scheduler would make is a cluster."""
    names = names or {}
    sink = UOp(Ops.SINK, src=tuple(forward) + tuple(backward))
    nodes = [node for node in sink.toposort if node is not sink]
    forward_nodes = set(UOp(Ops.SINK, src=tuple(forward)).toposort)
    ids = {node: f"n{i}" for i, node in enumerate(nodes)}
    lines = [
        "digraph lazygrad {",
        "  rankdir=BT;",
        '  node [shape=box, style=filled, fontname="monospace", fontsize=10];',
    ]
    clusters: dict[UOp, list[UOp]] = {}
    if kernels:
        roots = kernel_roots(sink, [node for node in sink.src])
        assigned: set[UOp] = set()
        for root in reversed(roots):
            members, stack = [], [root]
            while stack:
                node = stack.pop()
                if node in assigned or node.op is Ops.BUFFER or (node in roots and node is not root):
                    continue
                assigned.add(node)
                members.append(node)
                stack.extend(node.src)
            clusters[root] = members
    clustered = {node for members in clusters.values() for node in members}
    for node in nodes:
        color = "#ffffff" if node in forward_nodes else "#ffd8a8"
        if node.op is Ops.BUFFER:
            color = "#c3e6cb"
        name = f"{names[node]}\\n" if node in names else ""
        if node not in clustered:
            lines.append(f'  {ids[node]} [label="{name}{_label(node)}", fillcolor="{color}"];')
    for number, (root, members) in enumerate(clusters.items()):
        lines.append(f'  subgraph cluster_{number} {{ label="kernel {number}"; style=dashed;')
        for node in members:
            color = "#ffffff" if node in forward_nodes else "#ffd8a8"
            name = f"{names[node]}\\n" if node in names else ""
            lines.append(f'    {ids[node]} [label="{name}{_label(node)}", fillcolor="{color}"];')
        lines.append("  }")
    for node in nodes:
        for source in node.src:
            lines.append(f"  {ids[source]} -> {ids[node]};")
    lines.append("}")
    return "\n".join(lines) + "\n"


def save_dot(dot_text: str, path: str) -> str:
    """Write DOT to `path`; a `.svg` or `.png` path is rendered with graphviz's `dot` (the `.dot` is kept too)."""
    base, extension = os.path.splitext(path)
    dot_path = path if extension == ".dot" else base + ".dot"
    with open(dot_path, "w") as file:
        file.write(dot_text)
    if extension in (".svg", ".png"):
        if shutil.which("dot") is None:
            raise RuntimeError(
                f"cannot render {path}: graphviz's `dot` program is not installed (apt-get install graphviz); "
                f"the DOT text is in {dot_path}"
            )
        subprocess.run(["dot", f"-T{extension[1:]}", dot_path, "-o", path], check=True)
    return path


def save_graph(tensors, path: str, backward: bool = True, kernels: bool = True) -> str:
    """Draw the graph of `tensors` (a Tensor or a list) to `path` (.dot, .svg or .png). With `backward`, the
    gradients already built (the `.grad` of tensors in the graph) are drawn too, in orange; with `kernels`, the
    kernels the scheduler would make are boxed, so you see what fuses."""
    from lazygrad.tensor import Tensor, tensors_holding

    roots = [tensors] if isinstance(tensors, Tensor) else list(tensors)
    # realized tensors are drawn with the computation behind their buffers
    expanded = with_history([t.uop for t in roots])
    forward = [expanded[t.uop] for t in roots]
    in_graph = set(UOp(Ops.SINK, src=tuple(forward)).toposort)
    holders = tensors_holding(in_graph | set(UOp(Ops.SINK, src=tuple(t.uop for t in roots)).toposort))
    grads = [t._grad.uop for t in holders if backward and isinstance(t._grad, Tensor)]  # (not a released one)
    return save_dot(graph_dot(forward, grads, kernels=kernels), path)
