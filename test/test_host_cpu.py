"""LAZYGRAD_CPU: the host devices generate code (and choose register blocks) for a named CPU, checked in a fresh
interpreter, since the CPU is read once per process; and the C device's code for AVX-512 CPUs, which gcc 12
miscompiled."""

import os
import subprocess
import sys

import pytest

from lazygrad.runtime.host_cpu import cpuinfo_flags, named_cpu
from lazygrad.runtime.ops_cpu import miscompiled

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

# selects whose vectorized code gcc 12 miscompiles on AVX-512 CPUs (see ops_cpu.IF_CONVERSION_OFF)
SELECTS = """
import numpy as np
from lazygrad import Tensor, dtypes
rng = np.random.default_rng(1)
# between doubles converted from floats, one of them flipped: a masked vcvtss2sd, right in the low lane only
a, b, c = [rng.standard_normal((2, 1, 6, 5)).astype(np.float32) for _ in range(3)]
A, B, C = [Tensor(v).cast(dtypes.float64).expand(2, 3, 6, 5) for v in (a, b, c)]
expected = np.broadcast_to(np.where(a > 0, b, c[..., ::-1]), (2, 3, 6, 5))
np.testing.assert_array_equal((A > 0).where(B, C.flip(-1)).numpy(), expected)
# between flipped int64s converted to floats, on floats cast to int64: masked loads that lose the flip
c, d = [(rng.standard_normal((40, 2)) * 4).astype(np.float32) for _ in range(2)]
x, y = [rng.integers(-20, 21, (40, 2)) for _ in range(2)]
condition = Tensor(c).cast(dtypes.int64) > Tensor(d).flip(1).cast(dtypes.int64)
selected = condition.where(Tensor(x).flip(1).cast(dtypes.float32), Tensor(y).flip(1).cast(dtypes.float32))
expected = np.where(c.astype(np.int64) > d[:, ::-1].astype(np.int64), x[:, ::-1], y[:, ::-1]).astype(np.float32)
np.testing.assert_array_equal(selected.numpy(), expected)
print("ok")
"""
SKYLAKE_AVX512_FLAGS = {"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"}


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


# this machine's CPU, and (where this machine can run its code) an AVX-512 one: elsewhere the first passes trivially
@pytest.mark.parametrize("cpu", ["", "skylake-avx512"])
def test_c_selects_between_flipped_converted_values_are_right_on_avx512(cpu, tmp_path):
    if cpu and not SKYLAKE_AVX512_FLAGS <= cpuinfo_flags():
        pytest.skip(f"this machine cannot run code for {cpu}")
    result = run(SELECTS, CPU="1", LAZYGRAD_CACHE=str(tmp_path), **({"LAZYGRAD_CPU": cpu} if cpu else {}))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_gcc_code_with_a_masked_load_or_a_masked_scalar_conversion_is_compiled_again(tmp_path):
    # (what ops_cpu.miscompiled reads: gcc's optimized GIMPLE and the assembler's listing, kept beside the library)
    (tmp_path / "kernel.gimple").write_text("  vect_x_1.5_12 = MEM <vector(16) float> [(float *)_3];\n")
    (tmp_path / "kernel.lst").write_text("  36 0082 62F1FD29 \t\tvblendmpd\t%xmm1, %xmm0, %xmm2{%k1}\n")
    assert not miscompiled(str(tmp_path))
    (tmp_path / "kernel.lst").write_text("  37 0088 62D1760B \t\tvcvtss2sd\t%xmm13, %xmm1, %xmm0{%k3}\n")
    assert miscompiled(str(tmp_path))
    (tmp_path / "kernel.lst").write_text("  37 0088 C5F25AC5 \t\tvcvtss2sd\t%xmm13, %xmm1, %xmm0\n")
    assert not miscompiled(str(tmp_path))
    (tmp_path / "kernel.gimple").write_text("  vect_patt_1 = .MASK_LOAD (vectp.47_311, 64B, mask_patt_11.46_303);\n")
    assert miscompiled(str(tmp_path))
