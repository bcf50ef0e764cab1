"""Random-graph fuzz tests on the selected device: seeds of extra/fuzz.py, each comparing lazygrad with NumPy; seeds
of extra/fuzz_opts.py, each running every kernel of such a program with many optimization action lists; and the
programs the fuzzer found wrong, kept as regression tests.

Each seed builds a small random program of elementwise, reduce and movement ops over arrays, random numbers and
aranges (see extra/fuzz.py). A failure names the seed and the ops; ``python extra/fuzz.py --show SEED`` prints a
runnable reproducer. CI runs this file on every device; the seed count is per device (compiling dominates, and
the devices compile at very different speeds), chosen so that each run takes at most about two minutes on two cores.
"""

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

from lazygrad import Device, Tensor

# seeds per device; a seed costs about 0.1 s of CPU time on LLVM, 0.3 s on CPU (cc), 0.75 s on GPU (PoCL), 0.55 s on
# CUDA with MOCKCUDA (NVRTC and g++) and 0.06 s on PYTHON: the compiled devices run fewer (CI runs each device's
# suites on two cores, in well under half an hour in all), LLVM and the PYTHON reference the most
SEEDS = {"LLVM": 500, "CPU": 200, "GPU": 100, "CUDA": 100, "PYTHON": 1500}


# seeds of extra/fuzz_opts.py per device: each kernel of a seed's random program and of one of its GPU-shaped graphs
# run with the heuristic's action list, every list BEAM would time and random ones; a seed costs about 0.5 s of a CI
# run on LLVM, 1.5 s on CPU, 2 s on GPU (PoCL), 4.5 s on CUDA with MOCKCUDA (g++ builds each list) and 0.35 s on
# PYTHON, the device that runs the GPU-shaped kernels (threads, shared memory, shuffles) cheapest
OPT_SEEDS = {"LLVM": 40, "CPU": 10, "GPU": 12, "CUDA": 8, "PYTHON": 120}


def load_extra(name: str):
    """Import extra/<name>.py by its file path (extra/ is not a package)."""
    path = Path(__file__).resolve().parent.parent / "extra" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"lazygrad_extra_{name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up here while it executes
    spec.loader.exec_module(module)
    return module


fuzz, fuzz_opts = load_extra("fuzz"), load_extra("fuzz_opts")


@pytest.mark.parametrize("seed", range(SEEDS.get(Device.DEFAULT, min(SEEDS.values()))))
def test_fuzz_seed(seed: int) -> None:
    """The lazygrad and NumPy versions of the seed's random program agree."""
    fuzz.run_seed(seed)


@pytest.mark.parametrize("seed", range(OPT_SEEDS.get(Device.DEFAULT, min(OPT_SEEDS.values()))))
def test_action_lists_keep_each_kernel(seed: int) -> None:
    """Every kernel of the seed's program computes the same values with any action list it accepts as without one."""
    assert fuzz_opts.run_seed(seed, lists=4) == []


# (op, rows, padding): relu of one array combined with a second, read as rows of two through a pad of both dims
PADDED_ROWS = [
    ("sub", 8, ((2, 0), (1, 1))),  # squared afterwards: the program first seen wrong
    ("add", 12, ((2, 0), (1, 0))),
    ("mul", 33, ((3, 2), (2, 0))),
    ("add", 27, ((3, 1), (2, 1))),  # rows of 5: the row loop is unrolled by the compiler, not by codegen
]


@pytest.mark.parametrize("operation, rows, padding", PADDED_ROWS)
def test_padded_rows_of_relu(operation, rows, padding):
    """CPU=1 once got rows of zeros and values read past the buffers here: gcc 12 vectorized each row's gated loads
    as a group of masked loads and gave every vector of the group after the first the first one's mask."""
    rng = np.random.default_rng(rows)
    a, b = (rng.uniform(-2, 2, rows * 2).astype(np.float32) for _ in range(2))
    combine = {"add": lambda x, y: x + y, "sub": lambda x, y: x - y, "mul": lambda x, y: x * y}[operation]
    result, expected = combine(Tensor(a).relu(), Tensor(b)), combine(np.maximum(a, np.float32(0)), b)
    if operation == "sub":
        result, expected = result * result, expected * expected
    padded = result.reshape(rows, 2).pad(padding).numpy()
    np.testing.assert_allclose(padded, np.pad(expected.reshape(rows, 2), padding), rtol=1e-6, atol=1e-6)
