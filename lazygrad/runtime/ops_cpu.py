"""The CPU device (`CPU=1` or `CLANG=1`): C source compiled by the system compiler into a shared library, loaded
with ctypes and called with the buffers' addresses."""

from __future__ import annotations

import _ctypes
import ctypes
import glob
import hashlib
import os
import re
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
# gcc miscompiles some loops it vectorizes after if-converting their selects (`c ? a : b`) into masked vector code,
# and gcc 12 (Debian 12's) has both of these bugs, seen on AVX-512 CPUs (where/flip/cast kernels gave wrong values):
# - loads made conditional (.MASK_LOAD) that SLP reads as a group in another order than memory's (a flip) are read in
#   memory's order: the permutation is dropped (GCC PR tree-optimization/114375, fixed in GCC 14);
# - a masked select between doubles, one converted from a float in the low lane, is folded into a masked vcvtss2sd
#   (or vcvtsd2ss), whose mask covers only the low lane: the high lane comes from its other operand, whatever the mask
#   says (AVX-512VL).
# No flag turns off just these (-fno-wrapv, -mno-avx512vl, -ftrapping-math or -fno-thread-jumps leaves some kernels
# wrong, and the last makes softmax's exp scalar). Without if-conversion (IF_CONVERSION_OFF) gcc makes neither, but it
# leaves every loop with a select scalar (relu, where, the clamps of exp, padding), so only a kernel whose code holds
# one of the two constructs (`miscompiled`; none of a ResNet18, transformer or MLP step's kernels does) is compiled
# again without it.
IF_CONVERSION_OFF = ("-fno-tree-loop-if-convert",)
# (gcc only) a kernel's optimized GIMPLE and the assembler's listing, in gcc's working directory, for `miscompiled`
INSPECT_FLAGS = ("-fdump-tree-optimized=kernel.gimple", "-Wa,-al=kernel.lst")
MISCOMPILED_CONSTRUCTS = {
    "*.gimple": re.compile(r"\.MASK_LOAD\b"),
    "*.lst": re.compile(r"\bvcvts[sd]2s[sd]\s[^\n]*\{%k[1-7]\}"),
}


def find_compiler() -> str:
    """The path of the system C compiler `cc`, or DeviceUnavailable."""
    compiler = shutil.which("cc")
    if compiler is None:
        raise DeviceUnavailable("CPU: no C compiler found — install gcc or clang (e.g. apt-get install gcc)")
    return compiler


def predefined_macros(compiler: str) -> str:
    """The macros the compiler predefines for the target it generates code for (-march), one `#define` a line."""
    return subprocess.run(
        [compiler, C_FLAGS[1], "-dM", "-E", "-x", "c", "-"], input="", capture_output=True, text=True
    ).stdout


def is_gcc(macros: str) -> bool:
    """Whether the compiler that predefines `macros` is gcc (clang defines __GNUC__ too)."""
    return "#define __GNUC__ " in macros and "#define __clang__ " not in macros


def compiler_identity(compiler: str, macros: str) -> str:
    """A short hash of the compiler's version, the target it generates code for (its predefined `macros`) and how it
    is called (a kernel some earlier version of this module compiled wrong is not taken from the disk cache)."""
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True).stdout
    settings = (C_FLAGS, IF_CONVERSION_OFF, [pattern.pattern for pattern in MISCOMPILED_CONSTRUCTS.values()])
    return hashlib.sha256(f"{version}\n{macros}\n{settings}".encode()).hexdigest()[:12]


def miscompiled(directory: str) -> bool:
    """Whether gcc's code for a kernel, as INSPECT_FLAGS left it in `directory`, holds a construct gcc 12 miscompiles:
    a masked load, or a masked scalar conversion (see IF_CONVERSION_OFF)."""
    for files, construct in MISCOMPILED_CONSTRUCTS.items():
        for name in glob.glob(os.path.join(directory, files)):
            with open(name) as file:
                if construct.search(file.read()):
                    return True
    return False


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
        macros = predefined_macros(self.compiler)
        self.cache_name = f"cpu-{compiler_identity(self.compiler, macros)}"
        self.gcc = is_gcc(macros)

    def compile(self, source: str) -> bytes:
        with tempfile.TemporaryDirectory() as directory:
            self.run(source, directory, (*C_FLAGS, *(INSPECT_FLAGS if self.gcc else ())))
            if self.gcc and miscompiled(directory):
                self.run(source, directory, (*C_FLAGS, *IF_CONVERSION_OFF))
            with open(os.path.join(directory, "kernel.so"), "rb") as file:
                return file.read()

    def run(self, source: str, directory: str, flags: tuple[str, ...]) -> None:
        """Compile `source` into the shared library kernel.so in `directory`, also gcc's working directory."""
        result = subprocess.run(
            [self.compiler, *flags, "-x", "c", "-", "-o", "kernel.so", "-lm"],
            input=source,
            capture_output=True,
            text=True,
            cwd=directory,
        )
        if result.returncode != 0:
            raise RuntimeError(f"CPU: cc failed to compile\n{source}\n{result.stderr}")


class CProgram(HostProgram):
    """A compiled kernel: a function in a loaded shared library, run as a HostProgram."""

    binaries = LoadedBinaries(load_shared_library, unload_shared_library)

    def address_of(self, library: ctypes.CDLL, name: str) -> int:
        return ctypes.cast(getattr(library, name), ctypes.c_void_p).value


def open_device() -> HostDevice:
    return HostDevice("CPU", HostAllocator(), CStyleRenderer(host_cpu().target), CCompiler(), CProgram)
