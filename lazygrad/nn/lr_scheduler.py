"""Learning-rate schedules, as torch.optim.lr_scheduler (also reachable as `nn.optim.lr_scheduler`): StepLR,
MultiStepLR, ExponentialLR, CosineAnnealingLR, LambdaLR, LinearLR and OneCycleLR, with torch's arguments, defaults
and values.

An optimizer here has one learning rate (torch's single parameter group), a one-element tensor. A scheduler's
`step()` computes the next rate on the host, in Python floats with torch's own formulas (so `get_last_lr()` gives
torch's numbers), and writes it into that tensor with `assign`: a TinyJit training step reads the tensor, so its
replays use the new rate with no recapture. Call `scheduler.step()` outside the jitted function, after the
optimizer's step, as in torch.

The schedules that torch computes from the current rate (StepLR, ExponentialLR, CosineAnnealingLR, ...) continue from
the rate the last scheduler on the optimizer set, which every scheduler of that optimizer shares, so two schedulers
chain as torch's do. Reading the tensor back every step would wait for the device, so a rate written by hand
between steps (`opt.lr = 0.01`) is not seen by a running schedule (torch's chainable ones would continue from it)."""

from __future__ import annotations

import math
import types
from abc import ABC, abstractmethod
from bisect import bisect_right
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from lazygrad.dtype import dtypes
from lazygrad.nn.optim import SGD, Optimizer


def _current_lr(optimizer: Optimizer) -> float:
    """The optimizer's learning rate as a Python float: the one a scheduler last set, else read from its tensor once.
    A float32 rate is read as the shortest decimal that rounds to it (0.1, not 0.10000000149), the number the user
    most likely wrote, so a schedule from it gives torch's floats."""
    known = optimizer.__dict__.get("_scheduled_lr")
    if known is not None:
        return known
    value = optimizer.lr.numpy().reshape(-1)[0]
    value = float(str(np.float32(value))) if optimizer.lr.dtype == dtypes.float32 else float(value)
    optimizer.__dict__["_scheduled_lr"] = value
    return value


def _set_lr(optimizer: Optimizer, value: float) -> None:
    """Write `value` into the optimizer's learning-rate tensor and remember it for the next step's formulas. The
    write is realized now (one copy of a number): no write stays pending on the buffer a TinyJit replay reads."""
    optimizer.lr.assign(value).realize()
    optimizer.__dict__["_scheduled_lr"] = float(value)


class LRScheduler(ABC):
    """The base of the schedulers: `step()` moves to the next epoch (or batch) and sets the optimizer's learning rate,
    `get_last_lr()` is the list of the rates last set (one: lazygrad's optimizers have one parameter group), and
    `state_dict()` / `load_state_dict()` save and restore the schedule's position as a dict of Python values (as
    torch's; save it with pickle or torch.save, beside the optimizer's own state dict, which holds the rate). A
    subclass computes the next rate in `get_lr()` from `self.last_epoch`."""

    _is_initial = False

    def __init__(self, optimizer: Optimizer, last_epoch: int = -1):
        if not isinstance(optimizer, Optimizer):
            raise TypeError(
                f"{type(self).__name__}: expected a lazygrad optimizer (nn.optim.SGD, Adam, ...), got "
                f"{type(optimizer).__name__}"
            )
        self.optimizer = optimizer
        if last_epoch == -1:
            # (torch's group.setdefault("initial_lr", lr): the first scheduler of an optimizer fixes it)
            if "initial_lr" not in optimizer.__dict__:
                optimizer.__dict__["initial_lr"] = _current_lr(optimizer)
        elif "initial_lr" not in optimizer.__dict__:
            raise KeyError(
                f"{type(self).__name__}: last_epoch={last_epoch} resumes a schedule, which needs the optimizer's "
                "initial_lr (set by the scheduler that started it); build the scheduler with last_epoch=-1 and "
                "load its state_dict() instead"
            )
        self.base_lrs = [optimizer.__dict__["initial_lr"]]
        self.last_epoch = last_epoch
        self._step_count = 0
        # torch's first step, made when it is built: epoch 0's rate (LinearLR's start, OneCycleLR's initial_lr)
        self._is_initial = True
        try:
            self.step()
        finally:
            self._is_initial = False

    def _group_lr(self) -> float:
        return _current_lr(self.optimizer)

    @abstractmethod
    def get_lr(self) -> list[float]:
        """The rates for `self.last_epoch` (each schedule's formula)."""

    def get_last_lr(self) -> list[float]:
        """The learning rates the last `step()` set, one per parameter group (lazygrad's optimizers have one)."""
        return list(self._last_lr)

    def step(self, epoch: int | None = None) -> None:
        """Advance the schedule by one (call it after `optimizer.step()`) and set the optimizer's learning rate.
        `epoch` (deprecated in torch too) jumps to that epoch, by the closed form where the schedule has one."""
        self._step_count += 1
        if epoch is None:
            self.last_epoch += 1
            values = self.get_lr()
        else:
            self.last_epoch = epoch
            closed_form = getattr(self, "_get_closed_form_lr", None)
            values = closed_form() if closed_form is not None else self.get_lr()
        _set_lr(self.optimizer, values[0])
        self._last_lr = [float(value) for value in values]

    def state_dict(self) -> dict[str, Any]:
        """The schedule's state as a dict of Python values: everything but the optimizer, as torch's."""
        return {key: value for key, value in self.__dict__.items() if key != "optimizer"}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore a state from `state_dict()`. The optimizer's rate itself is in the optimizer's state dict: load
        that too (the next `step()` continues from the restored rate)."""
        self.__dict__.update(state_dict)
        if self.__dict__.get("_last_lr"):
            self.optimizer.__dict__["_scheduled_lr"] = float(self._last_lr[0])
        if "base_lrs" in state_dict:
            self.optimizer.__dict__.setdefault("initial_lr", float(self.base_lrs[0]))

    def _asdict(self) -> dict[str, Any]:
        # nn.state.get_state_dict walks a training state it is given: a scheduler holds no tensors of its own, and
        # walking on into its optimizer would list the optimizer's state a second time, under another name
        return {}


class LambdaLR(LRScheduler):
    """The initial rate times `lr_lambda(epoch)`, as torch's LambdaLR."""

    def __init__(self, optimizer: Optimizer, lr_lambda: Callable[[int], float] | list, last_epoch: int = -1):
        if isinstance(lr_lambda, (list, tuple)):
            if len(lr_lambda) != 1:
                raise ValueError(
                    f"LambdaLR: expected 1 lr_lambda (lazygrad's optimizers have one parameter group), got "
                    f"{len(lr_lambda)}"
                )
            self.lr_lambdas = list(lr_lambda)
        else:
            self.lr_lambdas = [lr_lambda]
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        return [base_lr * function(self.last_epoch) for function, base_lr in zip(self.lr_lambdas, self.base_lrs)]

    def state_dict(self) -> dict[str, Any]:
        """As torch's: the lambdas are saved only when they are callable objects (their attributes), not functions."""
        state = {key: value for key, value in self.__dict__.items() if key not in ("optimizer", "lr_lambdas")}
        state["lr_lambdas"] = [
            None if isinstance(function, types.FunctionType) else function.__dict__.copy()
            for function in self.lr_lambdas
        ]
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        state = dict(state_dict)
        lambdas = state.pop("lr_lambdas")
        super().load_state_dict(state)
        for function, saved in zip(self.lr_lambdas, lambdas):
            if saved is not None:
                function.__dict__.update(saved)


class StepLR(LRScheduler):
    """The rate times `gamma` every `step_size` epochs, as torch's StepLR."""

    def __init__(self, optimizer: Optimizer, step_size: int, gamma: float = 0.1, last_epoch: int = -1):
        self.step_size, self.gamma = step_size, gamma
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        if self.last_epoch == 0 or self.last_epoch % self.step_size != 0:
            return [self._group_lr()]
        return [self._group_lr() * self.gamma]

    def _get_closed_form_lr(self) -> list[float]:
        return [base_lr * self.gamma ** (self.last_epoch // self.step_size) for base_lr in self.base_lrs]


class MultiStepLR(LRScheduler):
    """The rate times `gamma` at each of the `milestones` epochs (twice at one listed twice), as torch's
    MultiStepLR."""

    def __init__(self, optimizer: Optimizer, milestones: Iterable[int], gamma: float = 0.1, last_epoch: int = -1):
        self.milestones, self.gamma = Counter(milestones), gamma
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        if self.last_epoch not in self.milestones:
            return [self._group_lr()]
        return [self._group_lr() * self.gamma ** self.milestones[self.last_epoch]]

    def _get_closed_form_lr(self) -> list[float]:
        milestones = sorted(self.milestones.elements())
        return [base_lr * self.gamma ** bisect_right(milestones, self.last_epoch) for base_lr in self.base_lrs]


class ExponentialLR(LRScheduler):
    """The rate times `gamma` every epoch, as torch's ExponentialLR."""

    def __init__(self, optimizer: Optimizer, gamma: float, last_epoch: int = -1):
        self.gamma = gamma
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        if self._is_initial:  # (resumed with last_epoch >= 0: the first step does not decay again)
            return [self._group_lr()]
        return [self._group_lr() * self.gamma]

    def _get_closed_form_lr(self) -> list[float]:
        return [base_lr * self.gamma**self.last_epoch for base_lr in self.base_lrs]


class LinearLR(LRScheduler):
    """The initial rate times a factor going linearly from `start_factor` to `end_factor` over `total_iters`
    epochs, then constant, as torch's LinearLR."""

    def __init__(
        self,
        optimizer: Optimizer,
        start_factor: float = 1.0 / 3,
        end_factor: float = 1.0,
        total_iters: int = 5,
        last_epoch: int = -1,
    ):
        if not 0 < start_factor <= 1.0:
            raise ValueError(f"LinearLR: start_factor must be in (0, 1] (as in torch), got {start_factor}")
        if not 0 <= end_factor <= 1.0:
            raise ValueError(f"LinearLR: end_factor must be in [0, 1] (as in torch), got {end_factor}")
        self.start_factor, self.end_factor, self.total_iters = start_factor, end_factor, total_iters
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        if self.last_epoch == 0:
            return [self._group_lr() * self.start_factor]
        if self._is_initial or self.last_epoch > self.total_iters:
            return [self._group_lr()]
        change = self.end_factor - self.start_factor
        ratio = 1.0 + change / (self.total_iters * self.start_factor + (self.last_epoch - 1) * change)
        return [self._group_lr() * ratio]

    def _get_closed_form_lr(self) -> list[float]:
        progress = min(self.total_iters, self.last_epoch) / self.total_iters
        return [
            base_lr * (self.start_factor + (self.end_factor - self.start_factor) * progress)
            for base_lr in self.base_lrs
        ]


class CosineAnnealingLR(LRScheduler):
    """Cosine annealing from the initial rate to `eta_min` over `T_max` epochs (and back up, periodically, past it),
    computed from the current rate as torch's CosineAnnealingLR computes it."""

    def __init__(self, optimizer: Optimizer, T_max: int, eta_min: float = 0.0, last_epoch: int = -1):  # noqa: N803
        self.T_max, self.eta_min = T_max, eta_min
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        lr, base_lr, epoch = self._group_lr(), self.base_lrs[0], self.last_epoch
        if self._is_initial:
            return [lr]
        if self._step_count == 1 and epoch > 0:
            return [self.eta_min + (base_lr - self.eta_min) * (1 + math.cos(epoch * math.pi / self.T_max)) / 2]
        if (epoch - 1 - self.T_max) % (2 * self.T_max) == 0:
            return [lr + (base_lr - self.eta_min) * (1 - math.cos(math.pi / self.T_max)) / 2]
        ratio = (1 + math.cos(math.pi * epoch / self.T_max)) / (1 + math.cos(math.pi * (epoch - 1) / self.T_max))
        return [ratio * (lr - self.eta_min) + self.eta_min]

    def _get_closed_form_lr(self) -> list[float]:
        cosine = 1 + math.cos(math.pi * self.last_epoch / self.T_max)
        return [self.eta_min + (base_lr - self.eta_min) * cosine / 2 for base_lr in self.base_lrs]


class OneCycleLR(LRScheduler):
    """The 1cycle policy, as torch's OneCycleLR: from max_lr / div_factor up to `max_lr` over the first `pct_start`
    of `total_steps` (or epochs × steps_per_epoch), then down to that / final_div_factor (`three_phase`: back to the
    start, then down), by cosine or linear annealing; step it after every batch. It sets the rate itself (the
    optimizer's own lr is not used).

    With `cycle_momentum` (torch's default) it also cycles the momentum, inversely, between `max_momentum` and
    `base_momentum`: SGD's `momentum` (an SGD built with momentum, as it has a velocity to cycle), or Adam's, AdamW's
    and LAMB's first decay `b1` (torch's beta1). Those are constants of the compiled update, not tensors: each new
    value compiles the step's update kernels again, and a TinyJit step keeps the momentum of its capture. With
    TinyJit pass cycle_momentum=False (the learning rate, a tensor, still follows the schedule)."""

    def __init__(
        self,
        optimizer: Optimizer,
        max_lr: float | list[float],
        total_steps: int | None = None,
        epochs: int | None = None,
        steps_per_epoch: int | None = None,
        pct_start: float = 0.3,
        anneal_strategy: str = "cos",
        cycle_momentum: bool = True,
        base_momentum: float | list[float] = 0.85,
        max_momentum: float | list[float] = 0.95,
        div_factor: float = 25.0,
        final_div_factor: float = 1e4,
        three_phase: bool = False,
        last_epoch: int = -1,
    ):
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"OneCycleLR: expected a lazygrad optimizer, got {type(optimizer).__name__}")
        if total_steps is not None:
            if not isinstance(total_steps, int) or total_steps <= 0:
                raise ValueError(f"OneCycleLR: expected a positive int total_steps, got {total_steps!r}")
            self.total_steps = total_steps
        elif epochs is not None and steps_per_epoch is not None:
            for name, value in (("epochs", epochs), ("steps_per_epoch", steps_per_epoch)):
                if not isinstance(value, int) or value <= 0:
                    raise ValueError(f"OneCycleLR: expected a positive int {name}, got {value!r}")
            self.total_steps = epochs * steps_per_epoch
        else:
            raise ValueError("OneCycleLR: give total_steps, or both epochs and steps_per_epoch")
        if not isinstance(pct_start, float) or not 0 <= pct_start <= 1:
            raise ValueError(f"OneCycleLR: expected a float pct_start between 0 and 1, got {pct_start!r}")
        if anneal_strategy not in ("cos", "linear"):
            raise ValueError(f"OneCycleLR: anneal_strategy must be 'cos' or 'linear', got {anneal_strategy!r}")
        self.anneal_strategy = anneal_strategy
        if three_phase:
            self._schedule_phases = [
                (float(pct_start * self.total_steps) - 1, "initial_lr", "max_lr", "max_momentum", "base_momentum"),
                (float(2 * pct_start * self.total_steps) - 2, "max_lr", "initial_lr", "base_momentum", "max_momentum"),
                (self.total_steps - 1, "initial_lr", "min_lr", "max_momentum", "max_momentum"),
            ]
        else:
            self._schedule_phases = [
                (float(pct_start * self.total_steps) - 1, "initial_lr", "max_lr", "max_momentum", "base_momentum"),
                (self.total_steps - 1, "max_lr", "min_lr", "base_momentum", "max_momentum"),
            ]
        # what torch keeps in the parameter group, kept here (so it is in this scheduler's state dict)
        max_lr = _one_value("max_lr", max_lr)
        self.group = {"initial_lr": max_lr / div_factor, "max_lr": max_lr}
        self.group["min_lr"] = self.group["initial_lr"] / final_div_factor
        self.cycle_momentum = cycle_momentum
        if cycle_momentum:
            self.momentum_name = _momentum_name(optimizer)
            self.group["max_momentum"] = _one_value("max_momentum", max_momentum)
            self.group["base_momentum"] = _one_value("base_momentum", base_momentum)
            if last_epoch == -1:
                setattr(optimizer, self.momentum_name, self.group["max_momentum"])
        if last_epoch == -1:
            optimizer.__dict__["initial_lr"] = self.group["initial_lr"]  # (torch sets the group's initial_lr too)
        super().__init__(optimizer, last_epoch)

    def _anneal(self, start: float, end: float, pct: float) -> float:
        if self.anneal_strategy == "cos":
            return end + (start - end) / 2.0 * (math.cos(math.pi * pct) + 1)
        return (end - start) * pct + start

    def get_lr(self) -> list[float]:
        step = self.last_epoch
        if step > self.total_steps:
            raise ValueError(
                f"OneCycleLR: tried to step {step} times, but total_steps is {self.total_steps}; make total_steps (or "
                "epochs × steps_per_epoch) cover the whole run"
            )
        start_step = 0.0
        for number, (end_step, start_lr, end_lr, start_momentum, end_momentum) in enumerate(self._schedule_phases):
            if step <= end_step or number == len(self._schedule_phases) - 1:
                pct = (step - start_step) / (end_step - start_step)
                lr = self._anneal(self.group[start_lr], self.group[end_lr], pct)
                if self.cycle_momentum:
                    momentum = self._anneal(self.group[start_momentum], self.group[end_momentum], pct)
                    setattr(self.optimizer, self.momentum_name, momentum)
                return [lr]
            start_step = end_step
        raise AssertionError("unreachable: the last phase takes every step")


def _one_value(name: str, value: float | list[float]) -> float:
    """A per-group value of torch's (a number, or a list of one per group): lazygrad's optimizers have one group."""
    if isinstance(value, (list, tuple)):
        if len(value) != 1:
            raise ValueError(
                f"OneCycleLR: expected 1 value for {name} (lazygrad's optimizers have one parameter group), got "
                f"{len(value)}"
            )
        value = value[0]
    return float(value)


def _momentum_name(optimizer: Optimizer) -> str:
    """The optimizer's attribute OneCycleLR cycles: SGD's momentum, or the Adam family's b1 (torch's beta1)."""
    if isinstance(optimizer, SGD):
        if not optimizer.momentum:
            raise ValueError(
                "OneCycleLR: cycle_momentum=True (torch's default) cycles SGD's momentum, but this SGD was built "
                "without momentum (no velocity to cycle; torch's would switch it on); build it with momentum=0.9, "
                "or pass cycle_momentum=False"
            )
        return "momentum"
    if hasattr(optimizer, "b1"):
        return "b1"
    raise ValueError(
        f"OneCycleLR: cycle_momentum=True needs an optimizer with a momentum or a beta1, got "
        f"{type(optimizer).__name__}; pass cycle_momentum=False"
    )
