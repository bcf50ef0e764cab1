"""Random-graph fuzz tests: a few hundred seeds of extra/fuzz.py, each comparing lazygrad with NumPy.

Each seed builds a small random program of elementwise, reduce and movement ops (see extra/fuzz.py).
A failure names the seed and the ops; ``python extra/fuzz.py --show SEED`` prints a runnable reproducer.
"""

import importlib.util
import sys
from pathlib import Path

import pytest

SEEDS = 300


def load_fuzzer():
    """Import extra/fuzz.py by its file path (extra/ is not a package)."""
    path = Path(__file__).resolve().parent.parent / "extra" / "fuzz.py"
    spec = importlib.util.spec_from_file_location("lazygrad_extra_fuzz", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up here while it executes
    spec.loader.exec_module(module)
    return module


fuzz = load_fuzzer()


@pytest.mark.parametrize("seed", range(SEEDS))
def test_fuzz_seed(seed: int) -> None:
    """The lazygrad and NumPy versions of the seed's random program agree."""
    fuzz.run_seed(seed)
