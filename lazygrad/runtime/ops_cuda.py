"""The CUDA device (`CUDA=1`): CUDA C compiled to PTX by NVRTC, run by pycuda where a driver exists.

Without a driver, `MOCKCUDA=1` still checks the CUDA renderer end to end: every kernel is compiled to PTX by NVRTC
(a compile error fails loudly with the source and log), then the same source is compiled as C++ with
`cuda_shim.h` (g++ -fopenmp) and run on the CPU, one OpenMP thread per CUDA thread of a block. Buffers then live
in host memory. A kernel that synchronizes (a group reduction) runs its block as a team of OpenMP threads. Each
kernel costs about 0.2 s to compile (NVRTC, then g++); the binaries are cached on disk like every other device's.

NVRTC comes from the pip wheels `nvidia-cuda-nvrtc` and `nvidia-cuda-runtime` (for cuda_fp16.h), or from a CUDA
toolkit in /usr/local/cuda; pycuda is imported only when a real GPU is used.
"""

from __future__ import annotations

import ctypes
import glob
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from typing import Any

import numpy as np

from lazygrad.codegen.renderer.cstyle import CUDARenderer
from lazygrad.device import Allocator, Compiled, Compiler, DeviceUnavailable, HostAllocator
from lazygrad.helpers import MOCKCUDA
from lazygrad.runtime.ops_cpu import load_shared_library

INSTALL_HINT = "pip install 'lazygrad[cuda]'"
NVRTC_WHEELS = "'nvidia-cuda-nvrtc==13.0.*' 'nvidia-cuda-runtime==13.0.*'"
SHIM_PATH = os.path.join(os.path.dirname(__file__), "cuda_shim.h")
THREADS_PER_BLOCK = 256
RENDERER = CUDARenderer()
SHIM_FLAGS = ("-std=c++17", "-O2", "-march=native", "-fwrapv", "-fopenmp", "-shared", "-fPIC")


def nvrtc_directories() -> list[tuple[str, str]]:
    """(library directory, include directory) pairs where NVRTC may be: the pip wheels, then the toolkit."""
    pairs = []
    try:
        import nvidia

        for root in nvidia.__path__:
            for library in sorted(glob.glob(os.path.join(root, "*", "lib"))):
                pairs.append((library, os.path.join(os.path.dirname(library), "include")))
    except ImportError:
        pass
    return pairs + [("/usr/local/cuda/lib64", "/usr/local/cuda/include")]


class NVRTC:
    """The NVRTC library through ctypes: CUDA C source → PTX."""

    def __init__(self):
        for library_directory, include_directory in nvrtc_directories():
            libraries = glob.glob(os.path.join(library_directory, "libnvrtc.so*"))
            builtins = glob.glob(os.path.join(library_directory, "libnvrtc-builtins.so*"))
            if libraries:
                # libnvrtc loads its builtins by name: load them first, globally, from the same directory
                for path in sorted(path for path in builtins if ".alt." not in path):
                    ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
                self.library = ctypes.CDLL(sorted(path for path in libraries if ".alt." not in path)[0])
                self.include_directory = include_directory
                break
        else:
            raise DeviceUnavailable(f"CUDA: NVRTC not found — pip install {NVRTC_WHEELS} (or {INSTALL_HINT})")
        self.library.nvrtcGetErrorString.restype = ctypes.c_char_p
        major, minor = ctypes.c_int(), ctypes.c_int()
        self.check(self.library.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)))
        self.version = f"{major.value}.{minor.value}"

    def check(self, status: int, what: str = "call") -> None:
        if status != 0:
            raise RuntimeError(f"CUDA: NVRTC {what} failed: {self.library.nvrtcGetErrorString(status).decode()}")

    def compile(self, source: str, architecture: str) -> bytes:
        """PTX for `source`; a compile error raises with the source and NVRTC's log."""
        program = ctypes.c_void_p()
        self.check(
            self.library.nvrtcCreateProgram(ctypes.byref(program), source.encode(), b"kernel.cu", 0, None, None),
            "nvrtcCreateProgram",
        )
        try:
            options = [f"--gpu-architecture={architecture}", f"--include-path={self.include_directory}"]
            option_array = (ctypes.c_char_p * len(options))(*(option.encode() for option in options))
            status = self.library.nvrtcCompileProgram(program, len(options), option_array)
            if status != 0:
                raise RuntimeError(f"CUDA: NVRTC failed to compile\n{source}\n{self.read(program, 'ProgramLog')}")
            return self.read(program, "PTX").encode()
        finally:
            self.library.nvrtcDestroyProgram(ctypes.byref(program))

    def read(self, program: ctypes.c_void_p, what: str) -> str:
        """The program's "PTX" or "ProgramLog" as text."""
        size = ctypes.c_size_t()
        self.check(getattr(self.library, f"nvrtcGet{what}Size")(program, ctypes.byref(size)))
        text = ctypes.create_string_buffer(size.value)
        self.check(getattr(self.library, f"nvrtcGet{what}")(program, text))
        return text.value.decode(errors="replace")


class PTXCompiler(Compiler):
    """CUDA C → PTX for one GPU architecture."""

    def __init__(self, architecture: str):
        self.nvrtc, self.architecture = NVRTC(), architecture
        self.cache_name = f"cuda-ptx-{architecture}-nvrtc{self.nvrtc.version}"

    def compile(self, source: str) -> bytes:
        return self.nvrtc.compile(source, self.architecture)


class MockCUDACompiler(PTXCompiler):
    """CUDA C → PTX (checked, then dropped) → the same source as C++ with cuda_shim.h → a shared library."""

    def __init__(self):
        super().__init__("compute_80")
        self.compiler = shutil.which("g++")
        if self.compiler is None:
            raise DeviceUnavailable("CUDA: MOCKCUDA=1 needs g++ to run kernels on the CPU — apt-get install g++")
        with open(SHIM_PATH, "rb") as file:
            shim_hash = hashlib.sha256(file.read() + str(SHIM_FLAGS).encode()).hexdigest()[:12]
        self.cache_name = f"cuda-mock-nvrtc{self.nvrtc.version}-{shim_hash}"

    def compile(self, source: str) -> bytes:
        super().compile(source)
        name = re.search(r"__global__ void (\w+)\(", source).group(1)
        cooperative = "__syncthreads" in source or "__shared__" in source
        # the shim replaces cuda_fp16.h; the kernel itself is compiled unchanged
        body = source.replace("#include <cuda_fp16.h>\n", "")
        launcher = (
            'extern "C" void lazygrad_launch(void **arguments, unsigned int grid, unsigned int block) {\n'
            f"  lazygrad_shim::launch({name}, arguments, grid, block, {str(cooperative).lower()});\n"
            "}\n"
        )
        with tempfile.TemporaryDirectory() as directory:
            output = os.path.join(directory, "kernel.so")
            command = [self.compiler, *SHIM_FLAGS, "-include", SHIM_PATH, "-x", "c++", "-", "-o", output]
            result = subprocess.run(command, input=body + launcher, capture_output=True, text=True)
            if result.returncode != 0:
                raise RuntimeError(f"CUDA: g++ failed to compile the mock kernel\n{body}{launcher}\n{result.stderr}")
            with open(output, "rb") as file:
                return file.read()


def launch_size(global_loops: tuple[int, ...]) -> tuple[int, int]:
    """(blocks, threads per block) for the threads the renderer's kernel expects (see `CUDARenderer.launch_size`)."""
    threads, block = RENDERER.launch_size(global_loops)
    block = block or min(THREADS_PER_BLOCK, threads)
    return -(-threads // block), block


class MockCUDAProgram:
    """A kernel compiled for the CPU through the shim, launched over host buffers."""

    def __init__(self, name: str, binary: bytes, global_loops: tuple[int, ...] = (), work: int = 0):
        self.library = load_shared_library(binary)
        self.grid, self.block = launch_size(global_loops)

    def __call__(self, *buffers: np.ndarray) -> None:
        arguments = (ctypes.c_void_p * len(buffers))(*(buffer.ctypes.data for buffer in buffers))
        self.library.lazygrad_launch(arguments, ctypes.c_uint(self.grid), ctypes.c_uint(self.block))


class CUDAAllocator(Allocator):
    """GPU memory through pycuda."""

    def __init__(self, driver):
        self.driver = driver

    def alloc(self, nbytes: int) -> Any:
        return self.driver.mem_alloc(nbytes)

    def free(self, handle: Any) -> None:
        handle.free()

    def copyin(self, handle: Any, array: np.ndarray) -> None:
        self.driver.memcpy_htod(handle, array)

    def copyout(self, out: np.ndarray, handle: Any) -> None:
        self.driver.memcpy_dtoh(out, handle)

    def staging_memory(self, nbytes: int) -> np.ndarray:
        return self.driver.pagelocked_empty(nbytes, np.uint8)

    def gpu_address(self, handle: Any) -> int:
        return int(handle)


class CUDAProgram:
    """A PTX kernel loaded by the driver, launched over GPU buffers."""

    def __init__(self, name: str, binary: bytes, global_loops: tuple[int, ...] = (), work: int = 0):
        import pycuda.driver

        self.module = pycuda.driver.module_from_buffer(binary)
        self.function = self.module.get_function(name)
        self.grid, self.block = launch_size(global_loops)

    def __call__(self, *buffers: Any) -> None:
        self.function(*buffers, block=(self.block, 1, 1), grid=(self.grid, 1))


class CUDADevice(Compiled):
    """A real GPU through pycuda (its first device)."""

    def __init__(self):
        try:
            import pycuda.autoinit  # noqa: F401  (creates the context)
            import pycuda.driver
        except ImportError as error:
            raise DeviceUnavailable(f"CUDA: pycuda is not installed — {INSTALL_HINT}") from error
        self.driver = pycuda.driver
        major, minor = pycuda.autoinit.device.compute_capability()
        compiler = PTXCompiler(f"compute_{major}{minor}")
        super().__init__("CUDA", CUDAAllocator(self.driver), RENDERER, compiler, CUDAProgram)

    def synchronize(self) -> None:
        """Wait until every launched kernel has finished."""
        self.driver.Context.synchronize()


def has_driver() -> bool:
    try:
        ctypes.CDLL("libcuda.so.1")
        return True
    except OSError:
        return False


def open_device() -> Compiled:
    if MOCKCUDA:
        return Compiled("CUDA", HostAllocator(), RENDERER, MockCUDACompiler(), MockCUDAProgram)
    if not has_driver():
        raise DeviceUnavailable("CUDA: no CUDA driver — set MOCKCUDA=1 to run on the CPU, or install a driver")
    return CUDADevice()
