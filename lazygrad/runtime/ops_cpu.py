"""The CPU device (`CPU=1` or `CLANG=1`): C source compiled by the system compiler into a shared library, loaded
with ctypes and called with the buffers' addresses."""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from lazygrad.codegen.renderer.cstyle import CStyleRenderer
from lazygrad.device import Compiled, Compiler, DeviceUnavailable, HostAllocator

# No -ffast-math: it makes isnan(NaN) false. -fwrapv: signed integers wrap around, as on every other device.
C_FLAGS = (
    "-O3",
    "-march=native",
    "-fno-math-errno",
    "-fno-trapping-math",
    "-ffp-contract=fast",
    "-fwrapv",
    "-shared",
    "-fPIC",
)


def find_compiler() -> str:
    """The path of the system C compiler `cc`, or DeviceUnavailable."""
    compiler = shutil.which("cc")
    if compiler is None:
        raise DeviceUnavailable("CPU: no C compiler found — install gcc or clang (e.g. apt-get install gcc)")
    return compiler


def compiler_identity(compiler: str) -> str:
    """A short hash of the compiler's version and the target it generates code for (-march=native)."""
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True).stdout
    target = subprocess.run(
        [compiler, "-march=native", "-dM", "-E", "-x", "c", "-"], input="", capture_output=True, text=True
    ).stdout
    return hashlib.sha256(f"{version}\n{target}\n{C_FLAGS}".encode()).hexdigest()[:12]


def load_shared_library(binary: bytes) -> ctypes.CDLL:
    """Load a shared library from its bytes (written to a temporary file that is removed once loaded)."""
    with tempfile.NamedTemporaryFile(suffix=".so", delete=False) as file:
        file.write(binary)
    try:
        return ctypes.CDLL(file.name)
    finally:
        os.unlink(file.name)


class CCompiler(Compiler):
    """C source → a shared library (its bytes), built by `cc`."""

    def __init__(self):
        self.compiler = find_compiler()
        self.cache_name = f"cpu-{compiler_identity(self.compiler)}"

    def compile(self, source: str) -> bytes:
        with tempfile.TemporaryDirectory() as directory:
            output = os.path.join(directory, "kernel.so")
            result = subprocess.run(
                [self.compiler, *C_FLAGS, "-x", "c", "-", "-o", output, "-lm"],
                input=source,
                capture_output=True,
                text=True,
            )
            if result.returncode != 0:
                raise RuntimeError(f"CPU: cc failed to compile\n{source}\n{result.stderr}")
            with open(output, "rb") as file:
                return file.read()


class CProgram:
    """A compiled kernel: a function in a loaded shared library, called with the buffers' addresses and the range
    of its outermost loop to run. Kernels with enough work split that loop across the cores (ctypes releases the
    GIL during each call)."""

    # below this many loop iterations in all, a thread costs more than it saves
    PARALLEL_WORK = 1 << 17

    def __init__(self, name: str, binary: bytes, global_loops: tuple[int, ...] = (), work: int = 0):
        self.library = load_shared_library(binary)
        self.function = getattr(self.library, name)
        self.function.restype = None
        self.outer = global_loops[0] if global_loops else 1
        self.chunks = min(CORES, self.outer) if work >= self.PARALLEL_WORK else 1

    def __call__(self, *buffers: np.ndarray) -> None:
        pointers = [ctypes.c_void_p(buffer.ctypes.data) for buffer in buffers]
        bounds = [ctypes.c_int64(self.outer * part // self.chunks) for part in range(self.chunks + 1)]
        others = [thread_pool().submit(self.function, *pointers, *bounds[i : i + 2]) for i in range(1, self.chunks)]
        self.function(*pointers, *bounds[0:2])
        for other in others:
            other.result()


CORES = os.cpu_count() or 1


@functools.cache
def thread_pool() -> ThreadPoolExecutor:
    """The threads that run the other parts of a split kernel."""
    return ThreadPoolExecutor(max_workers=CORES, thread_name_prefix="lazygrad-cpu")


def open_device() -> Compiled:
    return Compiled("CPU", HostAllocator(), CStyleRenderer(), CCompiler(), CProgram)
