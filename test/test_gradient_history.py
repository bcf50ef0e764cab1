"""Gradients through values that were computed (realized) or written in place before backward: realization keeps a
computed tensor's history, so reading a statistic first, or an in-place op on a computed value, must not cut the
gradient. Each case runs the same code in torch."""

import numpy as np
import pytest

from lazygrad import Tensor

torch = pytest.importorskip("torch")

X = np.arange(12, dtype=np.float32).reshape(4, 3) / 10 - 0.5
W = np.array([[0.3, -0.2], [0.1, 0.5], [-0.4, 0.2]], np.float32)
B = np.array([0.1, -0.3], np.float32)


def both(step):
    """`step(lib, x, w, b)` run with lazygrad tensors and with torch's; the gradients of w and b from each."""
    ours = [Tensor(X), Tensor(W, requires_grad=True), Tensor(B, requires_grad=True)]
    step(Tensor, *ours).backward()
    theirs = [torch.tensor(X), torch.tensor(W, requires_grad=True), torch.tensor(B, requires_grad=True)]
    step(torch, *theirs).backward()
    for mine, expected in zip(ours[1:], theirs[1:]):
        assert mine.grad is not None, "no gradient"
        np.testing.assert_allclose(mine.grad.numpy(), expected.grad.numpy(), rtol=1e-5, atol=1e-6)


def test_reading_a_statistic_of_a_reduce_first():
    def step(lib, x, w, b):
        scores = (x @ w).sum(-1)
        (scores > 0).float().mean().item()  # (logged before the loss is built)
        return scores.square().mean() + b.sum()

    both(step)


def test_reading_a_statistic_of_a_matmul_first():
    def step(lib, x, w, b):
        h = x @ w + b
        h.max().item()
        float((h > 0).float().sum())
        return h.square().sum()

    both(step)


def test_a_median_beside_other_uses_of_its_input():
    def step(lib, x, w, b):
        h = x @ w
        return h.median(dim=1).values.sum() + h.sum() + b.sum()

    both(step)


@pytest.mark.parametrize("write", ["+=", "mul_", "setitem", "clamp_"])
def test_an_in_place_op_on_a_matmul_or_a_reduce(write):
    def step(lib, x, w, b):
        out = x @ w
        summed = (x * w.sum(1)).sum(0)
        for y in (out, summed):
            if write == "+=":
                y += b.sum()
            elif write == "mul_":
                y.mul_(2)
            elif write == "setitem":
                y[0] = b.sum() * 3
            else:
                y.clamp_(max=0.2)
        return (out * out).sum() + summed.sum() + b.sum()

    both(step)


def test_a_bias_added_in_place():
    def step(lib, x, w, b):
        out = x @ w
        out += b
        return out.relu().sum()

    both(step)


def test_a_value_kept_before_an_in_place_write_keeps_its_gradient():
    """`g = h.exp(); h += 1`: g is computed before the write (its value is h's old exp), and its gradient flows
    through the computation behind h, which the write did not touch (torch: exp saved its output)."""

    def step(lib, x, w, b):
        h = x @ w + b
        if lib is Tensor:
            h.realize()
        g = h.exp()
        h += 1
        return (g * h).sum()

    both(step)


@pytest.mark.parametrize("write", ["setitem input", "step", "assign"])
def test_backward_after_a_write_into_what_the_loss_read_is_an_error(write):
    """Where the loss's graph reads memory written since (the next batch loaded into the input, an optimizer step on a
    weight it read), the values its gradient needs are gone: torch raises, and so does this (it gave None)."""
    x, w = Tensor(X), Tensor(W, requires_grad=True)
    loss = (x @ w).square().sum()
    if write == "setitem input":
        x[0] = Tensor([9.0, 9.0, 9.0])
    elif write == "step":
        with Tensor.test():
            w -= 0.5 * w
        w.realize()
    else:
        x.assign(x * 2).realize()
    with pytest.raises(RuntimeError, match="computed before a write into memory it read"):
        loss.backward()


def test_equal_values_computed_together_then_one_written():
    """`a` and `b` are one computation until computed, then share a buffer; a write into `a` gives `b` a copy of its
    own, which keeps the gradient (it lost it)."""

    def step(lib, x, w, b):
        h = w * 2
        one, two = h * 1, h * 1
        if lib is Tensor:
            one.realize()
        one += 1
        return (one * two).sum() + b.sum()

    both(step)


@pytest.mark.parametrize("write", ["+=", "mul_", "setitem"])
def test_equal_reductions_are_separate_tensors_under_a_write(write):
    """`a = x.sum(1); b = x.sum(1)` are one node until computed; a write into one leaves the other alone, as torch's
    two tensors (b changed too), and both keep their gradients."""

    def step(lib, x, w, b):
        one, two = (x @ w).sum(1), (x @ w).sum(1)
        if write == "+=":
            one += 1
        elif write == "mul_":
            one.mul_(2)
        else:
            one[0] = b.sum()
        return (one * 3 + two * two).sum() + b.sum()

    both(step)
    x = Tensor(X)
    one, two = x.sum(1), x.sum(1)
    one += 1
    np.testing.assert_allclose(two.numpy(), X.sum(1), rtol=1e-6)


@pytest.mark.parametrize("read_first", [False, True])
def test_a_pending_update_of_a_weight_before_backward(read_first):
    """`with no_grad: w -= 0.1` issued between the forward pass and backward (the write still pending): the gradient is
    taken at the values the forward pass read, as torch's (nothing it saved was written). It was None."""
    x, w = Tensor(X), Tensor(W, requires_grad=True)
    loss = (x @ w).square().sum()
    with Tensor.test():
        w -= 0.1
    if read_first:
        loss.item()
    loss.backward()
    tw = torch.tensor(W, requires_grad=True)
    (torch.tensor(X) @ tw).square().sum().backward()
    np.testing.assert_allclose(w.grad.numpy(), tw.grad.numpy(), rtol=1e-5)
    np.testing.assert_allclose(w.numpy(), W - 0.1, rtol=1e-6)


def test_backward_after_the_weights_were_stepped_is_an_error():
    """A loss read, then its weights stepped (the write run), then backward: its graph would take the gradient at the
    new weights, so it says so (it gave None)."""
    x, w = Tensor(X), Tensor(W, requires_grad=True)
    loss = (x @ w).square().sum()
    loss.item()
    with Tensor.test():
        w -= 0.1
    w.realize()
    with pytest.raises(RuntimeError, match="computed before a write into memory it read"):
        loss.backward()


def zeros_of_data(lib, *shape):
    """A tensor of zeros made from data (memory of its own, as `Tensor(np.zeros(...))`), or torch's zeros."""
    return Tensor(np.zeros(shape, np.float32)) if lib is Tensor else torch.zeros(*shape)


@pytest.mark.parametrize("write", ["setitem", "+="])
def test_a_value_with_a_gradient_written_into_data(write):
    # (a plain assign has no derivative: w and b silently got no gradient, and the model did not train)
    def step(lib, x, w, b):
        out = zeros_of_data(lib, 4, 2)
        if write == "+=":
            out += x @ w + b
        else:
            for row in range(4):
                out[row] = (x[row] @ w + b).tanh()
        return out.square().sum()

    both(step)


def test_a_recurrence_written_row_by_row_into_data():
    # each row reads the row written before it: the gradient flows through every write in turn (torch refuses to
    # differentiate this in place, so its reference keeps the rows in a list)
    ours = [Tensor(X), Tensor(W, requires_grad=True), Tensor(B, requires_grad=True)]
    x, w, b = ours
    out = Tensor(np.zeros((4, 2), np.float32))
    out[0] = x[0] @ w
    for row in range(1, 4):
        out[row] = (x[row] @ w + out[row - 1] * b).tanh()
    out.square().sum().backward()
    x, w, b = torch.tensor(X), torch.tensor(W, requires_grad=True), torch.tensor(B, requires_grad=True)
    rows = [x[0] @ w]
    for row in range(1, 4):
        rows.append((x[row] @ w + rows[-1] * b).tanh())
    torch.stack(rows).square().sum().backward()
    for mine, expected in zip(ours[1:], (w, b)):
        np.testing.assert_allclose(mine.grad.numpy(), expected.grad.numpy(), rtol=1e-5, atol=1e-6)


def test_a_row_read_before_a_later_write_keeps_the_values_it_read():
    # row 1 is made of row 2's first values; row 2 is written afterwards: the gradient of w must use the first ones
    w = Tensor(W, requires_grad=True)
    out = Tensor(np.full((3, 2), 2.0, np.float32))
    out[1] = out[2] * w[0]
    out[2] = 5 * w[1]
    out.square().sum().backward()
    expected = np.zeros_like(W)
    expected[0] = 2 * (2.0 * W[0]) * 2.0
    expected[1] = 2 * (5 * W[1]) * 5
    np.testing.assert_allclose(w.grad.numpy(), expected, rtol=1e-6)


def test_data_written_into_data_keeps_no_history():
    # nothing in the values takes a gradient (as torch's tensors without requires_grad): the loop keeps no copies,
    # and a hand-written update of a data tensor in a training loop stays an update
    images = Tensor(np.zeros((4, 3), np.float32))
    for row in range(4):
        images[row] = Tensor(X[row]) * 2
    assert images.is_leaf
    np.testing.assert_array_equal(images.numpy(), X * 2)
    w = Tensor(W.copy())
    for _ in range(2):
        (Tensor(X) @ w).square().mean().backward()
        w -= 0.1 * w.grad
        w.grad = None
    assert w.is_leaf


def truncated_backprop(lib, detach, steps=3):
    """A hidden state carried from one optimizer step to the next, detached (truncated backpropagation through
    time); the losses."""
    import lazygrad.nn.optim as optim

    data = np.float32([[0.5, -0.2], [0.1, 0.3]])
    if lib is Tensor:
        w = Tensor(data, requires_grad=True)
        opt, h, x = optim.SGD([w], lr=0.1), Tensor.zeros(1, 2), Tensor([[1.0, 2.0]])
    else:
        w = torch.tensor(data, requires_grad=True)
        opt, h, x = torch.optim.SGD([w], lr=0.1), torch.zeros(1, 2), torch.tensor([[1.0, 2.0]])
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        h = (x + h @ w).tanh()
        loss = h.sum()
        loss.backward()
        if detach == "before the step" and lib is Tensor:
            h = h.detach().realize()
        elif detach == "copied before the step" and lib is Tensor:
            h = h.detach().contiguous()
        opt.step()
        h = h.detach()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("detach", ["after the step", "before the step", "copied before the step"])
def test_a_detached_state_carried_across_optimizer_steps(detach):
    # (the state's own computation read the weights the step overwrote: backward raised, though no gradient passes
    # the detach; below it only the values in memory are read)
    np.testing.assert_allclose(truncated_backprop(Tensor, detach), truncated_backprop(torch, detach), rtol=1e-6)


def test_a_detached_state_carried_across_jit_steps():
    import lazygrad.nn.optim as optim
    from lazygrad import TinyJit

    w = Tensor(np.float32([[0.5, -0.2], [0.1, 0.3]]), requires_grad=True)
    opt = optim.SGD([w], lr=0.1)

    @TinyJit
    def step(x, h):
        opt.zero_grad()
        h = (x + h @ w).tanh()
        loss = h.sum()
        loss.backward()
        detached = h.detach().realize()
        opt.step()
        return loss.realize(), detached

    h, losses = Tensor.zeros(1, 2).contiguous(), []
    for _ in range(4):
        loss, h = step(Tensor([[1.0, 2.0]]), h)
        losses.append(loss.item())
    np.testing.assert_allclose(losses, truncated_backprop(torch, "after the step", steps=4), rtol=1e-6)


def test_a_value_without_a_gradient_path_made_before_a_step():
    # last step's argmax weighs this step's loss: nothing passes a gradient into it, so the step's write into the
    # weights it read leaves it a plain value (backward raised)
    def losses(lib):
        data, inputs = np.float32([[0.5, -0.2, 0.3], [0.1, 0.3, -0.4]]), np.float32([[1.0, 2.0], [0.5, -1.0]])
        w = Tensor(data, requires_grad=True) if lib is Tensor else torch.tensor(data, requires_grad=True)
        if lib is Tensor:
            from lazygrad.nn.optim import SGD

            opt, x, weight = SGD([w], lr=0.1), Tensor(inputs), Tensor.ones(2)
        else:
            opt, x, weight = torch.optim.SGD([w], lr=0.1), torch.tensor(inputs), torch.ones(2)
        found = []
        for _ in range(3):
            opt.zero_grad()
            logits = x @ w
            loss = (logits.logsumexp(-1) * weight).sum()
            loss.backward()
            weight = (logits.argmax(-1) == 0).float() + 1.0
            opt.step()
            found.append(loss.item())
        return found

    np.testing.assert_allclose(losses(Tensor), losses(torch), rtol=1e-6)


def test_a_detached_value_realized_passes_no_gradient():
    # `y.detach().realize()` became y's memory view, which held y's history: w got a gradient through it
    w, v = Tensor([1.0, 2.0], requires_grad=True), Tensor([1.0, 1.0], requires_grad=True)
    y = Tensor([3.0, 4.0]) * w
    h = y.detach().realize()
    (h * v).sum().backward()
    assert w.grad is None
    np.testing.assert_array_equal(v.grad.numpy(), [3.0, 8.0])
    h += 1  # (still a name of the memory it was computed into)
    np.testing.assert_array_equal(h.numpy(), [4.0, 9.0])


def test_a_repeated_training_step_finds_its_plans_again():
    # the values a step's write keeps join its schedule in the order their tensors were made: a tensor's id reused
    # before the registry forgot the dead one took the dead one's place, so each step of an unrolled LSTM made new
    # plans (0.2 s each for 10 steps of time)
    import lazygrad.engine.schedule as schedule
    from lazygrad.nn.optim import Adam

    rng = np.random.default_rng(0)
    batch, features, hidden = 4, 8, 16
    w_in = Tensor.randn(4 * hidden, features) * 0.3
    w_hidden = Tensor.randn(4 * hidden, hidden) * 0.3
    w_in, w_hidden = (w.detach().contiguous().realize().requires_grad_() for w in (w_in, w_hidden))
    opt, planned = Adam([w_in, w_hidden], lr=1e-3), []
    for _ in range(5):
        x = Tensor(rng.standard_normal((6, batch, features)).astype(np.float32))
        opt.zero_grad()
        h, c, outputs = Tensor.zeros(batch, hidden), Tensor.zeros(batch, hidden), []
        for t in range(6):
            i, f, g, o = (x[t] @ w_in.T + h @ w_hidden.T).chunk(4, 1)
            c = f.sigmoid() * c + i.sigmoid() * g.tanh()
            h = o.sigmoid() * c.tanh()
            outputs.append(h)
        loss = Tensor.stack(outputs).square().mean()
        loss.backward()
        opt.step()
        loss.item()
        planned.append(len(schedule._plans))
    assert planned[-1] == planned[-3], planned


@pytest.mark.parametrize("read", ["the loss", "a weight", "nothing"])
def test_a_weight_written_then_read_before_backward_takes_its_gradient(read):
    # a write under Tensor.test() (an update, a clamp) that something ran before backward (`loss.item()`, printing a
    # weight): the loss read the written value, and the weight got no gradient (the optimizer silently skipped it)
    def step(lib, x, w, b):
        return (x @ w + b).square().mean()

    ours = [Tensor(X), Tensor(W, requires_grad=True).realize(), Tensor(B, requires_grad=True).realize()]
    theirs = [torch.tensor(X), torch.tensor(W, requires_grad=True), torch.tensor(B, requires_grad=True)]
    with Tensor.test():
        ours[1] -= 0.25
        ours[2].clamp_(-0.2, 0.05)
    with torch.no_grad():
        theirs[1] -= 0.25
        theirs[2].clamp_(-0.2, 0.05)
    loss = step(Tensor, *ours)
    if read == "the loss":
        loss.item()
    elif read == "a weight":
        ours[1].numpy()
    loss.backward()
    step(torch, *theirs).backward()
    for mine, expected in zip(ours[1:], theirs[1:]):
        assert mine.grad is not None, "no gradient"
        np.testing.assert_allclose(mine.grad.numpy(), expected.grad.numpy(), rtol=1e-5, atol=1e-6)


def test_a_gradient_added_to_one_an_optimizer_step_released():
    # a GAN: the generator's loss reaches the discriminator its optimizer just stepped (torch adds to that .grad,
    # which the discriminator's next zero_grad clears); backward raised. What it holds is unknown: reading it says so
    from lazygrad.nn.optim import SGD

    d = Tensor(np.float32([[0.2], [0.7]]), requires_grad=True)
    g = Tensor(np.float32([[0.5, -0.3]]), requires_grad=True)
    opt_d = SGD([d], lr=0.1)
    fake = Tensor(np.float32([[1.0], [2.0]])) @ g
    (fake.detach() @ d).sigmoid().mean().backward()
    opt_d.step()
    (fake @ d).sigmoid().mean().backward()
    assert g.grad is not None
    with pytest.raises(RuntimeError, match="released"):
        d.grad.numpy()
    opt_d.zero_grad()
    assert d.grad is None


def test_writes_into_data_through_a_reshape_into_a_target_without_gradients_and_after_a_test_mode_write():
    w = Tensor([1.0, 2.0, 3.0, 4.0], requires_grad=True)
    o = Tensor(np.zeros(8, np.float32))
    o.reshape(2, 4)[1] = w * 2  # (the base, o, got no history: the loss read from it gave w no gradient)
    o.sum().backward()
    np.testing.assert_array_equal(w.grad.numpy(), [2.0] * 4)
    w.grad = None
    out = Tensor(np.zeros((2, 4), np.float32), requires_grad=False)  # (as torch, the write makes it take gradients)
    out[1] = w * 3
    out.sum().backward()
    np.testing.assert_array_equal(w.grad.numpy(), [3.0] * 4)
    w.grad = None
    o = Tensor(np.zeros((3, 4), np.float32))
    o[0] = w * 2
    with Tensor.test():
        o[1] = w * 3
    o[2] = w * 4  # (recorded again: it was dropped, and every write after it)
    o.sum().backward()
    np.testing.assert_array_equal(w.grad.numpy(), [4.0] * 4)  # (the test-mode write drops what came before it)


def test_random_numbers_written_into_data_keep_nothing():
    # a data loader adding noise: torch's randn carries no gradient, and the batch stays a leaf (it kept a history,
    # and each write copied the whole batch)
    batch = Tensor(np.zeros((4, 8), np.float32))
    for row in range(4):
        batch[row] = Tensor(np.ones(8, np.float32)) + Tensor.randn(8) * 0.1
    assert batch.is_leaf
