"""Optimizers: each `step()` builds the update of every parameter and its state as assigns and realizes them all
in one schedule."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod

from lazygrad.engine.realize import collector_paused
from lazygrad.tensor import Tensor


def _one_minus_powers(bases: tuple[float, float], steps: Tensor) -> Tensor:
    """1 - base**steps for two bases, as a tensor of two, in float32 as closely as torch's float64 arithmetic:
    -expm1(steps * ln(base)). The plain difference cancels for a base near 1: with b2 = 0.999, one ulp of float32 in
    0.999**1 is 1e-4 of the result (a GPU's exp2, within 2 ulp, moved Adam's first steps by that much)."""
    first, second = (math.log(base) if base > 0 else -math.inf for base in bases)  # (0**steps is 0 for steps >= 1)
    return -(steps * (Tensor.arange(2, device=steps.device) == 0).where(first, second)).expm1()


def _refuse_shared(params: list[Tensor], name: str) -> None:
    """An error naming a parameter given twice (or two sharing memory, like `w` and a slice of it): both updates would
    write one buffer, which the scheduler refused only at `step`, with an internal error (torch refuses a parameter in
    two groups, and a slice, which is no leaf)."""
    first: dict = {}
    for number, param in enumerate(params):
        buffer = param.uop.base
        if buffer in first:
            earlier = first[buffer]
            same = "is the same tensor as" if params[earlier] is param else "shares its memory (a view) with"
            raise ValueError(
                f"{name}: parameter {number} (shape {param.shape}, {param.dtype}) {same} parameter {earlier} "
                f"(shape {params[earlier].shape}); pass each parameter once: nn.state.get_parameters(model) lists "
                "tied weights once"
            )
        first[buffer] = number


class Optimizer(ABC):
    """Holds float parameters; `zero_grad` clears their gradients, `step` updates them in place. Its state dict
    (nn.state.get_state_dict) is all a resumed run needs: loaded into a new optimizer, it continues the same steps."""

    def __init__(self, params: list[Tensor], lr: float):
        # tensors marked requires_grad=False (running statistics, counters) are state, not parameters
        params = [param for param in params if not (isinstance(param, Tensor) and param.requires_grad is False)]
        if not params:
            raise ValueError(
                f"{type(self).__name__}: got no parameters to optimize; pass e.g. nn.state.get_parameters(model)"
            )
        for param in params:
            if not isinstance(param, Tensor) or not param.dtype.is_float:
                raise TypeError(
                    f"{type(self).__name__}: parameters must be float Tensors, got {getattr(param, 'dtype', type(param))}"
                )
        for param in params:
            if param.requires_grad is None:
                param.requires_grad = True
        # parameters live in buffers so updates can be written in place
        Tensor.realize_all(*params)
        _refuse_shared(params, type(self).__name__)
        self.params = params
        # the learning rate is a tensor, so changing it (lr.assign) needs no recompile and a JIT replay sees it
        self.lr = Tensor([lr], requires_grad=False, device=params[0].device).realize()
        self.buffers: list[Tensor] = []

    def zero_grad(self) -> None:
        for param in self.params:
            param.grad = None

    def _state(self, like: Tensor) -> Tensor:
        state = (
            Tensor.zeros(*like.shape, dtype=like.dtype, device=like.device, requires_grad=False).contiguous().realize()
        )
        self.buffers.append(state)
        return state

    def step(self) -> None:
        """Apply one update to every parameter that has a gradient, in one schedule."""
        Tensor.realize_all(*self.schedule_step())

    def schedule_step(self) -> list[Tensor]:
        """The tensors to realize for one update. Realize them together with e.g. the loss
        (`Tensor.realize_all(loss, *opt.schedule_step())`): in one schedule, everything reads the old weights."""
        with collector_paused():  # (an update is a few nodes per parameter, many in all: see collector_paused)
            return self._updates()

    @abstractmethod
    def _updates(self) -> list[Tensor]:
        """Assign every parameter's (and its state's) new value; the tensors to realize."""

    def _gradient(self, param: Tensor) -> Tensor | None:
        if param.grad is None:
            return None
        return param.grad.detach()


class SGD(Optimizer):
    """Stochastic gradient descent with optional momentum, Nesterov momentum and (L2) weight decay, as in torch."""

    def __init__(
        self,
        params: list[Tensor],
        lr: float = 0.001,
        momentum: float = 0.0,
        weight_decay: float = 0.0,
        nesterov: bool = False,
    ):
        super().__init__(params, lr)
        if nesterov and momentum <= 0:
            raise ValueError("SGD: nesterov momentum needs momentum > 0")
        self.momentum, self.weight_decay, self.nesterov = momentum, weight_decay, nesterov
        self.velocity = [self._state(p) for p in self.params] if momentum else []

    def _updates(self) -> list[Tensor]:
        updated = []
        for number, param in enumerate(self.params):
            grad = self._gradient(param)
            if grad is None:
                continue
            if self.weight_decay:
                grad = grad + self.weight_decay * param.detach()
            if self.momentum:
                velocity = self.velocity[number]
                # torch starts the velocity at the first gradient: a velocity of zeros gives exactly that, with no
                # flag outside the state dict, so a loaded checkpoint resumes (and every step is one graph). The
                # update reads the assigned velocity, so it runs after the velocity's kernel
                velocity.assign(velocity * self.momentum + grad)
                updated.append(velocity)
                grad = grad + self.momentum * velocity if self.nesterov else velocity
            # (computed in float32 where the learning rate is, and stored in the parameter's dtype: half, bfloat16)
            param.assign((param.detach() - self.lr * grad).cast(param.dtype))
            updated.append(param)
        return updated


class LAMB(Optimizer):
    """Adam with decoupled weight decay and, when `adam` is False, LAMB's layer-wise trust ratio."""

    def __init__(
        self,
        params: list[Tensor],
        lr: float = 0.001,
        b1: float = 0.9,
        b2: float = 0.999,
        eps: float = 1e-6,
        weight_decay: float = 0.0,
        adam: bool = False,
    ):
        super().__init__(params, lr)
        for name, beta in (("b1", b1), ("b2", b2)):
            if not 0 <= beta < 1:
                raise ValueError(f"{type(self).__name__}: {name} must be in [0, 1) (a moment's decay), got {beta}")
        self.b1, self.b2, self.eps, self.weight_decay, self.adam = b1, b2, eps, weight_decay, adam
        device = self.params[0].device
        self.steps = Tensor([0.0], requires_grad=False, device=device).realize()
        self.first = [self._state(p) for p in self.params]
        self.second = [self._state(p) for p in self.params]
        # torch counts a parameter's steps only when it has a gradient: a parameter's count is `steps` less the
        # steps it had none. Every parameter has its counter from the start, so the state dict has the same keys
        # whatever steps a run missed, and a checkpoint loads into a new optimizer
        self.missed_steps = [Tensor.zeros(1, device=device, requires_grad=False).contiguous() for _ in self.params]
        Tensor.realize_all(*self.missed_steps)
        # the parameters whose counter may be nonzero: only their updates read it. The others share the bias
        # corrections of `steps`, built once a step (reading every counter made the eager Adam step of extra/bench.py's
        # transformer a quarter slower)
        self.reads_missed_steps = [False] * len(self.params)
        self.counters_loaded = False

    def state_loaded(self) -> None:
        """Called by nn.state.load_state_dict: the counters of missed steps may have changed, so the next step reads
        them (once per load). A TinyJit replays its capture's graph, in which only the
        parameters known then read their counter: load a checkpoint before its first call, or `reset()` it after."""
        self.counters_loaded = True

    def _scales(self, steps: Tensor) -> tuple[Tensor, Tensor]:
        """The bias corrections after `steps` steps as two numbers, as in torch: the first moment's scale (with
        Adam's learning rate in it: LAMB's trust ratio needs the update unscaled) and the second's."""
        corrections = _one_minus_powers((self.b1, self.b2), steps)
        first = corrections.reciprocal() * self.lr if self.adam else corrections.reciprocal()
        # both in one buffer of two, one kernel: fused into each update, their exp, log and square root were computed
        # again for every element of every parameter
        scales = (Tensor.arange(2, device=steps.device) == 0).where(first, corrections.rsqrt()).contiguous()
        return scales[0:1], scales[1:2]

    def _updates(self) -> list[Tensor]:
        if self.counters_loaded:  # (see state_loaded)
            self.reads_missed_steps = list(Tensor.cat(*self.missed_steps).numpy() != 0)  # (one read for them all)
            self.counters_loaded = False
        # the step count lives on the device so a JIT replay advances the bias corrections too
        self.steps.assign(self.steps + 1)
        shared_scales = self._scales(self.steps)
        decay = self.lr * self.weight_decay if self.adam else self.weight_decay
        updated = [self.steps]
        for number, (param, first, second) in enumerate(zip(self.params, self.first, self.second)):
            grad, missed = self._gradient(param), self.missed_steps[number]
            if grad is None:
                missed.assign(missed + 1)
                updated.append(missed)
                self.reads_missed_steps[number] = True
                continue
            first_scale, second_scale = (
                self._scales(self.steps - missed) if self.reads_missed_steps[number] else shared_scales
            )
            first.assign(self.b1 * first + (1 - self.b1) * grad)
            second.assign(self.b2 * second + (1 - self.b2) * grad * grad)
            update = first * first_scale / (second.sqrt() * second_scale + self.eps)
            if self.weight_decay:
                update = update + decay * param.detach()
            if not self.adam:
                weight_norm, update_norm = param.detach().square().sum().sqrt(), update.square().sum().sqrt()
                trust = ((weight_norm > 0) & (update_norm > 0)).where(weight_norm / update_norm, 1.0)
                update = update * (trust * self.lr)
            param.assign((param.detach() - update).cast(param.dtype))  # (see SGD)
            updated.extend([first, second, param])
        return updated


class Adam(LAMB):
    """Adam (Kingma & Ba), as torch.optim.Adam without weight decay."""

    def __init__(self, params: list[Tensor], lr: float = 0.001, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8):
        super().__init__(params, lr, b1, b2, eps, weight_decay=0.0, adam=True)


class AdamW(LAMB):
    """Adam with decoupled weight decay, as torch.optim.AdamW."""

    def __init__(
        self,
        params: list[Tensor],
        lr: float = 0.001,
        b1: float = 0.9,
        b2: float = 0.999,
        eps: float = 1e-8,
        weight_decay: float = 0.01,
    ):
        super().__init__(params, lr, b1, b2, eps, weight_decay=weight_decay, adam=True)
