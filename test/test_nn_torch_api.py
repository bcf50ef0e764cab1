"""torch's training API beside the basics, each against torch: `mse(reduction=)`, `kl_div`, the convolution layers'
`padding_mode`, `nn.utils.clip_grad_norm_` / `clip_grad_value_`, the learning-rate schedulers of
`nn.optim.lr_scheduler` (also through a TinyJit step), and the error for torch's parameter groups.

Every shape is small: the file runs on any device, including the slow PYTHON emulator."""

import math
import pickle

import numpy as np
import pytest

from lazygrad import Tensor, TinyJit, nn
from lazygrad.nn import lr_scheduler
from lazygrad.nn.state import get_state_dict, load_state_dict


def rand(*shape, seed=0, low=-1.0, high=1.0):
    return np.random.default_rng(seed).uniform(low, high, shape).astype(np.float32)


def close(actual, expected, atol=1e-5, rtol=1e-5):
    np.testing.assert_allclose(
        np.asarray(actual, dtype=np.float64), np.asarray(expected, dtype=np.float64), atol=atol, rtol=rtol
    )


def _both(torch, *arrays):
    """Each array as a lazygrad tensor and a torch tensor, both requiring grad."""
    return [(Tensor(a, requires_grad=True), torch.tensor(a, requires_grad=True)) for a in arrays]


# ---- mse ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_mse_reductions_match_torch(torch, reduction):
    (x, tx), (y, ty) = _both(torch, rand(3, 4, seed=1), rand(3, 4, seed=2))
    out, expected = x.mse(y, reduction=reduction), torch.nn.functional.mse_loss(tx, ty, reduction=reduction)
    close(out.numpy(), expected.detach().numpy())
    weights = rand(*expected.shape, seed=3) if expected.ndim else np.float32(1.5)
    (out * Tensor(weights)).sum().backward()
    (expected * torch.tensor(weights)).sum().backward()
    close(x.grad.numpy(), tx.grad.numpy())
    close(y.grad.numpy(), ty.grad.numpy())


def test_mse_positional_and_default(torch):
    x, y = rand(5, seed=4), rand(5, seed=5)
    expected = torch.nn.functional.mse_loss(torch.tensor(x), torch.tensor(y)).item()
    assert Tensor(x).mse(Tensor(y)).shape == ()
    close(Tensor(x).mse(Tensor(y)).item(), expected)
    close(Tensor(x).mse(Tensor(y), "sum").item(), expected * 5)  # (reduction is the second positional argument)


def test_mse_bad_reduction_names_the_op():
    with pytest.raises(ValueError, match=r"mse: reduction must be 'mean', 'sum' or 'none', got 'avg'"):
        Tensor.ones(3).mse(Tensor.ones(3), reduction="avg")


# ---- kl_div -------------------------------------------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore:reduction. 'mean' divides")  # (torch's advice to use batchmean)
@pytest.mark.parametrize("log_target", [False, True])
@pytest.mark.parametrize("reduction", ["mean", "batchmean", "sum", "none"])
def test_kl_div_matches_torch(torch, reduction, log_target):
    log_probs = np.log(np.random.default_rng(6).dirichlet(np.ones(5), size=4)).astype(np.float32)
    probs = np.random.default_rng(7).dirichlet(np.ones(5), size=4).astype(np.float32)
    target = np.log(probs) if log_target else probs
    (x, tx), (y, ty) = _both(torch, log_probs, target)
    out = x.kl_div(y, reduction=reduction, log_target=log_target)
    expected = torch.nn.functional.kl_div(tx, ty, reduction=reduction, log_target=log_target)
    assert out.shape == tuple(expected.shape)
    close(out.numpy(), expected.detach().numpy())
    weights = rand(*expected.shape, seed=8) if expected.ndim else np.float32(2.0)
    (out * Tensor(weights)).sum().backward()
    (expected * torch.tensor(weights)).sum().backward()
    close(x.grad.numpy(), tx.grad.numpy())
    close(y.grad.numpy(), ty.grad.numpy())


def test_kl_div_zero_target_adds_nothing(torch):
    log_probs = np.array([[-1.0, -2.0, -0.5], [-3.0, -0.1, -2.5]], np.float32)
    target = np.array([[0.0, 0.4, 0.6], [1.0, 0.0, 0.0]], np.float32)
    x = Tensor(log_probs, requires_grad=True)
    out = x.kl_div(Tensor(target), reduction="none")
    expected = torch.nn.functional.kl_div(torch.tensor(log_probs), torch.tensor(target), reduction="none")
    close(out.numpy(), expected.numpy())
    assert (out.numpy()[target == 0] == 0).all()
    out.sum().backward()
    close(x.grad.numpy(), -target)  # (the input's slope is -target: 0 where the target is 0)
    assert np.isfinite(x.grad.numpy()).all()


def test_kl_div_batchmean_of_a_scalar_is_the_sum(torch):
    expected = torch.nn.functional.kl_div(torch.tensor(-1.0), torch.tensor(0.3), reduction="batchmean").item()
    close(Tensor(-1.0).kl_div(Tensor(0.3), reduction="batchmean").item(), expected)


def test_kl_div_errors():
    with pytest.raises(ValueError, match=r"kl_div: reduction must be 'mean', 'batchmean', 'sum' or 'none', got 'avg'"):
        Tensor.ones(3).kl_div(Tensor.ones(3), reduction="avg")
    with pytest.raises(ValueError, match=r"kl_div: target \(2,\) must match the input \(3,\)"):
        Tensor.ones(3).kl_div(Tensor.ones(2))


# ---- padding_mode -------------------------------------------------------------------------------------------------


def _copy_conv(torch_layer, layer):
    layer.weight = Tensor(torch_layer.weight.detach().numpy(), requires_grad=True)
    layer.bias = Tensor(torch_layer.bias.detach().numpy(), requires_grad=True)


@pytest.mark.parametrize("mode", ["zeros", "reflect", "replicate", "circular"])
@pytest.mark.parametrize("padding", [1, (2, 1), "same", "valid"])
def test_conv2d_padding_mode_matches_torch(torch, mode, padding):
    torch_layer = torch.nn.Conv2d(2, 3, (3, 2), padding=padding, padding_mode=mode, dilation=(1, 2))
    layer = nn.Conv2d(2, 3, (3, 2), padding=padding, padding_mode=mode, dilation=(1, 2))
    _copy_conv(torch_layer, layer)
    data = rand(2, 2, 5, 6, seed=9)
    x, tx = Tensor(data, requires_grad=True), torch.tensor(data, requires_grad=True)
    out, expected = layer(x), torch_layer(tx)
    close(out.numpy(), expected.detach().numpy())
    grad_output = rand(*expected.shape, seed=10)
    (out * Tensor(grad_output)).sum().backward()
    (expected * torch.tensor(grad_output)).sum().backward()
    close(x.grad.numpy(), tx.grad.numpy())
    close(layer.weight.grad.numpy(), torch_layer.weight.grad.numpy(), atol=1e-4)


@pytest.mark.parametrize("mode", ["reflect", "replicate", "circular"])
def test_conv1d_padding_mode_matches_torch(torch, mode):
    torch_layer = torch.nn.Conv1d(2, 4, 3, stride=2, padding=2, padding_mode=mode)
    layer = nn.Conv1d(2, 4, 3, 2, 2, 1, 1, True, mode)  # (torch's positional order)
    _copy_conv(torch_layer, layer)
    data = rand(3, 2, 7, seed=11)
    close(layer(Tensor(data)).numpy(), torch_layer(torch.tensor(data)).detach().numpy())


def test_padding_mode_differs_from_zeros(torch):
    # (guards the test above: were the mode ignored, "reflect" would give zeros padding's result)
    layer = nn.Conv2d(1, 1, 3, padding=1, padding_mode="reflect")
    zeros = nn.Conv2d(1, 1, 3, padding=1)
    zeros.weight, zeros.bias = layer.weight, layer.bias
    data = Tensor(rand(1, 1, 4, 4, seed=12))
    assert not np.allclose(layer(data).numpy(), zeros(data).numpy())


def test_padding_mode_errors():
    with pytest.raises(ValueError, match=r"Conv2d: padding_mode must be 'zeros', 'reflect', 'replicate' or 'circular'"):
        nn.Conv2d(1, 1, 3, padding_mode="constant")
    with pytest.raises(ValueError, match=r"ConvTranspose2d: only padding_mode='zeros'"):
        nn.ConvTranspose2d(1, 1, 3, padding_mode="reflect")
    layer = nn.Conv2d(1, 1, 3, padding=3, padding_mode="reflect")
    with pytest.raises(
        ValueError, match=r"Conv2d: padding_mode='reflect' pads spatial axis 0 .* smaller than its size 3"
    ):
        layer(Tensor.ones(1, 1, 3, 5))


def test_padding_mode_state_dict_is_torchs(torch):
    torch_layer = torch.nn.Conv2d(2, 3, 3, padding=1, padding_mode="circular")
    layer = nn.Conv2d(2, 3, 3, padding=1, padding_mode="circular")
    assert sorted(get_state_dict(layer)) == sorted(torch_layer.state_dict()) == ["bias", "weight"]
    load_state_dict(layer, {key: Tensor(value.numpy()) for key, value in torch_layer.state_dict().items()})
    data = rand(1, 2, 4, 4, seed=13)
    close(layer(Tensor(data)).numpy(), torch_layer(torch.tensor(data)).detach().numpy())


# ---- gradient clipping --------------------------------------------------------------------------------------------


def _clip_setup(torch, scale):
    """Two parameters with gradients (and one without) in lazygrad and torch, the gradients scaled by `scale`."""
    arrays = [rand(3, 4, seed=14), rand(5, seed=15), rand(2, seed=16)]
    ours = [Tensor(a, requires_grad=True) for a in arrays]
    theirs = [torch.tensor(a, requires_grad=True) for a in arrays]
    weights = [rand(3, 4, seed=17) * scale, rand(5, seed=18) * scale]
    (sum(((p * Tensor(w)).sum() for p, w in zip(ours, weights)), Tensor(0.0))).backward()
    sum((p * torch.tensor(w)).sum() for p, w in zip(theirs, weights)).backward()
    return ours, theirs


@pytest.mark.parametrize("norm_type", [2.0, 1.0, 3.0, math.inf, "inf"])
@pytest.mark.parametrize("max_norm", [0.5, 100.0])
def test_clip_grad_norm_matches_torch(torch, norm_type, max_norm):
    ours, theirs = _clip_setup(torch, 2.0)
    total = nn.utils.clip_grad_norm_(ours, max_norm, norm_type=norm_type)
    expected = torch.nn.utils.clip_grad_norm_(theirs, max_norm, norm_type=norm_type)
    assert isinstance(total, Tensor) and total.shape == ()
    close(total.numpy(), expected.numpy())
    for ours_param, their_param in zip(ours[:2], theirs[:2]):
        close(ours_param.grad.numpy(), their_param.grad.numpy())
    assert ours[2].grad is None


def test_clip_grad_norm_writes_in_place_and_takes_one_tensor(torch):
    ours, theirs = _clip_setup(torch, 3.0)
    held = ours[0].grad  # (torch's clip is in place: a gradient held before it sees the clipped values)
    nn.utils.clip_grad_norm_(ours[0], 0.25)
    torch.nn.utils.clip_grad_norm_(theirs[0], 0.25)
    close(held.numpy(), theirs[0].grad.numpy())
    close(np.linalg.norm(held.numpy()), 0.25, rtol=1e-4)


def test_clip_grad_norm_of_no_gradients_is_zero():
    assert nn.utils.clip_grad_norm_([Tensor.ones(2, requires_grad=True)], 1.0).item() == 0.0


def test_clip_grad_norm_nonfinite(torch):
    w = Tensor(np.ones(3, np.float32), requires_grad=True)
    (w * Tensor(np.array([1.0, np.inf, 2.0], np.float32))).sum().backward()
    with pytest.raises(RuntimeError, match=r"clip_grad_norm_: the total norm of order 2.0 of the gradients is inf"):
        nn.utils.clip_grad_norm_([w], 1.0, error_if_nonfinite=True)
    total = nn.utils.clip_grad_norm_([w], 1.0)  # (no check: clipped anyway, as torch's)
    tw = torch.ones(3, requires_grad=True)
    (tw * torch.tensor([1.0, math.inf, 2.0])).sum().backward()
    expected = torch.nn.utils.clip_grad_norm_([tw], 1.0)
    assert total.item() == expected.item() == math.inf
    np.testing.assert_array_equal(np.isnan(w.grad.numpy()), np.isnan(tw.grad.numpy()))


def test_clip_grad_value_matches_torch(torch):
    ours, theirs = _clip_setup(torch, 2.0)
    assert nn.utils.clip_grad_value_(ours, 0.7) is None
    torch.nn.utils.clip_grad_value_(theirs, 0.7)
    for ours_param, their_param in zip(ours[:2], theirs[:2]):
        close(ours_param.grad.numpy(), their_param.grad.numpy())
    assert abs(ours[0].grad.numpy()).max() == pytest.approx(0.7)


def test_clip_grad_norm_in_a_tinyjit_step(torch):
    # the clip is part of each replay: every step moves the weights by lr · max_norm in norm, whatever the input
    w = Tensor(np.zeros(4, np.float32), requires_grad=True)
    opt = nn.optim.SGD([w], lr=0.5)
    tw = torch.zeros(4, requires_grad=True)
    topt = torch.optim.SGD([tw], lr=0.5)

    @TinyJit
    def step(x):
        opt.zero_grad()
        (w * x).sum().backward()
        total = nn.utils.clip_grad_norm_([w], 0.1)
        opt.step()
        return total.realize()

    for number in range(4):
        data = rand(4, seed=20 + number) * (number + 1)
        total = step(Tensor(data))
        topt.zero_grad()
        (tw * torch.tensor(data)).sum().backward()
        expected = torch.nn.utils.clip_grad_norm_([tw], 0.1)
        topt.step()
        close(total.numpy(), expected.numpy())
        close(w.numpy(), tw.detach().numpy())


# ---- learning-rate schedulers -------------------------------------------------------------------------------------

SCHEDULES = [
    ("StepLR", {"step_size": 7}),
    ("StepLR", {"step_size": 3, "gamma": 0.5}),
    ("MultiStepLR", {"milestones": [3, 10, 10, 20], "gamma": 0.5}),
    ("ExponentialLR", {"gamma": 0.9}),
    ("CosineAnnealingLR", {"T_max": 10}),
    ("CosineAnnealingLR", {"T_max": 8, "eta_min": 0.001}),
    ("LambdaLR", {"lr_lambda": lambda epoch: 0.95**epoch / (1 + epoch % 4)}),
    ("LinearLR", {}),
    ("LinearLR", {"start_factor": 1.0, "end_factor": 0.1, "total_iters": 12}),
    ("OneCycleLR", {"max_lr": 0.5, "total_steps": 31}),
    (
        "OneCycleLR",
        {"max_lr": 0.3, "epochs": 4, "steps_per_epoch": 8, "anneal_strategy": "linear", "three_phase": True},
    ),
]


def _torch_lrs(torch, name, kwargs, steps, optimizer="SGD"):
    param = torch.zeros(2, requires_grad=True)
    opt = torch.optim.SGD([param], lr=0.1, momentum=0.9) if optimizer == "SGD" else torch.optim.Adam([param], lr=0.1)
    scheduler = getattr(torch.optim.lr_scheduler, name)(opt, **kwargs)
    lrs, momenta = [scheduler.get_last_lr()[0]], [_torch_momentum(opt)]
    for _ in range(steps):
        opt.step()
        scheduler.step()
        lrs.append(scheduler.get_last_lr()[0])
        momenta.append(_torch_momentum(opt))
    return lrs, momenta


def _torch_momentum(opt):
    group = opt.param_groups[0]
    return group["betas"][0] if "betas" in group else group["momentum"]


@pytest.mark.parametrize("name, kwargs", SCHEDULES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(SCHEDULES)])
def test_scheduler_matches_torch(torch, name, kwargs):
    steps = 30
    expected, expected_momenta = _torch_lrs(torch, name, kwargs, steps)
    opt = nn.optim.SGD([Tensor.zeros(2).contiguous()], lr=0.1, momentum=0.9)
    scheduler = getattr(nn.optim.lr_scheduler, name)(opt, **kwargs)
    lrs, momenta = [scheduler.get_last_lr()[0]], [opt.momentum]
    for _ in range(steps):
        scheduler.step()
        lrs.append(scheduler.get_last_lr()[0])
        momenta.append(opt.momentum)
    close(lrs, expected, atol=0, rtol=1e-12)
    close(momenta, expected_momenta, atol=0, rtol=1e-12)
    # the optimizer's rate tensor holds the last one (in float32)
    close(opt.lr.numpy()[0], expected[-1], atol=0, rtol=1e-6)


def test_scheduler_path_is_torchs():
    assert nn.optim.lr_scheduler is lr_scheduler
    assert nn.optim.lr_scheduler.StepLR is lr_scheduler.StepLR


def test_one_cycle_cycles_adams_beta1(torch):
    expected, expected_momenta = _torch_lrs(torch, "OneCycleLR", {"max_lr": 0.01, "total_steps": 10}, 9, "Adam")
    opt = nn.optim.Adam([Tensor.zeros(2).contiguous()], lr=0.1)
    scheduler = nn.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.01, total_steps=10)
    lrs, momenta = [scheduler.get_last_lr()[0]], [opt.b1]
    for _ in range(9):
        scheduler.step()
        lrs.append(scheduler.get_last_lr()[0])
        momenta.append(opt.b1)
    close(lrs, expected, atol=0, rtol=1e-12)
    close(momenta, expected_momenta, atol=0, rtol=1e-12)
    with pytest.raises(ValueError, match=r"OneCycleLR: tried to step 11 times, but total_steps is 10"):
        scheduler.step()
        scheduler.step()


def test_one_cycle_momentum_needs_sgd_momentum():
    opt = nn.optim.SGD([Tensor.zeros(2).contiguous()], lr=0.1)
    with pytest.raises(ValueError, match=r"OneCycleLR: cycle_momentum=True .* build it with momentum=0.9"):
        nn.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=10)
    nn.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=10, cycle_momentum=False)
    close(opt.lr.numpy()[0], 0.1 / 25)


def test_chained_schedulers_match_torch(torch):
    param = torch.zeros(2, requires_grad=True)
    topt = torch.optim.SGD([param], lr=0.1)
    theirs = [torch.optim.lr_scheduler.ExponentialLR(topt, 0.9), torch.optim.lr_scheduler.StepLR(topt, 4, 0.5)]
    opt = nn.optim.SGD([Tensor.zeros(2).contiguous()], lr=0.1)
    ours = [nn.optim.lr_scheduler.ExponentialLR(opt, 0.9), nn.optim.lr_scheduler.StepLR(opt, 4, 0.5)]
    for _ in range(12):
        topt.step()
        for scheduler in theirs + ours:
            scheduler.step()
        close(ours[1].get_last_lr(), theirs[1].get_last_lr(), atol=0, rtol=1e-12)


@pytest.mark.parametrize("name, kwargs", SCHEDULES[::2], ids=[n for n, _ in SCHEDULES[::2]])
def test_scheduler_state_dict_resumes(torch, name, kwargs):
    expected, _ = _torch_lrs(torch, name, kwargs, 20)
    opt = nn.optim.SGD([Tensor.zeros(2).contiguous()], lr=0.1, momentum=0.9)
    scheduler = getattr(nn.optim.lr_scheduler, name)(opt, **kwargs)
    for _ in range(10):
        scheduler.step()
    saved_scheduler = pickle.loads(pickle.dumps(scheduler.state_dict()))
    saved_optimizer = {key: Tensor(value.numpy()) for key, value in get_state_dict(opt).items()}
    assert "optimizer" not in saved_scheduler and saved_scheduler["last_epoch"] == 10
    # a new run: the scheduler built first (it sets the rate), then both states loaded, as torch's docs say
    resumed_opt = nn.optim.SGD([Tensor.zeros(2).contiguous()], lr=0.1, momentum=0.9)
    resumed = getattr(nn.optim.lr_scheduler, name)(resumed_opt, **kwargs)
    load_state_dict(resumed_opt, saved_optimizer)
    resumed.load_state_dict(saved_scheduler)
    assert resumed.get_last_lr() == scheduler.get_last_lr()
    lrs = []
    for _ in range(10):
        resumed.step()
        lrs.append(resumed.get_last_lr()[0])
    close(lrs, expected[11:], atol=0, rtol=1e-12)
    close(resumed_opt.lr.numpy()[0], expected[-1], atol=0, rtol=1e-6)


def test_lambda_lr_state_dict_keeps_callable_objects():
    class Warmup:
        def __init__(self):
            self.length = 3

        def __call__(self, epoch):
            return min(1.0, (epoch + 1) / self.length)

    opt = nn.optim.SGD([Tensor.zeros(2).contiguous()], lr=0.1)
    warmup = Warmup()
    scheduler = nn.optim.lr_scheduler.LambdaLR(opt, warmup)
    warmup.length = 5
    state = scheduler.state_dict()
    assert state["lr_lambdas"] == [{"length": 5}]
    fresh = Warmup()
    nn.optim.lr_scheduler.LambdaLR(opt, fresh).load_state_dict(state)
    assert fresh.length == 5
    assert nn.optim.lr_scheduler.LambdaLR(opt, lambda e: 1.0).state_dict()["lr_lambdas"] == [None]


def test_scheduler_errors():
    with pytest.raises(TypeError, match=r"StepLR: expected a lazygrad optimizer"):
        nn.optim.lr_scheduler.StepLR(object(), 3)
    opt = nn.optim.SGD([Tensor.zeros(2).contiguous()], lr=0.1)
    with pytest.raises(ValueError, match=r"LinearLR: start_factor must be in \(0, 1\]"):
        nn.optim.lr_scheduler.LinearLR(opt, start_factor=0)
    with pytest.raises(ValueError, match=r"OneCycleLR: give total_steps, or both epochs and steps_per_epoch"):
        nn.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, cycle_momentum=False)


@pytest.mark.parametrize(
    "name, kwargs", [("StepLR", {"step_size": 2, "gamma": 0.5}), ("CosineAnnealingLR", {"T_max": 5})]
)
def test_tinyjit_step_reads_the_scheduled_lr(torch, name, kwargs):
    # SGD without momentum: w -= lr_t · x, so the weights after each step show the rate that step used
    w = Tensor(np.zeros(3, np.float32), requires_grad=True)
    opt = nn.optim.SGD([w], lr=0.2)
    scheduler = getattr(nn.optim.lr_scheduler, name)(opt, **kwargs)
    tw = torch.zeros(3, requires_grad=True)
    topt = torch.optim.SGD([tw], lr=0.2)
    tscheduler = getattr(torch.optim.lr_scheduler, name)(topt, **kwargs)

    @TinyJit
    def step(x):
        opt.zero_grad()
        loss = (w * x).sum()
        loss.backward()
        opt.step()
        return loss.realize()

    previous = w.numpy()
    for number in range(8):
        data = rand(3, seed=30 + number)
        step(Tensor(data))
        topt.zero_grad()
        (tw * torch.tensor(data)).sum().backward()
        topt.step()
        close(w.numpy(), tw.detach().numpy(), atol=1e-6)
        # the rate this step used, from the weights' move: the schedule's, not the first one
        close((previous - w.numpy()) / data, np.full(3, tscheduler.get_last_lr()[0]), atol=1e-5, rtol=1e-4)
        previous = w.numpy()
        scheduler.step()
        tscheduler.step()
    assert tscheduler.get_last_lr()[0] != 0.2  # (the schedule moved: a replay stuck at 0.2 would fail above)


# ---- parameter groups ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("optimizer", ["SGD", "Adam", "AdamW", "LAMB"])
def test_param_groups_are_refused_with_the_fix(optimizer):
    groups = [{"params": [Tensor.ones(2)], "lr": 0.1}, {"params": [Tensor.ones(3)]}]
    with pytest.raises(
        TypeError, match=rf"{optimizer}: torch-style parameter groups are not supported .*one optimizer per group"
    ):
        getattr(nn.optim, optimizer)(groups)
    with pytest.raises(TypeError, match=r"parameter groups are not supported"):
        getattr(nn.optim, optimizer)(groups[0])


def test_a_generator_of_parameters_is_still_taken():
    w = Tensor.ones(2)
    opt = nn.optim.SGD((p for p in [w]), lr=0.1)
    assert opt.params == [w]


@pytest.mark.parametrize("optimizer", ["SGD", "Adam"])
def test_one_cycle_training_matches_torch(torch, optimizer):
    # eager steps, the rate and the cycled momentum (SGD's momentum, Adam's beta1) both changing each step
    w, tw = Tensor(np.ones(3, np.float32), requires_grad=True), torch.ones(3, requires_grad=True)
    if optimizer == "SGD":
        opt, topt = nn.optim.SGD([w], lr=0.1, momentum=0.9), torch.optim.SGD([tw], lr=0.1, momentum=0.9)
    else:
        opt, topt = nn.optim.Adam([w], lr=0.1), torch.optim.Adam([tw], lr=0.1)
    scheduler = nn.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.2, total_steps=5)
    tscheduler = torch.optim.lr_scheduler.OneCycleLR(topt, max_lr=0.2, total_steps=5)
    for number in range(5):
        data = rand(3, seed=40 + number)
        opt.zero_grad()
        (w * Tensor(data)).square().sum().backward()
        opt.step()
        scheduler.step()
        topt.zero_grad()
        (tw * torch.tensor(data)).square().sum().backward()
        topt.step()
        tscheduler.step()
        close(w.numpy(), tw.detach().numpy(), atol=1e-6)


def test_total_norm_and_clip_with_norm_match_torch(torch):
    ours, theirs = _clip_setup(torch, 2.0)
    grads = [p.grad for p in ours[:2]]
    total = nn.utils.get_total_norm(grads, norm_type=3.0)
    expected = torch.nn.utils.get_total_norm([p.grad for p in theirs[:2]], norm_type=3.0)
    close(total.numpy(), expected.numpy())
    nn.utils.clip_grads_with_norm_(ours, 0.3, total)
    torch.nn.utils.clip_grads_with_norm_(theirs, 0.3, expected)
    for ours_param, their_param in zip(ours[:2], theirs[:2]):
        close(ours_param.grad.numpy(), their_param.grad.numpy())
    assert nn.utils.get_total_norm([]).item() == 0.0


def test_conv_layers_take_torchs_device_and_dtype():
    from lazygrad import dtypes

    layer = nn.Conv2d(2, 3, 3, dtype=dtypes.float64, padding_mode="replicate", padding=1)
    assert layer.weight.dtype == layer.bias.dtype == dtypes.float64
    assert layer(Tensor.ones(1, 2, 4, 4, dtype=dtypes.float64)).dtype == dtypes.float64
    assert nn.ConvTranspose1d(2, 3, 3, dtype=dtypes.float64).weight.dtype == dtypes.float64
    with pytest.raises(TypeError, match=r"Conv2d: dtype must be a float dtype"):
        nn.Conv2d(2, 3, 3, dtype=dtypes.int32)
