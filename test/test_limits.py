"""Limits: kernels with more inputs than one call can pass, Python numbers that do not fit a tensor's dtype, class
labels out of range and integer tensors asked for gradients. Every case either computes what NumPy or PyTorch
computes or raises an error that names the op, the value and the fix."""

import functools

import numpy as np
import pytest

from lazygrad import Device, Tensor
from lazygrad.device import DeviceUnavailable
from lazygrad.engine import schedule as scheduler

DEVICES = ["LLVM", "CPU", "GPU", "CUDA", "PYTHON"]


@pytest.fixture(params=DEVICES)
def device(request) -> str:
    """A device's name, or a skip saying why it cannot run here."""
    try:
        Device[request.param]
    except DeviceUnavailable as error:
        pytest.skip(str(error))
    return request.param


# ---- kernels with many inputs -------------------------------------------------------------------------------------


def test_a_kernel_reads_more_buffers_than_a_call_can_pass(device):
    # ctypes calls take at most 1024 arguments: host kernels take one array of addresses instead
    arrays = [np.arange(3, dtype=np.float32) * (number % 7) + number for number in range(1030)]
    total = functools.reduce(lambda x, y: x + y, [Tensor(array, device=device) for array in arrays])
    kernels = total.schedule()
    limit = Device[device].max_buffers
    if limit is None or limit > 1031:
        assert [len(kernel.buffers) for kernel in kernels] == [1031]
    else:  # the device limits a kernel's parameters (OpenCL's CL_DEVICE_MAX_PARAMETER_SIZE): kernels stay within it
        assert len(kernels) > 1 and max(len(kernel.buffers) for kernel in kernels) <= limit
    np.testing.assert_allclose(total.numpy(), np.sum(arrays, axis=0), rtol=1e-6)


@pytest.fixture
def limit_of_eight(monkeypatch):
    """The default device taking at most 8 buffers per kernel, with the schedules planned so far forgotten."""
    monkeypatch.setattr(Device[Device.DEFAULT], "max_buffers", 8)
    monkeypatch.setattr(scheduler, "_plans", {})


def test_the_scheduler_keeps_kernels_within_the_device_limit(limit_of_eight):
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal((4, 5)).astype(np.float32) for _ in range(16)]
    tensors = [Tensor(array) for array in arrays]
    added = functools.reduce(lambda x, y: x + y, tensors)
    # a reduce over a wide sum, a select of three wide operands, and a result read by two kernels
    reduced = (added * tensors[0]).sum(axis=1)
    chosen = (tensors[1] > 0).where(added, functools.reduce(lambda x, y: x * 0.5 + y, tensors[::-1]))
    kernels = Tensor.schedule(reduced, chosen)
    assert max(len(kernel.buffers) for kernel in kernels) <= 8
    total = np.sum(arrays, axis=0, dtype=np.float32)
    halved = functools.reduce(lambda x, y: x * np.float32(0.5) + y, arrays[::-1])
    np.testing.assert_allclose(reduced.numpy(), (total * arrays[0]).sum(axis=1), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(chosen.numpy(), np.where(arrays[1] > 0, total, halved), rtol=1e-5, atol=1e-5)


def test_gradients_through_a_split_kernel(limit_of_eight):
    arrays = [np.full(3, number + 1, np.float32) for number in range(12)]
    tensors = [Tensor(array, requires_grad=True) for array in arrays]
    product = functools.reduce(lambda x, y: x * y, [t / (i + 1) for i, t in enumerate(tensors)])
    (product.sum() + functools.reduce(lambda x, y: x + y, tensors).sum()).backward()
    # every factor is 1, so d(product)/d(t_i) = 1/t_i = 1/(i+1), and the plain sum adds 1
    for number, tensor in enumerate(tensors):
        np.testing.assert_allclose(tensor.grad.numpy(), np.full(3, 1 + 1 / (number + 1), np.float32), rtol=1e-5)
