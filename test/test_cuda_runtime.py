"""The CUDA runtime without a GPU: contexts on every thread, prepared launches, events, graphs, the caching allocator
and pinned copies, checked on a fake driver that records every call; the same runtime over the mock driver (real
values, run on the CPU); NVRTC's targets and where it is loaded from; copies between every pair of devices.

The fake driver keeps the real one's context rules: each thread has its own current context, none at first, and
every call but the context ones fails with "invalid device context" without the primary context current. Tests
that need a real GPU skip, saying why there is none.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import io
import itertools
import os
import re
import shutil
import subprocess
import sys
import threading

import numpy as np
import pytest

from lazygrad import Device, Tensor, TinyJit, dtypes
from lazygrad.codegen.renderer.cstyle import ASYNC_COPIES, DYNAMIC_SHARED, WIDE_ACCESSES
from lazygrad.device import CORES, Buffer, Compiler, DeviceUnavailable
from lazygrad.engine import realize
from lazygrad.engine.buffers import buffer_of
from lazygrad.helpers import DEVICE_ENV_VARS, MOCKCUDA, Context
from lazygrad.runtime import cuda_compiler, cuda_driver, cuda_mock, ops_cuda
from lazygrad.runtime.cuda_driver import CUDAError

REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PRIMARY, FOREIGN = 0xC0, 0xF0
EVENT_SECONDS = 0.00125  # what the fake driver says every timed span took


class FakeDriver:
    """The driver surface the CUDA runtime uses, in Python. Memory is real host memory and copies copy; kernels
    and graphs only record what they were launched with. Every call is recorded as (call, thread name, details)."""

    def __init__(self, capacity: int = 1 << 30):
        self.thread = threading.local()
        self.calls: list[tuple] = []
        self.memory: dict[int, ctypes.Array] = {}
        self.pinned: dict[int, int] = {}  # address -> size of each pinned host allocation
        self.capacity = capacity
        self.handles = itertools.count(0x1000)
        self.graphs: dict[int, list[tuple]] = {}
        self.lock = threading.Lock()

    def record(self, call: str, *details) -> None:
        if getattr(self.thread, "context", None) != PRIMARY:
            raise CUDAError(call, cuda_driver.INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context")
        with self.lock:
            self.calls.append((call, threading.current_thread().name, *details))

    def named(self, call: str) -> list[tuple]:
        return [entry for entry in self.calls if entry[0] == call]

    def new_handle(self) -> int:
        with self.lock:
            return next(self.handles)

    def version(self):
        return "fake"

    def device_count(self):
        return 1

    def device(self, ordinal):
        return ordinal

    def device_name(self, device):
        return "fake GPU"

    def compute_capability(self, device):
        return 9, 0

    def multiprocessors(self, device):
        return 132

    def max_shared_memory(self, device):
        return 227 * 1024

    def allow_shared_memory(self, function, nbytes):
        self.record("allow_shared_memory", function, nbytes)

    def primary_context(self, device):
        return PRIMARY

    def current_context(self):
        return getattr(self.thread, "context", None)

    def set_current_context(self, context):
        self.thread.context = context

    def module_load(self, image):
        self.record("module_load", image)
        return self.new_handle()

    def module_unload(self, module):
        self.record("module_unload", module)

    def module_function(self, module, name):
        self.record("module_function", name)
        return self.new_handle()

    def mem_alloc(self, nbytes):
        if sum(len(block) for block in self.memory.values()) + nbytes > self.capacity:
            raise CUDAError("cuMemAlloc", cuda_driver.OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory")
        self.record("mem_alloc", nbytes)
        block = ctypes.create_string_buffer(nbytes)
        self.memory[ctypes.addressof(block)] = block
        return ctypes.addressof(block)

    def mem_free(self, pointer):
        self.record("mem_free", pointer)
        del self.memory[pointer]

    def mem_info(self):
        used = sum(len(block) for block in self.memory.values())
        return self.capacity - used, self.capacity

    def host_alloc(self, nbytes):
        self.record("host_alloc", nbytes)
        block = ctypes.create_string_buffer(nbytes)
        self.memory[ctypes.addressof(block)] = block
        self.pinned[ctypes.addressof(block)] = nbytes
        return ctypes.addressof(block)

    def host_free(self, address):
        self.record("host_free", address)

    def is_pinned(self, address: int, nbytes: int) -> bool:
        return any(start <= address and address + nbytes <= start + size for start, size in self.pinned.items())

    def copy_to_device(self, pointer, address, nbytes, stream):
        self.record("copy_to_device", pointer, address, nbytes)
        ctypes.memmove(pointer, address, nbytes)

    def copy_to_host(self, address, pointer, nbytes, stream):
        self.record("copy_to_host", address, pointer, nbytes)
        ctypes.memmove(address, pointer, nbytes)

    def stream_create(self):
        self.record("stream_create")
        return self.new_handle()

    def stream_synchronize(self, stream):
        self.record("stream_synchronize")

    def launch(self, function, grid, block, stream, params, shared=0):
        values = tuple(ctypes.c_uint64.from_address(pointer).value for pointer in params)
        self.record("launch", function, grid, block, values)

    def prepared_launch(self, function, grid, block, stream, params, shared=0):
        return lambda: self.launch(function, grid, block, stream, params, shared)

    def event_create(self):
        self.record("event_create")
        return self.new_handle()

    def event_record(self, event, stream):
        self.record("event_record", event)

    def event_synchronize(self, event):
        self.record("event_synchronize", event)

    def event_elapsed(self, start, end):
        self.record("event_elapsed")
        return EVENT_SECONDS

    def graph_create(self):
        self.record("graph_create")
        handle = self.new_handle()
        self.graphs[handle] = []
        return handle

    def graph_add_kernel(self, graph, dependency, function, grid, block, params, shared=0):
        values = tuple(ctypes.c_uint64.from_address(pointer).value for pointer in params)
        self.record("graph_add_kernel", dependency, function, values)
        self.graphs[graph].append(values)
        return len(self.graphs[graph]) - 1

    def graph_instantiate(self, graph):
        self.record("graph_instantiate")
        handle = self.new_handle()
        self.graphs[handle] = list(self.graphs[graph])
        return handle

    def graph_set_kernel(self, executable, node, function, grid, block, params, shared=0):
        values = tuple(ctypes.c_uint64.from_address(pointer).value for pointer in params)
        self.record("graph_set_kernel", node, values)
        self.graphs[executable][node] = values

    def graph_launch(self, executable, stream):
        self.record("graph_launch", list(self.graphs[executable]))

    def graph_destroy(self, graph, executable):
        self.record("graph_destroy")


class SourceCompiler(Compiler):
    """Hands the source on as the binary: the fake driver loads anything."""

    cache_name = "cuda-fake-source"

    def compile(self, source: str) -> bytes:
        return source.encode()


@contextlib.contextmanager
def installed_cuda(device: ops_cuda.CUDADevice):
    """`Device["CUDA"]` is `device` inside; the programs built for it are forgotten after, and those of the device
    it replaced come back."""
    saved_device = Device._opened.get("CUDA")
    saved_programs = {key: value for key, value in realize._programs.items() if key[0] == "CUDA"}
    for key in saved_programs:
        del realize._programs[key]
    Device._opened["CUDA"] = device
    try:
        yield device
    finally:
        gc.collect()  # buffers of this device go back to its allocator now
        for key in [key for key in realize._programs if key[0] == "CUDA"]:
            del realize._programs[key]
        realize._programs.update(saved_programs)
        if saved_device is None:
            Device._opened.pop("CUDA", None)
        else:
            Device._opened["CUDA"] = saved_device


@pytest.fixture
def fake():
    """A CUDA device over a FakeDriver, as `Device["CUDA"]`; yields the driver."""
    driver = FakeDriver()
    with installed_cuda(ops_cuda.CUDADevice(driver, SourceCompiler())):
        yield driver


@pytest.fixture
def mock():
    """A CUDA device over the MockDriver (kernels compiled by NVRTC and g++, run on the CPU), as `Device["CUDA"]`."""
    try:
        compiler = cuda_compiler.MockCUDACompiler()
    except DeviceUnavailable as error:
        pytest.skip(str(error))
    with installed_cuda(ops_cuda.CUDADevice(cuda_mock.MockDriver(), compiler)) as device:
        yield device


def numbers(*shape, seed=0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-2, 2, size=shape).astype(np.float32)


# ---- contexts and threads ----------------------------------------------------------------------------------------


def test_the_drivers_offer_the_same_calls():
    def calls(kind) -> set[str]:
        return {name for name in vars(kind) if not name.startswith("_") and callable(getattr(kind, name))}

    runtime_calls = calls(cuda_driver.CUDADriver) - {"error", "call", "out"}
    assert calls(cuda_mock.MockDriver) - {"require_context", "new_handle"} == runtime_calls
    assert calls(FakeDriver) - {"record", "named", "new_handle", "is_pinned"} == runtime_calls


@pytest.mark.parametrize("driver", [FakeDriver(), cuda_mock.MockDriver()], ids=["fake", "mock"])
def test_the_drivers_refuse_calls_without_a_context(driver):
    errors = []

    def allocate():
        try:
            driver.mem_alloc(64)
        except CUDAError as error:
            errors.append(str(error))

    thread = threading.Thread(target=allocate)
    thread.start()
    thread.join()
    assert len(errors) == 1
    assert re.fullmatch(r"CUDA: \w+ failed: CUDA_ERROR_INVALID_CONTEXT \(invalid device context\)", errors[0])


def test_compile_threads_and_user_threads_have_the_context_current(fake):
    a, b = numbers(5, 7, seed=1), numbers(5, 7, seed=2)
    x = Tensor(a, device="CUDA")
    np.testing.assert_array_equal(x.numpy(), a)  # copied in and out through the driver
    (x * 2 + 1).sum(axis=1).realize()
    results = []

    def user_thread():
        y = Tensor(b, device="CUDA")
        results.append(((y - 3).exp2().realize(), y.numpy()))

    thread = threading.Thread(target=user_thread, name="user-thread")
    thread.start()
    thread.join()
    np.testing.assert_array_equal(results[0][1], b)
    # modules load on the compile threads; kernels launch on the threads that realize; nothing failed for want of a
    # context (every recorded call had the primary context current: FakeDriver.record checks it)
    loads = fake.named("module_load")
    assert len(loads) == 2 and all(thread_name.startswith("lazygrad-compile") for _, thread_name, _ in loads)
    launch_threads = [thread_name for _, thread_name, *_ in fake.named("launch")]
    assert launch_threads == ["MainThread", "user-thread"]


def test_a_foreign_context_is_restored_after_each_call(fake):
    device = Device["CUDA"]
    x = Tensor(numbers(4, seed=1), device="CUDA").realize()
    (x * 2).realize()  # compiled and launched here first
    seen = []

    def other_library_thread():
        fake.set_current_context(FOREIGN)
        pointer = device.allocator.alloc(100_000)  # (a size no freed block serves)
        seen.append(fake.current_context())
        device.allocator.free(pointer)
        seen.append(fake.current_context())
        (x * 2).realize()
        seen.append(fake.current_context())

    fake.calls.clear()
    thread = threading.Thread(target=other_library_thread)
    thread.start()
    thread.join()
    assert seen == [FOREIGN, FOREIGN, FOREIGN] and fake.named("mem_alloc")[-1][1] == thread.name
    assert fake.named("launch")[-1][1] == thread.name  # launched in the device's context, then the foreign one back


# ---- launches, events, graphs -------------------------------------------------------------------------------------


def test_launches_are_prepared_and_queued_without_waiting(fake):
    inputs = [Tensor(numbers(4, 8, seed=seed), device="CUDA").realize() for seed in (1, 2, 3)]
    fake.calls.clear()
    outputs = [(x * 2).realize() for x in inputs]
    launches = fake.named("launch")
    assert len(launches) == 3 and len({launch[2] for launch in launches}) == 1  # one kernel, launched three times
    pointers = [(buffer_of(y.uop.base).handle, buffer_of(x.uop.base).handle) for x, y in zip(inputs, outputs)]
    assert [launch[5] for launch in launches] == pointers  # each launch with its own output and input
    assert not fake.named("stream_synchronize") and not fake.named("event_synchronize")  # nothing waited
    outputs[0].numpy()
    assert [call[0] for call in fake.calls[-3:]] == ["copy_to_host", "event_record", "event_synchronize"]


def test_debug_2_times_kernels_with_events(fake, capsys):
    x = Tensor(numbers(16, seed=4), device="CUDA").realize()
    (x * 3).realize()  # compiled before the timed run
    fake.calls.clear()
    with Context(DEBUG=2):
        (x * 3).realize()
    sequence = [call[0] for call in fake.calls]
    launch = sequence.index("launch")
    assert sequence[launch - 1 : launch + 4] == [
        "event_record",
        "launch",
        "event_record",
        "event_synchronize",
        "event_elapsed",
    ]
    assert f"{EVENT_SECONDS * 1e3:9.3f} ms" in capsys.readouterr().out


def test_tinyjit_replays_a_step_as_one_graph_launch(fake):
    weight = Tensor(numbers(6, 4, seed=5), device="CUDA").realize()

    @TinyJit
    def step(x):
        return ((x @ weight).relu() * 2).sum(axis=1).realize()

    inputs = [Tensor(numbers(3, 6, seed=10 + i), device="CUDA").realize() for i in range(4)]
    step(inputs[0])
    step(inputs[1])  # captured
    fake.calls.clear()
    step(inputs[2])
    kernels = len(step.launches)
    assert kernels >= 2 and not fake.named("launch")
    assert len(fake.named("graph_add_kernel")) == kernels and len(fake.named("graph_launch")) == 1
    input_pointer = buffer_of(inputs[2].uop.base).handle
    taking_input = [
        number for number, (_, _, _, _, values) in enumerate(fake.named("graph_add_kernel")) if input_pointer in values
    ]
    assert taking_input
    fake.calls.clear()
    step(inputs[3])  # another input buffer: only the kernels that read it get new arguments
    updates = fake.named("graph_set_kernel")
    new_pointer = buffer_of(inputs[3].uop.base).handle
    assert [node for _, _, node, _ in updates] == taking_input and all(new_pointer in values for *_, values in updates)
    assert len(fake.named("graph_launch")) == 1 and not fake.named("launch") and not fake.named("graph_create")
    step.reset()
    gc.collect()
    assert len(fake.named("graph_destroy")) == 1


def test_a_released_program_unloads_once_no_graph_uses_it(fake):
    x = Tensor(numbers(8, seed=6), device="CUDA").realize()
    (x * 5).realize()
    kernel = next(value for key, value in realize._programs.items() if key[0] == "CUDA")
    program = kernel.program
    graph = Device["CUDA"].graph([program])
    graph([[buffer_of(x.uop.base).handle, buffer_of(x.uop.base).handle]])
    program.release()
    assert not fake.named("module_unload")  # the graph still launches it
    del graph
    gc.collect()
    sequence = [call[0] for call in fake.calls]
    assert sequence[-2:] == ["stream_synchronize", "module_unload"]
    with pytest.raises(RuntimeError, match=f"CUDA: kernel {program.name} was released and cannot run"):
        program(1, 2)


def test_beam_times_each_run_with_cuda_events(fake):
    """A candidate's first run (first touches of its memory) is waited for; each timed run is a launch between two
    events, waited for, and its time the events' (not the host's clock around the launch and the wait)."""
    from lazygrad.engine import search

    x = Tensor(numbers(64, seed=9), device="CUDA").realize()
    (x * 6).realize()
    kernel = next(value for key, value in realize._programs.items() if key[0] == "CUDA")
    fake.calls.clear()
    seconds = search._time(kernel.program, [("CUDA", 64, dtypes.float32)] * 2)
    kinds = ("launch", "stream_synchronize", "event_record", "event_synchronize", "event_elapsed")
    sequence = [call[0] for call in fake.calls if call[0] in kinds]
    timed_run = ["event_record", "launch", "event_record", "event_synchronize", "event_elapsed"]
    assert sequence == ["launch", "stream_synchronize"] + timed_run * search.TIMED_RUNS
    assert seconds == EVENT_SECONDS


# ---- memory --------------------------------------------------------------------------------------------------------


def test_size_classes():
    assert [ops_cuda.size_class(n) for n in (1, 512, 513, 1 << 20)] == [512, 512, 1024, 1 << 20]
    assert ops_cuda.size_class((1 << 20) + 1) == (1 << 20) + (1 << 17)
    assert ops_cuda.size_class(100_000_000) == 100_663_296  # 12 eighths of 2**26: 0.7% more than asked


def test_the_allocator_reuses_freed_blocks_by_size_class(fake):
    allocator = Device["CUDA"].allocator
    first = allocator.alloc(1000)
    allocator.free(first)
    before = len(fake.named("mem_alloc"))
    assert allocator.alloc(700) == first and len(fake.named("mem_alloc")) == before  # same class: no driver call
    other = allocator.alloc(3000)
    assert other != first and len(fake.named("mem_alloc")) == before + 1
    allocator.free(first)
    allocator.free(other)
    stats = allocator.stats()
    assert stats["in_use_bytes"] == 0 and stats["cached_bytes"] == 1024 + 3072 and stats["reuses"] >= 1
    with pytest.raises(ValueError, match="CUDA: cannot free 0x1: this allocator did not hand it out, or it is free"):
        allocator.free(1)
    fake.calls.clear()
    assert allocator.empty_cache() == 1024 + 3072
    assert [call[0] for call in fake.calls] == ["stream_synchronize", "mem_free", "mem_free"]
    assert allocator.stats()["cached_bytes"] == 0


def test_a_cuda_aware_mpi_gets_the_buffers_gpu_address(fake):
    """distributed.py hands GPU memory to a CUDA-aware MPI by its address; host staging is for other MPIs only."""
    x = Tensor(numbers(10, seed=3), device="CUDA").realize()
    handle = buffer_of(x.uop.base).handle
    assert Device["CUDA"].allocator.gpu_address(handle) == handle and handle in fake.memory


def test_dead_buffers_go_to_the_allocator_cache(fake):
    allocator = Device["CUDA"].allocator
    x = Tensor(numbers(300, seed=7), device="CUDA").realize()
    in_use = allocator.stats()["in_use_bytes"]
    del x
    gc.collect()
    assert allocator.stats()["in_use_bytes"] == in_use - 1536 and allocator.stats()["cached_bytes"] >= 1536


def test_out_of_memory_empties_the_cache_then_says_what_is_held():
    driver = FakeDriver(capacity=8 << 20)
    device = ops_cuda.CUDADevice(driver, SourceCompiler())
    allocator = device.allocator
    kept, cached = allocator.alloc(3 << 20), allocator.alloc(4 << 20)
    allocator.free(cached)
    pointer = allocator.alloc(5 << 20)  # fits only once the cached 4 MiB go back
    assert allocator.stats()["cached_bytes"] == 0 and len(driver.named("mem_free")) == 1
    with pytest.raises(MemoryError) as error:
        allocator.alloc(6 << 20)
    assert str(error.value) == (
        "CUDA: out of memory allocating 6.0 MiB: lazygrad holds 8.0 MiB in live buffers and the GPU has 0.0 MiB free "
        "of 8.0 MiB — free tensors you no longer need or use smaller batches"
    )
    allocator.free(kept)
    allocator.free(pointer)


def test_copies_go_through_pinned_buffers_in_chunks(fake, monkeypatch):
    monkeypatch.setattr(ops_cuda.StagingBuffers, "SIZE", 4096)
    values = numbers(5000, seed=8)  # 20000 bytes: five chunks over two staging buffers
    x = Tensor(values, device="CUDA").realize()
    copies = fake.named("copy_to_device")
    assert [copy[4] for copy in copies] == [4096] * 4 + [20000 - 4 * 4096]
    assert all(fake.is_pinned(address, nbytes) for *_, address, nbytes in copies)
    assert len(fake.named("host_alloc")) == 2 and not fake.named("stream_synchronize")
    # a staging buffer is filled again only after the GPU has read it
    sequence = [call[0] for call in fake.calls if call[0] in ("copy_to_device", "event_synchronize")]
    assert sequence[:4] == ["copy_to_device", "copy_to_device", "event_synchronize", "copy_to_device"]
    np.testing.assert_array_equal(x.numpy(), values)
    assert all(fake.is_pinned(address, nbytes) for _, _, address, _, nbytes in fake.named("copy_to_host"))


# ---- the ctypes binding, over a stand-in for libcuda -------------------------------------------------------------


@pytest.fixture
def stub(tmp_path):
    """A CUDA device over the real binding (CUDADriver) and libcuda_stub.c, built against the real cuda.h, as
    `Device["CUDA"]`; yields the device and the stub library (to read what it was given)."""
    header = cuda_compiler.header_directory()
    if header is None or not os.path.exists(f"{header}/cuda.h"):
        pytest.skip("no cuda.h here to build the driver stub against (pip install 'nvidia-cuda-runtime==13.0.*')")
    if shutil.which("cc") is None:
        pytest.skip("no C compiler to build the driver stub")
    library = tmp_path / "libcuda_stub.so"
    source = os.path.join(os.path.dirname(__file__), "libcuda_stub.c")
    built = subprocess.run(
        ["cc", "-shared", "-fPIC", "-Wall", "-Werror", f"-I{header}", source, "-o", str(library)],
        capture_output=True,
        text=True,
    )
    assert built.returncode == 0, built.stderr  # a prototype that differs from cuda.h's fails here
    driver = cuda_driver.CUDADriver(str(library))
    with installed_cuda(ops_cuda.CUDADevice(driver, SourceCompiler())) as device:
        yield device, ctypes.CDLL(str(library))


def test_the_binding_passes_what_the_driver_expects(stub, capsys):
    device, library = stub

    def read(name: str, kind=ctypes.c_int):
        return kind.in_dll(library, name).value

    assert (device.driver.version(), device.driver.device_name(0), device.driver.compute_capability(0)) == (
        "13.0",
        "stub GPU",
        (9, 0),
    )
    values = numbers(100, seed=80)
    x = Tensor(values, device="CUDA").realize()
    np.testing.assert_array_equal(x.numpy(), values)  # allocated, copied in and out through pinned buffers
    y = (x * 2).realize()  # compiled and loaded on a compile thread, launched here
    kernel = next(value for key, value in realize._programs.items() if key[0] == "CUDA")
    assert (
        read("stub_modules_loaded") == 1
        and (ctypes.c_char * 64).in_dll(library, "stub_function_name").value.decode() == kernel.name
    )
    launched = (ctypes.c_uint64 * 8).in_dll(library, "stub_launch_arguments")
    assert list(launched[:2]) == [buffer_of(y.uop.base).handle, buffer_of(x.uop.base).handle]
    grid, block = read("stub_launch_grid", ctypes.c_uint), read("stub_launch_block", ctypes.c_uint)
    assert (grid, block) == (kernel.program.grid, kernel.program.block) and grid * block >= 100
    with Context(DEBUG=2):
        (Tensor(values, device="CUDA") * 2).realize()
    assert "    0.500 ms" in capsys.readouterr().out  # cuEventElapsedTime's milliseconds, as seconds
    # a captured step: one graph launch per replay, and new arguments for the node that reads a new input
    step = TinyJit(lambda t: (t * 3).realize())
    inputs = [Tensor(numbers(100, seed=81 + i), device="CUDA").realize() for i in range(4)]
    outputs = [step(t) for t in inputs]
    assert read("stub_graph_launches") == 2 and read("stub_node_updates") == 1
    noded = (ctypes.c_uint64 * 8).in_dll(library, "stub_node_arguments")
    assert list(noded[:2]) == [buffer_of(outputs[3].uop.base).handle, buffer_of(inputs[3].uop.base).handle]
    kernel.program.release()
    assert read("stub_modules_unloaded") == 1
    # errors come back with the driver's name and description
    errors = []
    thread = threading.Thread(target=lambda: errors.append(pytest.raises(CUDAError, device.driver.mem_alloc, 8)))
    thread.start()
    thread.join()
    assert str(errors[0].value) == "CUDA: cuMemAlloc_v2 failed: CUDA_ERROR_INVALID_CONTEXT (invalid device context)"
    ctypes.c_size_t.in_dll(library, "stub_capacity").value = read("stub_used", ctypes.c_size_t) + (1 << 20)
    with pytest.raises(MemoryError, match=r"CUDA: out of memory allocating 2\.0 MiB: .* the GPU has 1\.0 MiB free of"):
        device.allocator.alloc(2 << 20)


# ---- the mock driver: the same runtime, with values ----------------------------------------------------------------


def counted_launches(mock, monkeypatch) -> dict[str, int]:
    """The mock driver's kernel and graph launches from now on, counted as "kernels" and "graphs"."""
    launches = {"kernels": 0, "graphs": 0}

    def count(kind, function):
        def counted(*arguments):
            launches[kind] += 1
            return function(*arguments)

        return counted

    monkeypatch.setattr(mock.driver, "launch", count("kernels", mock.driver.launch))
    monkeypatch.setattr(mock.driver, "graph_launch", count("graphs", mock.driver.graph_launch))
    return launches


def test_mock_tinyjit_graph_replays_with_the_right_values(mock, monkeypatch):
    launches = counted_launches(mock, monkeypatch)
    weights = numbers(6, 5, seed=20)
    weight = Tensor(weights, device="CUDA").realize()

    @TinyJit
    def step(x):
        return ((x @ weight).relu() * 0.5 + 1).sum(axis=1).realize()

    for call in range(5):
        data = numbers(4, 6, seed=30 + call)
        before = dict(launches)
        result = step(Tensor(data, device="CUDA"))
        np.testing.assert_allclose(result.numpy(), (np.maximum(data @ weights, 0) * 0.5 + 1).sum(axis=1), rtol=1e-5)
        if call >= 2:  # replays: one graph launch, no kernel launches
            assert launches["graphs"] == before["graphs"] + 1 and launches["kernels"] == before["kernels"]


def test_mock_tinyjit_graph_runs_the_kernels_after_a_host_step(mock, monkeypatch):
    """A label check reads the labels on the host; the step's kernels after it still replay as one graph."""
    launches = counted_launches(mock, monkeypatch)
    weights = numbers(6, 3, seed=22)
    weight = Tensor(weights, device="CUDA").realize()

    @TinyJit
    def step(x, y):
        return (x @ weight).sparse_categorical_crossentropy(y).realize()

    for call in range(4):
        data, labels = numbers(4, 6, seed=60 + call), np.array([0, 2, 1, call % 3], np.int32)
        before = dict(launches)
        loss = step(Tensor(data, device="CUDA"), Tensor(labels, device="CUDA"))
        logits = data @ weights
        log_softmax = logits - logits.max(1, keepdims=True)
        log_softmax -= np.log(np.exp(log_softmax).sum(1, keepdims=True))
        np.testing.assert_allclose(loss.numpy(), -log_softmax[np.arange(4), labels].mean(), rtol=1e-5)
        if call >= 2:
            assert launches == {"kernels": before["kernels"], "graphs": before["graphs"] + 1}
    with pytest.raises(ValueError, match="label 3 at index"):  # the replay still checks each call's labels
        step(Tensor(numbers(4, 6, seed=70), device="CUDA"), Tensor(np.array([0, 3, 1, 1], np.int32), device="CUDA"))


def test_mock_release_unloads_the_library(mock):
    x = Tensor(numbers(8, seed=21), device="CUDA").realize()
    np.testing.assert_allclose((x * 7).numpy(), numbers(8, seed=21) * 7, rtol=1e-6)
    kernel = next(value for key, value in realize._programs.items() if key[0] == "CUDA")
    library_path = mock.driver.modules[kernel.program.module]._name

    def mapped() -> bool:
        with open("/proc/self/maps") as maps:
            return library_path in maps.read()

    assert mapped()
    kernel.program.release()
    assert not mapped()


BLOCK_EXCHANGE = """extern "C" __global__ void exchange(float* out, const float* x) {
  __shared__ float row[96];
  int t = threadIdx.x, first = blockIdx.x * 96;
  float value = x[first + t];
  for (int round = 0; round < 3; round++) {  // each round: every thread's value goes to the mirrored thread
    row[t] = value;
    __syncthreads();
    value = row[95 - t] + (float)round;
    __syncthreads();
  }
  out[first + t] = value + __shfl_sync(0xffffffffu, value, t ^ 1);
}
"""


def run_on_the_mock(source: str, name: str, arrays: list[np.ndarray], grid: int, block: int) -> list[np.ndarray]:
    """Compile `source` for the mock, launch kernel `name` on copies of `arrays` (one pointer each) in `grid`
    blocks of `block` threads, and return the arrays as the kernel left them."""
    driver = cuda_mock.MockDriver()
    driver.set_current_context(driver.primary_context(0))
    module = driver.module_load(cuda_compiler.MockCUDACompiler().compile(source))
    pointers = [driver.mem_alloc(array.nbytes) for array in arrays]
    for pointer, array in zip(pointers, arrays):
        ctypes.memmove(pointer, array.ctypes.data, array.nbytes)
    values, params = ops_cuda.argument_array(len(arrays))
    values[:] = pointers
    driver.launch(driver.module_function(module, name), grid, block, driver.stream_create(), params)
    results = [np.empty_like(array) for array in arrays]
    for pointer, result in zip(pointers, results):
        ctypes.memmove(result.ctypes.data, pointer, result.nbytes)
    return results


def test_mock_threads_wait_for_each_other_at_barriers(nvrtc):
    """A block's threads run as fibers that switch at each barrier: every value a thread reads from shared memory
    or a shuffle is what the others wrote before the barrier, over several rounds and blocks."""
    x = numbers(4 * 96, seed=23)
    out, _ = run_on_the_mock(BLOCK_EXCHANGE, "exchange", [np.zeros_like(x), x], grid=4, block=96)
    value = x.reshape(4, 96)
    for round in range(3):
        value = value[:, ::-1] + round
    expected = value + value.reshape(4, 48, 2)[:, :, ::-1].reshape(4, 96)
    np.testing.assert_array_equal(out, expected.reshape(-1))


TILE = "__shared__ __align__(32) half tile[512]; nvcuda::wmma::fragment<nvcuda::wmma::matrix_a, 16, 16, 16, half, "
TILE += "nvcuda::wmma::row_major> a; nvcuda::wmma::load_matrix_sync(a, tile + {offset}, {ldm});"


@pytest.mark.parametrize(
    "body, failure",
    [
        ("if (threadIdx.x == 3) return; __syncthreads();", "some threads of a block ended while others wait"),
        (
            "if (threadIdx.x == 3) { __syncthreads(); } else { __syncthreads(); }",
            "the threads of a block wait at different barriers",
        ),
        # (thread 3's 400 KB below its 256 KiB stack would be thread 2's, which is mapped)
        ("if (threadIdx.x == 3) { volatile float deep[100000]; deep[0] = 1.0f; } __syncthreads();", "SIGSEGV"),
        (
            "__shared__ __align__(16) float tile[16]; LAZYGRAD_COPY_ASYNC(cg, tile + 2, out, 16); LAZYGRAD_WAIT_COPIES();",
            "cp.async to an address that is not a multiple of its size",
        ),
        (TILE.format(offset=8, ldm=16), "load_matrix_sync: a tile whose first element is not 32-byte aligned"),
        (TILE.format(offset=0, ldm=20), "load_matrix_sync: a tile whose rows are not a multiple of 16 bytes apart"),
        (
            TILE.format(offset=0, ldm=16).replace("nvcuda::wmma::load", "if (threadIdx.x == 3) nvcuda::wmma::load"),
            "the threads of a warp made different tensor-core calls",
        ),
        ("out[0] = __shfl_sync(0xffffffffu, 1.0f, 0);", "__shfl_sync: a mask other than the lanes the block has"),
        ("out[0] = __shfl_sync(0xffu, 1.0f, 9);", "__shfl_sync: a read of a lane the mask leaves out"),
        (
            "float4 v = LAZYGRAD_WIDE(const float4, out + 2); out[0] = v.x;",
            "a wide load or store (float4) at an address that is not a multiple of its size",
        ),
    ],
    ids=[
        "a thread leaves before a barrier",
        "threads wait at different barriers",
        "a stack overflows",
        "a misaligned asynchronous copy",
        "a misaligned tile",
        "a tile's rows 40 bytes apart",
        "a tile one thread of a warp loads",
        "a shuffle naming lanes the block lacks",
        "a shuffle of a lane left out",
        "a misaligned float4",
    ],
)
def test_mock_kernels_that_would_break_on_a_gpu_fail_loudly(nvrtc, body, failure):
    """A block whose threads part at a barrier (undefined on a GPU) stops with the shim's message; a thread that
    overflows its stack faults on the page below it instead of writing over another thread's; an address a GPU
    would fault on (a copy to shared memory, a tensor-core tile), a tensor-core call some threads of a warp skip,
    and a shuffle whose mask a GPU would wait on forever or leave undefined stop with the shim's message too."""
    prelude = ASYNC_COPIES + WIDE_ACCESSES
    if "nvcuda::wmma" in body:
        if not cuda_compiler.has_matrix_headers(nvrtc.include_directory):
            pytest.skip("NVRTC has no mma.h headers here")
        prelude += "#include <mma.h>\n#include <cuda_fp16.h>\n"
    source = f'{prelude}extern "C" __global__ void broken(float* out) {{ {body} out[threadIdx.x] = 1.0f; }}'
    script = (
        "import numpy as np, test_cuda_runtime as t\n"
        f"t.run_on_the_mock({source!r}, 'broken', [np.zeros(8, np.float32)], grid=1, block=8)\n"
    )
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.join(REPOSITORY, "test"), REPOSITORY])}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=environment)
    assert result.returncode != 0
    if failure == "SIGSEGV":
        assert result.returncode == -11, result.stderr
    else:
        assert f"cuda_shim: {failure}" in result.stderr, result.stderr


HEAVY = """extern "C" __global__ void heavy(float* out, const float* x) {
  float a[96];  // (live all at once: ptxas gives the kernel over 64 registers a thread)
  #pragma unroll
  for (int i = 0; i < 96; i++) a[i] = x[threadIdx.x + 1024 * i];
  #pragma unroll
  for (int r = 0; r < 4; r++) {
    #pragma unroll
    for (int i = 0; i < 96; i++) a[i] = a[i] * a[(i + 7) % 96] + 1.0f;
  }
  float total = 0.0f;
  #pragma unroll
  for (int i = 0; i < 96; i++) total += a[i];
  out[threadIdx.x] = total;
}
"""


def test_mock_launches_fail_where_the_gpu_lacks_registers_or_shared_memory(nvrtc):
    """A launch is checked as an A100 checks it: ptxas' count of a kernel's registers (over 64 a thread) keeps a
    block of 1,024 threads from launching, while one of 256 computes; dynamic shared memory past 48 KiB must be
    allowed first, up to the GPU's limit; a block has at most 1,024 threads."""
    x = np.random.default_rng(3).random(1024 * 96, dtype=np.float32)
    out, _ = run_on_the_mock(HEAVY, "heavy", [np.zeros(1024, np.float32), x], grid=1, block=256)
    a = x.reshape(96, 1024)[:, :256].copy()
    for _ in range(4):
        for i in range(96):
            a[i] = a[i] * a[(i + 7) % 96] + np.float32(1)
    np.testing.assert_allclose(out[:256], a.sum(axis=0), rtol=1e-5)
    driver = cuda_mock.MockDriver()
    driver.set_current_context(driver.primary_context(0))
    function = driver.module_function(driver.module_load(cuda_compiler.MockCUDACompiler().compile(HEAVY)), "heavy")
    assert function.registers > 64 and function.static_shared == 0
    values, params = ops_cuda.argument_array(2)
    values[:] = [driver.mem_alloc(1024 * 4), driver.mem_alloc(x.nbytes)]
    stream = driver.stream_create()
    with pytest.raises(CUDAError, match=r"CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES .*1024 threads of \d+ registers"):
        driver.launch(function, 1, 1024, stream, params)
    with pytest.raises(CUDAError, match=r"CUDA_ERROR_INVALID_VALUE \(a block of 2048 threads"):
        driver.launch(function, 1, 2048, stream, params)
    with pytest.raises(CUDAError, match=r"CUDA_ERROR_INVALID_VALUE \(65536 bytes of dynamic shared memory, 49152"):
        driver.launch(function, 1, 32, stream, params, shared=64 * 1024)
    driver.allow_shared_memory(function, 64 * 1024)
    driver.launch(function, 1, 32, stream, params, shared=64 * 1024)
    with pytest.raises(CUDAError, match="cuFuncSetAttribute failed: CUDA_ERROR_INVALID_VALUE"):
        driver.allow_shared_memory(function, 200 * 1024)


def test_a_mock_launch_must_give_a_kernel_the_dynamic_shared_memory_it_uses(nvrtc):
    """The shim gives a kernel the dynamic shared memory its source declares whatever the launch asks for; the mock
    driver refuses a launch that gives less, where a GPU's kernel would read and write past it."""
    source = DYNAMIC_SHARED.format(bytes=64 * 1024) + (
        'extern "C" __global__ void staged(float* out) { float* row = (float*)lazygrad_shared;\n'
        "  row[threadIdx.x * 512] = (float)threadIdx.x; __syncthreads(); out[threadIdx.x] = row[(31 - threadIdx.x) * 512]; }"
    )
    driver = cuda_mock.MockDriver()
    driver.set_current_context(driver.primary_context(0))
    function = driver.module_function(driver.module_load(cuda_compiler.MockCUDACompiler().compile(source)), "staged")
    out = np.zeros(32, np.float32)
    values, params = ops_cuda.argument_array(1)
    values[:] = [out.ctypes.data]
    stream = driver.stream_create()
    driver.allow_shared_memory(function, 64 * 1024)
    with pytest.raises(
        CUDAError,
        match=r"ILLEGAL_ADDRESS \(the kernel uses 65536 bytes of dynamic shared memory, the launch gives 1024",
    ):
        driver.launch(function, 1, 32, stream, params, shared=1024)
    driver.launch(function, 1, 32, stream, params, shared=64 * 1024)
    np.testing.assert_array_equal(out, np.arange(32)[::-1])


def test_a_cuda_kernel_in_blocks_larger_than_its_registers_allow_is_refused():
    """A launch the GPU refuses for its registers is a LaunchRefused naming the kernel and its block, which BEAM
    passes over; a block the registers allow runs."""
    if not MOCKCUDA:
        pytest.skip("a kernel of known registers on the mock")
    from lazygrad.device import LaunchRefused

    device = Device["CUDA"]
    binary = device.compiler.compile(HEAVY)
    out, x = Buffer("CUDA", 1024, dtypes.float32), Buffer("CUDA", 1024 * 96, dtypes.float32)
    device.runtime("heavy", binary, (1, 256, 0))(out.handle, x.handle)
    with pytest.raises(LaunchRefused, match="CUDA: kernel heavy cannot run in blocks of 1024 threads: .*RESOURCES"):
        device.runtime("heavy", binary, (1, 1024, 0))(out.handle, x.handle)


# ---- compiling -----------------------------------------------------------------------------------------------------

SAXPY = 'extern "C" __global__ void saxpy(float* out, const float* x) { out[threadIdx.x] += 2.0f * x[threadIdx.x]; }'


@pytest.fixture
def nvrtc():
    try:
        return cuda_compiler.load_nvrtc()
    except DeviceUnavailable as error:
        pytest.skip(str(error))


def test_the_target_is_the_gpus_own_architecture(nvrtc):
    assert cuda_compiler.choose_target(nvrtc, (9, 0)) == "sm_90"
    # a GPU newer than NVRTC knows gets PTX for the newest architecture NVRTC knows, which the driver compiles
    newest = nvrtc.architectures[-1]
    assert cuda_compiler.choose_target(nvrtc, (99, 0)) == f"compute_{newest}"
    with pytest.raises(
        DeviceUnavailable, match=r"CUDA: NVRTC \S+ cannot compile for this GPU \(compute capability 3\.0"
    ):
        cuda_compiler.choose_target(nvrtc, (3, 0))


def test_cubin_where_nvrtc_knows_the_gpu_else_ptx(nvrtc):
    cubin, ptx = cuda_compiler.NVRTCCompiler("sm_90"), cuda_compiler.NVRTCCompiler("compute_90")
    assert cubin.compile(SAXPY)[:4] == b"\x7fELF"
    assert b".target sm_90" in ptx.compile(SAXPY) and b".entry saxpy" in ptx.compile(SAXPY)
    # the disk cache keeps them apart, and apart from another NVRTC's
    assert (
        cubin.cache_name == f"cuda-sm_90-nvrtc{nvrtc.version}"
        and ptx.cache_name == f"cuda-compute_90-nvrtc{nvrtc.version}"
    )


PLANTED_LIBRARY = """
#include <stdio.h>
__attribute__((constructor)) static void planted(void) { FILE *marker = fopen("loaded-from-cwd", "w"); fclose(marker); }
"""


@pytest.mark.parametrize("package", ["namespace", "regular"])
def test_nvrtc_is_never_loaded_from_the_working_directory(tmp_path, nvrtc, package):
    """A folder `nvidia/` in the working directory joins the `nvidia` namespace package (or, with an __init__.py,
    replaces it); a libnvrtc planted there must not be loaded."""
    library = tmp_path / "nvidia" / "x" / "lib" / "libnvrtc.so.13"
    library.parent.mkdir(parents=True)
    built = subprocess.run(
        ["cc", "-shared", "-fPIC", "-x", "c", "-", "-o", str(library)],
        input=PLANTED_LIBRARY,
        capture_output=True,
        text=True,
    )
    if built.returncode != 0:
        pytest.skip(f"no C compiler to build the planted library: {built.stderr}")
    if package == "regular":
        (tmp_path / "nvidia" / "__init__.py").write_text("")
    script = (
        "from lazygrad import Device, Tensor\n"
        "assert Tensor([1.0, 2.0], device='CUDA').numpy().tolist() == [1.0, 2.0]\n"
        "from lazygrad.runtime.cuda_compiler import load_nvrtc\n"
        "print(load_nvrtc().path)\n"
    )
    environment = {key: value for key, value in os.environ.items() if key not in DEVICE_ENV_VARS}
    environment.update(PYTHONPATH=REPOSITORY, CUDA="1", MOCKCUDA="1", LAZYGRAD_CACHE=str(tmp_path / "cache"))
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert not (tmp_path / "loaded-from-cwd").exists()
    assert result.stdout.strip() == nvrtc.path


# ---- what `python -m lazygrad` says -------------------------------------------------------------------------------


def device_report(**variables: str) -> dict[str, str]:
    environment = {key: value for key, value in os.environ.items() if key not in DEVICE_ENV_VARS}
    environment.update(PYTHONPATH=REPOSITORY, **variables)
    result = subprocess.run(
        [sys.executable, "-m", "lazygrad"], env=environment, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    return {line.split()[0]: line.split(None, 1)[1] for line in result.stdout.splitlines() if line.strip()}


def test_the_device_report_says_why_cuda_is_unavailable(tmp_path):
    try:
        ctypes.CDLL(cuda_driver.LIBRARY)
        pytest.skip("an NVIDIA driver is installed here")
    except OSError as error:
        reason = str(error)
    report = device_report(MOCKCUDA="0", LAZYGRAD_CACHE=str(tmp_path))
    assert report["CUDA"] == (
        f"unavailable: CUDA: no NVIDIA driver ({reason}) — install the NVIDIA driver, or set MOCKCUDA=1 to compile "
        "kernels with NVRTC and run them on the CPU"
    )
    assert report["LLVM"] == "available" and report["default:"] == "LLVM"
    assert report["cores:"].startswith(f"{CORES} (this process's;")


def test_a_gpu_that_cannot_be_opened_says_why(monkeypatch, nvrtc):
    class TakenGPU(FakeDriver):
        def primary_context(self, device):
            raise CUDAError(
                "cuDevicePrimaryCtxRetain",
                216,
                "CUDA_ERROR_CONTEXT_ALREADY_IN_USE",
                "exclusive-thread device already in use by a different thread",
            )

    monkeypatch.setattr(ops_cuda, "CUDADriver", TakenGPU)
    monkeypatch.setattr(MOCKCUDA, "value", 0)
    with pytest.raises(DeviceUnavailable) as error:
        ops_cuda.open_device()
    assert str(error.value) == (
        "CUDA: the GPU cannot be used: cuDevicePrimaryCtxRetain failed: CUDA_ERROR_CONTEXT_ALREADY_IN_USE "
        "(exclusive-thread device already in use by a different thread)"
    )


def test_the_device_report_describes_the_mock_device(tmp_path, nvrtc):
    report = device_report(MOCKCUDA="1", LAZYGRAD_CACHE=str(tmp_path))
    assert report["CUDA"] == (
        f"available: the CPU (MOCKCUDA=1), compute capability 8.0, sm_80 (CUBIN), driver none (MOCKCUDA), "
        f"NVRTC {nvrtc.version}"
    )


def test_the_device_report_says_an_opencl_cpu_device_is_no_gpu(tmp_path):
    report = device_report(LAZYGRAD_CACHE=str(tmp_path))
    if not report["GPU"].startswith("available"):
        pytest.skip(f"no OpenCL device here: {report['GPU']}")
    from lazygrad import Device

    device = Device["GPU"].device
    if device.type != Device["GPU"].cl.device_type.CPU:
        pytest.skip(f"the OpenCL device here is no CPU device: {report['GPU']}")
    assert report["GPU"].startswith(f"available: {device.name.strip()}, an OpenCL cpu device (runs on the CPU: no GPU")
    assert f"driver {device.driver_version}" in report["GPU"]


# ---- copies between devices -----------------------------------------------------------------------------------------

DEVICES = ["LLVM", "CPU", "GPU", "CUDA", "PYTHON"]


@pytest.fixture
def every_device(request):
    """Every device of DEVICES that runs here; CUDA over the mock driver (skips name what is missing)."""
    for name in DEVICES:
        if name != "CUDA":
            try:
                Device[name]
            except DeviceUnavailable as error:
                pytest.skip(str(error))
    request.getfixturevalue("mock")


@pytest.mark.parametrize("source", DEVICES)
@pytest.mark.parametrize("destination", DEVICES)
def test_to_copies_between_every_pair_of_devices(every_device, source, destination):
    if source == destination:
        pytest.skip("not a copy")
    values = numbers(3, 5, seed=40)
    integers = np.arange(-7, 8, dtype=np.int32).reshape(3, 5)
    floats = Tensor(values, device=source).permute(1, 0).to(destination)  # a view, copied as its values
    counts = Tensor(integers, device=source).to(destination)
    assert floats.device == destination and counts.dtype == dtypes.int32
    np.testing.assert_array_equal(floats.numpy(), values.T)
    np.testing.assert_array_equal((counts * 3).to(source).numpy(), integers * 3)


# ---- a real GPU ------------------------------------------------------------------------------------------------------


@pytest.fixture
def gpu():
    """The real CUDA device, or a skip saying why there is none."""
    try:
        driver = cuda_driver.CUDADriver()
        target = cuda_compiler.choose_target(cuda_compiler.load_nvrtc(), driver.compute_capability(driver.device(0)))
    except DeviceUnavailable as error:
        pytest.skip(str(error))
    with installed_cuda(ops_cuda.CUDADevice(driver, cuda_compiler.NVRTCCompiler(target))) as device:
        yield device


def test_gpu_runs_from_user_threads_and_replays_graphs(gpu):
    values = numbers(64, 33, seed=50)
    results = {}

    def run(name):
        x = Tensor(values, device="CUDA")
        results[name] = ((x * 2 + 1).relu().sum(axis=1) / 3).numpy()

    threads = [threading.Thread(target=run, args=(f"thread {i}",)) for i in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    expected = (np.maximum(values * 2 + 1, 0).sum(axis=1) / 3).astype(np.float32)
    assert len(results) == 3 and all(np.allclose(result, expected, rtol=1e-5) for result in results.values())
    weights = numbers(33, 16, seed=51)
    weight = Tensor(weights, device="CUDA").realize()
    step = TinyJit(lambda x: (x @ weight).relu().realize())
    for call in range(4):
        data = numbers(8, 33, seed=60 + call)
        np.testing.assert_allclose(
            step(Tensor(data, device="CUDA")).numpy(), np.maximum(data @ weights, 0), rtol=1e-4, atol=1e-5
        )
    with Context(DEBUG=2), contextlib.redirect_stdout(io.StringIO()) as output:
        step(Tensor(numbers(8, 33, seed=70), device="CUDA")).numpy()
    assert "graph of" in output.getvalue() and "one launch" in output.getvalue()
    assert gpu.allocator.stats()["reuses"] > 0


def test_the_parameter_limit_follows_nvrtc_the_driver_and_the_architecture():
    """32764 bytes of parameters (4095 pointers) where NVRTC and the driver are 12.1 or newer on compute 7.0 or newer;
    4096 bytes (512 pointers) otherwise."""

    class Version:
        version = "12.1"

    compiler = object.__new__(cuda_compiler.NVRTCCompiler)
    compiler.nvrtc, compiler.target = Version(), "sm_90"
    assert compiler.max_buffers() == compiler.max_buffers("12.4") == compiler.max_buffers("none (MOCKCUDA)") == 4095
    assert compiler.max_buffers("12.0") == 512
    compiler.target = "compute_61"
    assert compiler.max_buffers("12.4") == 512
    compiler.nvrtc.version, compiler.target = "11.8", "sm_80"
    assert compiler.max_buffers("12.4") == 512
