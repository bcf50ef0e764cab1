"""CUDA C → GPU code with NVRTC: a CUBIN for the GPU's own architecture, or PTX; and, for `MOCKCUDA=1`, the same
source as C++ over cuda_shim.h, a shared library that runs on the CPU.

NVRTC is loaded only from an installed place: the `nvidia-cuda-nvrtc` wheel in site-packages, the toolkit in
/usr/local/cuda, or the system library path — never from the working directory (a folder named `nvidia` there would
otherwise shadow the installed package). Its headers (cuda_fp16.h) come from the `nvidia-cuda-runtime` wheel or the
toolkit.
"""

from __future__ import annotations

import ctypes
import functools
import glob
import hashlib
import os
import re
import shutil
import site
import subprocess
import sysconfig
import tempfile

from lazygrad.device import Compiler, DeviceUnavailable

INSTALL_HINT = "pip install 'lazygrad[cuda]'"
TOOLKIT = "/usr/local/cuda"
SHIM_PATH = os.path.join(os.path.dirname(__file__), "cuda_shim.h")
# (no contraction, as NVRTC's --fmad=false: the renderer writes the fused multiply-adds; a frame larger than a page
# touches each of its pages in turn, so a thread that overflows its stack faults on the shim's guard page below it)
SHIM_FLAGS = (
    "-std=c++17",
    "-O2",
    "-march=native",
    "-fwrapv",
    "-ffp-contract=off",
    "-fstack-clash-protection",
    "-shared",
    "-fPIC",
)
SHIM_HEADERS = ("cuda_fp16.h", "cuda_bf16.h", "mma.h")  # what cuda_shim.h stands in for
# MOCKCUDA has no GPU: a CUBIN for a fixed architecture (an A100's, as the mock driver says it is) checks the source,
# and ptxas reports each kernel's registers and shared memory, which the mock's launches check as the driver would
MOCK_TARGET = "sm_80"
# what a mock kernel's library exports beside the kernel: its entry, and (registers, bytes of static shared memory,
# bytes of dynamic shared memory) for the mock driver's launch checks
MOCK_ENTRY = """extern "C" void lazygrad_launch_{name}(void **params, unsigned int grid, unsigned int block) {{
  lazygrad_shim::launch({name}, params, grid, block, {cooperative});
}}
extern "C" const unsigned int lazygrad_resources_{name}[3] = {{{resources}}};
"""


def site_directories() -> list[str]:
    """The installed package directories (site-packages of this interpreter or virtual environment, and the
    user's), without the working directory or PYTHONPATH entries."""
    paths = sysconfig.get_paths()
    candidates = [paths["purelib"], paths["platlib"], *site.getsitepackages()]
    if site.ENABLE_USER_SITE:
        candidates.append(site.getusersitepackages())
    return list(dict.fromkeys(os.path.abspath(path) for path in candidates if os.path.isabs(path)))


def library_candidates() -> list[str]:
    """Where libnvrtc may be, in order: the pip wheels (nvidia/*/lib in site-packages), the toolkit, then the sonames
    the dynamic loader finds on the system library path."""
    directories = [path for root in site_directories() for path in sorted(glob.glob(f"{root}/nvidia/*/lib"))]
    directories.append(f"{TOOLKIT}/lib64")
    paths = [path for directory in directories for path in sorted(glob.glob(f"{directory}/libnvrtc.so*"))]
    return [path for path in paths if ".alt." not in path] + ["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"]


def header_directory() -> str | None:
    """A directory holding cuda_fp16.h: the nvidia-cuda-runtime wheel's or the toolkit's; one that also holds the
    headers of mma.h (crt/mma.h: the nvidia-cuda-crt wheel, or the toolkit) where there is one, for tensor cores."""
    directories = [path for root in site_directories() for path in sorted(glob.glob(f"{root}/nvidia/*/include"))]
    directories.append(f"{TOOLKIT}/include")
    found = [path for path in directories if os.path.exists(f"{path}/cuda_fp16.h")]
    return next((path for path in found if has_matrix_headers(path)), found[0] if found else None)


def has_matrix_headers(directory: str) -> bool:
    """Whether kernels that include mma.h (tensor cores) compile with `directory` on the include path."""
    return os.path.exists(f"{directory}/mma.h") and os.path.exists(f"{directory}/crt/mma.h")


class NVRTC:
    """The NVRTC library through ctypes: CUDA C source → CUBIN or PTX."""

    def __init__(self):
        for candidate in library_candidates():
            try:
                if os.sep in candidate:
                    # libnvrtc opens its builtins by name: load them first, globally, from the same directory
                    for builtins in sorted(
                        glob.glob(os.path.join(os.path.dirname(candidate), "libnvrtc-builtins.so*"))
                    ):
                        if ".alt." not in builtins:
                            ctypes.CDLL(builtins, mode=ctypes.RTLD_GLOBAL)
                self.library, self.path = ctypes.CDLL(candidate), candidate
                break
            except OSError:
                continue
        else:
            raise DeviceUnavailable(
                f"CUDA: NVRTC not found (looked in site-packages' nvidia/*/lib, {TOOLKIT}/lib64 and the system library "
                f"path) — {INSTALL_HINT}, or pip install 'nvidia-cuda-nvrtc==13.0.*'"
            )
        self.include_directory = header_directory()
        if self.include_directory is None:
            raise DeviceUnavailable(
                f"CUDA: cuda_fp16.h not found (looked in site-packages' nvidia/*/include and {TOOLKIT}/include) — "
                f"{INSTALL_HINT}, or pip install 'nvidia-cuda-runtime==13.0.*'"
            )
        self.library.nvrtcGetErrorString.restype = ctypes.c_char_p
        major, minor = ctypes.c_int(), ctypes.c_int()
        self.check(self.library.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)))
        self.version = f"{major.value}.{minor.value}"
        count = ctypes.c_int()
        self.check(self.library.nvrtcGetNumSupportedArchs(ctypes.byref(count)))
        architectures = (ctypes.c_int * count.value)()
        self.check(self.library.nvrtcGetSupportedArchs(architectures))
        self.architectures = sorted(architectures)  # e.g. [75, 80, ..., 120]: compute capability major*10+minor

    def check(self, status: int, what: str = "call") -> None:
        if status != 0:
            raise RuntimeError(f"CUDA: NVRTC {what} failed: {self.library.nvrtcGetErrorString(status).decode()}")

    def compile(self, source: str, target: str) -> bytes:
        """A CUBIN (`target` "sm_90") or PTX (`target` "compute_90") for `source`; a compile error raises with the
        source and NVRTC's log."""
        return self.build(source, target)[0]

    def build(self, source: str, target: str, options: tuple[str, ...] = ()) -> tuple[bytes, str]:
        """`compile` with more NVRTC `options` ("-Xptxas=-v": ptxas reports each kernel's registers), and the log."""
        program = ctypes.c_void_p()
        self.check(
            self.library.nvrtcCreateProgram(ctypes.byref(program), source.encode(), b"kernel.cu", 0, None, None),
            "nvrtcCreateProgram",
        )
        try:
            # --fmad=false: the renderer writes the multiply-adds it fuses (CStyleRenderer.fused_multiply_add)
            options = [
                f"--gpu-architecture={target}",
                f"--include-path={self.include_directory}",
                "--fmad=false",
                *options,
            ]
            option_array = (ctypes.c_char_p * len(options))(*(option.encode() for option in options))
            status = self.library.nvrtcCompileProgram(program, len(options), option_array)
            log = self.read(program, "ProgramLog").decode(errors="replace")
            if status != 0:
                raise RuntimeError(f"CUDA: NVRTC failed to compile\n{source}\n{log}")
            return self.read(program, "CUBIN" if target.startswith("sm_") else "PTX"), log
        finally:
            self.library.nvrtcDestroyProgram(ctypes.byref(program))

    def read(self, program: ctypes.c_void_p, what: str) -> bytes:
        """The program's "PTX", "CUBIN" or "ProgramLog" (text ends at its NUL)."""
        size = ctypes.c_size_t()
        self.check(getattr(self.library, f"nvrtcGet{what}Size")(program, ctypes.byref(size)))
        output = ctypes.create_string_buffer(size.value)
        self.check(getattr(self.library, f"nvrtcGet{what}")(program, output))
        return output.raw if what == "CUBIN" else output.value


@functools.cache
def load_nvrtc() -> NVRTC:
    return NVRTC()


def choose_target(nvrtc: NVRTC, compute_capability: tuple[int, int]) -> str:
    """`sm_XY` (a CUBIN the driver loads as it is) where NVRTC knows the GPU's architecture, else `compute_XY` (PTX the
    driver compiles at load) for the newest architecture NVRTC knows below it."""
    architecture = compute_capability[0] * 10 + compute_capability[1]
    if architecture in nvrtc.architectures:
        return f"sm_{architecture}"
    older = [known for known in nvrtc.architectures if known < architecture]
    if not older:
        raise DeviceUnavailable(
            f"CUDA: NVRTC {nvrtc.version} cannot compile for this GPU (compute capability "
            f"{compute_capability[0]}.{compute_capability[1]}; it knows {nvrtc.architectures}) — install an NVRTC "
            "that supports it"
        )
    return f"compute_{older[-1]}"


class NVRTCCompiler(Compiler):
    """CUDA C → GPU code for one target (`sm_90`: CUBIN, `compute_90`: PTX). The disk cache is keyed by the target
    and NVRTC's version."""

    def __init__(self, target: str):
        self.nvrtc, self.target = load_nvrtc(), target
        self.cache_name = f"cuda-{target}-nvrtc{self.nvrtc.version}"

    def max_buffers(self, driver_version: str | None = None) -> int:
        """The most buffer pointers a kernel may take. CUDA 12.1 raised a kernel's parameter space from 4096 to 32764
        bytes on Volta (compute capability 7.0) and newer, where both NVRTC and the driver are 12.1 or newer; NVRTC
        rejects a kernel over its limit. `driver_version` ("12.4"; None or not a number: not known) lowers the limit
        for an older driver."""
        versions = [self.nvrtc.version] + ([driver_version] if driver_version else [])
        parsed = [tuple(int(part) for part in version.split(".")) for version in versions if _is_version(version)]
        architecture = int(self.target.split("_")[1])
        large = min(parsed) >= (12, 1) and architecture >= 70
        return (32764 if large else 4096) // ctypes.sizeof(ctypes.c_void_p)

    def tensor_core_architecture(self) -> int:
        """The compute capability (major*10 + minor) the code is compiled for, where mma.h's headers are there to
        compile tensor-core code; else 0."""
        return int(self.target.split("_")[1]) if has_matrix_headers(self.nvrtc.include_directory) else 0

    def compile(self, source: str) -> bytes:
        return self.nvrtc.compile(source, self.target)


def _is_version(text: str) -> bool:
    return bool(re.fullmatch(r"\d+(\.\d+)*", text))


class MockCUDACompiler(NVRTCCompiler):
    """CUDA C → CUBIN (checked, then dropped, but for the registers and shared memory ptxas reports) → the same
    source as C++ with cuda_shim.h → a shared library whose `lazygrad_launch_<kernel>(params, grid, block)` runs the
    kernel on the CPU, and whose `lazygrad_resources_<kernel>` holds those two numbers and the bytes of dynamic
    shared memory the kernel uses (which the shim gives it whatever the launch asks for)."""

    def __init__(self):
        super().__init__(MOCK_TARGET)
        self.compiler = shutil.which("g++")
        if self.compiler is None:
            raise DeviceUnavailable("CUDA: MOCKCUDA=1 needs g++ to run kernels on the CPU — apt-get install g++")
        with open(SHIM_PATH, "rb") as file:  # (a library built with another shim or entry is not this one)
            shim_hash = hashlib.sha256(file.read() + str(SHIM_FLAGS).encode() + MOCK_ENTRY.encode()).hexdigest()[:12]
        self.cache_name = f"cuda-mock-{MOCK_TARGET}-nvrtc{self.nvrtc.version}-{shim_hash}"

    def compile(self, source: str) -> bytes:
        _, log = self.nvrtc.build(source, self.target, ("-Xptxas=-v",))
        name = re.search(r"__global__ (?:__launch_bounds__\(\d+\) )?void (\w+)\(", source).group(1)
        registers, shared = kernel_resources(log)
        dynamic = re.search(r"LAZYGRAD_DYNAMIC_SHARED\((\d+)\);", source)  # (the renderer's, see cstyle.py)
        cooperative = any(word in source for word in ("__syncthreads", "__shared__", "__shfl_sync"))
        # the shim replaces the CUDA headers; the kernel itself is compiled unchanged
        body = source
        for header in SHIM_HEADERS:
            body = body.replace(f"#include <{header}>\n", "")
        resources = f"{registers}, {shared}, {dynamic.group(1) if dynamic else 0}"
        launcher = MOCK_ENTRY.format(name=name, cooperative=str(cooperative).lower(), resources=resources)
        with tempfile.TemporaryDirectory() as directory:
            output = os.path.join(directory, "kernel.so")
            command = [self.compiler, *SHIM_FLAGS, "-include", SHIM_PATH, "-x", "c++", "-", "-o", output]
            result = subprocess.run(command, input=body + launcher, capture_output=True, text=True)
            if result.returncode != 0:
                raise RuntimeError(f"CUDA: g++ failed to compile the mock kernel\n{body}{launcher}\n{result.stderr}")
            with open(output, "rb") as file:
                return file.read()


def kernel_resources(log: str) -> tuple[int, int]:
    """(registers a thread, bytes of static shared memory) of the one kernel ptxas compiled, from its -v report."""
    used = re.search(r"Used (\d+) registers([^\n]*)", log)  # ("Used 32 registers, used 1 barriers, 2048 bytes smem")
    if used is None:
        raise RuntimeError(f"CUDA: ptxas reported no register count for the mock kernel\n{log}")
    shared = re.search(r"(\d+) bytes smem", used.group(2))
    return int(used.group(1)), int(shared.group(1)) if shared else 0
