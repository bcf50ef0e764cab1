"""The link between BUFFER UOps and device memory.

A BUFFER UOp owns its `Buffer` through a weak-key map: when the last UOp (and so the last Tensor or graph) referring
to the buffer dies, the memory is freed. Realized results are remembered the same way, so any graph that still
contains a computed node reads the buffer instead of recomputing it.
"""

from __future__ import annotations

import itertools
import weakref

import numpy as np

from lazygrad.device import Buffer
from lazygrad.dtype import DType
from lazygrad.uop.ops import Ops, UOp

_buffers: weakref.WeakKeyDictionary[UOp, Buffer] = weakref.WeakKeyDictionary()
# computed node -> the view of the buffer that holds its value
realized: weakref.WeakKeyDictionary[UOp, UOp] = weakref.WeakKeyDictionary()
_unique_ids = itertools.count()


def new_buffer(device: str, size: int, dtype: DType) -> UOp:
    """A fresh BUFFER UOp with (not yet allocated) device memory behind it."""
    node = UOp(Ops.BUFFER, dtype, (), (next(_unique_ids), size, device))
    _buffers[node] = Buffer(device, size, dtype)
    return node


def buffer_from_numpy(array: np.ndarray, device: str, dtype: DType) -> UOp:
    """A BUFFER UOp holding a copy of `array`, viewed with the array's shape."""
    node = new_buffer(device, array.size, dtype)
    _buffers[node].copyin(array)
    return node if array.shape == (array.size,) else UOp(Ops.RESHAPE, dtype, (node,), array.shape)


def buffer_of(node: UOp) -> Buffer:
    """The memory behind a BUFFER UOp."""
    return _buffers[node]


def is_buffer_view(node: UOp) -> bool:
    """True for a BUFFER, or reshapes of one: a node whose value already sits, in order, in memory."""
    while node.op is Ops.RESHAPE:
        node = node.src[0]
    return node.op is Ops.BUFFER


def forget_buffer(buffer: UOp) -> None:
    """Drop every remembered result held in `buffer` or computed from it: it is about to be overwritten, and a
    graph built later must read (and compute from) the new values."""
    for node in [node for node, view in list(realized.items()) if view.base is buffer or buffer in node.toposort]:
        del realized[node]
