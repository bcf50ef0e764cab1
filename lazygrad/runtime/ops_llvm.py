"""The LLVM device (the default): LLVM IR optimized for this CPU by llvmlite, compiled to machine code, run
through ctypes."""

from __future__ import annotations

import ctypes
import functools
import os
from concurrent.futures import ThreadPoolExecutor

from lazygrad.codegen.renderer.llvmir import LLVMRenderer
from lazygrad.device import Compiled, Compiler, DeviceUnavailable, HostAllocator


@functools.cache
def target_machine():
    try:
        import llvmlite.binding as llvm
    except ImportError as error:
        raise DeviceUnavailable("LLVM: llvmlite is not installed — pip install llvmlite") from error
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    target = llvm.Target.from_triple(llvm.get_process_triple())
    features = llvm.get_host_cpu_features().flatten()
    return target.create_target_machine(cpu=llvm.get_host_cpu_name(), features=features, opt=3, jit=True)


class LLVMCompiler(Compiler):
    """IR text → O3-optimized object code for the host CPU."""

    def __init__(self):
        self.machine = target_machine()
        self.cache_name = f"llvm-{self.machine.triple}-{hash_of(self.machine)}"

    def compile(self, source: str) -> bytes:
        import llvmlite.binding as llvm

        module = llvm.parse_assembly(source)
        module.verify()
        tuning = llvm.create_pipeline_tuning_options(speed_level=3)
        tuning.loop_vectorization = True
        tuning.slp_vectorization = True
        builder = llvm.create_pass_builder(self.machine, tuning)
        builder.getModulePassManager().run(module, builder)
        return self.machine.emit_object(module)


def hash_of(machine) -> str:
    import hashlib

    import llvmlite.binding as llvm

    return hashlib.sha256(f"{llvm.get_host_cpu_name()} {llvm.get_host_cpu_features().flatten()}".encode()).hexdigest()[
        :12
    ]


class LLVMProgram:
    """A compiled kernel: object code loaded into an MCJIT engine, called with the buffers' addresses. Kernels with
    enough work split their outermost loop across the cores; ctypes releases the GIL during each call."""

    # below this many loop iterations in all, a thread costs more than it saves
    PARALLEL_WORK = 1 << 17

    def __init__(self, name: str, binary: bytes, global_loops: tuple[int, ...] = (), work: int = 0):
        import llvmlite.binding as llvm

        self.engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""), target_machine())
        self.engine.add_object_file(llvm.ObjectFileRef.from_data(binary))
        self.engine.finalize_object()
        self.address = self.engine.get_function_address(name)
        self.outer = global_loops[0] if global_loops else 1
        self.chunks = min(CORES, self.outer) if work >= self.PARALLEL_WORK else 1
        self.function = None

    def __call__(self, *buffers) -> None:
        if self.function is None:
            types = [ctypes.c_void_p] * len(buffers) + [ctypes.c_int64, ctypes.c_int64]
            self.function = ctypes.CFUNCTYPE(None, *types)(self.address)
        pointers = [buffer.ctypes.data for buffer in buffers]
        if self.chunks == 1:
            self.function(*pointers, 0, self.outer)
            return
        bounds = [self.outer * part // self.chunks for part in range(self.chunks + 1)]
        others = [_pool().submit(self.function, *pointers, bounds[i], bounds[i + 1]) for i in range(1, self.chunks)]
        self.function(*pointers, bounds[0], bounds[1])
        for other in others:
            other.result()


CORES = os.cpu_count() or 1


@functools.cache
def _pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=CORES, thread_name_prefix="lazygrad-llvm")


def open_device() -> Compiled:
    return Compiled("LLVM", HostAllocator(), LLVMRenderer(), LLVMCompiler(), LLVMProgram)
