"""The LLVM device (the default): LLVM IR optimized for this CPU by llvmlite, compiled to machine code, run
through ctypes."""

from __future__ import annotations

import ctypes
import functools
import hashlib
import threading

from lazygrad.codegen.renderer.llvmir import LLVMRenderer
from lazygrad.device import Compiled, Compiler, DeviceUnavailable, HostAllocator, HostProgram


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


# the optimization pipeline; it is part of the disk cache's key, so objects built under other settings are not reused
PIPELINE = {"loop_vectorization": True, "slp_vectorization": True}


class LLVMCompiler(Compiler):
    """IR text → O3-optimized object code for the host CPU."""

    def __init__(self):
        self.machine = target_machine()
        settings = ",".join(f"{name}={value}" for name, value in sorted(PIPELINE.items()))
        self.cache_name = f"llvm-{self.machine.triple}-{hash_of(self.machine)}-O3-{settings}"

    def compile(self, source: str) -> bytes:
        import llvmlite.binding as llvm

        module = llvm.parse_assembly(source)
        module.verify()
        tuning = llvm.create_pipeline_tuning_options(speed_level=3)
        for name, value in PIPELINE.items():
            setattr(tuning, name, value)
        builder = llvm.create_pass_builder(self.machine, tuning)
        builder.getModulePassManager().run(module, builder)
        return self.machine.emit_object(module)


def hash_of(machine) -> str:
    import llvmlite.binding as llvm

    return hashlib.sha256(f"{llvm.get_host_cpu_name()} {llvm.get_host_cpu_features().flatten()}".encode()).hexdigest()[
        :12
    ]


@functools.cache
def engine():
    """The one MCJIT engine every kernel is loaded into (an engine per kernel costs milliseconds to set up; kernel
    names are unique per process, so their symbols never clash). It owns the target machine, and lives as long."""
    import llvmlite.binding as llvm

    return llvm.create_mcjit_compiler(llvm.parse_assembly(""), target_machine())


_loading = threading.Lock()  # kernels are loaded from the compile threads
_loaded: set[bytes] = set()  # digests of the objects in the engine: a batch of kernels is one object


class LLVMProgram(HostProgram):
    """A compiled kernel: object code loaded into the MCJIT engine, run as a HostProgram."""

    def __init__(self, name: str, binary: bytes, global_loops: tuple[int, ...] = (), work: int = 0):
        import llvmlite.binding as llvm

        digest = hashlib.sha256(binary).digest()
        with _loading:
            if digest not in _loaded:
                engine().add_object_file(llvm.ObjectFileRef.from_data(binary))
                engine().finalize_object()
                _loaded.add(digest)
            address = engine().get_function_address(name)
        super().__init__(ctypes.CFUNCTYPE(None, *self.SIGNATURE)(address), global_loops, work)


def open_device() -> Compiled:
    return Compiled("LLVM", HostAllocator(), LLVMRenderer(), LLVMCompiler(), LLVMProgram)
