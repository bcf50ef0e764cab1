"""The CPU device (`CPU=1` or `CLANG=1`): C source compiled by the system compiler into a shared library, loaded
with ctypes and called with the buffers' addresses."""

from __future__ import annotations

import _ctypes
import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile

from lazygrad.codegen.renderer.cstyle import CStyleRenderer
from lazygrad.device import Compiler, DeviceUnavailable, HostAllocator, HostDevice, HostProgram, LoadedBinaries
from lazygrad.runtime.host_cpu import host_cpu

# No -ffast-math: it makes isnan(NaN) false. -fwrapv: signed integers wrap around, as on every other device.
C_FLAGS = (
    "-O3",
    # the CPU: this machine's, or the one LAZYGRAD_CPU names
    f"-march={'native' if host_cpu().native else host_cpu().name}",
    "-fno-math-errno",
    "-fno-trapping-math",
    "-ffp-contract=fast",  # (only accumulator updates are left to it: see CStyleRenderer.fused_multiply_add)
    "-fopenmp-simd",  # (only `#pragma omp simd`: reduce loops whose accumulators may be reassociated)
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
    """A short hash of the compiler's version and the target it generates code for (-march)."""
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True).stdout
    target = subprocess.run(
        [compiler, C_FLAGS[1], "-dM", "-E", "-x", "c", "-"], input="", capture_output=True, text=True
    ).stdout
    return hashlib.sha256(f"{version}\n{target}\n{C_FLAGS}".encode()).hexdigest()[:12]


def load_shared_library(binary: bytes) -> ctypes.CDLL:
    """Load a shared library from its bytes: written to a new file in a new private directory (so no other user
    can change what is loaded between writing and loading), loaded, and removed."""
    with tempfile.TemporaryDirectory(prefix="lazygrad-") as directory:
        path = os.path.join(directory, "kernel.so")
        with open(path, "xb") as file:
            file.write(binary)
        return ctypes.CDLL(path)


def unload_shared_library(library: ctypes.CDLL) -> None:
    """Unmap a library loaded by `load_shared_library` (its file is already gone). ctypes has no public call for it;
    its C module's dlclose takes the handle."""
    _ctypes.dlclose(library._handle)


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


class CProgram(HostProgram):
    """A compiled kernel: a function in a loaded shared library, run as a HostProgram."""

    binaries = LoadedBinaries(load_shared_library, unload_shared_library)

    def address_of(self, library: ctypes.CDLL, name: str) -> int:
        return ctypes.cast(getattr(library, name), ctypes.c_void_p).value


def open_device() -> HostDevice:
    return HostDevice("CPU", HostAllocator(), CStyleRenderer(host_cpu().target), CCompiler(), CProgram)
