"""Optimizers: each `step()` builds the update of every parameter and its state as assigns and realizes them all
in one schedule. A step is all or nothing: every gradient is read and checked before the first assign is issued, so
a step that raises changes no parameter, moment or counter."""

from __future__ import annotations

import math
import re
import warnings
from abc import ABC, abstractmethod
from typing import Any

import numpy as np

from lazygrad.dtype import DType, dtypes
from lazygrad.engine.buffers import is_buffer_view, views_memory
from lazygrad.engine.realize import collector_paused
from lazygrad.tensor import Tensor, pending_assigns
from lazygrad.tensor_nn import eval_mode_layers

# the keys of an optimizer's state dict before it held only its own state: the parameters (`params.N`, the model's
# weights) and a second copy of its moments (`buffers.N`). A checkpoint written then still loads: they are ignored
_OLD_STATE_KEY = re.compile(r"(params|buffers)\.\d+")


def _one_minus_powers(bases: tuple[float, float], steps: Tensor) -> Tensor:
    """1 - base**steps for two bases, as a tensor of two, in `steps`' dtype as closely as torch's float64 arithmetic:
    -expm1(steps * ln(base)). The plain difference cancels for a base near 1: with b2 = 0.999, one ulp of float32 in
    0.999**1 is 1e-4 of the result (a GPU's exp2, within 2 ulp, moved Adam's first steps by that much)."""
    first, second = (math.log(base) if base > 0 else -math.inf for base in bases)  # (0**steps is 0 for steps >= 1)
    if steps.dtype != dtypes.float32:  # (the logarithms as constants of that dtype: a Python float would be float32)
        first, second = (Tensor.full((), value, dtype=steps.dtype, device=steps.device) for value in (first, second))
    return -(steps * (Tensor.arange(2, device=steps.device) == 0).where(first, second)).expm1()


def _compute_dtype(param: Tensor) -> DType:
    """The dtype a parameter's update is computed in: float64 for float64 parameters, float32 for the others (half
    and bfloat16 updates are computed in float32 and stored in the parameter's dtype)."""
    return dtypes.float64 if param.dtype == dtypes.float64 else dtypes.float32


def _check_hyperparameter(optimizer: str, name: str, value: Any) -> None:
    """A number that must not be negative (as torch checks lr, momentum, eps and weight_decay)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{optimizer}: {name} must be a number, got {value!r}")
    if not value >= 0:  # (NaN too)
        raise ValueError(f"{optimizer}: invalid {name} {value}: it must be >= 0 (as in torch)")


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


def _refuse_view(param: Tensor, number: int, name: str) -> None:
    """An error for a parameter that is a view (a slice, transpose, flip or pad) of memory: an update cannot be
    written into it in place (assign refuses it), and an error then, in the middle of a step, left the parameters
    before it updated."""
    if views_memory(param.uop) and not is_buffer_view(param.uop):
        raise ValueError(
            f"{name}: parameter {number} (shape {param.shape}, {param.dtype}) is a view (a slice, transpose, flip or "
            "pad) of another tensor's memory, which a step cannot write in place (torch writes through the view into "
            "that tensor; lazygrad cannot); give it memory of its own first: p = p.contiguous().realize(), and hold "
            "that tensor in the model"
        )


class LearningRate(Tensor):
    """An optimizer's learning rate: a one-element tensor, so changing it (`opt.lr.assign(0.01)`) needs no recompile
    and a TinyJit replay reads it. `assign` takes a Python number or a one-element tensor of any shape, dtype or
    device (`opt.lr.assign(Tensor([0.01]))`)."""

    __slots__ = ()

    def assign(self, value: Tensor | Any) -> Tensor:
        if not isinstance(value, Tensor):
            if np.ndim(value) == 0:
                value = [value]
            value = Tensor(value, dtype=self.dtype, device=self.device)
        if value.numel() == 1:
            value = value.to(self.device).cast(self.dtype).reshape(self.shape)
        return super().assign(value)

    def __deepcopy__(self, memo: dict) -> LearningRate:
        copied = memo[id(self)] = LearningRate(self.numpy(), dtype=self.dtype, device=self.device, requires_grad=False)
        return copied

    def __reduce__(self):
        return LearningRate, (self.numpy(), self.dtype.name, self.device, False)


class _OnDevices:
    """A tensor of the optimizer's (the learning rate, the bias corrections) on each device and in each dtype a
    step needs it: the tensor itself where it already is, a copy (or a cast, fused into its readers) elsewhere, each
    made once a step."""

    def __init__(self, make):
        self.make, self.made = make, {}

    def __call__(self, dtype: DType, device: str):
        if (dtype, device) not in self.made:
            self.made[dtype, device] = self.make(dtype, device)
        return self.made[dtype, device]


def _on(tensor: Tensor | float, dtype: DType, device: str) -> Tensor | float:
    """`tensor` on `device` in `dtype` (a Python number, such as a learning rate set as `opt.lr = 0.01`, as it is)."""
    if not isinstance(tensor, Tensor):
        return tensor
    tensor = tensor if tensor.device == device else tensor.to(device)
    return tensor if tensor.dtype == dtype else tensor.cast(dtype)


class Optimizer(ABC):
    """Holds float parameters; `zero_grad` clears their gradients, `step` updates them in place. A float tensor
    marked requires_grad=False when it is built is frozen: it joins the trained parameters, with fresh state, at the
    first step it has a gradient (unfrozen later, as torch's "freeze the backbone" recipe; torch also makes a
    parameter's state at its first gradient). So `nn.state.get_parameters(model)` can be passed whole: BatchNorm's
    running statistics (requires_grad=False) never get a gradient, and int or bool state is left out. Parameters may
    be on several devices.

    Its state dict (nn.state.get_state_dict) holds its own state only, as torch's: the learning rate, moments and
    counters, not the parameters. It is all a resumed run needs: loaded into a new optimizer, it continues the same
    steps (and loading it leaves the model's weights as they are)."""

    def __init__(self, params: list[Tensor], lr: float):
        name = type(self).__name__
        if isinstance(params, Tensor):
            raise TypeError(f"{name}: params must be a list of tensors, got one tensor; pass [tensor]")
        params = _refuse_param_groups(params, name)
        _check_hyperparameter(name, "lr", lr)
        trained, frozen, left_out = [], [], 0
        for number, param in enumerate(params):
            if not isinstance(param, Tensor):
                raise TypeError(f"{name}: parameters must be float Tensors, got {type(param)} at position {number}")
            if not param.dtype.is_float:
                if param.requires_grad:
                    raise TypeError(
                        f"{name}: parameter {number} (shape {param.shape}) is {param.dtype} and requires_grad; only "
                        "float tensors can be trained"
                    )
                left_out += 1
                continue  # (int or bool state: counters, masks, position ids)
            position = len(trained) + len(frozen)  # (its number in the state dict: its place among the floats)
            if param.requires_grad is False:
                frozen.append((position, param))
                # a node of its own, as a trained parameter gets (two equal constants are one node, and realized
                # together one buffer: unfrozen later, both updates would write it)
                param.requires_grad = True
                param.requires_grad = False
                continue
            if param.requires_grad is None:
                param.requires_grad = True
            trained.append((position, param))
        kept = [param for _, param in trained + frozen]
        if not kept:
            ints = f" ({left_out} int or bool tensor{'s' if left_out != 1 else ''} left out)" if left_out else ""
            raise ValueError(
                f"{name}: got no float parameters to optimize{ints}; pass e.g. nn.state.get_parameters(model)"
            )
        # parameters live in buffers so updates can be written in place
        Tensor.realize_all(*kept)
        _refuse_shared(kept, name)
        for number, param in trained:
            _refuse_view(param, number, name)
        # the trained parameters, and each one's place among the float parameters given (frozen ones included): its
        # state's number in the state dict, as torch numbers it, whenever it joined
        self.params, self.positions = [param for _, param in trained], [number for number, _ in trained]
        self.frozen = frozen
        # the learning rate is a tensor, so changing it (lr.assign) needs no recompile and a JIT replay sees it. It
        # lives on the first parameter's device (a step copies it to the others'), in float64 if a parameter is
        # float64 (torch computes with Python's floats): float32 updates read it as float32
        self.lr = LearningRate(
            [lr],
            dtype=dtypes.float64 if any(param.dtype == dtypes.float64 for param in kept) else dtypes.float32,
            requires_grad=False,
            device=kept[0].device,
        ).realize()

    def __setattr__(self, name: str, value: Any) -> None:
        # `opt.lr = 0.01`, as torch's schedules write it, sets the learning-rate tensor a step (and a TinyJit replay)
        # reads and the state dict holds; replacing it with a float dropped `lr` from the state dict, so a resumed run
        # silently took the constructor's rate
        if name == "lr" and isinstance(self.__dict__.get("lr"), LearningRate) and not isinstance(value, LearningRate):
            if not isinstance(value, Tensor):  # (checked as the constructor checks it: None was a "ragged list")
                _check_hyperparameter(type(self).__name__, "lr", value)
            self.__dict__["lr"].assign(value)
            return
        super().__setattr__(name, value)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear every parameter's gradient: None (torch's default), or with `set_to_none=False` zeros where a
        parameter has one (a step then updates it with a zero gradient, as torch does)."""
        for param in self.params + [param for _, param in self.frozen]:
            if not set_to_none:
                try:
                    had = param.grad is not None
                except RuntimeError:  # (a released gradient: there was one)
                    had = True
                if had:
                    param.grad = param.zeros_like(requires_grad=False)
                    continue
            param.grad = None

    @staticmethod
    def _state(like: Tensor) -> Tensor:
        return Tensor.zeros(*like.shape, dtype=like.dtype, device=like.device, requires_grad=False).contiguous()

    def _add_state(self, param: Tensor, joining: bool = False) -> list[Tensor]:
        """Make a parameter's state (moments, counters) beside the others', for one `joining` after some steps or
        from the start; returns it, unrealized."""
        return []

    def _unfrozen(self) -> None:
        """Frozen parameters that have a gradient now join the trained ones, with fresh state."""
        self._join([(number, param) for number, param in self.frozen if param.grad is not None])

    def _join(self, joining: list[tuple[int, Tensor]]) -> None:
        if not joining:
            return
        numbers = {number for number, _ in joining}
        self.frozen = [(number, param) for number, param in self.frozen if number not in numbers]
        state = []
        for number, param in joining:
            _refuse_view(param, number, type(self).__name__)
            self.params.append(param)
            self.positions.append(number)
            state += self._add_state(param, joining=True)
        Tensor.realize_all(*state)

    def state_loading(self, state: dict[str, Any]) -> None:
        """Called by nn.state.load_state_dict with the state it loads (keys relative to this optimizer): a frozen
        parameter whose moments the checkpoint holds, in its shape (it had joined when it was saved), joins now, so
        they are loaded into its place. (Moments of another shape are left to the load's own check: it fails and
        nothing joins.)"""
        joining = []
        for number, param in self.frozen:
            moments = [state[key] for name in self._moments if (key := f"{name}.{number}") in state]
            try:
                shapes = [tuple(m.shape) if hasattr(m, "shape") else np.shape(m) for m in moments]
                if shapes and all(shape == param.shape for shape in shapes):
                    joining.append((number, param))
            except ValueError:  # (a ragged list: the load names it)
                pass
        self._join(joining)

    def _asdict(self) -> dict[str, Any]:
        """What nn.state walks for the state dict (as a namedtuple's fields): the optimizer's own state (learning
        rate, moments, counters), not the parameters, which are the model's. A parameter's state is numbered by its
        place in the list the optimizer was given, whenever it joined."""
        state = {name: value for name, value in vars(self).items() if name not in ("params", "positions", "frozen")}
        for name in self._per_parameter:
            state[name] = dict(zip(self.positions, state[name]))
        return state

    # the lists of state that hold one tensor for each trained parameter, in the order of self.params, and those
    # among them of the parameter's shape
    _per_parameter: tuple[str, ...] = ()
    _moments: tuple[str, ...] = ()

    @staticmethod
    def _ignores_state_key(key: str) -> bool:
        """Keys nn.state.load_state_dict skips: the parameters and the copies of the moments an optimizer's state
        dict held before (`params.N`, `buffers.N`), so old checkpoints load without overwriting the model."""
        return _OLD_STATE_KEY.fullmatch(key) is not None

    def step(self) -> None:
        """Apply one update to every parameter that has a gradient, in one schedule (with every other write still
        pending, such as batch norm's running statistics)."""
        Tensor.realize_all(*self.schedule_step())

    def schedule_step(self) -> list[Tensor]:
        """The tensors to realize for one update. Realize them together with e.g. the loss
        (`Tensor.realize_all(loss, *opt.schedule_step())`): in one schedule, everything reads the old weights. They
        include every other write still pending (batch norm's running statistics): state no one reads until eval
        would otherwise be a chain of one update per step, each keeping its batch alive."""
        if eval_mode_layers and not Tensor.training:
            trained = set(map(id, self.params))
            if layers := sorted({type(layer).__name__ for layer in eval_mode_layers if id(layer.weight) in trained}):
                warnings.warn(
                    f"{type(self).__name__}.step: {', '.join(layers)} ran in eval mode (Tensor.training is False, "
                    "lazygrad's default; torch's modules start in training mode): it normalized with running "
                    "statistics that never update, and dropout was off. Run the training step under "
                    "`with Tensor.train():` (or set Tensor.training = True)",
                    RuntimeWarning,
                    stacklevel=3,
                )
        eval_mode_layers.clear()
        with collector_paused():  # (an update is a few nodes per parameter, many in all: see collector_paused)
            return [*self._updates(), *pending_assigns()]

    @abstractmethod
    def _updates(self) -> list[Tensor]:
        """Assign every parameter's (and its state's) new value; the tensors to realize."""

    def _gradients(self) -> list[Tensor | None]:
        """Every parameter's gradient (None for one without), each read and checked before a step issues its first
        assign: a step that fails (a released gradient, a view) must change nothing."""
        self._unfrozen()
        name, grads = type(self).__name__, []
        for number, param in enumerate(self.params):
            grad = param.grad
            if grad is not None:
                if grad.device != param.device:
                    raise ValueError(
                        f"{name}: parameter {number} (shape {param.shape}) is on {param.device} but its gradient on "
                        f"{grad.device}; move the gradient (p.grad = p.grad.to(p.device))"
                    )
                _refuse_view(param, number, name)
                grad = grad.detach()
                if grad.dtype != param.dtype:
                    grad = grad.cast(param.dtype)
            grads.append(grad)
        return grads

    def _learning_rates(self) -> _OnDevices:
        return _OnDevices(lambda dtype, device: _on(self.lr, dtype, device))


class SGD(Optimizer):
    """Stochastic gradient descent with optional momentum (and dampening), Nesterov momentum and (L2) weight decay,
    as in torch."""

    _per_parameter, _moments = ("velocity", "momentum_started"), ("velocity",)

    def __init__(
        self,
        params: list[Tensor],
        lr: float = 0.001,
        momentum: float = 0.0,
        *by_position: Any,
        weight_decay: float = 0.0,
        nesterov: bool = False,
        dampening: float = 0.0,
    ):
        if by_position:  # (torch's fourth is dampening, tinygrad's weight_decay: a guess would be silently wrong)
            raise TypeError(
                f"SGD: got {len(by_position)} more positional arguments {by_position} after momentum; pass "
                "weight_decay=, nesterov= and dampening= by name (torch's and tinygrad's orders differ there)"
            )
        if not isinstance(nesterov, (bool, np.bool_)):
            raise TypeError(f"SGD: nesterov must be True or False, got {nesterov!r}")
        _check_hyperparameter("SGD", "lr", lr)
        for name, value in (("momentum", momentum), ("weight_decay", weight_decay)):
            _check_hyperparameter("SGD", name, value)
        if isinstance(dampening, bool) or not isinstance(dampening, (int, float, np.integer, np.floating)):
            raise TypeError(f"SGD: dampening must be a number, got {dampening!r}")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("SGD: nesterov momentum needs momentum > 0 and zero dampening")
        super().__init__(params, lr)
        self.momentum, self.weight_decay, self.nesterov = momentum, weight_decay, nesterov
        self.dampening = dampening
        self.velocity: list[Tensor] = []
        # with dampening, torch's first step takes the gradient undamped: whether a parameter's velocity has started
        # (it had a gradient) is state, on the device (a TinyJit replay) and in the state dict (a resumed run)
        self.momentum_started: list[Tensor] = []
        Tensor.realize_all(*(state for param in self.params for state in self._add_state(param)))

    def _add_state(self, param: Tensor, joining: bool = False) -> list[Tensor]:
        if not self.momentum:
            return []
        self.velocity.append(self._state(param))
        if not self.dampening:
            return [self.velocity[-1]]
        self.momentum_started.append(Tensor.zeros(1, dtype=dtypes.bool, device=param.device).contiguous())
        return [self.velocity[-1], self.momentum_started[-1]]

    def _updates(self) -> list[Tensor]:
        grads = self._gradients()  # (first: see _gradients)
        learning_rates = self._learning_rates()
        updated = []
        for number, (param, grad) in enumerate(zip(self.params, grads)):
            if grad is None:
                continue
            if self.weight_decay:
                grad = grad + self.weight_decay * param.detach()
            if self.momentum:
                velocity = self.velocity[number]
                # torch starts the velocity at the first gradient: a velocity of zeros gives exactly that, with no
                # flag outside the state dict, so a loaded checkpoint resumes (and every step is one graph). The
                # update reads the assigned velocity, so it runs after the velocity's kernel
                if self.dampening:
                    started = self.momentum_started[number]
                    damped = velocity * self.momentum + (1 - self.dampening) * grad
                    velocity.assign(started.reshape(()).where(damped, grad))
                    started.assign(started.ones_like())
                    updated.append(started)
                else:
                    velocity.assign(velocity * self.momentum + grad)
                updated.append(velocity)
                grad = grad + self.momentum * velocity if self.nesterov else velocity
            # (computed in float32 where the learning rate is, and stored in the parameter's dtype: half, bfloat16)
            lr = learning_rates(_compute_dtype(param), param.device)
            param.assign((param.detach() - lr * grad).cast(param.dtype))
            updated.append(param)
        return updated


def _betas(name: str, b1: float | None, b2: float | None, betas: tuple[float, float] | None) -> tuple[float, float]:
    """The two decays, given as torch's `betas=(b1, b2)` or tinygrad's `b1=`, `b2=` (not both)."""
    if isinstance(b1, (tuple, list)):  # (torch's positional order: (params, lr, betas, eps, weight_decay))
        raise TypeError(
            f"{name}: b1 is {b1!r}; pass torch's betas by keyword (betas=(b1, b2)): the positional order here is "
            "(params, lr, b1, b2, eps, weight_decay)"
        )
    if betas is not None:
        if b1 is not None or b2 is not None:
            raise TypeError(f"{name}: pass betas=(b1, b2) or b1= and b2=, not both")
        if not isinstance(betas, (tuple, list)) or len(betas) != 2:
            raise TypeError(f"{name}: betas must be two numbers (b1, b2), got {betas!r}")
        b1, b2 = betas
    b1, b2 = 0.9 if b1 is None else b1, 0.999 if b2 is None else b2
    for beta_name, beta in (("b1", b1), ("b2", b2)):
        if isinstance(beta, bool) or not isinstance(beta, (int, float, np.integer, np.floating)):
            raise TypeError(f"{name}: {beta_name} must be a number, got {beta!r}")
        if not 0 <= beta < 1:
            raise ValueError(f"{name}: {beta_name} must be in [0, 1) (a moment's decay), got {beta}")
    return float(b1), float(b2)


class LAMB(Optimizer):
    """Adam with decoupled weight decay and, when `adam` is False, LAMB's layer-wise trust ratio. The decays are
    `b1` and `b2`, or torch's `betas=(b1, b2)`."""

    _per_parameter = ("first", "second", "max_second", "missed_steps")
    _moments = ("first", "second", "max_second")

    def __init__(
        self,
        params: list[Tensor],
        lr: float = 0.001,
        b1: float | None = None,
        b2: float | None = None,
        eps: float = 1e-6,
        weight_decay: float = 0.0,
        adam: bool = False,
        *,
        betas: tuple[float, float] | None = None,
        decoupled_weight_decay: bool = True,
        amsgrad: bool = False,
    ):
        name = type(self).__name__
        _check_hyperparameter(name, "lr", lr)
        b1, b2 = _betas(name, b1, b2, betas)
        for hyper, value in (("eps", eps), ("weight_decay", weight_decay)):
            _check_hyperparameter(name, hyper, value)
        if not adam and not decoupled_weight_decay:
            raise ValueError(f"{name}: LAMB's weight decay is decoupled")
        if amsgrad and not adam:
            raise ValueError(f"{name}: amsgrad is Adam's variant; LAMB has none")
        super().__init__(params, lr)
        self.b1, self.b2, self.eps, self.weight_decay, self.adam = b1, b2, eps, weight_decay, adam
        self.decoupled_weight_decay, self.amsgrad = decoupled_weight_decay, amsgrad
        self.steps = Tensor([0.0], requires_grad=False, device=self.lr.device).realize()
        self.first: list[Tensor] = []
        self.second: list[Tensor] = []
        self.max_second: list[Tensor] = []  # amsgrad: the largest second moment so far, which the update divides by
        # torch counts a parameter's steps only when it has a gradient: a parameter's count is `steps` less the
        # steps it had none. Every parameter has its counter from the start, so the state dict has the same keys
        # whatever steps a run missed, and a checkpoint loads into a new optimizer
        self.missed_steps: list[Tensor] = []
        # the parameters whose counter may be nonzero: only their updates read it. The others share the bias
        # corrections of `steps`, built once a step (reading every counter made the eager Adam step of extra/bench.py's
        # transformer a quarter slower)
        self.reads_missed_steps: list[bool] = []
        self.counters_loaded = False
        Tensor.realize_all(*(state for param in self.params for state in self._add_state(param)))

    def _add_state(self, param: Tensor, joining: bool = False) -> list[Tensor]:
        state = [self._state(param), self._state(param)]
        self.first.append(state[0])
        self.second.append(state[1])
        if self.amsgrad:
            self.max_second.append(self._state(param))
            state.append(self.max_second[-1])
        missed = self._state(self.steps)
        if joining:  # (it missed every step so far: its first step with a gradient is its first, as in torch)
            missed.realize().assign(self.steps.detach())
        self.missed_steps.append(missed)
        self.reads_missed_steps.append(joining)
        return [*state, missed]

    def state_loaded(self) -> None:
        """Called by nn.state.load_state_dict: the counters of missed steps may have changed, so the next step reads
        them (once per load). A TinyJit replays its capture's graph, in which only the
        parameters known then read their counter: load a checkpoint before its first call, or `reset()` it after."""
        self.counters_loaded = True

    def _scales(self, steps: Tensor, dtype: DType = dtypes.float32) -> tuple[Tensor, Tensor]:
        """The bias corrections after `steps` steps as two numbers in `dtype`, as in torch: the first moment's scale
        (with Adam's learning rate in it: LAMB's trust ratio needs the update unscaled) and the second's."""
        steps = steps if steps.dtype == dtype else steps.cast(dtype)
        corrections = _one_minus_powers((self.b1, self.b2), steps)
        lr = _on(self.lr, dtype, steps.device)
        first = corrections.reciprocal() * lr if self.adam else corrections.reciprocal()
        # both in one buffer of two, one kernel: fused into each update, their exp, log and square root were computed
        # again for every element of every parameter
        scales = (Tensor.arange(2, device=steps.device) == 0).where(first, corrections.rsqrt()).contiguous()
        return scales[0:1], scales[1:2]

    def _updates(self) -> list[Tensor]:
        if self.counters_loaded:  # (see state_loaded)
            self.reads_missed_steps = list(Tensor.cat(*self.missed_steps).numpy() != 0)  # (one read for them all)
            self.counters_loaded = False
        grads = self._gradients()  # (before the counter advances: see _gradients)
        # the step count lives on the device so a JIT replay advances the bias corrections too
        self.steps.assign(self.steps + 1)

        def moved(scales: tuple[Tensor, Tensor], device: str) -> tuple[Tensor, Tensor]:
            return scales if device == self.steps.device else (scales[0].to(device), scales[1].to(device))

        # the bias corrections of `steps`, shared by every parameter that missed no step: built once a step for
        # each dtype (on the counter's device) and copied to each other device the parameters need. (Two tables: one
        # whose maker read the table itself would be a reference cycle, holding each step's tensors until a gc)
        home = self.steps.device
        at_home = _OnDevices(lambda dtype, _: self._scales(self.steps, dtype))
        shared = _OnDevices(lambda dtype, device: moved(at_home(dtype, home), device))
        learning_rates = self._learning_rates()
        updated = [self.steps]
        for number, (param, grad, first, second) in enumerate(zip(self.params, grads, self.first, self.second)):
            missed = self.missed_steps[number]
            if grad is None:
                missed.assign(missed + 1)
                updated.append(missed)
                self.reads_missed_steps[number] = True
                continue
            dtype = _compute_dtype(param)
            first_scale, second_scale = (
                moved(self._scales(self.steps - missed, dtype), param.device)
                if self.reads_missed_steps[number]
                else shared(dtype, param.device)
            )
            if self.weight_decay and not self.decoupled_weight_decay:  # (torch's Adam: L2, added to the gradient)
                grad = grad + self.weight_decay * param.detach()
            first.assign(self.b1 * first + (1 - self.b1) * grad)
            second.assign(self.b2 * second + (1 - self.b2) * grad * grad)
            denominator = second
            if self.amsgrad:
                largest = self.max_second[number]
                largest.assign(largest.maximum(second))
                updated.append(largest)
                denominator = largest
            update = first * first_scale / (denominator.sqrt() * second_scale + self.eps)
            if self.weight_decay and self.decoupled_weight_decay:
                decay = learning_rates(dtype, param.device) * self.weight_decay if self.adam else self.weight_decay
                update = update + decay * param.detach()
            if not self.adam:
                weight_norm, update_norm = param.detach().square().sum().sqrt(), update.square().sum().sqrt()
                trust = ((weight_norm > 0) & (update_norm > 0)).where(weight_norm / update_norm, 1.0)
                update = update * (trust * learning_rates(dtype, param.device))
            param.assign((param.detach() - update).cast(param.dtype))  # (see SGD)
            updated.extend([first, second, param])
        return updated


class Adam(LAMB):
    """Adam (Kingma & Ba), as torch.optim.Adam: `weight_decay` is torch's L2 penalty, added to the gradient
    (`decoupled_weight_decay=True` makes it AdamW's); `amsgrad` divides by the largest second moment so far. The
    decays are `b1` and `b2`, or torch's `betas=(b1, b2)`."""

    def __init__(
        self,
        params: list[Tensor],
        lr: float = 0.001,
        b1: float | None = None,
        b2: float | None = None,
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        *,
        betas: tuple[float, float] | None = None,
        amsgrad: bool = False,
        decoupled_weight_decay: bool = False,
    ):
        super().__init__(
            params,
            lr,
            b1,
            b2,
            eps,
            weight_decay=weight_decay,
            adam=True,
            betas=betas,
            decoupled_weight_decay=decoupled_weight_decay,
            amsgrad=amsgrad,
        )


class AdamW(LAMB):
    """Adam with decoupled weight decay, as torch.optim.AdamW. The decays are `b1` and `b2`, or torch's
    `betas=(b1, b2)`."""

    def __init__(
        self,
        params: list[Tensor],
        lr: float = 0.001,
        b1: float | None = None,
        b2: float | None = None,
        eps: float = 1e-8,
        weight_decay: float = 0.01,
        *,
        betas: tuple[float, float] | None = None,
        amsgrad: bool = False,
    ):
        super().__init__(params, lr, b1, b2, eps, weight_decay=weight_decay, adam=True, betas=betas, amsgrad=amsgrad)


def _refuse_param_groups(params: Any, name: str) -> list:
    """The parameters as a list, refusing torch's parameter groups (dicts such as {"params": [...], "lr": 0.01})
    with an error that says how to do the same: an optimizer here has one learning rate and one set of
    hyperparameters, and lazygrad has no combinator of optimizers. (A generator of tensors is read once, here.)"""
    if isinstance(params, dict) and "params" in params:
        params = [params]
    params = list(params)
    groups = [number for number, param in enumerate(params) if isinstance(param, dict)]
    if groups:
        keys = ", ".join(sorted(map(str, params[groups[0]])))
        raise TypeError(
            f"{name}: torch-style parameter groups are not supported (got a dict with keys {keys} at position "
            f"{groups[0]}): an optimizer here has one learning rate and one set of hyperparameters. Build one "
            f"optimizer per group instead, e.g. opts = [{name}(group['params'], lr=group['lr']) for group in groups], "
            "and call zero_grad() and step() on each"
        )
    return params


# torch's path for the schedulers, torch.optim.lr_scheduler (imported last: it builds on the optimizers above)
from lazygrad.nn import lr_scheduler  # noqa: E402,F401
