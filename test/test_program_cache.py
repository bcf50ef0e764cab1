"""The in-memory program cache: at most PROGRAM_CACHE compiled kernels stay in it, the least recently used leave
first, and a kernel's device code is freed once it is out of the cache and nothing holds it — but never while a
TinyJit capture (or the device graph made from it) still launches it. An evicted kernel is built again when needed.

The in-process tests run on the default device (run the file with CPU=1, GPU=1, CUDA=1 MOCKCUDA=1 or PYTHON=1 for
the others); `test_every_device_in_a_fresh_process` runs a short version of them on each device that is available.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from support import available

from lazygrad import Device, Tensor
from lazygrad.device import DeviceUnavailable
from lazygrad.engine import realize
from lazygrad.engine.buffers import buffer_of
from lazygrad.engine.jit import TinyJit
from lazygrad.helpers import CACHELEVEL, Context, GlobalCounters

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = np.arange(16, dtype=np.float32) - 5


@pytest.fixture
def device() -> str:
    return available(Device.DEFAULT)


def code_freed(program) -> bool:
    """Whether a program gave its device code back (CUDA: its module is unloaded; elsewhere: it was released)."""
    if hasattr(program, "module"):
        return program.module is None
    return program.released


def loaded_code(device: str) -> int | None:
    """How many binaries the device holds loaded for programs (None where the device does not say)."""
    opened = Device[device]
    if hasattr(opened.runtime, "binaries"):  # LLVM, CPU: the program class loads binaries
        return len(opened.runtime.binaries.loaded)
    if device == "GPU":
        return len(opened.programs.loaded)
    if hasattr(getattr(opened, "driver", None), "modules"):  # the CUDA mock driver
        return len(opened.driver.modules)
    return None


def distinct_graph(x: Tensor, number: int) -> np.ndarray:
    """One new kernel per number (the constant is part of the kernel), checked against NumPy."""
    result = (x * (1000 + number) + 1).numpy()
    np.testing.assert_allclose(result, DATA * (1000 + number) + 1)
    return result


def newest_kernel() -> realize.CompiledKernel:
    return next(reversed(realize._programs.values()))


def test_distinct_graphs_keep_the_cache_bounded_and_free_what_leaves_it(device):
    x = Tensor(DATA, device=device).realize()
    gc.collect()
    realize.release_unused()
    # what earlier tests in this process still hold loaded (on NVIDIA's OpenCL, two more binaries) is not this test's
    held_before = loaded_code(device)
    limit, count = 3, 12
    with Context(PROGRAM_CACHE=limit):
        programs = []
        for number in range(count):
            distinct_graph(x, number)
            assert len(realize._programs) <= limit
            programs.append(newest_kernel().program)
        gc.collect()
        realize.release_unused()
        assert [code_freed(program) for program in programs] == [True] * (count - limit) + [False] * limit
        assert realize.live_programs() <= limit
        loaded = loaded_code(device)
        assert loaded is None or loaded <= held_before + limit


def test_an_evicted_kernel_is_built_again_and_computes_the_same(device):
    x = Tensor(DATA, device=device).realize()
    with Context(PROGRAM_CACHE=2):
        first = distinct_graph(x, 100)
        evicted = newest_kernel()
        for number in range(101, 104):
            distinct_graph(x, number)
        assert all(kernel is not evicted for kernel in realize._programs.values())
        program = evicted.program
        del evicted
        gc.collect()
        realize.release_unused()
        assert code_freed(program)
        compiles = GlobalCounters.compile_count
        np.testing.assert_allclose(distinct_graph(x, 100), first)
        rebuilt = newest_kernel()
        assert rebuilt.program is not program and not code_freed(rebuilt.program)
        # built again from the same source (the kernel keeps its name), so the disk cache has its binary
        assert GlobalCounters.compile_count == compiles or not CACHELEVEL


def test_a_jit_step_whose_kernels_left_the_cache_still_replays(device):
    @TinyJit
    def step(tensor: Tensor) -> tuple[Tensor, Tensor]:
        doubled = (tensor * 3 + 2).contiguous()
        return doubled.realize(), (doubled.sum() + doubled).realize()

    def check(step: TinyJit, value: float) -> None:
        doubled, shifted = step(Tensor(DATA + value, device=device))
        expected = (DATA + value) * 3 + 2
        np.testing.assert_allclose(doubled.numpy(), expected)
        np.testing.assert_allclose(shifted.numpy(), expected.sum() + expected, rtol=1e-5)

    x = Tensor(DATA, device=device).realize()
    with Context(PROGRAM_CACHE=2):
        check(step, 0)  # runs
        check(step, 1)  # captures
        captured = [launch.kernel for launch in step.launches if launch.kernel is not None]
        assert len(captured) >= 2
        for number in range(200, 205):  # every captured kernel leaves the cache
            distinct_graph(x, number)
        assert not any(kernel in realize._programs.values() for kernel in captured)
        gc.collect()
        realize.release_unused()
        assert not any(code_freed(kernel.program) for kernel in captured)
        check(step, 2)  # the first replay (and the device graph, where there is one) after the eviction
        for number in range(205, 210):
            distinct_graph(x, number)
        gc.collect()
        realize.release_unused()
        check(step, 3)
        assert realize.live_programs() <= 2 + len(captured)
        # the same graph outside the JIT finds its kernels still in memory: no second build
        GlobalCounters.reset()
        doubled = (Tensor(DATA, device=device) * 3 + 2).contiguous().realize()
        np.testing.assert_allclose(doubled.numpy(), DATA * 3 + 2)
        assert any(kernel in realize._programs.values() for kernel in captured)
        programs = [kernel.program for kernel in captured]
        del step, captured, doubled
        for number in range(210, 215):
            distinct_graph(x, number)
        gc.collect()
        realize.release_unused()
        assert all(code_freed(program) for program in programs)


def rss_mib() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="measures memory through /proc")
def test_memory_stays_bounded_over_300_distinct_graphs(device):
    x = Tensor(DATA, device=device).realize()
    with Context(PROGRAM_CACHE=20):
        for number in range(300, 330):
            distinct_graph(x, number)
        gc.collect()
        before = rss_mib()
        for number in range(330, 600):
            distinct_graph(x, number)
            assert realize.live_programs() <= 20
        gc.collect()
        realize.release_unused()
        loaded = loaded_code(device)
        assert loaded is None or loaded <= 21
        # without the bound, 270 kernels keep about 30 MiB on LLVM; with it, growth is noise
        growth = rss_mib() - before
        assert growth < 24, f"RSS grew {growth:.1f} MiB over 270 graphs"


def test_the_limit_must_be_positive_and_a_number():
    for value, expected in [
        ("lots", "PROGRAM_CACHE='lots' is not an integer: PROGRAM_CACHE takes an integer"),
        ("0", "PROGRAM_CACHE=0 is out of range: PROGRAM_CACHE takes an integer >= 1"),
    ]:
        environment = {**os.environ, "PYTHONPATH": ROOT, "PROGRAM_CACHE": value}
        result = subprocess.run(
            [sys.executable, "-c", "import lazygrad"], env=environment, capture_output=True, text=True
        )
        assert result.returncode != 0 and expected in result.stderr


FRESH_PROCESS = textwrap.dedent(
    """
    import gc
    import numpy as np
    from lazygrad import Device, Tensor
    from lazygrad.device import DeviceUnavailable
    from lazygrad.engine import realize
    from lazygrad.engine.jit import TinyJit

    try:
        Device[Device.DEFAULT]
    except (DeviceUnavailable, ImportError) as error:
        print("unavailable:", error)
        raise SystemExit(0)
    data = np.arange(16, dtype=np.float32) - 5
    x = Tensor(data).realize()

    @TinyJit
    def step(tensor):
        return (tensor * 7 - 1).realize()

    for value in range(2):
        np.testing.assert_allclose(step(Tensor(data + value)).numpy(), (data + value) * 7 - 1)
    programs = []
    for number in range(40):
        np.testing.assert_allclose((x * (1000 + number) + 1).numpy(), data * (1000 + number) + 1)
        assert len(realize._programs) <= 3
        programs.append(next(reversed(realize._programs.values())).program)
    np.testing.assert_allclose((x * 1000 + 1).numpy(), data * 1000 + 1)  # evicted, built again
    for value in range(2, 4):  # the step's kernel left the cache long ago
        np.testing.assert_allclose(step(Tensor(data + value)).numpy(), (data + value) * 7 - 1)
    gc.collect()
    realize.release_unused()
    freed = sum(getattr(p, "module", 0) is None if hasattr(p, "module") else p.released for p in programs)
    print("device", Device.DEFAULT, "freed", freed, "live", realize.live_programs())
    assert freed >= 40 - 3 and realize.live_programs() <= 3 + 1
    """
)


@pytest.mark.parametrize(
    "variables",
    [{}, {"CPU": "1"}, {"GPU": "1"}, {"CUDA": "1", "MOCKCUDA": "1"}, {"PYTHON": "1"}],
    ids=["LLVM", "CPU", "GPU", "MOCKCUDA", "PYTHON"],
)
def test_every_device_in_a_fresh_process(variables):
    environment = {key: value for key, value in os.environ.items() if key not in ("LLVM", "CPU", "CLANG", "GPU")}
    environment = {key: value for key, value in environment.items() if key not in ("CUDA", "MOCKCUDA", "PYTHON")}
    environment.update(variables, PYTHONPATH=ROOT, PROGRAM_CACHE="3")
    result = subprocess.run(
        [sys.executable, "-c", FRESH_PROCESS], env=environment, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stdout + result.stderr
    if result.stdout.startswith("unavailable:"):
        pytest.skip(result.stdout.strip())
    assert "freed" in result.stdout


def test_llvm_programs_find_their_own_objects_function_among_objects_of_the_same_name():
    # BEAM builds several candidates of one kernel, each an object defining the same name; a program made later for
    # an object loaded earlier (the kernel the realize before had kept) must run that object's code, not the name's
    # newest definition: another candidate's code run with this one's launch range wrote past the end of a buffer
    import ctypes

    try:
        from lazygrad.runtime.ops_llvm import LLVMCompiler, LLVMProgram

        compiler = LLVMCompiler()
    except (DeviceUnavailable, ImportError) as error:
        pytest.skip(str(error))
    source = "define i32 @answer() {{\n  ret i32 {value}\n}}\n"
    first, second = [compiler.compile(source.format(value=value)) for value in (1, 2)]
    binaries = LLVMProgram.binaries

    def answer(binary: bytes) -> tuple[bytes, int]:
        digest, address = binaries.acquire(binary, lambda engine: engine.engine.get_function_address("answer"))
        return digest, ctypes.CFUNCTYPE(ctypes.c_int32)(address)()

    acquired = [answer(first), answer(second), answer(first)]
    assert [value for _, value in acquired] == [1, 2, 1]
    engine = binaries.loaded[acquired[0][0]][0]
    for digest, _ in acquired:
        binaries.release(digest)
    assert engine.engine.closed and acquired[0][0] not in binaries.loaded  # the last release frees the code


def test_a_released_program_refuses_to_run(device):
    x = Tensor(DATA, device=device).realize()
    with Context(PROGRAM_CACHE=1):
        distinct_graph(x, 900)
        program = newest_kernel().program
        distinct_graph(x, 901)
        gc.collect()
        realize.release_unused()
    assert code_freed(program)
    if device != "PYTHON":  # the emulator has no device code to lose
        memory = buffer_of(x.uop.base).handle
        with pytest.raises(RuntimeError, match="released"):
            program(memory, memory)


@pytest.mark.parametrize("name", ["LLVM", "CPU"])
def test_a_repeated_schedule_with_a_large_kernel_runs_as_one_graph_built_again_after_an_eviction(name):
    """On a host device a repeated schedule whose kernels are built, one of them large enough to share with the other
    cores, runs as one graph call (its workers start once for the schedule); the plan holds its kernels weakly, so
    they leave the cache and free their code as any other, and the graph is made again from the kernels built anew."""
    from lazygrad.device import CORES

    if CORES < 2:
        pytest.skip("one core: nothing to share")
    device = available(name)
    data = np.arange(512 * 256, dtype=np.float32).reshape(512, 256) / 4096
    x = Tensor(data, device=device).realize()

    def step() -> np.ndarray:
        return ((x * 2.5).exp().sum(1) + x.max(1)).numpy()

    expected = np.exp(data * 2.5).sum(1) + data.max(1)
    np.testing.assert_allclose(step(), expected, rtol=1e-5)
    graphs = []
    original = realize.run_as_graph

    def counting(plan, kernels, buffers):
        ran = original(plan, kernels, buffers)
        graphs.append(plan.graph[1] if ran else None)
        return ran

    with Context(PROGRAM_CACHE=2):
        realize.run_as_graph = counting
        try:
            np.testing.assert_allclose(step(), expected, rtol=1e-5)
            first = graphs[-1]
            assert first is not None and first.shared
            for number in range(300, 304):  # the step's kernels leave the cache
                distinct_graph(Tensor(DATA, device=device).realize(), number)
            gc.collect()
            realize.release_unused()
            assert all(code_freed(program) for program in first.programs)
            np.testing.assert_allclose(step(), expected, rtol=1e-5)  # built again, launched one by one
            np.testing.assert_allclose(step(), expected, rtol=1e-5)  # a graph of the new kernels
            assert graphs[-1] is not None and graphs[-1] is not first
        finally:
            realize.run_as_graph = original
