"""Every test session starts from an empty disk cache of its own: kept kernels and binaries of an earlier session
(or of another version of the code) never stand in for what a test means to generate and compile. The process that
made it (with xdist, the controller, whose workers inherit it) removes it when it exits. Every test also starts and
ends in eval mode with gradients on, whatever it sets."""

import atexit
import os
import shutil
import tempfile

import pytest

if not os.environ.get("LAZYGRAD_CACHE"):
    os.environ["LAZYGRAD_CACHE"] = tempfile.mkdtemp(prefix="lazygrad-test-cache-")
    atexit.register(shutil.rmtree, os.environ["LAZYGRAD_CACHE"], ignore_errors=True)


@pytest.fixture(autouse=True)
def _modes_restored():
    from lazygrad import Tensor  # (imported once the cache above is set)

    Tensor.training, Tensor.no_grad = False, False
    yield
    Tensor.training, Tensor.no_grad = False, False


@pytest.fixture
def torch():
    """torch, or the test is skipped where it is not installed."""
    return pytest.importorskip("torch")
