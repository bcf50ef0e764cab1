"""BEAM search: choose a kernel's register block by compiling and timing the candidates on the device.

With `BEAM=N`, every new kernel that can be register-blocked (a matrix product, a reduce with reused inputs) has up
to N candidate blocks compiled and run on scratch buffers of its sizes; the fastest is used. The choice is kept on
disk by the kernel's content hash and the device, so a later process skips the search.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from typing import Any

from lazygrad.codegen.opt import Blocking, blocking_choices
from lazygrad.device import Buffer, Device
from lazygrad.helpers import BEAM, CACHEDIR, CACHELEVEL, DEBUG
from lazygrad.uop.ops import UOp

TIMED_RUNS = 3  # each candidate's time is its fastest of these runs


def best_blocking(
    device: Any, ast: UOp, lowered: UOp, build: Callable[[Blocking], tuple[Any, list[tuple[str, int, Any]]]]
) -> Blocking | None:
    """The fastest register block for a kernel, or None where there is no choice to make (or BEAM is off).

    `build(blocking)` compiles the kernel with that block and returns its program and, per parameter, the device,
    size and dtype of the buffer it takes."""
    choices = blocking_choices(lowered)[: max(BEAM.value, 0)]
    if len(choices) < 2:
        return None
    path = os.path.join(CACHEDIR, "beam", f"{device.name}-{ast.key.hex()}.json")
    if CACHELEVEL >= 1 and os.path.exists(path):
        with open(path) as file:
            return tuple(json.load(file))
    timings = {choice: _time(*build(choice)) for choice in choices}
    best = min(timings, key=timings.get)
    if DEBUG >= 1:
        print(f"BEAM: {', '.join(f'{c}: {t * 1e3:.3f} ms' for c, t in timings.items())} -> {best}")
    if CACHELEVEL >= 1:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as file:
            json.dump(list(best), file)
    return best


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
