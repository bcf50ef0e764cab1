"""The CPU the host devices (LLVM, CPU) generate code for, read once: the host's own, or the one `LAZYGRAD_CPU`
names (an LLVM/GCC CPU name such as `haswell`, `znver3` or `skylake-avx512`), so the code and the optimization
choices of another x86-64 machine can be built, tested and timed here. The kernel optimizer reads its vector width,
register count and the stack it may copy inputs into through the renderer's Target. Cache sizes are always this
machine's own (the code runs here, whatever CPU it is generated for)."""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

from lazygrad.codegen.renderer import Target
from lazygrad.device import CORES

# x86-64 CPUs by their widest vectors. AVX-512: 16 floats a vector and 32 vector registers; AVX and AVX2: 8 floats
# and 16 registers; the rest of x86-64 (SSE): 4 floats and 16 registers.
AVX512_CPUS = {
    "skylake-avx512",
    "cascadelake",
    "cooperlake",
    "cannonlake",
    "icelake-client",
    "icelake-server",
    "tigerlake",
    "rocketlake",
    "sapphirerapids",
    "emeraldrapids",
    "graniterapids",
    "graniterapids-d",
    "diamondrapids",
    "knl",
    "knm",
    "znver4",
    "znver5",
    "x86-64-v4",
}
AVX_CPUS = {
    "sandybridge",
    "ivybridge",
    "haswell",
    "broadwell",
    "skylake",
    "alderlake",
    "raptorlake",
    "meteorlake",
    "arrowlake",
    "arrowlake-s",
    "lunarlake",
    "pantherlake",
    "gracemont",
    "sierraforest",
    "grandridge",
    "clearwaterforest",
    "bdver1",
    "bdver2",
    "bdver3",
    "bdver4",
    "btver2",
    "znver1",
    "znver2",
    "znver3",
    "x86-64-v3",
}
SSE_CPUS = {"x86-64", "x86-64-v2", "nehalem", "westmere", "core2", "penryn", "silvermont", "goldmont", "tremont"}
# the CPUs above without a fused multiply-add instruction (FMA3, or AMD's FMA4)
NO_FMA_CPUS = SSE_CPUS | {"sandybridge", "ivybridge", "btver2"}


@dataclass(frozen=True)
class HostCPU:
    """The CPU code is generated for: its LLVM/GCC name, whether it is the host itself, and its vectors."""

    name: str
    native: bool
    vector_width: int  # floats in a vector register
    vector_registers: int
    fma: bool = True  # a fused multiply-add instruction

    @property
    def target(self) -> Target:
        # a copy of an input (PACK) takes half of a core's L2 cache (the rows it meets there need the other half), and
        # at most STACK_COPY_LIMIT: it lives on the stack of whichever thread runs the kernel
        pack_bytes = min(l2_cache_bytes() // 2, STACK_COPY_LIMIT)
        return Target(
            vector_width=self.vector_width,
            vector_registers=self.vector_registers,
            fma=self.fma,
            pack_bytes=pack_bytes,
            cores=CORES,
        )

    def describe(self) -> str:
        source = "this machine's" if self.native else "LAZYGRAD_CPU"
        return (
            f"{self.name} ({source}; {self.vector_width} floats a vector, {self.vector_registers} registers, "
            f"{'' if self.fma else 'no '}FMA; "
            f"this machine's L2 cache {l2_cache_bytes() // 1024} KiB a core)"
        )


DEFAULT_L2_BYTES = 256 * 1024  # where the OS does not say: the smallest L2 of an x86-64 core in use
STACK_COPY_LIMIT = 256 * 1024  # (a thread's stack is 8 MiB on Linux, but 512 KiB on some other systems)


@functools.cache
def l2_cache_bytes() -> int:
    """The L2 cache of one core of this machine, from Linux's sysfs (DEFAULT_L2_BYTES where it is not there)."""
    folder = "/sys/devices/system/cpu/cpu0/cache"
    try:
        for index in sorted(os.listdir(folder)):
            with open(f"{folder}/{index}/level") as level, open(f"{folder}/{index}/size") as size:
                if level.read().strip() == "2":
                    text = size.read().strip().upper()
                    scale = {"K": 1024, "M": 1024 * 1024}.get(text[-1:], 1)
                    return int(text.rstrip("KM")) * scale
    except (OSError, ValueError):
        pass
    return DEFAULT_L2_BYTES


def named_cpu(name: str) -> HostCPU:
    """The CPU `LAZYGRAD_CPU` names; ValueError naming the variable and what it takes for a name it does not know."""
    fma = name not in NO_FMA_CPUS
    if name in AVX512_CPUS:
        return HostCPU(name, False, 16, 32, fma)
    if name in AVX_CPUS:
        return HostCPU(name, False, 8, 16, fma)
    if name in SSE_CPUS:
        return HostCPU(name, False, 4, 16, fma)
    known = ", ".join(sorted(AVX512_CPUS | AVX_CPUS | SSE_CPUS))
    raise ValueError(
        f"environment variable LAZYGRAD_CPU={name!r} is not an x86-64 CPU lazygrad knows: LAZYGRAD_CPU takes an "
        f"LLVM/GCC CPU name — one of {known} — or is left unset for this machine's CPU"
    )


def native_cpu() -> HostCPU:
    """This machine's CPU, from LLVM (llvmlite) where it is installed, else from /proc/cpuinfo's flags."""
    try:
        import llvmlite.binding as llvm

        llvm.initialize_native_target()
        name, flags = llvm.get_host_cpu_name(), llvm.get_host_cpu_features().flatten()
        features = {flag[1:] for flag in flags.split(",") if flag.startswith("+")}
    except ImportError:
        name, features = "native", cpuinfo_flags()
    fma = bool(features & {"fma", "fma4"})
    if "avx512f" in features:
        return HostCPU(name, True, 16, 32, fma)
    if "avx" in features:
        return HostCPU(name, True, 8, 16, fma)
    return HostCPU(name, True, 4, 16, fma)


def cpuinfo_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as file:
            return next((set(line.split(":", 1)[1].split()) for line in file if line.startswith("flags")), set())
    except OSError:
        return set()


@functools.cache
def host_cpu() -> HostCPU:
    """The CPU the LLVM and CPU devices generate code for."""
    name = os.getenv("LAZYGRAD_CPU", "")
    return named_cpu(name) if name else native_cpu()
