"""LAZYGRAD_CPU: the host devices generate code (and choose register blocks) for a named CPU, checked in a fresh
interpreter, since the CPU is read once per process."""

import os
import subprocess
import sys

import pytest

from lazygrad.runtime.host_cpu import named_cpu

REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PRODUCT = """
import numpy as np
from lazygrad import Tensor
from lazygrad.runtime.host_cpu import host_cpu
rng = np.random.default_rng(0)
a, b = rng.standard_normal((96, 160), dtype=np.float32), rng.standard_normal((160, 64), dtype=np.float32)
np.testing.assert_allclose((Tensor(a) @ Tensor(b)).relu().numpy(), np.maximum(a @ b, 0), rtol=1e-4, atol=1e-4)
print(host_cpu().describe())
"""


def run(code: str, **env: str) -> subprocess.CompletedProcess:
    names = ("LLVM", "CPU", "CLANG", "GPU", "CUDA", "PYTHON", "LAZYGRAD_CPU")
    environment = {key: value for key, value in os.environ.items() if key not in names}
    environment.update(env, PYTHONPATH=REPOSITORY)
    return subprocess.run([sys.executable, "-c", code], env=environment, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("device", ["LLVM", "CPU"])
@pytest.mark.parametrize("cpu, described", [("haswell", "16 registers, FMA"), ("sandybridge", "16 registers, no FMA")])
def test_code_for_an_avx_cpu_computes_the_same_values(device, cpu, described, tmp_path):
    result = run(PRODUCT, LAZYGRAD_CPU=cpu, LAZYGRAD_CACHE=str(tmp_path), **{device: "1"})
    assert result.returncode == 0, result.stderr
    # (its weights are copied onto the stack, as much as this machine's L2 cache allows)
    assert f"{cpu} (LAZYGRAD_CPU; 8 floats a vector, {described}; this machine's L2 cache" in result.stdout


def test_the_stack_copies_take_half_of_this_machines_l2_cache_at_most_256_kib(monkeypatch):
    from lazygrad.runtime import host_cpu

    assert host_cpu.l2_cache_bytes() >= 64 * 1024
    assert named_cpu("haswell").target.pack_bytes == min(host_cpu.l2_cache_bytes() // 2, 256 * 1024)
    # where sysfs does not say, the smallest L2 in use
    host_cpu.l2_cache_bytes.cache_clear()
    monkeypatch.setattr(host_cpu.os, "listdir", lambda folder: (_ for _ in ()).throw(OSError("no sysfs")))
    try:
        assert host_cpu.l2_cache_bytes() == host_cpu.DEFAULT_L2_BYTES
    finally:
        monkeypatch.undo()
        host_cpu.l2_cache_bytes.cache_clear()


def test_cpu_names_and_their_vectors():
    assert (named_cpu("skylake-avx512").vector_width, named_cpu("skylake-avx512").vector_registers) == (16, 32)
    assert (named_cpu("znver3").vector_width, named_cpu("znver3").vector_registers) == (8, 16)
    assert named_cpu("x86-64").vector_width == 4
    assert named_cpu("haswell").fma and named_cpu("bdver1").fma  # (AMD's FMA4)
    assert not named_cpu("ivybridge").fma and not named_cpu("x86-64-v2").fma


def test_an_unknown_cpu_name_is_an_error_naming_the_variable(tmp_path):
    result = run("import lazygrad.runtime.host_cpu as h; h.host_cpu()", LAZYGRAD_CPU="pentium-ultra")
    assert result.returncode != 0
    assert "LAZYGRAD_CPU='pentium-ultra' is not an x86-64 CPU lazygrad knows" in result.stderr
    assert "haswell" in result.stderr and "left unset for this machine's CPU" in result.stderr
