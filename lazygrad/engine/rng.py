"""Random-number state: one seed and one counter per process, advanced under a lock.

Random tensors are a counter-based hash computed inside kernels. Each draw takes the next `count` counter values
and writes where they start, with the seed's key, into a small buffer of its own: a *random source*. Nothing ever
writes that buffer again, so a random tensor is a pure function of its source. Every kernel that computes it gets
the same values, recomputing it later gives them again, and two draws never share counter values, whichever
threads draw them. The same seed gives the same numbers on every device.

A TinyJit replay does not run the Python that drew its random tensors, so it gives each source of the captured step
the next counter values itself (`redraw`): dropout masks differ from step to step.
"""

from __future__ import annotations

import threading

import numpy as np

from lazygrad.dtype import dtypes
from lazygrad.engine.buffers import buffer_of, new_buffer
from lazygrad.uop.ops import Ops, UOp

_lock = threading.Lock()
_seed = 0
_counter = 0


def mix32(value: int) -> int:
    """A 32-bit integer hash (a bijection), the one random kernels apply to counters."""
    value &= 0xFFFFFFFF
    value ^= value >> 16
    value = (value * 0x7FEB352D) & 0xFFFFFFFF
    value ^= value >> 15
    value = (value * 0x846CA68B) & 0xFFFFFFFF
    return value ^ (value >> 16)


def manual_seed(seed: int) -> None:
    """Restart the counter under a new seed."""
    global _seed, _counter
    with _lock:
        _seed, _counter = int(seed), 0


def _draw(count: int) -> np.ndarray:
    """The next `count` counter values, as a source holds them: the low 32 bits of the first, and the key, which
    mixes the seed with the high bits (so the counter may pass 2**32 without repeating itself)."""
    global _counter
    with _lock:
        start, seed = _counter, _seed
        _counter += count
    key = mix32(((seed + (start >> 32)) * 0x9E3779B9 + 0x7F4A7C15) & 0xFFFFFFFF)
    return np.array([start & 0xFFFFFFFF, key], dtype=np.uint32)


def random_source(count: int, device: str) -> UOp:
    """A new random source (a BUFFER of two uint32: first counter value, key) covering `count` values."""
    node = new_buffer(device, 2, dtypes.uint32, random_count=count)
    buffer_of(node).copyin(_draw(count))
    return node


def is_random_source(node: UOp) -> bool:
    """True for the buffer of a random source (its arg carries the count it covers)."""
    return node.op is Ops.BUFFER and len(node.arg) > 3


def redraw(node: UOp) -> None:
    """Give a random source the next counter values (a JIT replay drawing its step's random tensors anew)."""
    buffer_of(node).copyin(_draw(node.arg[3]))
