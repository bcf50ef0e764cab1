"""BEAM search: choose a kernel's register block by compiling and timing the candidates on the device.

With `BEAM=N`, every new kernel that can be register-blocked (a matrix product, a reduce with reused inputs) has up
to N candidate blocks compiled and run on scratch buffers of its sizes; the fastest is used. The choice is kept in the
disk cache by the kernel's content hash and the device, so a later process skips the search; a kept choice that is
not one of the kernel's candidates is ignored, and the search runs again.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from lazygrad.codegen.opt import Blocking, blocking_choices
from lazygrad.device import Buffer, Device
from lazygrad.diskcache import disk_cache
from lazygrad.helpers import BEAM, DEBUG
from lazygrad.uop.ops import UOp

TIMED_RUNS = 3  # each candidate's time is its fastest of these runs


def best_blocking(
    device: Any, ast: UOp, lowered: UOp, build: Callable[[Blocking], tuple[Any, list[tuple[str, int, Any]]]]
) -> Blocking | None:
    """The fastest register block for a kernel, or None where there is no choice to make (or BEAM is off).

    `build(blocking)` compiles the kernel with that block and returns its program and, per parameter, the device,
    size and dtype of the buffer it takes. A choice kept on disk is used only if it is one this kernel offers."""
    offered = blocking_choices(lowered)
    choices = offered[: max(BEAM.value, 0)]
    if len(choices) < 2:
        return None
    key = f"{device.name} {ast.key.hex()}"
    kept = disk_cache.get("beam", key)
    if kept is not None:
        choice = decode_choice(kept)
        if choice in offered:
            return choice
        if DEBUG >= 1:
            print(f"BEAM: ignoring the kept choice {kept.decode(errors='replace')}: not one of {offered}")
    timings = {choice: _time(*build(choice)) for choice in choices}
    best = min(timings, key=timings.get)
    if DEBUG >= 1:
        print(f"BEAM: {', '.join(f'{c}: {t * 1e3:.3f} ms' for c, t in timings.items())} -> {best}")
    disk_cache.put("beam", key, json.dumps(list(best)).encode())
    return best


def decode_choice(kept: bytes) -> Blocking | None:
    """A register block from its JSON (a list of two integers), or None."""
    try:
        value = json.loads(kept)
    except ValueError:
        return None
    if isinstance(value, list) and len(value) == 2 and all(type(number) is int for number in value):
        return tuple(value)
    return None


def _time(program: Any, parameters: list[tuple[str, int, Any]]) -> float:
    """The fastest of a few runs of `program` on scratch memory (values do not matter for the timing)."""
    buffers = [Buffer(device_name, size, dtype) for device_name, size, dtype in parameters]
    handles = [buffer.handle for buffer in buffers]
    # devices that queue launches (GPU, CUDA) are waited for, so that the time is the kernel's, not the queueing's
    synchronize = getattr(Device[parameters[0][0]], "synchronize", lambda: None)
    program(*handles)  # the first run pays for first touches of the memory
    synchronize()
    fastest = float("inf")
    for _ in range(TIMED_RUNS):
        start = time.perf_counter()
        program(*handles)
        synchronize()
        fastest = min(fastest, time.perf_counter() - start)
    return fastest
