"""PyTorch checkpoints read without torch (`nn.state.torch_load`) and `load_state_dict`'s key and shape checks.

Checkpoints are written by torch.save here; torch_load itself never imports torch (one test proves it in a process
where importing torch fails). Pickles that name anything but tensors and containers must be refused before any of
their code runs."""

import io
import os
import pickle
import subprocess
import sys
import zipfile

import numpy as np
import pytest
from test_ops import assert_tensor

from lazygrad import Device, Tensor, dtypes, nn
from lazygrad.nn.state import get_state_dict, load_state_dict, torch_load

torch = pytest.importorskip("torch")

TORCH_DTYPES = [
    (torch.float32, dtypes.float32),
    (torch.float16, dtypes.float16),
    (torch.float64, dtypes.float64),
    (torch.int64, dtypes.int64),
    (torch.int32, dtypes.int32),
    (torch.int16, dtypes.int16),
    (torch.int8, dtypes.int8),
    (torch.uint8, dtypes.uint8),
    (torch.bool, dtypes.bool),
]


@pytest.mark.parametrize("torch_dtype, dtype", TORCH_DTYPES, ids=[str(d[0]) for d in TORCH_DTYPES])
def test_torch_load_dtypes(tmp_path, torch_dtype, dtype):
    values = (torch.arange(-6, 6).reshape(3, 4) * 7).to(torch_dtype)
    torch.save({"values": values}, tmp_path / "x.pth")
    loaded = torch_load(str(tmp_path / "x.pth"))["values"]
    expected = values.numpy()
    assert_tensor(loaded, expected.astype(dtype.np), dtype=dtype)


def test_torch_load_keeps_bfloat16(tmp_path):
    values = torch.tensor([[1.5, -2.25, 3e38], [1e-3, float("inf"), float("nan")]]).to(torch.bfloat16)
    torch.save({"w": values, "w_t": values.t()}, tmp_path / "x.pth")
    loaded = torch_load(str(tmp_path / "x.pth"))
    assert_tensor(loaded["w"], values.float().numpy(), dtype=dtypes.bfloat16, rtol=0, atol=0)
    assert_tensor(loaded["w_t"], values.t().float().numpy(), dtype=dtypes.bfloat16, rtol=0, atol=0)
    # it computes as bfloat16, as the torch tensor does
    assert_tensor(loaded["w"] * 3, (values * 3).float().numpy(), dtype=dtypes.bfloat16, rtol=0, atol=0)


def test_torch_load_views_shared_storage_and_containers(tmp_path):
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    checkpoint = {
        "transposed": base.t(),
        "sliced": base[1:, ::2],
        "shared": base,
        "nested": {"list": [base[0], torch.tensor(3.5)], "tuple": (torch.ones(2, dtype=torch.int32), "text", 7)},
        "parameter": torch.nn.Parameter(torch.full((2, 2), 0.5)),
        "number": 1.25,
        "empty": torch.zeros(0, 3),
    }
    torch.save(checkpoint, tmp_path / "x.pth")
    loaded = torch_load(str(tmp_path / "x.pth"))
    assert_tensor(loaded["transposed"], base.t().numpy())
    assert_tensor(loaded["sliced"], base[1:, ::2].numpy())
    assert_tensor(loaded["shared"], base.numpy())
    assert_tensor(loaded["nested"]["list"][0], base[0].numpy())
    assert_tensor(loaded["nested"]["list"][1], np.float32(3.5))
    assert isinstance(loaded["nested"]["tuple"], tuple) and loaded["nested"]["tuple"][1:] == ("text", 7)
    assert_tensor(loaded["nested"]["tuple"][0], np.ones(2, np.int32))
    assert_tensor(loaded["parameter"], np.full((2, 2), 0.5, np.float32))
    assert loaded["number"] == 1.25
    assert loaded["empty"].shape == (0, 3)


def test_torch_load_into_a_model(tmp_path):
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Conv2d(2, 3, 3), torch.nn.BatchNorm2d(3))
    module.eval()
    torch.save(module.state_dict(), tmp_path / "model.pth")

    class Model:
        def __init__(self):
            self.layers = [nn.Conv2d(2, 3, 3), nn.BatchNorm2d(3)]

        def __call__(self, x):
            return self.layers[1](self.layers[0](x))

    model = Model()
    state = {
        key.replace("0.", "layers.0.", 1).replace("1.", "layers.1.", 1): value
        for key, value in torch_load(str(tmp_path / "model.pth")).items()
    }
    load_state_dict(model, state)
    x = np.random.default_rng(0).standard_normal((1, 2, 5, 5)).astype(np.float32)
    with torch.no_grad():
        expected = module(torch.tensor(x)).numpy()
    assert_tensor(model(Tensor(x)), expected, atol=1e-5)


class RunsCode:
    def __reduce__(self):
        return (os.system, ("touch /tmp/lazygrad-torch-load-pwned",))


def _checkpoint_with_pickle(path, payload: bytes) -> None:
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("archive/data.pkl", payload)
        archive.writestr("archive/version", "3\n")


def test_torch_load_refuses_code(tmp_path):
    marker = "/tmp/lazygrad-torch-load-pwned"
    if os.path.exists(marker):
        os.remove(marker)
    path = tmp_path / "evil.pth"
    _checkpoint_with_pickle(path, pickle.dumps({"weight": RunsCode()}, protocol=2))
    with pytest.raises(
        pickle.UnpicklingError, match=r"asks for (posix|os)\.system, which is not a tensor or a container"
    ):
        torch_load(str(path))
    assert not os.path.exists(marker)
    # the same through torch.save, wrapped in a real checkpoint
    torch.save({"weight": torch.ones(2), "evil": RunsCode()}, tmp_path / "evil2.pth")
    with pytest.raises(pickle.UnpicklingError, match="is refused"):
        torch_load(str(tmp_path / "evil2.pth"))
    assert not os.path.exists(marker)


def test_torch_load_refuses_whole_modules(tmp_path):
    torch.save(torch.nn.Linear(2, 2), tmp_path / "module.pth")
    with pytest.raises(pickle.UnpicklingError, match=r"torch\.nn\.modules\.linear\.Linear.*Save a state_dict"):
        torch_load(str(tmp_path / "module.pth"))


def test_torch_load_errors(tmp_path):
    (tmp_path / "text.pth").write_text("not a checkpoint")
    with pytest.raises(ValueError, match="is not a zip archive: only torch.save's zip format"):
        torch_load(str(tmp_path / "text.pth"))
    torch.save({"x": torch.ones(2)}, tmp_path / "legacy.pth", _use_new_zipfile_serialization=False)
    with pytest.raises(ValueError, match="is not a zip archive"):
        torch_load(str(tmp_path / "legacy.pth"))
    # a storage shorter than the tensors in it claim
    torch.save({"x": torch.ones(8)}, tmp_path / "x.pth")
    with zipfile.ZipFile(tmp_path / "x.pth") as source, zipfile.ZipFile(tmp_path / "short.pth", "w") as target:
        for name in source.namelist():
            content = source.read(name)
            target.writestr(name, content[:8] if name.endswith("/data/0") else content)
    with pytest.raises(ValueError, match=r"storage '0' in .* holds 8 bytes, fewer than 8 FloatStorage elements"):
        torch_load(str(tmp_path / "short.pth"))


def test_torch_load_without_torch(tmp_path):
    torch.save({"w": torch.arange(6, dtype=torch.float32).reshape(2, 3).t()}, tmp_path / "x.pth")
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "from lazygrad.nn.state import torch_load\n"
        f"print(torch_load({str(tmp_path / 'x.pth')!r})['w'].numpy().tolist())"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[[0.0, 3.0], [1.0, 4.0], [2.0, 5.0]]"


# ---------------------------------------------------------------------------------------------------------------------
# load_state_dict


class Pair:
    def __init__(self):
        self.first, self.second = nn.Linear(3, 2), nn.Linear(2, 1)


def _state(model) -> dict:
    return {name: Tensor(np.full(t.shape, 0.5, np.float32)) for name, t in get_state_dict(model).items()}


def test_load_state_dict_names_every_problem():
    model = Pair()
    state = _state(model)
    del state["second.bias"]
    state["third.weight"] = Tensor([1.0])
    state["first.weight"] = Tensor(np.zeros((3, 3), np.float32))
    with pytest.raises(KeyError) as error:
        load_state_dict(model, state)
    message = str(error.value)
    assert "missing keys ['second.bias']" in message
    assert "unexpected keys ['third.weight']" in message
    assert "first.weight: (3, 3) in the state dict, (2, 3) in the model" in message
    assert "strict=False" in message


def test_state_dicts_of_objects_with_back_references_and_slots():
    """A reference back to an object that holds this one (a layer's parent) is not followed (it recursed without
    end); attributes kept in __slots__ are found as those in __dict__."""

    class Child:
        def __init__(self, parent):
            self.parent, self.weight = parent, Tensor.ones(2)

    class Slotted:
        __slots__ = ("weight", "bias")

        def __init__(self):
            self.weight, self.bias = Tensor.ones(2), Tensor.zeros(3)

    class Model:
        def __init__(self):
            self.child, self.layers, self.slotted = Child(self), [], Slotted()
            self.layers.append(self.layers)

    assert sorted(get_state_dict(Model())) == ["child.weight", "slotted.bias", "slotted.weight"]


def test_load_state_dict_takes_lists_and_names_their_shapes():
    model = Pair()
    state = {name: np.ones(t.shape, np.float32).tolist() for name, t in get_state_dict(model).items()}
    load_state_dict(model, state)
    assert_tensor(model.first.bias, np.ones(2, np.float32))
    state["first.bias"] = [1.0, 2.0, 3.0]
    with pytest.raises(KeyError, match=r"first.bias: \(3,\) in the state dict, \(2,\) in the model"):
        load_state_dict(model, state)


def test_load_state_dict_not_strict():
    model = Pair()
    before = model.second.bias.numpy().copy()
    state = _state(model)
    del state["second.bias"]
    state["extra"] = Tensor([1.0])
    load_state_dict(model, state, strict=False)
    assert_tensor(model.first.weight, np.full((2, 3), 0.5, np.float32))
    assert_tensor(model.second.bias, before)
    state["first.bias"] = Tensor(np.zeros(5, np.float32))
    with pytest.raises(
        KeyError, match=r"shape mismatches \[first.bias: \(5,\) in the state dict, \(2,\) in the model\]"
    ):
        load_state_dict(model, state, strict=False)


def test_load_state_dict_casts_and_rejects_non_dicts():
    model = Pair()
    state = {name: Tensor(np.ones(t.shape, np.float16)) for name, t in get_state_dict(model).items()}
    load_state_dict(model, state)
    assert model.first.weight.dtype == dtypes.float32
    assert_tensor(model.first.weight, np.ones((2, 3), np.float32))
    with pytest.raises(TypeError, match="load_state_dict: expected a dict of tensors, got list"):
        load_state_dict(model, [1, 2])


def test_torch_load_from_bytes_buffer_is_not_a_path(tmp_path):
    buffer = io.BytesIO()
    torch.save({"x": torch.ones(1)}, buffer)
    (tmp_path / "x.pth").write_bytes(buffer.getvalue())
    assert_tensor(torch_load(str(tmp_path / "x.pth"))["x"], np.ones(1, np.float32))


def test_load_state_dict_takes_float64_arrays_where_the_device_has_no_doubles(monkeypatch):
    # NumPy values go straight into each parameter's dtype: a float64 array never becomes a float64 tensor
    monkeypatch.setattr(Device[Device.DEFAULT], "unsupported_dtypes", {dtypes.float64: "no doubles"})
    model = Pair()
    load_state_dict(model, {name: np.full(t.shape, 0.25) for name, t in get_state_dict(model).items()})
    assert model.first.weight.dtype == dtypes.float32
    assert_tensor(model.first.weight, np.full((2, 3), 0.25, np.float32))


def test_load_state_dict_takes_torch_tensors_of_bfloat16():
    # NumPy has no bfloat16, so torch cannot hand such a tensor over as it is
    layer = nn.Linear(2, 2)
    weight = torch.tensor([[1.5, -2.0], [0.25, 3.0]], dtype=torch.bfloat16)
    load_state_dict(layer, {"weight": weight, "bias": torch.zeros(2, dtype=torch.bfloat16)})
    np.testing.assert_array_equal(layer.weight.numpy(), weight.float().numpy())
