"""Small utilities and every environment variable lazygrad reads, with its default and meaning."""

from __future__ import annotations

import contextlib
import functools
import math
import os
from typing import Iterable


@functools.cache
def getenv(key: str, default=0, meaning: str = ""):
    """An environment variable converted to the type of `default` (an empty one is the same as an unset one); a value
    that does not convert is an error naming the variable, what it accepts and, where given, what it means."""
    value = os.getenv(key, "")
    if value == "":
        return default
    try:
        return type(default)(value)
    except ValueError:
        accepted = {int: "an integer", float: "a number"}.get(type(default), type(default).__name__)
        explained = f" — {meaning} —" if meaning else ""
        raise ValueError(
            f"environment variable {key}={value!r} is not {accepted}: {key} takes {accepted}{explained} or is left unset "
            f"for the default, {default}"
        ) from None


class ContextVar:
    """A setting read once from the environment and changeable at run time with `Context`."""

    registry: dict[str, ContextVar] = {}

    def __init__(self, key: str, default: int, meaning: str):
        self.key, self.value, self.meaning = key, getenv(key, default, meaning), meaning
        ContextVar.registry[key] = self

    def __bool__(self) -> bool:
        return bool(self.value)

    def __ge__(self, other: int) -> bool:
        return self.value >= other

    def __gt__(self, other: int) -> bool:
        return self.value > other

    def __le__(self, other: int) -> bool:
        return self.value <= other

    def __lt__(self, other: int) -> bool:
        return self.value < other


# Every environment variable, in one place.
DEBUG = ContextVar("DEBUG", 0, "1: schedule summary, 2: a line per kernel, 4: source, 5: kernel AST, 6: linear program")
NOOPT = ContextVar("NOOPT", 0, "1 turns kernel optimizations (loop merging, unrolling) off")
CACHELEVEL = ContextVar("CACHELEVEL", 1, "0 turns the disk cache (compiled kernels, BEAM choices) off")
BEAM = ContextVar(
    "BEAM", 0, "N > 0 times up to N register blocks per new kernel and keeps the fastest (cached on disk)"
)
ALLOW_TF32 = ContextVar(
    "ALLOW_TF32",
    0,
    "1 lets float32 matrix products run on tensor cores in TF32 (inputs rounded to 10 mantissa bits), as PyTorch's "
    "allow_tf32; also `with Tensor.allow_tf32():`",
)
JIT = ContextVar("JIT", 1, "0 makes TinyJit run the function every call instead of replaying its kernels")
MOCKCUDA = ContextVar("MOCKCUDA", 0, "1 runs CUDA=1 without a driver: NVRTC compiles every kernel, the CPU runs it")
CL_PLATFORM = ContextVar("CL_PLATFORM", -1, "index of the OpenCL platform GPU=1 uses (-1: the first that works)")
CL_DEVICE = ContextVar("CL_DEVICE", -1, "index of the OpenCL device in that platform (-1: the first that works)")
PROGRAM_CACHE = ContextVar(
    "PROGRAM_CACHE", 1000, "N >= 1 compiled kernels kept in memory; beyond that the least recently used are freed"
)
if PROGRAM_CACHE.value < 1:
    raise ValueError(
        f"environment variable PROGRAM_CACHE={PROGRAM_CACHE.value} is out of range: PROGRAM_CACHE takes an integer >= 1 "
        "— how many compiled kernels stay in memory — or is left unset for the default, 1000"
    )
# The disk cache's directory (see diskcache.py): compiled kernels and BEAM choices. Empty is the same as unset; a
# relative path is taken from the directory lazygrad was started in.
CACHEDIR = os.path.abspath(os.path.expanduser(getenv("LAZYGRAD_CACHE", "~/.cache/lazygrad")))
# set by mpirun in each process it starts (Open MPI; MPICH and Intel MPI set PMI_SIZE): the job's number of ranks, or 0
MPI_WORLD_SIZE = int(os.getenv("OMPI_COMM_WORLD_SIZE") or os.getenv("PMI_SIZE") or 0)
# Device selection variables: exactly one of these may be set (read in device.py through `device_env_vars`).
DEVICE_ENV_VARS = {"LLVM": "LLVM", "GPU": "GPU", "CUDA": "CUDA", "CPU": "CPU", "CLANG": "CPU", "PYTHON": "PYTHON"}


def device_env_vars() -> list[str]:
    """The device variables set to a true value in the environment."""
    return [name for name in DEVICE_ENV_VARS if getenv(name, 0, f"1 selects the {DEVICE_ENV_VARS[name]} device")]


@contextlib.contextmanager
def Context(**settings: int):
    """Temporarily change settings: `with Context(DEBUG=2): ...`."""
    old = {key: ContextVar.registry[key].value for key in settings}
    try:
        for key, value in settings.items():
            ContextVar.registry[key].value = value
        yield
    finally:
        for key, value in old.items():
            ContextVar.registry[key].value = value


class GlobalCounters:
    """Totals since the last `reset()`: kernels run, floating ops and bytes moved, kernel time, compiles; and the
    bytes of device memory live buffers hold, now (`memory_used`, never reset) and at most since (`memory_peak`)."""

    kernel_count = 0
    global_ops = 0
    global_mem = 0
    time_sum_s = 0.0
    compile_count = 0
    compile_cache_hits = 0
    memory_used = 0
    memory_peak = 0

    @staticmethod
    def reset() -> None:
        GlobalCounters.kernel_count = GlobalCounters.global_ops = GlobalCounters.global_mem = 0
        GlobalCounters.time_sum_s = 0.0
        GlobalCounters.compile_count = GlobalCounters.compile_cache_hits = 0
        GlobalCounters.memory_peak = GlobalCounters.memory_used


def prod(values: Iterable[int]) -> int:
    """The product of integers (1 for none)."""
    return math.prod(values)


def all_same(items: list) -> bool:
    return all(item == items[0] for item in items)


def flatten(nested: Iterable[Iterable]) -> list:
    return [item for inner in nested for item in inner]


def argsort(values: list) -> list[int]:
    return sorted(range(len(values)), key=values.__getitem__)
