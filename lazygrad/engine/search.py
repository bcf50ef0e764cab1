"""BEAM search: choose a kernel's optimization actions by compiling and timing candidate lists on the device.

With `BEAM=N`, every new kernel with choices to make (a matrix product, a reduce with reused inputs; on a device
with threads, every kernel with outputs to spread) has up to N candidate action lists — the default list with each
register block, or block size, the heuristic offers — compiled and run on scratch buffers of its sizes, and timed
by the device's own events where it has them (a GPU's: CUDA events, OpenCL profiling); the fastest is used. The
choice is kept in the disk cache by the kernel's content hash, the device and the CPU or GPU model it was timed on
(`beam_key`), with the number of candidates timed, so a later process on that machine skips the search, unless it
asks for a wider one (a larger BEAM); a kept list that is not one of the kernel's candidates is ignored, and the
search runs again.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from lazygrad.codegen.heuristic import candidate_opts, heuristic_opts
from lazygrad.codegen.opt import Opt
from lazygrad.device import Buffer, Device, LaunchRefused
from lazygrad.diskcache import disk_cache
from lazygrad.helpers import BEAM, DEBUG
from lazygrad.uop.ops import UOp

TIMED_RUNS = 3  # each candidate's time is its fastest of these runs

Opts = tuple[Opt, ...]
# compiles a kernel with an action list: its program and, per parameter, the device, size and dtype of its buffer
Build = Callable[[Opts], tuple[Any, list[tuple[str, int, Any]]]]


def beam_opts(device: Any, ast: UOp, prepared: UOp, build: Build) -> Opts:
    """The fastest of a kernel's candidate action lists (the heuristic's list where there is no choice to make).

    `build(opts)` compiles the kernel with those actions and returns its program and, per parameter, the device,
    size and dtype of the buffer it takes. A list kept on disk is used only if it is one of the candidates."""
    target = device.renderer.target
    offered = candidate_opts(prepared, target)
    candidates = offered[: max(BEAM.value, 0)]
    if len(candidates) < 2:
        return heuristic_opts(prepared, target)
    key = beam_key(device, ast)
    kept = disk_cache.get("beam", key)
    if kept is not None:
        choice, timed = decode_choice(kept)
        if choice in offered and timed >= len(candidates):
            return choice
        if DEBUG >= 1:
            why = (
                "not one of the kernel's candidates"
                if choice not in offered
                else f"{timed} were timed, not {len(candidates)}"
            )
            print(f"BEAM: ignoring the kept choice {kept.decode(errors='replace')}: {why}")
    timings = {opts: _time_candidate(build, opts) for opts in candidates}
    best = min(timings, key=timings.get)
    if timings[best] == float("inf"):
        raise LaunchRefused(f"BEAM: the device runs none of the {len(candidates)} candidates of kernel {key}")
    if DEBUG >= 1:
        listed = ", ".join(f"[{' '.join(map(str, opts))}]: {seconds * 1e3:.3f} ms" for opts, seconds in timings.items())
        print(f"BEAM: {listed} -> [{' '.join(map(str, best))}]")
    kept = {"opts": [opt.to_json() for opt in best], "timed": len(candidates)}
    disk_cache.put("beam", key, json.dumps(kept).encode())
    return best


def beam_key(device: Any, ast: UOp) -> str:
    """The disk cache's key of a kernel's BEAM choice: per device and per CPU or GPU model, since the compiler's
    identity names the code it generates for (the host CPU and its features, or LAZYGRAD_CPU's; the GPU's
    architecture), so a choice timed on one machine is not taken on another."""
    return f"{device.name} {device.compiler.cache_name} {ast.key.hex()}"


def decode_choice(kept: bytes) -> tuple[Opts | None, int]:
    """A kept choice from its JSON: the action list (a list of [op, axis, amount]; None if it is not one) and how
    many candidates the search that chose it timed (a wider search, a larger BEAM, times again)."""
    try:
        choice = json.loads(kept)
        return tuple(Opt.from_json(value) for value in choice["opts"]), int(choice["timed"])
    except (ValueError, TypeError, KeyError):
        return None, 0


def _time_candidate(build: Build, opts: Opts) -> float:
    """Build a candidate, time it, and give its code back (the chosen list is built again through the program
    cache, as any kernel is). A candidate the device cannot run in blocks of its size (registers) takes forever."""
    try:
        program, parameters = build(opts)
        try:
            return _time(program, parameters)
        finally:
            getattr(program, "release", lambda: None)()
    except LaunchRefused as error:
        if DEBUG >= 1:
            print(f"BEAM: [{' '.join(map(str, opts))}] cannot run: {error}")
        return float("inf")


def _time(program: Any, parameters: list[tuple[str, int, Any]]) -> float:
    """The fastest of a few runs of `program` on scratch memory (values do not matter for the timing): as the device
    times it where it can (a GPU's events: the launch and the wait are not the kernel's), else by the host's clock."""
    buffers = [Buffer(device_name, size, dtype) for device_name, size, dtype in parameters]
    handles = [buffer.handle for buffer in buffers]
    # devices that queue launches (GPU, CUDA) are waited for, so that the time is the kernel's, not the queueing's
    synchronize = getattr(Device[parameters[0][0]], "synchronize", lambda: None)
    program(*handles)  # the first run pays for first touches of the memory
    synchronize()
    if (timed := getattr(program, "timed", None)) is not None:
        return min(timed(*handles) for _ in range(TIMED_RUNS))
    fastest = float("inf")
    for _ in range(TIMED_RUNS):
        start = time.perf_counter()
        program(*handles)
        synchronize()
        fastest = min(fastest, time.perf_counter() - start)
    return fastest
