"""The LLVM device (the default): LLVM IR optimized for this CPU by llvmlite, compiled to machine code, run
through ctypes."""

from __future__ import annotations

import ctypes
import functools
import hashlib
import threading

from lazygrad.codegen.renderer.llvmir import NOTHING_TO_VECTORIZE, LLVMRenderer
from lazygrad.device import Compiler, DeviceUnavailable, HostAllocator, HostDevice, HostProgram, LoadedBinaries
from lazygrad.runtime.host_cpu import host_cpu


@functools.cache
def target_machine():
    """The target machine kernels are compiled for (an MCJIT engine owns one of its own: see `new_target_machine`)."""
    return new_target_machine()


def new_target_machine():
    try:
        import llvmlite.binding as llvm
    except ImportError as error:
        raise DeviceUnavailable("LLVM: llvmlite is not installed — pip install llvmlite") from error
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    target = llvm.Target.from_triple(llvm.get_process_triple())
    cpu = host_cpu()
    # a named CPU (LAZYGRAD_CPU) brings its own features; this machine's are read from it
    features = llvm.get_host_cpu_features().flatten() if cpu.native else ""
    return target.create_target_machine(cpu=cpu.name, features=features, opt=3, jit=True)


# the optimization pipelines: O3 with these settings, and the cleanups that a module leaving nothing to LLVM's
# vectorizers gets instead (see NOTHING_TO_VECTORIZE); both are part of the disk cache's key, so objects built under
# other settings are not reused. LLVM's loop unroller is off: once the loop vectorizer had interleaved a reduce, it
# unrolled the short constant loops around it into thousands of instructions (a batch norm's per-channel sum of
# 16 x 256 took 1 s to compile instead of 25 ms), and no benchmark ran faster for it.
PIPELINE = {"loop_vectorization": True, "slp_vectorization": True, "loop_unrolling": False}
CLEANUP_PASSES = ("sroa", "instruction_combine", "simplify_cfg")


class LLVMCompiler(Compiler):
    """IR text → object code for the host CPU, optimized at O3 (or by a few cleanups, where codegen has vectorized
    the kernel's loops itself or left them scalar)."""

    def __init__(self):
        self.machine = target_machine()
        settings = ",".join(f"{name}={value}" for name, value in sorted(PIPELINE.items()))
        self.cache_name = (
            f"llvm-{self.machine.triple}-{hash_of(self.machine)}-O3-{settings}-or-{'-'.join(CLEANUP_PASSES)}"
        )
        self.local = threading.local()  # each compiling thread's own LLVM context and target machine

    def compile(self, source: str) -> bytes:
        import llvmlite.binding as llvm
        from llvmlite.binding import ffi

        local = self.local
        if not hasattr(local, "context"):
            local.context, local.machine = llvm.create_context(), new_target_machine()
        module = parse(source, local.context)
        try:
            module.verify()
            tuning = llvm.create_pipeline_tuning_options(speed_level=3)
            for name, value in PIPELINE.items():
                setattr(tuning, name, value)
            builder = llvm.create_pass_builder(local.machine, tuning)
            if source.startswith(NOTHING_TO_VECTORIZE):
                passes = llvm.create_new_module_pass_manager()
                for name in CLEANUP_PASSES:
                    getattr(passes, f"add_{name}_pass")()
            else:
                passes = builder.getModulePassManager()
            unlocked(ffi.lib.LLVMPY_RunNewModulePassManager)(passes, module, builder)
            with ffi.OutputString() as error:
                buffer = unlocked(ffi.lib.LLVMPY_TargetMachineEmitToMemory)(local.machine, module, 1, error)
                if not buffer:
                    raise RuntimeError(str(error))
            try:
                return ctypes.string_at(ffi.lib.LLVMPY_GetBufferStart(buffer), ffi.lib.LLVMPY_GetBufferSize(buffer))
            finally:
                ffi.lib.LLVMPY_DisposeMemoryBuffer(buffer)
        finally:
            module.close()


def unlocked(function):
    """An llvmlite entry point called without llvmlite's lock. llvmlite makes every call into LLVM under one
    process-wide lock, so compiler threads would take turns; parsing, optimizing and emitting code (the time of a
    compile) touch only the calling thread's own context, module and target machine, which LLVM allows on several
    threads at once. Where llvmlite wraps its functions differently, the call keeps the lock (and stays correct)."""
    return getattr(function, "_cfn", function)


def parse(source: str, context):
    """An LLVM module parsed from IR text into `context` (llvmlite's parse_assembly, without its lock)."""
    from llvmlite.binding import ffi
    from llvmlite.binding.module import ModuleRef

    with ffi.OutputString() as error:
        module = ModuleRef(
            unlocked(ffi.lib.LLVMPY_ParseAssembly)(context, ctypes.c_char_p(source.encode()), error), context
        )
        if error:
            module.close()
            raise RuntimeError(f"LLVM IR parsing error\n{error}")
    return module


def hash_of(machine) -> str:
    import llvmlite.binding as llvm

    cpu = host_cpu()
    features = llvm.get_host_cpu_features().flatten() if cpu.native else "its own"
    return hashlib.sha256(f"{cpu.name} {features}".encode()).hexdigest()[:12]


class Engine:
    """An MCJIT engine (with its own target machine: an engine owns its machine) holding one object file, a batch of
    kernels. Each object gets an engine of its own, so a program finds its function among its own object's symbols
    only: objects defining the same name (BEAM's candidates for one kernel, a kernel built again while a TinyJit holds
    its first build) can never answer for each other. (Sharing an engine between objects saved ~0.3 ms per object,
    but a second program on an object loaded earlier looked its name up after other objects had defined it again,
    and ran another kernel's code with its own launch range: writes past the end of a buffer.) Closing the engine
    frees the machine code."""

    def __init__(self, binary: bytes):
        import llvmlite.binding as llvm

        self.engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""), new_target_machine())
        self.engine.add_object_file(llvm.ObjectFileRef.from_data(binary))
        self.engine.finalize_object()

    def close(self) -> None:
        self.engine.close()


class LLVMProgram(HostProgram):
    """A compiled kernel: a function in an object file loaded into one of the engines, run as a HostProgram."""

    binaries = LoadedBinaries(Engine, Engine.close)  # which calls them under its lock: one thread at a time

    def address_of(self, engine: Engine, name: str) -> int:
        return engine.engine.get_function_address(name)


def open_device() -> HostDevice:
    return HostDevice("LLVM", HostAllocator(), LLVMRenderer(host_cpu().target), LLVMCompiler(), LLVMProgram)
