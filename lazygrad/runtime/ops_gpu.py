"""The GPU device (`GPU=1`): OpenCL C through pyopencl. Runs here on PoCL's CPU driver (pip install
'lazygrad[opencl]'), and on any OpenCL GPU.

The platform and device are chosen deliberately: `CL_PLATFORM` and `CL_DEVICE` (indices, as listed by
`python -m lazygrad.device`) override; otherwise the first device, in platform order, that builds a test kernel
is used (PoCL 3.0 from pip cannot build for CPUs newer than its LLVM 14, such as AMD Zen 5; Debian's PoCL 3.1 can).
Programs are built once: the program binary is cached on disk (keyed by platform, device and driver version), a
loaded program is kept in memory by its binary while a kernel uses it, and each kernel object is fetched once. A
kernel's launch size, (work-groups, work-items per group), comes with its program (codegen/threads.py).
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from typing import Any

import numpy as np

from lazygrad.codegen.renderer import Target
from lazygrad.codegen.renderer.opencl import OpenCLRenderer
from lazygrad.device import Allocator, Compiled, Compiler, DeviceUnavailable, LaunchRefused, LoadedBinaries
from lazygrad.dtype import dtypes
from lazygrad.helpers import CL_DEVICE, CL_PLATFORM, DEBUG

INSTALL_HINT = "pip install 'lazygrad[opencl]'"
BUILT_KEPT = 64  # programs a compiler keeps built for the device to load (see CLCompiler.built)


def device_target(device: Any) -> Target:
    """What codegen needs to know of an OpenCL device. CPU drivers want vectors as wide as their SIMD registers and
    small work-groups (PoCL runs a work-group as loops over its work-items); GPUs (preferred vector width 1) want
    no vectors, work-groups of a few warps, and memory read and written 16 bytes at a time where it can be."""
    # at most 8 floats (256 bits): pip's PoCL 3.0 reports 16 on an AVX-512 CPU its LLVM 14 does not know (Zen 4, 5)
    # but builds for AVX2, and its built-ins on 512-bit vectors (convert_long8, fmod of double8) gave garbage or
    # crashed; a run of a probe kernel to tell could corrupt that driver's state in the process
    vector_width = min(max(device.preferred_vector_width_float, 1), 8)
    max_threads = device.max_work_group_size
    aim = 64 if vector_width > 1 else 256
    block_threads = 1 << (min(max_threads, aim).bit_length() - 1)
    return Target(
        vector_width,
        max_threads=max_threads,
        block_threads=block_threads,
        shared_memory=device.local_mem_size,
        cores=device.max_compute_units,
        wide_bytes=16 if vector_width == 1 else 0,  # (a GPU reads a float4 at once; a CPU driver computes in vectors)
    )


def import_pyopencl():
    """pyopencl, or DeviceUnavailable saying how to install it."""
    try:
        import pyopencl
    except ImportError as error:
        raise DeviceUnavailable(f"GPU: pyopencl is not installed — {INSTALL_HINT}") from error
    return pyopencl


PROBE_SOURCE = "__kernel void probe(__global float* data0) { data0[get_global_id(0)] = 1.0f; }"


def builds_kernels(cl, device) -> str | None:
    """None if `device` builds a tiny kernel, else the reason it does not (e.g. PoCL 3.0's LLVM 14 does not know
    Zen 5 CPUs: "unknown target CPU 'generic'")."""
    try:
        cl.Program(cl.Context([device]), PROBE_SOURCE).build()
        return None
    except cl.Error as error:
        lines = [line for line in str(error).splitlines() if "error" in line.lower()]
        return lines[-1].strip() if lines else str(error).strip()


def choose_device(cl) -> Any:
    """The OpenCL device to use: `CL_PLATFORM`/`CL_DEVICE` (indices) if set, else the first device, in platform
    order, that builds a test kernel."""
    try:
        platforms = cl.get_platforms()
    except cl.Error:  # the ICD loader reports "platform not found" as an error
        platforms = []
    if not platforms:
        raise DeviceUnavailable(
            f"GPU: no OpenCL platform found (no driver is registered in /etc/OpenCL/vendors) — {INSTALL_HINT} for "
            "PoCL on the CPU; for an NVIDIA GPU register its driver: echo libnvidia-opencl.so.1 > "
            "/etc/OpenCL/vendors/nvidia.icd"
        )
    platform_choice, device_choice = CL_PLATFORM.value, CL_DEVICE.value
    if platform_choice >= len(platforms):
        raise DeviceUnavailable(f"GPU: CL_PLATFORM={platform_choice} but there are {len(platforms)} OpenCL platforms")
    candidates = []
    for platform in [platforms[platform_choice]] if platform_choice >= 0 else platforms:
        try:
            devices = platform.get_devices()
        except cl.Error:
            continue
        if device_choice >= len(devices):
            raise DeviceUnavailable(f"GPU: CL_DEVICE={device_choice} but {platform.name} has {len(devices)} devices")
        candidates += [devices[device_choice]] if device_choice >= 0 else devices
    if not candidates:
        raise DeviceUnavailable(f"GPU: no OpenCL device found — {INSTALL_HINT}")
    reasons = []
    for device in candidates:
        reason = builds_kernels(cl, device)
        if reason is None:
            return device
        reasons.append(f"{device.name} ({device.platform.version}): {reason}")
    raise DeviceUnavailable(
        "GPU: no OpenCL device could build a kernel — " + "; ".join(reasons) + ". On CPUs newer than PoCL 3.0's "
        "LLVM 14 knows, install a newer PoCL (e.g. apt-get install pocl-opencl-icd)"
    )


class CLAllocator(Allocator):
    """Device memory as `cl.Buffer`s; copies block until done, so the NumPy array may be reused at once."""

    def __init__(self, cl, context, queue):
        self.cl, self.context, self.queue = cl, context, queue

    def alloc(self, nbytes: int) -> Any:
        return self.cl.Buffer(self.context, self.cl.mem_flags.READ_WRITE, nbytes)

    def free(self, handle: Any) -> None:
        handle.release()

    def copyin(self, handle: Any, array: np.ndarray) -> None:
        self.cl.enqueue_copy(self.queue, handle, array, is_blocking=True)

    def copyout(self, out: np.ndarray, handle: Any) -> None:
        self.cl.enqueue_copy(self.queue, out, handle, is_blocking=True)


class CLCompiler(Compiler):
    """OpenCL C → the device's program binary."""

    def __init__(self, cl, context, device):
        self.cl, self.context, self.device = cl, context, device
        # OpenCL C's float `/` and sqrt may be 2.5 and 3 ulps off unless asked for correct rounding, which every
        # other device gives (a device that cannot do it computes them as it can)
        exact = device.single_fp_config & cl.device_fp_config.CORRECTLY_ROUNDED_DIVIDE_SQRT
        self.options = ["-cl-fp32-correctly-rounded-divide-sqrt"] if exact else []
        identity = f"{device.platform.name} {device.platform.version} {device.name} {device.driver_version}"
        identity += " ".join(["", *self.options])
        self.cache_name = f"opencl-{hashlib.sha256(identity.encode()).hexdigest()[:12]}"
        # programs built here, by their binary's hash, until the device loads them: building a program again from
        # its binary costs as much again on PoCL (it generates the machine code anew)
        self.built: OrderedDict[bytes, Any] = OrderedDict()
        self.lock = threading.Lock()

    def compile(self, source: str) -> bytes:
        program = self.cl.Program(self.context, source)
        try:
            program.build(options=self.options)
        except self.cl.Error as error:
            raise RuntimeError(f"GPU: OpenCL failed to build\n{source}\n{error}") from error
        binary = program.get_info(self.cl.program_info.BINARIES)[0]
        with self.lock:
            self.built[hashlib.sha256(binary).digest()] = program
            if len(self.built) > BUILT_KEPT:  # (compiled and never loaded: a failed launch, a BEAM candidate)
                self.built.popitem(last=False)
        return binary

    def take_built(self, binary: bytes) -> Any | None:
        """The program this compiler built into `binary`, if it is still kept (once: the device holds it now)."""
        with self.lock:
            return self.built.pop(hashlib.sha256(binary).digest(), None)


class CLDevice(Compiled):
    """The OpenCL device: context, in-order queue, and the programs loaded so far (by binary)."""

    def __init__(self):
        cl = import_pyopencl()
        self.cl = cl
        self.device = choose_device(cl)
        self.context = cl.Context([self.device])
        # profiling always on: DEBUG=2 times kernels by their events whenever it is turned on
        profiling = cl.command_queue_properties.PROFILING_ENABLE
        self.queue = cl.CommandQueue(self.context, self.device, properties=profiling)
        # built programs, by binary, while a kernel uses them; pyopencl releases an OpenCL object when its Python
        # object goes (a kernel object holds its program, and OpenCL keeps both while a queued launch needs them)
        self.programs = LoadedBinaries(self.build_binary, lambda program: None)
        allocator = CLAllocator(cl, self.context, self.queue)
        compiler = CLCompiler(cl, self.context, self.device)
        renderer = OpenCLRenderer(device_target(self.device))
        # a kernel's parameters (a pointer per buffer) may take at most CL_DEVICE_MAX_PARAMETER_SIZE bytes
        max_buffers = self.device.max_parameter_size // (self.device.address_bits // 8)
        super().__init__("GPU", allocator, renderer, compiler, self.load_program, max_buffers)
        extensions = self.device.extensions.split()
        if "cl_khr_fp64" not in extensions:
            self.unsupported_dtypes[dtypes.float64] = "the OpenCL device lacks cl_khr_fp64"
        if self.device.profile == "EMBEDDED_PROFILE" and "cles_khr_int64" not in extensions:
            for dtype in (dtypes.int64, dtypes.uint64):
                self.unsupported_dtypes[dtype] = "the OpenCL device's embedded profile lacks cles_khr_int64"

    @property
    def description(self) -> str:
        """The OpenCL device, its kind (a CPU device, such as PoCL's, is no GPU), its platform and driver version."""
        kinds = [
            name.lower()
            for name in ("GPU", "CPU", "ACCELERATOR")
            if self.device.type & getattr(self.cl.device_type, name)
        ]
        kind = ", ".join(kinds) or "other"
        note = " (runs on the CPU: no GPU is in use)" if kinds == ["cpu"] else ""
        platform, driver = self.device.platform.name.strip(), self.device.driver_version
        return f"{self.device.name.strip()}, an OpenCL {kind} device{note}, {platform}, driver {driver}"

    def build_binary(self, binary: bytes) -> Any:
        built = self.compiler.take_built(binary)
        return built if built is not None else self.cl.Program(self.context, [self.device], [binary]).build()

    def load_program(self, name: str, binary: bytes, launch: tuple[int, ...] = (1, 1), work: int = 0) -> CLProgram:
        """The runner for kernel `name` in `binary`; a binary is built into a program once while kernels use it."""
        digest, kernel = self.programs.acquire(binary, lambda program: self.cl.Kernel(program, name))
        return CLProgram(self, kernel, launch, digest)

    def synchronize(self) -> None:
        """Wait until every queued command has finished."""
        self.queue.finish()

    def graph(self, programs: list[CLProgram]) -> CLGraph:
        """A replay of these kernels, in this order, with arguments set once (see `CLGraph`)."""
        return CLGraph(self, programs)


class CLProgram:
    """A kernel object and its launch size, (work-groups, work-items per group). `digest` names its program in
    `device.programs`; `release()` gives both back, and the kernel cannot run after."""

    def __init__(self, device: CLDevice, kernel: Any, launch: tuple[int, int], digest: bytes | None = None):
        self.device, self.kernel, self.digest = device, kernel, digest
        self.name = kernel.function_name
        self.local_size = launch[1]
        self.global_size = launch[0] * launch[1]
        # (the driver's most for this kernel, which its registers may hold below the device's)
        most = kernel.get_work_group_info(device.cl.kernel_work_group_info.WORK_GROUP_SIZE, device.device)
        if self.local_size > most:
            self.release()
            raise LaunchRefused(
                f"GPU: kernel {self.name} cannot run in work-groups of {self.local_size}: this device runs at most "
                f"{most} of its work-items a group"
            )

    @property
    def released(self) -> bool:
        return self.kernel is None

    def release(self) -> None:
        """Done with this kernel: its kernel object goes, and its program once no kernel of it is in use (a graph's
        own kernel objects keep the program alive for the graph). Idempotent."""
        if self.kernel is not None:
            self.kernel = None
            if self.digest is not None:
                self.device.programs.release(self.digest)

    def __call__(self, *buffers: Any, wait: bool = False) -> float | None:
        """Queue one launch; with `wait` (or at DEBUG>=2), wait for it and return its time in seconds from the
        profiling event."""
        if self.kernel is None:
            raise RuntimeError(f"GPU: kernel {self.name} was released and cannot run anymore")
        self.kernel.set_args(*buffers)
        event = self.device.cl.enqueue_nd_range_kernel(
            self.device.queue, self.kernel, (self.global_size,), (self.local_size,)
        )
        if wait or DEBUG >= 2:
            event.wait()
            return (event.profile.end - event.profile.start) * 1e-9
        return None

    def timed(self, *buffers: Any) -> float:
        """Launch once, wait for it, and return the seconds the device took."""
        return self(*buffers, wait=True)


class CLGraph:
    """The kernels of a captured step, replayed with prebuilt arguments: each launch has a kernel object of its own,
    whose arguments are set at the first call and later only where a launch's buffers changed, so a replay is one
    enqueue per kernel."""

    def __init__(self, device: CLDevice, programs: list[CLProgram]):
        self.device, self.programs = device, programs
        self.kernels = [device.cl.Kernel(program.kernel.program, program.kernel.function_name) for program in programs]
        self.sizes = [((program.global_size,), (program.local_size,)) for program in programs]
        self.buffers: list[list[Any]] = [[] for _ in programs]

    def __call__(self, buffers: list[list[Any]]) -> float | None:
        """Queue every kernel on its buffers; at DEBUG>=2 wait, and return the seconds from the first kernel's start
        to the last one's end (profiling events)."""
        for kernel, bound, new in zip(self.kernels, self.buffers, buffers):
            if bound != new:
                kernel.set_args(*new)
                bound[:] = new
        enqueue, queue = self.device.cl.enqueue_nd_range_kernel, self.device.queue
        events = [enqueue(queue, kernel, *sizes) for kernel, sizes in zip(self.kernels, self.sizes)]
        if DEBUG >= 2:
            events[-1].wait()
            return (events[-1].profile.end - events[0].profile.start) * 1e-9
        return None


def open_device() -> Compiled:
    return CLDevice()
