"""Small utilities and every environment variable lazygrad reads, with its default and meaning."""

from __future__ import annotations

import contextlib
import functools
import math
import os
from typing import Iterable


class _Auto:
    """A member's place in a `Kinds` class body (its value is its number, from 1, in the order written)."""


def auto() -> _Auto:
    return _Auto()


class _KindsType(type):
    """Makes each `auto()` attribute of a `Kinds` class body an instance of the class (see `Kinds`)."""

    def __new__(mcs, name: str, bases: tuple, namespace: dict):
        names = [key for key, value in namespace.items() if isinstance(value, _Auto)]
        cls = super().__new__(mcs, name, bases, {key: value for key, value in namespace.items() if key not in names})
        cls.__members__ = {}
        for number, member_name in enumerate(names, start=1):
            member = object.__new__(cls)
            member.name, member.value = member_name, number
            cls.__members__[member_name] = member
            type.__setattr__(cls, member_name, member)
        return cls

    def __iter__(cls):
        return iter(cls.__members__.values())

    def __len__(cls) -> int:
        return len(cls.__members__)

    def __getitem__(cls, name: str):
        return cls.__members__[name]


class Kinds(metaclass=_KindsType):
    """A fixed set of named members, as an Enum of `auto()` values: `Ops.ADD`, `.name`, `.value`, `Ops["ADD"]`,
    iteration, identity for equality and hashing, the same str and repr. Not `enum.Enum`, because on Python 3.11 its
    metaclass defines `__getattr__`, which sends every attribute lookup on the class through a Python hook: `Ops.ADD`
    took 0.2 µs instead of 0.04, and the compiler reads such members millions of times."""

    __slots__ = ("name", "value")
    __members__: dict[str, Kinds]

    def __init__(self, *_):
        raise TypeError(f"{type(self).__name__}: members are fixed; use {type(self).__name__}[name]")

    def __repr__(self) -> str:
        return f"<{type(self).__name__}.{self.name}: {self.value}>"

    def __str__(self) -> str:
        return f"{type(self).__name__}.{self.name}"

    def __reduce__(self):
        return getattr, (type(self), self.name)

    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self


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


class _Counters:
    """Totals since the last `reset()`: kernels run, floating ops and bytes moved, kernel time, compiles, kernels
    generated (lowered, optimized, linearized and rendered: their count, and the total and slowest of the generating
    thread's CPU time, and of its wall time, which also grows with the cores the compile threads take); and the bytes of
    device memory live buffers hold, now (`memory_used`, never reset) and at most since (`memory_peak`).
    (One instance with slots: every launch adds to these, and a slot is quicker to write than a class attribute.)"""

    __slots__ = (
        "kernel_count",
        "global_ops",
        "global_mem",
        "time_sum_s",
        "compile_count",
        "compile_cache_hits",
        "generate_count",
        "generate_time_s",
        "generate_max_s",
        "generate_wall_s",
        "generate_wall_max_s",
        "memory_used",
        "memory_peak",
    )

    def __init__(self):
        self.memory_used = 0
        self.reset()

    def reset(self) -> None:
        self.kernel_count = self.global_ops = self.global_mem = 0
        self.time_sum_s = 0.0
        self.compile_count = self.compile_cache_hits = self.generate_count = 0
        self.generate_time_s = self.generate_max_s = self.generate_wall_s = self.generate_wall_max_s = 0.0
        self.memory_peak = self.memory_used


GlobalCounters = _Counters()


def prod(values: Iterable[int]) -> int:
    """The product of integers (1 for none)."""
    return math.prod(values)


def all_same(items: list) -> bool:
    return all(item == items[0] for item in items)


def flatten(nested: Iterable[Iterable]) -> list:
    return [item for inner in nested for item in inner]


def argsort(values: list) -> list[int]:
    return sorted(range(len(values)), key=values.__getitem__)
