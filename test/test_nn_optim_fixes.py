"""Fixes from a bug hunt of the optimizers and state dicts against torch: frozen parameters are kept (and train once
unfrozen), a step is all or nothing, an optimizer's state dict holds only its own state, a model holding a class or
a module has a state dict, float64 parameters are updated in float64, and torch's arguments (dampening, betas, L2
weight decay, amsgrad, set_to_none, LayerNorm's bias=False, negative values refused, opt.lr.assign(number)); a
load_state_dict that fails loads nothing and names the key.

Every shape is small: the file runs on any device, including the slow PYTHON emulator.
"""

import collections
import copy
import warnings

import numpy as np
import pytest
from support import available
from test_nn import close, rand

from lazygrad import Device, Tensor, TinyJit, dtypes, nn
from lazygrad.nn import optim
from lazygrad.nn.state import get_parameters, get_state_dict, load_state_dict, safe_load, safe_save

X = rand(3, 2, seed=11)  # (a batch of more than one row)


def _torch_linear(torch, layer: nn.Linear):
    module = torch.nn.Linear(*reversed(layer.weight.shape))
    with torch.no_grad():
        module.weight.copy_(torch.from_numpy(layer.weight.numpy()))
        module.bias.copy_(torch.from_numpy(layer.bias.numpy()))
    return module


# ---- 1. a parameter frozen when the optimizer is built trains once unfrozen ----------------------------------------


@pytest.mark.parametrize("make", ["SGD", "Adam", "AdamW"])
def test_a_parameter_frozen_at_construction_trains_once_unfrozen(torch, make):
    kwargs = {"lr": 0.1, "momentum": 0.9} if make == "SGD" else {"lr": 0.1}
    backbone, head = nn.Linear(2, 2), nn.Linear(2, 1)
    theirs_backbone, theirs_head = _torch_linear(torch, backbone), _torch_linear(torch, head)
    ours = [backbone.weight, backbone.bias]
    theirs = list(theirs_backbone.parameters())
    for tensor in ours:
        tensor.requires_grad = False
    for tensor in theirs:
        tensor.requires_grad_(False)
    opt = getattr(optim, make)(get_parameters([backbone, head]), **kwargs)
    topt = getattr(torch.optim, make)([*theirs, *theirs_head.parameters()], **kwargs)
    assert len(opt.params) == 2 and len(opt.frozen) == 2  # (the frozen ones join at their first gradient)
    for step in range(4):
        if step == 2:  # unfrozen after two steps of the head alone
            for tensor in ours:
                tensor.requires_grad = True
            for tensor in theirs:
                tensor.requires_grad_(True)
        opt.zero_grad()
        head(backbone(Tensor(X))).square().sum().backward()
        opt.step()
        topt.zero_grad()
        theirs_head(theirs_backbone(torch.from_numpy(X))).square().sum().backward()
        topt.step()
    for a, b in [*zip(ours, theirs), (head.weight, theirs_head.weight), (head.bias, theirs_head.bias)]:
        close(a, b.detach(), rtol=1e-5, atol=1e-6)
    assert len(opt.params) == 4 and not opt.frozen


def test_an_optimizer_over_frozen_parameters_only_is_built(torch):
    w, tw = Tensor([1.0, -2.0], requires_grad=False), torch.tensor([1.0, -2.0])
    opt, topt = optim.Adam([w], lr=0.1), torch.optim.Adam([tw], lr=0.1)
    opt.step()  # (no gradient: nothing moves)
    topt.step()
    w.requires_grad = True
    tw.requires_grad_()
    for _ in range(2):
        opt.zero_grad()
        (w * w * w).sum().backward()
        opt.step()
        topt.zero_grad()
        (tw * tw * tw).sum().backward()
        topt.step()
    close(w, tw.detach(), rtol=1e-6, atol=1e-7)


@pytest.mark.filterwarnings(
    "ignore:Adam.step. BatchNorm ran in eval mode"
)  # (its running statistics are not the point)
def test_frozen_tensors_get_state_only_once_they_have_a_gradient():
    class Net:
        def __init__(self):
            self.conv, self.norm = nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2)

        def __call__(self, x):
            return self.norm(self.conv(x)).relu().mean()

    net = Net()
    net.conv.weight.requires_grad = False
    opt = optim.Adam(get_parameters(net), lr=0.01)
    trained = [net.conv.bias, net.norm.weight, net.norm.bias]
    assert [id(p) for p in opt.params] == [id(p) for p in trained]
    # no moments for the frozen weight, nor for BatchNorm's running statistics (they never get a gradient); state
    # is numbered by place in the list given, as torch numbers it: the weight is 0, the statistics 4 and 5
    moments = lambda: sorted(key for key in get_state_dict(opt) if key.startswith("first."))  # noqa: E731
    assert moments() == ["first.1", "first.2", "first.3"]
    x = Tensor(np.random.default_rng(0).standard_normal((2, 1, 5, 5)).astype(np.float32))
    net(x).backward()
    opt.step()
    assert len(opt.params) == 3 and moments() == ["first.1", "first.2", "first.3"]
    net.conv.weight.requires_grad = True  # unfrozen: it joins at its first gradient, the statistics never do
    opt.zero_grad()
    net(x).backward()
    opt.step()
    assert [id(p) for p in opt.params] == [id(p) for p in (*trained, net.conv.weight)]
    assert moments() == ["first.0", "first.1", "first.2", "first.3"]
    assert get_state_dict(opt)["first.0"] is opt.first[3]
    # its count starts at its first step, as torch's state does: steps 2, missed 1
    assert opt.steps.item() == 2 and opt.missed_steps[3].item() == 1


# ---- 2. a step is all or nothing ------------------------------------------------------------------------------------


@pytest.mark.parametrize("make", ["Adam", "AdamW", "LAMB"])
def test_a_step_that_raises_does_not_advance_the_step_counter(torch, make):
    w = Tensor([1.0, 2.0], requires_grad=True)
    opt = getattr(optim, make)([w], lr=0.1)
    (w * w).sum().backward()
    opt.step()
    with pytest.raises(RuntimeError, match="released"):
        opt.step()  # (its gradient read the weights this step overwrote)
    assert opt.steps.tolist() == [1.0]
    opt.zero_grad()
    (w * w).sum().backward()
    opt.step()
    # the same two steps, uninterrupted (torch's for Adam and AdamW)
    if make == "LAMB":
        reference = Tensor([1.0, 2.0], requires_grad=True)
        ropt = optim.LAMB([reference], lr=0.1)
        for _ in range(2):
            ropt.zero_grad()
            (reference * reference).sum().backward()
            ropt.step()
        close(w, reference.numpy(), rtol=1e-6, atol=1e-7)
        return
    tw = torch.tensor([1.0, 2.0], requires_grad=True)
    topt = getattr(torch.optim, make)([tw], lr=0.1)
    for _ in range(2):
        topt.zero_grad()
        (tw * tw).sum().backward()
        topt.step()
    close(w, tw.detach(), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("make", ["SGD", "Adam"])
def test_a_step_that_fails_changes_no_parameter(make):
    other = available("CPU" if Device.DEFAULT != "CPU" else "LLVM")
    a, b = Tensor([1.0, 1.0], requires_grad=True), Tensor([2.0, 2.0], requires_grad=True)
    opt = getattr(optim, make)([a, b], lr=0.1)
    a.grad, b.grad = Tensor([1.0, 1.0]), Tensor([1.0, 1.0], device=other)  # (the second on the wrong device)
    with pytest.raises(ValueError, match=r"parameter 1 \(shape \(2,\)\) is on .* but its gradient on"):
        opt.step()
    assert a.tolist() == [1.0, 1.0] and b.tolist() == [2.0, 2.0]
    if make == "Adam":
        assert opt.steps.tolist() == [0.0] and opt.first[0].tolist() == [0.0, 0.0]


def test_a_view_parameter_is_refused_when_the_optimizer_is_built():
    a = Tensor([1.0, 1.0], requires_grad=True)
    w = Tensor(np.ones((2, 3), np.float32)).T
    w.requires_grad = True
    with pytest.raises(ValueError, match=r"Adam: parameter 1 \(shape \(3, 2\).*is a view .*p.contiguous\(\)"):
        optim.Adam([a, w], lr=0.1)
    assert a.tolist() == [1.0, 1.0]


@pytest.mark.parametrize("make", ["SGD", "Adam", "LAMB"])
def test_parameters_on_two_devices_train(torch, make):
    other = available("CPU" if Device.DEFAULT != "CPU" else "LLVM")
    kwargs = {"lr": 0.1, "momentum": 0.9} if make == "SGD" else {"lr": 0.1}
    start = ([1.0, 2.0], [3.0, -1.0])
    b, c = Tensor(start[0], requires_grad=True), Tensor(start[1], requires_grad=True, device=other)
    opt = getattr(optim, make)([b, c], **kwargs)
    if make == "LAMB":
        reference = Tensor(start[0], requires_grad=True), Tensor(start[1], requires_grad=True)
        ropt = optim.LAMB(list(reference), **kwargs)
    else:
        theirs = [torch.tensor(values, requires_grad=True) for values in start]
        topt = getattr(torch.optim, make)(theirs, **kwargs)
    for _ in range(3):
        opt.zero_grad()
        ((b * b).sum() + (c * c * c).sum().to(b.device)).backward()
        opt.step()
        if make == "LAMB":
            ropt.zero_grad()
            ((reference[0] * reference[0]).sum() + (reference[1] ** 3).sum()).backward()
            ropt.step()
        else:
            topt.zero_grad()
            ((theirs[0] * theirs[0]).sum() + (theirs[1] ** 3).sum()).backward()
            topt.step()
    expected = [t.numpy() for t in reference] if make == "LAMB" else [t.detach().numpy() for t in theirs]
    assert c.device == Device.canonicalize(other)
    close(b, expected[0], rtol=1e-5, atol=1e-6)
    close(c, expected[1], rtol=1e-5, atol=1e-6)


# ---- 3. an optimizer's state dict holds its own state -----------------------------------------------------------


def test_an_optimizers_state_dict_holds_only_its_state(torch, tmp_path):
    model = nn.Linear(2, 1)
    opt = optim.Adam(get_parameters(model), lr=0.1)
    opt.zero_grad()
    model(Tensor(X)).sum().backward()
    opt.step()
    state = get_state_dict(opt)
    assert sorted(state) == ["first.0", "first.1", "lr", "missed_steps.0", "missed_steps.1", "second.0", "second.1"] + [
        "steps"
    ]
    # the moments, as torch's (exp_avg, exp_avg_sq): twice the parameters, and a few counters
    parameters = sum(p.numel() for p in get_parameters(model))
    assert sum(t.numel() for t in state.values()) == 2 * parameters + 2 + 2
    momentum = optim.SGD(get_parameters(model), lr=0.1, momentum=0.9)
    assert sorted(get_state_dict(momentum)) == ["lr", "velocity.0", "velocity.1"]
    # loading the optimizer's checkpoint resumes its moments and leaves the model's weights alone (torch's
    # opt.load_state_dict does)
    path = str(tmp_path / "opt.safetensors")
    safe_save(state, path)
    load_state_dict(model, {"weight": Tensor([[7.0, 7.0]]), "bias": Tensor([7.0])})
    resumed = optim.Adam(get_parameters(model), lr=0.1)
    load_state_dict(resumed, safe_load(path))
    assert model.weight.tolist() == [[7.0, 7.0]] and model.bias.tolist() == [7.0]
    close(resumed.first[0], opt.first[0].numpy(), rtol=0, atol=0)
    assert resumed.steps.tolist() == [1.0]


def test_a_checkpoint_that_holds_the_parameters_still_loads_without_them():
    # files written when the state dict also held `params.N` (the model's weights) and `buffers.N` (the moments
    # again): they load strictly, their parameters ignored
    model = nn.Linear(2, 1)
    opt = optim.Adam(get_parameters(model), lr=0.1)
    model(Tensor(X)).sum().backward()
    opt.step()
    old = {name: Tensor(value.numpy()) for name, value in get_state_dict(opt).items()}
    old.update({"params.0": Tensor(np.full((1, 2), 5.0, np.float32)), "params.1": Tensor([5.0])})
    old.update({f"buffers.{n}": Tensor(t.numpy()) for n, t in enumerate([*opt.first, *opt.second])})
    weights = model.weight.numpy().copy()
    resumed = optim.Adam(get_parameters(model), lr=0.1)
    load_state_dict(resumed, old)
    np.testing.assert_array_equal(model.weight.numpy(), weights)
    close(resumed.second[0], opt.second[0].numpy(), rtol=0, atol=0)

    class Trainer:  # (an optimizer held by another object: its old keys under its name)
        def __init__(self):
            self.opt = optim.Adam(get_parameters(model), lr=0.1)

    trainer = Trainer()
    load_state_dict(trainer, {f"opt.{name}": value for name, value in old.items()})
    np.testing.assert_array_equal(model.weight.numpy(), weights)
    assert trainer.opt.steps.tolist() == [1.0]
    with pytest.raises(KeyError, match=r"unexpected keys \['params.0'\]"):
        load_state_dict(model, {**get_state_dict(model), "params.0": Tensor([1.0])})  # (a model has no such rule)


# ---- 5. a model holding a namedtuple class or a module ------------------------------------------------------------


def test_state_dict_of_a_model_holding_a_class_or_a_module():
    Output = collections.namedtuple("Output", ["logits", "loss"])

    class Model:
        def __init__(self):
            self.fc = nn.Linear(4, 2)
            self.output_type, self.np, self.collections = Output, np, collections

        def __call__(self, x):
            return self.output_type(self.fc(x), None)

    model = Model()
    assert sorted(get_state_dict(model)) == ["fc.bias", "fc.weight"]
    assert len(get_parameters(model)) == 2
    # a namedtuple instance still gives its fields
    assert sorted(get_state_dict(Output(Tensor([1.0]), Tensor([2.0])))) == ["logits", "loss"]


# ---- 6. float64 parameters are updated in float64 -----------------------------------------------------------------


def _needs_float64():
    if dtypes.float64 in Device[Device.DEFAULT].unsupported_dtypes:
        pytest.skip(f"{Device.DEFAULT} has no float64")


@pytest.mark.parametrize("make", ["SGD", "Adam", "AdamW"])
def test_float64_parameters_are_updated_in_float64(torch, make):
    _needs_float64()
    kwargs = {"lr": 0.1, "momentum": 0.9} if make == "SGD" else {"lr": 0.1}
    start = np.array([1.0, -3.0, 100.0, 1e-3])
    w, tw = Tensor(start, requires_grad=True), torch.tensor(start, requires_grad=True)
    assert w.dtype == dtypes.float64
    opt, topt = getattr(optim, make)([w], **kwargs), getattr(torch.optim, make)([tw], **kwargs)
    assert opt.lr.dtype == dtypes.float64
    for _ in range(4):
        opt.zero_grad()
        (w * w * w).sum().backward()
        opt.step()
        topt.zero_grad()
        (tw * tw * tw).sum().backward()
        topt.step()
    np.testing.assert_allclose(w.numpy(), tw.detach().numpy(), rtol=1e-13, atol=0)


def test_float32_parameters_keep_a_float32_learning_rate_beside_float64_ones(torch):
    _needs_float64()
    a, b = Tensor([1.0, 2.0], requires_grad=True), Tensor(np.array([1.0, 2.0]), requires_grad=True)
    ta, tb = torch.tensor([1.0, 2.0], requires_grad=True), torch.tensor([1.0, 2.0], dtype=torch.float64)
    tb.requires_grad_()
    opt, topt = optim.Adam([a, b], lr=0.1), torch.optim.Adam([ta, tb], lr=0.1)
    for _ in range(3):
        opt.zero_grad()
        ((a * a).sum() + (b * b).sum()).backward()
        opt.step()
        topt.zero_grad()
        ((ta * ta).sum() + (tb * tb).sum()).backward()
        topt.step()
    assert a.dtype == dtypes.float32 and b.dtype == dtypes.float64
    close(a, ta.detach(), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(b.numpy(), tb.detach().numpy(), rtol=1e-13)


# ---- 7. torch's arguments ------------------------------------------------------------------------------------------


def _against_torch(torch, ours_opt, theirs_opt, steps=4, rtol=1e-5, atol=1e-6, skip_first=False):
    """Steps of both optimizers on two parameters (the second one without a gradient in the first step when
    `skip_first`); every parameter must match after each."""
    arrays = [rand(3, 2, seed=1), rand(2, seed=2)]
    ours = [Tensor(a, requires_grad=True) for a in arrays]
    theirs = [torch.tensor(a, requires_grad=True) for a in arrays]
    opt, topt = ours_opt(ours), theirs_opt(theirs)
    x = rand(4, 3, seed=3)
    for step in range(steps):
        for optimizer, (w, b), xs in ((opt, ours, Tensor(x)), (topt, theirs, torch.from_numpy(x))):
            optimizer.zero_grad()
            out = xs @ w
            loss = (out.tanh() ** 2).sum() if skip_first and step == 0 else ((out + b).tanh() ** 2).sum()
            loss.backward()
            optimizer.step()
        for number, (a, b) in enumerate(zip(ours, theirs)):
            np.testing.assert_allclose(a.numpy(), b.detach().numpy(), rtol=rtol, atol=atol, err_msg=f"param {number}")
    return opt


@pytest.mark.parametrize("skip_first", [False, True])
@pytest.mark.parametrize("nesterov", [False, True])
@pytest.mark.parametrize("dampening", [0.0, 0.3])
def test_sgd_dampening(torch, dampening, nesterov, skip_first):
    kwargs = {"lr": 0.1, "momentum": 0.9, "dampening": dampening, "weight_decay": 0.01}
    if nesterov and dampening:
        for make in (optim.SGD, torch.optim.SGD):
            with pytest.raises(ValueError, match="[Nn]esterov"):
                make([Tensor([1.0]) if make is optim.SGD else torch.tensor([1.0])], nesterov=True, **kwargs)
        return
    kwargs["nesterov"] = nesterov
    opt = _against_torch(
        torch, lambda p: optim.SGD(p, **kwargs), lambda p: torch.optim.SGD(p, **kwargs), skip_first=skip_first
    )
    if dampening:  # (whether each velocity has started is in the state dict: a resumed run continues the same)
        assert sorted(get_state_dict(opt)) == ["lr", "momentum_started.0", "momentum_started.1"] + [
            "velocity.0",
            "velocity.1",
        ]


@pytest.mark.parametrize("make", ["Adam", "AdamW"])
def test_adam_takes_torchs_betas(torch, make):
    kwargs = {"lr": 0.05, "betas": (0.8, 0.99)}
    _against_torch(
        torch, lambda p: getattr(optim, make)(p, **kwargs), lambda p: getattr(torch.optim, make)(p, **kwargs)
    )
    opt = getattr(optim, make)([Tensor([1.0])], betas=(0.8, 0.99))
    assert (opt.b1, opt.b2) == (0.8, 0.99)
    assert (optim.Adam([Tensor([1.0])], b1=0.7).b1, optim.Adam([Tensor([1.0])]).b2) == (0.7, 0.999)
    with pytest.raises(TypeError, match="not both"):
        getattr(optim, make)([Tensor([1.0])], b1=0.8, betas=(0.8, 0.99))
    with pytest.raises(ValueError, match=r"b1 must be in \[0, 1\)"):
        getattr(optim, make)([Tensor([1.0])], betas=(1.5, 0.99))


@pytest.mark.parametrize(
    "kwargs",
    [
        {"lr": 0.05, "weight_decay": 0.1},
        {"lr": 0.05, "weight_decay": 0.1, "decoupled_weight_decay": True},
        {"lr": 0.05, "amsgrad": True},
        {"lr": 0.05, "weight_decay": 0.1, "amsgrad": True, "betas": (0.5, 0.9)},
    ],
    ids=["l2", "decoupled", "amsgrad", "amsgrad-l2"],
)
@pytest.mark.parametrize("skip_first", [False, True])
def test_adam_weight_decay_is_torchs_l2_and_amsgrad(torch, kwargs, skip_first):
    _against_torch(
        torch, lambda p: optim.Adam(p, **kwargs), lambda p: torch.optim.Adam(p, **kwargs), skip_first=skip_first
    )


@pytest.mark.parametrize("skip_first", [False, True])
def test_adamw_keeps_decoupled_decay_with_amsgrad(torch, skip_first):
    kwargs = {"lr": 0.05, "weight_decay": 0.1, "amsgrad": True}
    _against_torch(
        torch, lambda p: optim.AdamW(p, **kwargs), lambda p: torch.optim.AdamW(p, **kwargs), skip_first=skip_first
    )


@pytest.mark.parametrize("make", ["SGD", "Adam"])
def test_zero_grad_set_to_none_false_gives_zero_gradients(torch, make):
    kwargs = {"lr": 0.1, "momentum": 0.9} if make == "SGD" else {"lr": 0.1}
    w, tw = Tensor([1.0, -2.0], requires_grad=True), torch.tensor([1.0, -2.0], requires_grad=True)
    unused, tunused = Tensor([3.0], requires_grad=True), torch.tensor([3.0], requires_grad=True)
    opt = getattr(optim, make)([w, unused], **kwargs)
    topt = getattr(torch.optim, make)([tw, tunused], **kwargs)
    for step in range(3):
        opt.zero_grad(set_to_none=False)
        topt.zero_grad(set_to_none=False)
        assert unused.grad is None and tunused.grad is None
        if step == 0:
            (w * w).sum().backward()
            (tw * tw).sum().backward()
        else:  # (no backward: a zero gradient still moves by the momentum, as in torch)
            assert w.grad.tolist() == [0.0, 0.0]
        opt.step()
        topt.step()
        close(w, tw.detach(), rtol=1e-6, atol=1e-7)
    opt.zero_grad()
    assert w.grad is None


def test_layernorm_without_bias(torch):
    x = rand(2, 3, 4, seed=5)
    ours, theirs = nn.LayerNorm(4, bias=False), torch.nn.LayerNorm(4, bias=False)
    assert ours.bias is None and sorted(get_state_dict(ours)) == sorted(theirs.state_dict()) == ["weight"]
    with torch.no_grad():
        theirs.weight.copy_(torch.tensor([1.0, 2.0, 3.0, 4.0]))
    load_state_dict(ours, {"weight": Tensor([1.0, 2.0, 3.0, 4.0])})
    close(ours(Tensor(x)), theirs(torch.from_numpy(x)), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "make, kwargs",
    [
        ("SGD", {"lr": -0.1}),
        ("SGD", {"lr": 0.1, "momentum": -0.5}),
        ("SGD", {"lr": 0.1, "weight_decay": -1.0}),
        ("Adam", {"lr": -1.0}),
        ("Adam", {"eps": -1.0}),
        ("Adam", {"weight_decay": -1.0}),
        ("AdamW", {"eps": -1.0}),
        ("AdamW", {"weight_decay": -0.1}),
    ],
)
def test_negative_hyperparameters_are_refused_as_torch_refuses_them(torch, make, kwargs):
    with pytest.raises(ValueError):
        getattr(torch.optim, make)([torch.tensor([1.0], requires_grad=True)], **kwargs)
    name = next(iter(kwargs)) if len(kwargs) == 1 else [k for k in kwargs if k != "lr"][0]
    with pytest.raises(ValueError, match=rf"{make}: invalid {name} -"):
        getattr(optim, make)([Tensor([1.0], requires_grad=True)], **kwargs)


def test_lr_assign_takes_a_python_number():
    w = Tensor([1.0], requires_grad=True)
    opt = optim.SGD([w], lr=0.1)

    def step():
        opt.zero_grad()
        (w * 2).sum().backward()
        opt.step()

    run = TinyJit(step)
    expected = 1.0
    for lr in (0.1, 0.5, 0.25, 0.125, 0.0625):
        if lr == 0.25:
            opt.lr.assign(Tensor([lr]))  # (still as before)
        elif lr == 0.125:
            opt.lr.assign(Tensor(lr))  # (0-d)
        else:
            opt.lr.assign(lr)
        run()
        expected -= 2 * lr
        np.testing.assert_allclose(w.numpy(), [expected], rtol=1e-6)
    assert opt.lr.shape == (1,) and opt.lr.tolist() == [0.0625]
    copied = copy.deepcopy(opt)
    copied.lr.assign(0.5)
    assert copied.lr.tolist() == [0.5] and opt.lr.tolist() == [0.0625]
    for make in (optim.SGD, optim.Adam):  # (a Python number in place of the tensor still works in an eager step)
        v = Tensor([1.0], requires_grad=True)
        plain = make([v], lr=0.1)
        plain.lr = 0.5
        (v * 2).sum().backward()
        plain.step()
        assert v.tolist() == ([0.0] if make is optim.SGD else [0.5])


class _Two:
    def __init__(self):
        self.a, self.b = Tensor([1.0, 2.0]), Tensor([3.0, 4.0])


def test_load_state_dict_converts_every_value_before_loading_any(torch):
    model = _Two()
    with pytest.raises(TypeError, match=r"load_state_dict: the value of 'b'"):
        load_state_dict(model, {"a": np.array([5.0, 6.0]), "b": np.array(["x", "y"])})
    assert model.a.tolist() == [1.0, 2.0] and model.b.tolist() == [3.0, 4.0]
    with pytest.raises(TypeError, match=r"load_state_dict: the value of 'b': .*complex64"):
        load_state_dict(model, {"a": torch.tensor([5.0, 6.0]), "b": torch.tensor([1.0, 2.0], dtype=torch.complex64)})
    assert model.a.tolist() == [1.0, 2.0]
    load_state_dict(model, {"a": np.array([5.0, 6.0]), "b": [7, 8]})
    assert model.a.tolist() == [5.0, 6.0] and model.b.tolist() == [7.0, 8.0]


@pytest.mark.parametrize("make", ["SGD", "Adam", "LAMB"])
def test_a_step_leaves_no_reference_cycles(make):
    # a step's tables of learning rates and bias corrections held themselves through their makers: each step's
    # tensors (and their buffers) lived until a garbage collection
    import gc

    w = Tensor(np.ones((4, 4), np.float32), requires_grad=True)
    opt = getattr(optim, make)([w], lr=0.01)
    for _ in range(2):
        opt.zero_grad()
        (w * w).sum().backward()
        opt.step()
    gc.collect()
    gc.disable()
    try:
        for _ in range(3):
            opt.zero_grad()
            (w * w).sum().backward()
            opt.step()
        assert gc.collect() == 0
    finally:
        gc.enable()


def test_setting_lr_to_a_number_keeps_it_in_the_state_dict_and_the_replays():
    """`opt.lr = 0.05` (torch's schedules) replaced the learning-rate tensor with a float: the state dict lost `lr`, a
    strict resume failed and a loose one took the constructor's rate. It now sets the tensor."""
    from lazygrad.nn.state import get_state_dict, load_state_dict

    w = Tensor([1.0, 2.0], requires_grad=True)
    opt = optim.SGD([w], lr=0.1)
    opt.lr = 0.05
    state = get_state_dict(opt)
    np.testing.assert_allclose(state["lr"].numpy(), [0.05])
    resumed = optim.SGD([Tensor([1.0, 2.0], requires_grad=True)], lr=0.1)
    load_state_dict(resumed, state)
    np.testing.assert_allclose(resumed.lr.numpy(), [0.05])

    @TinyJit
    def step(x):
        opt.zero_grad()
        (w * x).sum().backward()
        opt.step()
        return w.realize()

    for _ in range(3):
        step(Tensor([1.0, 1.0]))
    opt.lr = 1.0
    before = w.numpy().copy()
    step(Tensor([1.0, 1.0]))
    np.testing.assert_allclose(w.numpy(), before - 1.0, rtol=1e-6)


# ---- a second hunt: resuming after an unfreeze, torch-style calls, loads that fail part way -------------------------


@pytest.mark.parametrize("make", ["SGD", "Adam"])
def test_state_is_numbered_by_place_in_the_list_so_a_resume_after_an_unfreeze_matches_torch(torch, make):
    kwargs = {"lr": 0.1, "momentum": 0.9} if make == "SGD" else {"lr": 0.1}
    start = {"A": [1.0, 2.0], "B": [3.0, -4.0]}
    a, b = Tensor(start["A"], requires_grad=False), Tensor(start["B"], requires_grad=True)
    ta, tb = torch.tensor(start["A"]), torch.tensor(start["B"], requires_grad=True)
    ours, theirs = getattr(optim, make)([a, b], **kwargs), getattr(torch.optim, make)([ta, tb], **kwargs)

    def step(x, y, opt):
        opt.zero_grad()
        (x * 3 + y * y).sum().backward()
        opt.step()

    step(a, b, ours)
    step(ta, tb, theirs)
    a.requires_grad, _ = True, ta.requires_grad_(True)  # unfrozen: A joins after B, but keeps number 0
    step(a, b, ours)
    step(ta, tb, theirs)
    checkpoint = {key: value.numpy() for key, value in get_state_dict(ours).items()}
    their_checkpoint = copy.deepcopy(theirs.state_dict())  # (torch's loads share the moments' tensors)
    assert {key.rsplit(".", 1)[-1] for key in checkpoint if "." in key} == {"0", "1"}
    for frozen_again in (False, True):  # resumed with A trainable, or frozen as at the start (it joins at the load)
        a2 = Tensor(a.numpy(), requires_grad=not frozen_again)
        b2 = Tensor(b.numpy(), requires_grad=True)
        resumed = getattr(optim, make)([a2, b2], **kwargs)
        load_state_dict(resumed, checkpoint)
        a2.requires_grad = True
        reference = getattr(torch.optim, make)(
            [ta2 := ta.detach().clone().requires_grad_(), tb2 := tb.detach().clone().requires_grad_()], **kwargs
        )
        reference.load_state_dict(copy.deepcopy(their_checkpoint))
        for _ in range(2):
            step(a2, b2, resumed)
            step(ta2, tb2, reference)
        np.testing.assert_allclose(a2.numpy(), ta2.detach().numpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(b2.numpy(), tb2.detach().numpy(), rtol=1e-5, atol=1e-6)


def test_sgd_refuses_arguments_whose_place_torch_and_tinygrad_read_differently():
    w = Tensor([1.0, 2.0], requires_grad=True)
    with pytest.raises(
        TypeError, match=r"SGD: got 2 more positional arguments \(0, 0.0005\).*weight_decay=, nesterov="
    ):
        optim.SGD([w], 0.1, 0.9, 0, 5e-4)  # (torch: dampening 0, weight decay 5e-4; tinygrad: weight decay 0)
    with pytest.raises(TypeError, match="nesterov must be True or False, got 0.0005"):
        optim.SGD([w], 0.1, 0.9, nesterov=5e-4)
    assert optim.SGD([w], 0.1, 0.9, weight_decay=5e-4, dampening=0).weight_decay == 5e-4


def test_int_and_bool_state_in_a_model_is_left_out_of_the_optimizer():
    class Model:
        def __init__(self):
            self.fc = nn.Linear(2, 2)
            self.position_ids = Tensor.arange(8)  # (torch: a buffer, never a parameter)
            self.mask = Tensor.ones(2, 2).tril().bool()

    model = Model()
    opt = optim.AdamW(get_parameters(model), lr=0.1)
    assert [id(p) for p in opt.params] == [id(model.fc.weight), id(model.fc.bias)]
    model.fc(X).sum().backward()
    opt.step()
    assert model.position_ids.tolist() == list(range(8))


def test_a_load_into_a_view_fails_before_it_changes_anything():
    class Model:
        def __init__(self):
            self.a = Tensor([1.0, 2.0, 3.0]).realize()
            self.b = Tensor(np.arange(3, dtype=np.float32)).realize().reshape(3, 1).expand(3, 2)  # (not writable)
            self.c = Tensor([7.0]).realize()

    model = Model()
    new = {"a": np.zeros(3, np.float32), "b": np.ones((3, 2), np.float32), "c": np.zeros(1, np.float32)}
    with pytest.raises(RuntimeError, match=r"load_state_dict \('b'\): this \(3, 2\) tensor is an expanded view"):
        load_state_dict(model, new)
    assert model.a.tolist() == [1.0, 2.0, 3.0] and model.c.tolist() == [7.0]


def test_a_value_that_is_not_an_array_of_numbers_names_its_key():
    with pytest.raises(ValueError, match="the value of 'weight' is not a rectangular array"):
        load_state_dict(nn.Linear(3, 2), {"weight": [[1, 2, 3], [4, 5]], "bias": [0.0, 0.0]})
    for value in (None, "abc"):
        with pytest.raises(TypeError, match="the value of 'weight' is not numbers"):
            load_state_dict(nn.Linear(3, 1), {"weight": value, "bias": [0.0]})


def test_batchnorm_trains_on_a_float64_input_keeping_its_float32_statistics(torch):
    values = np.random.default_rng(5).standard_normal((8, 3))
    norm = nn.BatchNorm1d(3)
    with Tensor.train():
        out = norm(Tensor(values))
    assert out.dtype == dtypes.float64 and norm.running_mean.dtype == dtypes.float32
    reference = torch.nn.BatchNorm1d(3).double()
    expected = reference(torch.tensor(values))
    np.testing.assert_allclose(out.numpy(), expected.detach().numpy(), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(norm.running_mean.numpy(), reference.running_mean.numpy(), rtol=1e-6)
    np.testing.assert_allclose(norm.running_var.numpy(), reference.running_var.numpy(), rtol=1e-6)


def test_a_checkpoint_whose_moments_do_not_fit_a_frozen_parameter_fails_and_joins_nothing():
    frozen, trained = Tensor([1.0, 2.0], requires_grad=False), Tensor([3.0], requires_grad=True)
    opt = optim.Adam([frozen, trained], lr=0.1)
    state = {key: value.numpy() for key, value in get_state_dict(opt).items()}
    state["first.0"] = state["second.0"] = np.zeros(3, np.float32)  # (another model's moments at its place)
    with pytest.raises(nn.state.StateDictError, match=r"unexpected keys \['first.0', 'second.0'\]"):
        load_state_dict(opt, state)
    assert opt.params == [trained] and "first.0" not in get_state_dict(opt)


def test_deepcopy_after_a_step_leaves_the_released_gradient_out():
    # torch's `best = copy.deepcopy(model.state_dict())` after opt.step() raised "gradient was released"
    w = Tensor([1.0, 2.0], requires_grad=True)
    opt = optim.SGD([w], lr=0.1)
    (w * w).sum().backward()
    opt.step()
    best = copy.deepcopy({"w": w})
    np.testing.assert_allclose(best["w"].numpy(), [0.8, 1.6], rtol=1e-6)
    assert best["w"].grad is None and best["w"].requires_grad is True


def test_setting_the_learning_rate_is_checked_as_the_constructor_checks_it():
    opt = optim.SGD([Tensor([1.0], requires_grad=True)], lr=0.1)
    with pytest.raises(TypeError, match="lr must be a number"):
        opt.lr = None
    with pytest.raises(ValueError, match="invalid lr -1.0"):
        opt.lr = -1.0
    opt.lr = np.float32(0.25)
    opt.lr *= 0.5
    np.testing.assert_allclose(opt.lr.numpy(), [0.125])


def test_a_step_runs_the_running_statistics_batch_norm_wrote(torch):
    """An eager step realizes every write still pending, not only the parameters': batch norm's running statistics
    were a chain of one update per step (each keeping its batch alive), and each step took longer (9 to 76 ms in
    1,000 steps)."""
    from lazygrad.tensor import pending_assigns

    rng = np.random.default_rng(3)
    norm, layer = nn.BatchNorm1d(4), nn.Linear(4, 2)
    reference = torch.nn.BatchNorm1d(4)
    opt = optim.SGD(get_parameters([norm, layer]), lr=0.1)
    for _ in range(3):
        batch = rng.standard_normal((8, 4)).astype(np.float32)
        with Tensor.train():
            opt.zero_grad()
            layer(norm(Tensor(batch))).square().mean().backward()
            opt.step()
        reference(torch.tensor(batch))
        assert not pending_assigns()
    np.testing.assert_allclose(norm.running_mean.numpy(), reference.running_mean.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(norm.running_var.numpy(), reference.running_var.numpy(), rtol=1e-5, atol=1e-6)
    assert norm.num_batches_tracked.item() == 3


def test_a_step_warns_when_the_batch_norm_it_trains_ran_in_eval_mode():
    # lazygrad starts in eval mode (tinygrad's); a loop ported from torch, whose modules start in training mode,
    # silently trained batch norm on running statistics that never update, with dropout off
    bn, layer = nn.BatchNorm2d(2), nn.Linear(2, 1)
    opt = optim.SGD([*get_parameters(layer), bn.weight, bn.bias], lr=0.1)
    x = Tensor(rand(4, 2, 3, 3, seed=3))

    def step():
        opt.zero_grad()
        layer(bn(x).mean((2, 3)).dropout(0.5)).sum().backward()
        opt.step()

    with pytest.warns(RuntimeWarning, match=r"SGD.step: BatchNorm ran in eval mode .*Tensor.train\(\)"):
        step()
    with Tensor.train(), warnings.catch_warnings():
        warnings.simplefilter("error")
        step()
    # nor does a step training no batch norm that ran in eval mode (evaluating one model, then training another)
    bn(x).realize()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        opt = optim.SGD(get_parameters(layer), lr=0.1)
        opt.zero_grad()
        layer(x.mean((2, 3))).sum().backward()
        opt.step()
