"""Views and in-place writes as torch has them: a write pending on a buffer runs whether or not the tensor that made it
lives, every name of the memory (a view, a reshape, a detached tensor) reads it, two names writing in turn both count,
writes through a reshape of a constant or of a tensor with gradient history reach that tensor (keeping its gradient),
and the movement ops torch copies with (flip, pad, repeat, ...) keep the values they were made from. Each is compared
with torch's values and gradients."""

import gc

import numpy as np
import pytest

from lazygrad import Tensor


def _both(torch, values):
    """The same float32 values as a realized lazygrad tensor and a torch tensor."""
    array = np.asarray(values, dtype=np.float32)
    return Tensor(array).realize(), torch.tensor(array)


def _same(ours, theirs):
    np.testing.assert_allclose(ours.numpy(), theirs.detach().numpy(), rtol=1e-6, atol=1e-6)


# ---- 1. a pending write runs even when the tensor that made it died ----------------------------------------------------


def test_an_in_place_op_through_a_view_that_died_still_runs(torch):
    ours = [Tensor([[1.0, 2.0], [3.0, 4.0]]).realize() for _ in range(3)]
    theirs = [torch.tensor([[1.0, 2.0], [3.0, 4.0]]) for _ in range(3)]
    for params in (ours, theirs):
        for p in params:
            flat = p.view(-1)
            flat *= 0.5  # (`flat` is rebound before anything reads the parameters)
    gc.collect()
    for mine, their in zip(ours, theirs):
        _same(mine, their)


@pytest.mark.parametrize("form", ["del", "helper", "temporary assign", "setitem then del"])
def test_writes_through_views_that_die_reach_the_tensor(torch, form):
    def run(x, ones):
        if form == "del":
            y = x.reshape(2, 2)
            y += 1
            del y
        elif form == "helper":

            def scale(t):
                v = t.view(2, 2)
                v *= 10

            scale(x)
            scale(x)
        elif form == "temporary assign":
            x.reshape(2, 2).copy_(ones) if hasattr(x, "copy_") else x.reshape(2, 2).assign(ones)
        else:
            y = x.reshape(2, 2)
            y[0] = 7.0
            y += 1
            del y
        gc.collect()
        return x

    ours, theirs = _both(torch, [0.0, 1.0, 2.0, 3.0])
    _same(run(ours, Tensor.ones(2, 2)), run(theirs, torch.ones(2, 2)))


def test_a_write_through_a_dead_view_counts_in_a_step_and_its_gradient(torch):
    # a view's write, its tensor gone, reaches a value built later (and the gradient through it)
    def run(x, w):
        y = x * 2
        z = y.reshape(4, 3)
        z += 1
        del z
        return y * w

    data = np.arange(12, dtype=np.float32).reshape(3, 4) / 7
    weights = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    x, w = Tensor(data, requires_grad=True), Tensor(weights)
    tx, tw = torch.tensor(data, requires_grad=True), torch.tensor(weights)
    out, their_out = run(x, w), run(tx, tw)
    out.sum().backward()
    their_out.sum().backward()
    _same(out, their_out)
    _same(x.grad, tx.grad)


# ---- 2. writes through views of constants ------------------------------------------------------------------------------


CREATORS = {
    "zeros": (lambda: Tensor.zeros(4), lambda torch: torch.zeros(4)),
    "ones": (lambda: Tensor.ones(4), lambda torch: torch.ones(4)),
    "full": (lambda: Tensor.full((4,), 3.0), lambda torch: torch.full((4,), 3.0)),
    "zeros_like": (lambda: Tensor([1.0, 2.0, 3.0, 4.0]).zeros_like(), lambda torch: torch.zeros(4)),
    "arange": (lambda: Tensor.arange(4).float(), lambda torch: torch.arange(4).float()),
    "arange int": (lambda: Tensor.arange(4), lambda torch: torch.arange(4)),
}


@pytest.mark.parametrize("name", [name for name in CREATORS if name != "arange"])  # (a cast of one: a computation)
def test_setitem_through_a_reshape_of_a_constant_reaches_it(torch, name):
    ours, theirs = CREATORS[name][0](), CREATORS[name][1](torch)
    ours.reshape(2, 2)[1] = 7
    theirs.reshape(2, 2)[1] = 7
    np.testing.assert_array_equal(ours.numpy(), theirs.numpy())


@pytest.mark.parametrize("name", CREATORS)
def test_an_in_place_op_through_a_reshape_of_a_constant_reaches_it(torch, name):
    ours, theirs = CREATORS[name][0](), CREATORS[name][1](torch)
    for x in (ours, theirs):
        y = x.reshape(2, 2)
        y *= 10
        y += 1
    np.testing.assert_array_equal(ours.numpy(), theirs.numpy())


def test_writes_through_views_of_unrealized_constants(torch):
    ours, theirs = Tensor.zeros(2, 3), torch.zeros(2, 3)
    for x in (ours, theirs):
        v = x.reshape(6)
        v[2] = 7.0
        v[1:3] = v[1:3] + 1.0  # (`v[1:3] += 1`, which lazygrad refuses: see the README)
    np.testing.assert_array_equal(ours.numpy(), theirs.numpy())
    # torch's pattern: a buffer made with zeros, filled through a view of another shape
    ours, theirs = Tensor.zeros(2 * 3, 4), torch.zeros(2 * 3, 4)
    ours.view(2, 3, 4)[:, 0] = Tensor.ones(2, 4)
    theirs.view(2, 3, 4)[:, 0] = torch.ones(2, 4)
    np.testing.assert_array_equal(ours.numpy(), theirs.numpy())
    # `empty`: only the written row is defined
    x = Tensor.empty(4)
    x.reshape(2, 2)[1] = 7.0
    np.testing.assert_array_equal(x.numpy()[2:], [7.0, 7.0])


def test_a_slice_of_a_constant_writes_through_to_it_as_a_slice_of_memory_does():
    # (it went into the slice alone, and then was refused)
    x = Tensor.zeros(2, 3)
    row = x[0]
    row[1] = 9.0
    np.testing.assert_array_equal(x.numpy(), [[0.0, 9.0, 0.0], [0.0, 0.0, 0.0]])
    np.testing.assert_array_equal(row.numpy(), [0.0, 9.0, 0.0])
    # a view of a constant no live tensor holds is a value of its own
    y = Tensor.zeros(4).reshape(2, 2)
    y += 1
    np.testing.assert_array_equal(y.numpy(), np.ones((2, 2)))


def test_equal_constants_are_told_apart_or_refused():
    # two equal constants are one node until computed: a write through a reshape of one cannot tell which it reaches
    a, b = Tensor.zeros(4), Tensor.zeros(4)
    with pytest.raises(RuntimeError, match="tensors hold"):
        a.reshape(2, 2)[0] = 1.0
    a = a.contiguous()
    a.reshape(2, 2)[0] = 1.0
    np.testing.assert_array_equal(a.numpy(), [1.0, 1.0, 0.0, 0.0])
    np.testing.assert_array_equal(b.numpy(), [0.0, 0.0, 0.0, 0.0])


# ---- 3. a value built after a pending write, from any name of the buffer, reads it ------------------------------------


def test_a_value_built_from_a_view_after_a_write_sees_it(torch):
    ours, theirs = _both(torch, [0.0, 1.0, 2.0, 3.0])
    results = []
    for x in (ours, theirs):
        y = x[1:3]
        x += 10
        results.append(((y * 1), y, (y * 1)))
    for mine, their in zip(*results):
        _same(mine, their)


def test_a_transpose_made_before_an_update_reads_the_updated_weights(torch):
    ours, theirs = _both(torch, [[1.0, 2.0], [3.0, 4.0]])
    outs = []
    for w, make in ((ours, Tensor), (theirs, torch.tensor)):
        w_t = w.T
        if w is theirs:
            with torch.no_grad():
                w -= 1.0
        else:
            with Tensor.test():
                w -= 1.0
        outs.append(make([[1.0, 0.0]]) @ w_t)
    _same(*outs)


@pytest.mark.parametrize("read", ["mul", "sum", "slice", "view mul"])
def test_a_value_built_from_the_base_after_a_write_through_a_view_sees_it(torch, read):
    ours, theirs = _both(torch, [0.0, 1.0, 2.0, 3.0])
    outs = []
    for x in (ours, theirs):
        y = x.reshape(2, 2)
        if read == "view mul":
            x += 10
            outs.append(y * 1)
            continue
        y += 10
        outs.append({"mul": x * 1, "sum": x.sum(), "slice": x[1:3] * 1}[read])
    _same(*outs)


def test_values_built_before_a_write_keep_their_values(torch):
    ours, theirs = _both(torch, [0.0, 1.0, 2.0, 3.0])
    outs = []
    for x in (ours, theirs):
        y = x[1:3]
        before = y * 1
        kept = (x * 2).clone() if x is theirs else x * 2
        before = before.clone() if x is theirs else before
        x[0] = 5.0
        y2 = x.reshape(2, 2)
        y2 += 1
        outs.append((before, kept, y * 1, x * 1))
    for mine, their in zip(*outs):
        _same(mine, their)


def test_a_view_of_a_tensor_with_a_write_pending_is_a_view(torch):
    ours, theirs = _both(torch, [0.0, 1.0, 2.0, 3.0])
    outs = []
    for x in (ours, theirs):
        x += 10
        y, flipped = x[1:3], x.flip(0)
        x += 1
        outs.append((y, flipped, x))
    for mine, their in zip(*outs):
        _same(mine, their)


# ---- 4. writes through two names of one buffer both count ------------------------------------------------------------


@pytest.mark.parametrize("order", ["view then base", "base then view", "two views", "setitem then views"])
def test_writes_through_different_names_of_one_buffer_all_count(torch, order):
    ours, theirs = _both(torch, [0.0, 1.0, 2.0, 3.0, 4.0, 5.0])
    outs = []
    for x in (ours, theirs):
        a, b = x.reshape(2, 3), x.reshape(6, 1)
        if order == "view then base":
            a += 10
            x -= 1
        elif order == "base then view":
            x += 1
            a += 10
        elif order == "two views":
            a += 1
            b *= 2
        else:
            x[0] = 50.0
            a *= 2
            b += 1
            a[1, 1] = -3.0
            x -= 1
        outs.append((x, a, b))
    for mine, their in zip(*outs):
        _same(mine, their)


def test_interleaved_in_place_ops_through_a_view_and_its_base(torch):
    ours, theirs = _both(torch, np.arange(6))
    outs = []
    for x in (ours, theirs):
        y = x.reshape(2, 3)
        y *= 2
        y += 1
        x -= 1
        outs.append((x, y))
    for mine, their in zip(*outs):
        _same(mine, their)


# ---- 5. writes through a reshape of a tensor with gradient history keep its gradient --------------------------------


def _gradients(torch, build):
    """Values and gradients of x (and v) from `build(x, v)`, lazygrad's and torch's."""
    data = np.arange(12, dtype=np.float32) / 7
    vdata = np.array([1.5, -2.0, 3.0, 0.5], dtype=np.float32)
    weights = np.linspace(-1.0, 2.0, 12, dtype=np.float32)
    results = []
    for kind in ("ours", "theirs"):
        if kind == "ours":
            x, v, w = Tensor(data, requires_grad=True), Tensor(vdata, requires_grad=True), Tensor(weights)
        else:
            x, v = torch.tensor(data, requires_grad=True), torch.tensor(vdata, requires_grad=True)
            w = torch.tensor(weights)
        y = build(x, v)
        (y * w).sum().backward()
        results.append((y, x.grad, v.grad))
    return results


@pytest.mark.parametrize(
    "case", ["setitem", "setitem realized", "in place", "in place realized", "setitem range", "in place twice"]
)
def test_a_write_through_a_reshape_keeps_the_gradient(torch, case):
    def build(x, v):
        y = x * 2
        if "realized" in case:
            y = (y * 1).realize() if isinstance(y, Tensor) else y.clone()
        if case.startswith("setitem range"):
            y.reshape(3, 4)[1] = v * 3
        elif case.startswith("setitem"):
            y.reshape(2, 6)[0, :4] = v
        else:
            z = y.reshape(4, 3)
            z += 1
            if case == "in place twice":
                z *= 3
                y[0] = 0.5
        return y * (v.sum() if "range" in case else 1.0)

    (ours, x_grad, v_grad), (theirs, their_x_grad, their_v_grad) = _gradients(torch, build)
    _same(ours, theirs)
    _same(x_grad, their_x_grad)
    if their_v_grad is None:
        assert v_grad is None or not v_grad.numpy().any()
    else:
        _same(v_grad, their_v_grad)


def test_a_gradient_through_a_reshaped_write_is_not_released(torch):
    ours, theirs = (
        Tensor([1.0, 2.0, 3.0, 4.0], requires_grad=True),
        torch.tensor([1.0, 2.0, 3.0, 4.0], requires_grad=True),
    )
    for x in (ours, theirs):
        y = x * 2
        z = y.reshape(2, 2)
        z += 1
        (y * y).sum().backward()
    _same(ours.grad, theirs.grad)


# ---- 6. detach shares memory ----------------------------------------------------------------------------------------


def test_a_write_through_a_detached_tensor_reaches_the_tensor(torch):
    ours, theirs = _both(torch, [0.0, 1.0, 2.0, 3.0])
    outs = []
    for x in (ours, theirs):
        view = x.reshape(2, 2)
        d = x.detach()
        d += 1
        d[0] = 10.0
        outs.append((x, d, view))
    for mine, their in zip(*outs):
        _same(mine, their)


def test_updating_parameters_through_detach_as_torch_code_does(torch):
    data = np.array([[1.0, -2.0], [0.5, 4.0]], dtype=np.float32)
    p, tp = Tensor(data, requires_grad=True), torch.tensor(data, requires_grad=True)
    for param in (p, tp):
        (param * param).sum().backward()
        step = param.detach()
        step -= 0.1 * (param.grad if param is tp else param.grad.detach())
    _same(p, tp)
    # no gradient flows through the detached name, though it is the parameter's memory
    p.grad = None
    (p.detach() * p).sum().backward()
    _same(p.grad, tp.detach())


# ---- 7. movement ops torch copies with keep their values -------------------------------------------------------------

COPIES = {
    "flip": lambda x, torch: x.flip(0),
    "pad": lambda x, torch: torch.nn.functional.pad(x, (1, 1)) if torch else x.pad((1, 1)),
    "repeat": lambda x, torch: x.repeat(2),
    "repeat 2d": lambda x, torch: x.reshape(3, 4).repeat(2, 1),
    "tile": lambda x, torch: x.tile(2),
    "repeat_interleave": lambda x, torch: x.repeat_interleave(2),
    "T.reshape": lambda x, torch: x.reshape(3, 4).T.reshape(-1),
    "cat of one": lambda x, torch: torch.cat([x]) if torch else Tensor.cat(x),
    "stack of one": lambda x, torch: torch.stack([x]) if torch else Tensor.stack(x),
    "expand.reshape": lambda x, torch: x.reshape(12, 1).expand(12, 2).reshape(24),
    "slice.reshape": lambda x, torch: x.reshape(3, 4)[:, :2].reshape(6),
}
VIEWS = {
    "reshape": lambda x, torch: x.reshape(3, 4),
    "expand": lambda x, torch: x.reshape(1, 12).expand(2, 12),
    "narrow": lambda x, torch: x.narrow(0, 3, 4),
    "slice with steps": lambda x, torch: x[1::2],
    "2d slice with steps": lambda x, torch: x.reshape(3, 4)[::2, 1::2],
    "select": lambda x, torch: x.reshape(3, 4)[:, 1],
    "T": lambda x, torch: x.reshape(3, 4).T,
    "permute": lambda x, torch: x.reshape(2, 3, 2).permute(2, 0, 1),
    "movedim": lambda x, torch: x.reshape(2, 3, 2).movedim(0, 2),
    "squeeze": lambda x, torch: x.reshape(1, 12, 1).squeeze(),
    "unsqueeze": lambda x, torch: x.unsqueeze(1),
    "unfold": lambda x, torch: x.unfold(0, 2, 2),
    "unfold large windows": lambda x, torch: x.unfold(0, 5, 2),
    "diagonal": lambda x, torch: x.reshape(3, 4).diagonal(),
    "split": lambda x, torch: x.split(5)[0],
    "chunk": lambda x, torch: x.chunk(3)[1],
    "unbind": lambda x, torch: x.reshape(3, 4).unbind(1)[0],
    "T.reshape where it keeps the layout": lambda x, torch: x.reshape(3, 4).T.reshape(4, 3, 1),
    "slice.reshape where it keeps the layout": lambda x, torch: x.reshape(3, 4)[1:].reshape(8),
}


@pytest.mark.parametrize("name", COPIES)
def test_copies_keep_their_values_and_views_follow_writes(torch, name):
    ours, theirs = _both(torch, np.arange(12))
    made = [COPIES[name](ours, None), *(view(ours, None) for view in VIEWS.values())]
    their_made = [COPIES[name](theirs, torch), *(view(theirs, torch) for view in VIEWS.values())]
    ours[0], theirs[0] = 99.0, 99.0
    ours += 100
    theirs += 100
    ours.reshape(3, 4)[1] = -5.0
    theirs.reshape(3, 4)[1] = -5.0
    for mine, their in zip(made, their_made):
        _same(mine, their)


@pytest.mark.parametrize("name", COPIES)
def test_a_copy_made_while_a_write_is_pending_has_the_written_values(torch, name):
    ours, theirs = _both(torch, np.arange(12))
    for x in (ours, theirs):
        view = x.reshape(2, 6)
        view += 1  # (pending: made through another name)
    made, their_made = COPIES[name](ours, None), COPIES[name](theirs, torch)
    ours += 100
    theirs += 100
    _same(made, their_made)


def test_a_copy_is_written_into_as_a_value_of_its_own(torch):
    ours, theirs = _both(torch, np.arange(6))
    outs = []
    for x in (ours, theirs):
        flipped, padded = x.flip(0), torch.nn.functional.pad(x, (1, 1)) if x is theirs else x.pad((1, 1))
        flipped += 1
        padded[0] = 7.0
        outs.append((x, flipped, padded))
    for mine, their in zip(*outs):
        _same(mine, their)


def test_random_chains_of_movement_ops_are_views_exactly_where_torch_s_are(torch):
    # slices, transposes, expands and reshapes chained at random: a result follows a later write into the tensor
    # where torch's shares its memory (a reshape torch makes a copy for, and whatever is made of that, does not)
    import random

    def choices(shape):
        found = [lambda t: t.reshape(-1), lambda t: t.unsqueeze(0)]
        if len(shape) >= 2:
            found.append(lambda t: t.transpose(0, 1))
        if shape and shape[0] > 1:
            found.append(lambda t: t[1:])
        if shape and shape[-1] > 2:
            found.append(lambda t: t[..., ::2])
        if shape and shape[0] == 1:
            found.append(lambda t: t.expand(3, *t.shape[1:]))
        size = int(np.prod(shape))
        found += [lambda t, a=a: t.reshape(a, -1) for a in (2, 3, 4) if size % a == 0 and size > a]
        return found

    for seed in range(60):
        rng = random.Random(seed)
        ours, theirs = _both(torch, np.arange(24))
        mine, their = ours, theirs
        for _ in range(rng.randint(2, 5)):
            op = rng.choice(choices(tuple(their.shape)))
            mine, their = op(mine), op(their)
        ours += 100
        theirs += 100
        _same(mine, their)


def test_scaling_a_gradient_in_place_as_clipping_does():
    """`p.grad *= coef` (torch's clip_grad_norm_ by hand): a matrix product's weight gradient is a transpose of a sum
    no other tensor holds, a value of its own that the write replaces. It was refused as a view of another tensor."""
    torch = pytest.importorskip("torch")
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    w = Tensor(np.ones((4, 3), np.float32), requires_grad=True)
    (Tensor(x) @ w.T).sum().backward()
    tw = torch.ones(4, 3, requires_grad=True)
    (torch.tensor(x) @ tw.T).sum().backward()
    coef = 1.0 / float(np.sqrt((w.grad * w.grad).sum().item()))
    w.grad *= coef
    torch.nn.utils.clip_grad_norm_([tw], 1.0)
    np.testing.assert_allclose(w.grad.numpy(), tw.grad.numpy(), rtol=1e-5)
    # a transpose of a tensor someone holds is written through to it, as torch's
    product, theirs = Tensor(x) @ w.detach().T, torch.tensor(x) @ tw.detach().T
    turned, their_turned = product.T, theirs.T
    turned *= 2
    their_turned *= 2
    np.testing.assert_allclose(product.numpy(), theirs.numpy(), rtol=1e-6)
    np.testing.assert_allclose(turned.numpy(), their_turned.numpy(), rtol=1e-6)


def test_a_write_through_a_reshape_of_a_buffer_equal_computations_share_is_refused():
    """Equal computations are one node, and realized, one buffer that both tensors name: a write through a reshape of
    it would change both (which one the reshape was made of is not known), so it is refused; a clone is writable."""
    for write in ("imul", "setitem", "assign"):
        a = Tensor([1.0, 2.0, 3.0])
        x, y = a * 2, a * 2
        y.realize()
        view = x.reshape(3, 1)
        with pytest.raises(RuntimeError, match=r"a reshape of a \(3,\) buffer that 2 tensors share.*x\.clone\(\)"):
            if write == "imul":
                view *= 10
            elif write == "setitem":
                view[0] = 100.0
            else:
                view.assign(Tensor([[7.0], [7.0], [7.0]]))
        assert x.tolist() == y.tolist() == [2.0, 4.0, 6.0]
        x = x.clone()
        x.reshape(3, 1)[0] = 100.0
        assert x.tolist() == [100.0, 4.0, 6.0] and y.tolist() == [2.0, 4.0, 6.0]


def test_views_of_a_computation_show_a_later_write_into_it_as_torchs():
    """A write into a tensor not in memory yet (a computation, a constant) first computes it into its buffer where a
    live tensor is a view of it, and moves the views onto that buffer; copies (a flip) keep what they were."""
    torch = pytest.importorskip("torch")
    for write in ("iadd", "setitem", "assign"):
        ours, theirs = Tensor([1.0, 2.0, 3.0, 4.0]) * 2, torch.tensor([1.0, 2.0, 3.0, 4.0]) * 2
        views = [lambda t: t.reshape(2, 2), lambda t: t[1:3], lambda t: t[::2], lambda t: t.reshape(2, 2).T]
        mine, their = [view(ours) for view in views], [view(theirs) for view in views]
        flipped, their_flipped = ours.flip(0), theirs.flip(0).clone()
        if write == "iadd":
            ours += 1
            theirs += 1
        elif write == "setitem":
            ours[0] = 100.0
            theirs[0] = 100.0
        else:
            ours.assign(Tensor([5.0, 6.0, 7.0, 8.0]))
            theirs.copy_(torch.tensor([5.0, 6.0, 7.0, 8.0]))
        for view, expected in zip(mine, their):
            np.testing.assert_array_equal(view.numpy(), expected.numpy(), err_msg=write)
        np.testing.assert_array_equal(flipped.numpy(), their_flipped.numpy())
    # a view realized first (a reshape: its computation is computed, and it stays a view of that)
    ours, theirs = Tensor([1.0, 2.0, 3.0, 4.0]) * 3 + 1, torch.tensor([1.0, 2.0, 3.0, 4.0]) * 3 + 1
    mine, their = ours.reshape(2, 2), theirs.reshape(2, 2)
    mine.realize()
    mine *= 2
    their *= 2
    ours += 1
    theirs += 1
    np.testing.assert_array_equal(ours.numpy(), theirs.numpy())
    np.testing.assert_array_equal(mine.numpy(), their.numpy())
    # equal constants are one node until computed: whose views they are is not known
    a, b = Tensor.zeros(4), Tensor.zeros(4)
    view = a.reshape(2, 2)
    with pytest.raises(RuntimeError, match=r"\+=: this \(4,\) tensor has views .* 2 tensors hold its computation"):
        a += 1
    assert view.tolist() == [[0.0, 0.0], [0.0, 0.0]] and b.tolist() == [0.0] * 4


# ---- writes into slices and transposes reach the tensor they view -----------------------------------------------------


def _rows_up(x, lib):
    x[2:4] += 1


def _row_named(x, lib):
    row = x[1]
    row += 10
    return row


def _transposed_row(x, lib):
    turned = x.T
    turned[0] *= 2
    return turned


def _filled_columns(x, lib):
    part = x[:, 1:3]
    part.fill_(0) if lib == "torch" else part.assign(Tensor.zeros(4, 2))
    return part


def _every_other(x, lib):
    part = x[::2, ::2]
    part += 100
    return part


def _columns_then_block(x, lib):
    x[:, 0] *= -1
    x[1:3, 1:] -= 5


def _reshape_then_slice(x, lib):
    part = x.reshape(20)[3:7]
    part *= 0
    return part


def _slice_then_transpose(x, lib):
    part = x[1:3].T
    part += 1
    return part


def _rows_in_a_loop(x, lib):
    for number, row in enumerate([x[i] for i in range(4)]):
        row *= number + 1


def _with_gradients_off(x, lib):
    import torch

    with torch.no_grad() if lib == "torch" else Tensor.test():
        row = x[1]
        row += 1
    return row


@pytest.mark.parametrize(
    "write",
    [
        _rows_up,
        _row_named,
        _transposed_row,
        _filled_columns,
        _every_other,
        _columns_then_block,
        _reshape_then_slice,
        _slice_then_transpose,
        _rows_in_a_loop,
        _with_gradients_off,
    ],
    ids=lambda write: write.__name__.strip("_"),
)
@pytest.mark.parametrize("base", ["memory", "computation"])
def test_a_write_into_a_view_reaches_the_tensor_viewed(torch, write, base):
    """`x[2:4] += 1`, `row = x[1]; row += 10`, `x.T[0] *= 2`, ...: written through to x, as torch's (they were
    refused, since a write into the view alone would not reach x)."""
    values = np.arange(20, dtype=np.float32).reshape(4, 5)
    ours, theirs = _both(torch, values)
    if base == "computation":
        ours, theirs = ours * 2, theirs * 2
    mine, their = write(ours, "lazygrad"), write(theirs, "torch")
    _same(ours, theirs)
    if mine is not None:
        _same(mine, their)


def test_a_write_into_a_view_keeps_the_gradient_its_value_carries(torch):
    values = np.arange(20, dtype=np.float32).reshape(4, 5) / 10
    results = []
    for lib, Lib in (("lazygrad", Tensor), ("torch", torch)):
        x = Lib.tensor(values) if lib == "torch" else Tensor(values)
        w = Lib.ones(5, requires_grad=True)
        x[1] += w  # data written with a value that has a gradient: x's graph now reads w
        part = x[:, 1:3]
        part *= w[:2]
        (x * x).sum().backward()
        results.append((x, w.grad))
    for mine, their in zip(*results):
        _same(mine, their)
    # and a view of a computation with a gradient history writes into it, keeping that history
    results = []
    for Lib in (Tensor, torch):
        x = Lib.tensor(values, requires_grad=True) if Lib is torch else Tensor(values, requires_grad=True)
        y = x * 2
        column = y[:, 2]
        column *= 3
        (y * y).sum().backward()
        results.append((y, x.grad))
    for mine, their in zip(*results):
        _same(mine, their)


def test_writes_into_views_that_torch_refuses_or_copies(torch):
    x = Tensor(np.arange(6, dtype=np.float32)).realize()
    wide = x.reshape(1, 6).expand(3, 6)
    with pytest.raises(RuntimeError, match=r"\+=: this \(3, 6\) tensor is an expanded view"):
        wide += 1
    leaf = Tensor(np.arange(6, dtype=np.float32), requires_grad=True)
    row = leaf[1:3]
    with pytest.raises(RuntimeError, match=r"\+=: this \(2,\) tensor is a view .* \(a leaf\).*Tensor.test\(\)"):
        row += 1
    with Tensor.test():  # (as torch.no_grad())
        row = leaf[1:3]
        row += 1
    np.testing.assert_array_equal(leaf.numpy(), [0, 2, 3, 3, 4, 5])
    # a flip is a copy in torch: a write into a slice of one changes it alone
    flipped = x.flip(0)[0]
    flipped += 1
    np.testing.assert_array_equal(x.numpy(), np.arange(6))
    assert flipped.item() == 6.0
