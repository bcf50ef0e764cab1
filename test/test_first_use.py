"""A new user's first lines, each in a fresh interpreter with an empty compile cache, on every device that runs here.

A long test process has realized many things before any one test runs, which hides what goes wrong the first time:
these snippets run alone, each in its own process, and check their values against NumPy or PyTorch.
"""

import functools
import os
import subprocess
import sys
import tempfile
import textwrap

import pytest

REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEVICES = {
    "LLVM": {},
    "CPU": {"CPU": "1"},
    "GPU": {"GPU": "1"},
    "CUDA": {"CUDA": "1", "MOCKCUDA": "1"},
    "PYTHON": {"PYTHON": "1"},
}


def run_fresh(code: str, device: str, cache: str, timeout: int = 240) -> subprocess.CompletedProcess:
    """Run `code` in a new interpreter on `device`, with `cache` as its (empty) compile cache."""
    env = {key: value for key, value in os.environ.items() if key not in ("LLVM", "CPU", "CLANG", "GPU", "CUDA")}
    env = {key: value for key, value in env.items() if key not in ("PYTHON", "MOCKCUDA", "DEBUG", "NOOPT", "BEAM")}
    env.update(DEVICES[device], LAZYGRAD_CACHE=cache, PYTHONPATH=REPOSITORY)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=REPOSITORY,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@functools.cache
def unavailable(device: str) -> str | None:
    """Why `device` cannot run here, or None."""
    probe = "from lazygrad import Device; print(Device.DEFAULT); Device[Device.DEFAULT]"
    with tempfile.TemporaryDirectory(prefix="lazygrad-probe-") as cache:
        result = run_fresh(probe, device, cache, timeout=120)
    return None if result.returncode == 0 else (result.stderr.strip().splitlines() or ["unknown error"])[-1]


@pytest.fixture(params=list(DEVICES))
def device(request) -> str:
    reason = unavailable(request.param)
    if reason is not None:
        pytest.skip(f"{request.param} unavailable: {reason}")
    return request.param


SNIPPETS = {
    # the first layer a new user makes, applied at once: its output matches its own (then read) weights
    "linear": """
        import numpy as np
        from lazygrad import Tensor, nn
        layer = nn.Linear(3, 4)
        out = layer(Tensor.ones(1, 3)).numpy()
        expected = np.ones((1, 3), np.float32) @ layer.weight.numpy().T + layer.bias.numpy()
        np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)
        bound = 1 / np.sqrt(3)
        assert np.all(np.abs(layer.weight.numpy()) <= bound) and np.all(np.abs(layer.bias.numpy()) <= bound)
    """,
    # wide enough that its fresh weights, read through the product's expand, are worth a buffer of their own (that
    # decision once looped forever on a random weight)
    "wide_linear": """
        import numpy as np
        from lazygrad import Tensor, nn
        layer = nn.Linear(128, 64)
        out = layer(Tensor.ones(8, 128)).numpy()
        expected = np.ones((8, 128), np.float32) @ layer.weight.numpy().T + layer.bias.numpy()
        np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-5)
    """,
    "two_random_tensors": """
        import numpy as np
        from lazygrad import Tensor
        a, b = Tensor.rand(3), Tensor.rand(3)
        total = (a + b).numpy()
        np.testing.assert_allclose(total, a.numpy() + b.numpy(), rtol=1e-6)
        assert np.all((a.numpy() >= 0) & (a.numpy() < 1)) and not np.array_equal(a.numpy(), b.numpy())
    """,
    "random_matmul": """
        import numpy as np
        from lazygrad import Tensor
        a, b = Tensor.randn(24, 24), Tensor.randn(24, 24)
        product = (a @ b).numpy()
        np.testing.assert_allclose(product, a.numpy() @ b.numpy(), rtol=1e-4, atol=1e-4)
        # 576 standard normal draws: the mean's standard error is 1/24, so 0.25 is six of them
        assert 0.8 < a.numpy().std() < 1.2 and abs(a.numpy().mean()) < 0.25
    """,
    "seeded_product": """
        import numpy as np
        from lazygrad import Tensor
        Tensor.manual_seed(1)
        a, b = Tensor.randn(2), Tensor.randn(2)
        product = (a * b).numpy()
        np.testing.assert_allclose(product, a.numpy() * b.numpy(), rtol=1e-6)
        print(repr(product.tolist()))
    """,
    # two layers realized together: the output uses the weights the layers keep (PyTorch computes the reference)
    "fresh_conv_layers": """
        import numpy as np, torch
        from lazygrad import Tensor, nn
        c1, c2 = nn.Conv2d(4, 4, 3, padding=1, bias=False), nn.Conv2d(4, 4, 3, padding=1, bias=False)
        x = Tensor(np.random.default_rng(0).standard_normal((1, 4, 6, 6)).astype(np.float32)).realize()
        y = c2(c1(x).relu()).numpy()
        w1, w2 = torch.tensor(c1.weight.numpy()), torch.tensor(c2.weight.numpy())
        expected = torch.conv2d(torch.conv2d(torch.tensor(x.numpy()), w1, padding=1).relu(), w2, padding=1)
        np.testing.assert_allclose(y, expected.numpy(), rtol=1e-4, atol=1e-4)
    """,
    # the first training step's gradients are taken at the weights the layer keeps
    "first_gradient": """
        import numpy as np
        from lazygrad import Tensor, nn
        layer = nn.Linear(5, 2)
        x = np.random.default_rng(0).standard_normal((4, 5)).astype(np.float32)
        (layer(Tensor(x)) ** 2).sum().backward()
        w, b = layer.weight.numpy(), layer.bias.numpy()
        out = x @ w.T + b
        np.testing.assert_allclose(layer.weight.grad.numpy(), (2 * out).T @ x, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(layer.bias.grad.numpy(), (2 * out).sum(0), rtol=1e-4, atol=1e-5)
    """,
}


@pytest.mark.parametrize("name", list(SNIPPETS))
def test_first_use(name, device, tmp_path):
    result = run_fresh(SNIPPETS[name], device, str(tmp_path / "cache"))
    assert result.returncode == 0, f"{name} on {device}:\n{result.stdout}\n{result.stderr}"


def test_seeded_numbers_repeat_across_processes_and_devices(tmp_path):
    """The same seed gives the same numbers in a new process, on every device."""
    outputs = {}
    for device in DEVICES:
        if unavailable(device) is None:
            result = run_fresh(SNIPPETS["seeded_product"], device, str(tmp_path / device))
            assert result.returncode == 0, result.stderr
            outputs[device] = [float(value) for value in result.stdout.strip().strip("[]").split(",")]
    again = run_fresh(SNIPPETS["seeded_product"], "LLVM", str(tmp_path / "again"))
    reference = outputs["LLVM"]
    assert [float(value) for value in again.stdout.strip().strip("[]").split(",")] == reference
    for device, values in outputs.items():
        assert values == pytest.approx(reference, rel=1e-5), device
