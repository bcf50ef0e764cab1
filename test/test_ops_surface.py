"""PyTorch's spellings of the op surface against PyTorch: `dim=` beside `axis=`, the keyword names of movement
ops and clamp, and the ops a PyTorch user reaches for beside tinygrad's; values, gradients and errors.

The same file runs on every device; tensors stay small (the PYTHON device emulates kernels one scalar at a time)."""

import numpy as np
import pytest
from test_ops import data
from test_ops_backward import compare_backward

from lazygrad import Tensor, dtypes

torch = pytest.importorskip("torch")
F = torch.nn.functional

TOLERANCE = {"rtol": 1e-4, "atol": 1e-5}


def grad_check(function, *arrays, torch_function=None, tolerance=None):
    """Values and gradients of every float input against torch."""
    compare_backward(
        list(arrays), function, torch_function or function, tolerance or TOLERANCE, np.random.default_rng(1)
    )


# ---------------------------------------------------------------------------------------------------------------------
# dim= beside axis=

# ops whose axis parameter PyTorch calls dim; each runs with dim=1 on a (3, 4) input in both libraries
DIM_OPS = {
    "sum": lambda x, **k: x.sum(**k),
    "mean": lambda x, **k: x.mean(**k),
    "prod": lambda x, **k: x.prod(**k),
    "var": lambda x, **k: x.var(**k),
    "std": lambda x, **k: x.std(**k),
    "logsumexp": lambda x, **k: x.logsumexp(**k),
    "softmax": lambda x, **k: x.softmax(**k),
    "log_softmax": lambda x, **k: x.log_softmax(**k),
    "cumsum": lambda x, **k: x.cumsum(**k),
    "cumprod": lambda x, **k: x.cumprod(**k),
    "logcumsumexp": lambda x, **k: x.logcumsumexp(**k),
    "amax": lambda x, **k: x.amax(**k),
    "amin": lambda x, **k: x.amin(**k),
    "cummax": lambda x, **k: x.cummax(**k)[0],
    "var_mean": lambda x, **k: sum(x.var_mean(**k) if isinstance(x, Tensor) else torch.var_mean(x, **k)),
    "std_mean": lambda x, **k: sum(x.std_mean(**k) if isinstance(x, Tensor) else torch.std_mean(x, **k)),
}


@pytest.mark.parametrize("name", list(DIM_OPS))
def test_dim_keyword_matches_torch(name):
    function = DIM_OPS[name]
    grad_check(lambda x: function(x, dim=1), data(3, 4, seed=3), tolerance={"rtol": 1e-4, "atol": 1e-5})
    array = data(3, 4, seed=4)
    np.testing.assert_array_equal(function(Tensor(array), dim=-1).numpy(), function(Tensor(array), axis=-1).numpy())


@pytest.mark.parametrize("name", ["argmax", "argmin", "any", "all"])
def test_dim_keyword_without_gradient(name):
    array = data(3, 4, seed=5) > 0 if name in ("any", "all") else data(3, 4, seed=5)
    got = getattr(Tensor(array), name)(dim=0, keepdim=True).numpy()
    np.testing.assert_array_equal(got, getattr(torch.tensor(array), name)(dim=0, keepdim=True).numpy())


def test_dim_and_axis_together_is_an_error():
    x = Tensor(data(3, 4))
    with pytest.raises(TypeError, match=r"sum: got both axis= and dim="):
        x.sum(axis=0, dim=1)
    with pytest.raises(TypeError, match="cumsum"):
        x.cumsum(0, dim=1)


@pytest.mark.parametrize("name", ["max", "min"])
def test_max_with_dim_names_the_spellings(name):
    # PyTorch's max(dim=) returns (values, indices); tinygrad's max returns values: refuse rather than guess
    with pytest.raises(TypeError, match=rf"{name}\(dim=...\) returns \(values, indices\).*a{name}\(dim=...\)"):
        getattr(Tensor(data(3, 4)), name)(dim=1)
    with pytest.raises(TypeError, match="unexpected keyword arguments"):
        getattr(Tensor(data(3, 4)), name)(1, keepdims=True)


# ---------------------------------------------------------------------------------------------------------------------
# keyword names of movement ops and clamp


def test_movement_keywords_match_torch():
    array = data(2, 3, 4)
    grad_check(lambda x: x.permute(dims=(2, 0, 1)), array)
    grad_check(lambda x: x.flip(dims=(0, 2)), array)
    grad_check(lambda x: x.flip(0, 2), array, torch_function=lambda x: x.flip((0, 2)))
    grad_check(lambda x: x[:, :1].expand(size=(2, 3, 4)), array)
    with pytest.raises(ValueError, match=r"flip: axes \(0, -3\) repeat an axis"):
        Tensor(array).flip(0, -3)
    with pytest.raises(TypeError, match="permute: got both order= and dims="):
        Tensor(array).permute(order=(0, 1, 2), dims=(0, 1, 2))


def test_clamp_keywords_match_torch():
    array = data(3, 4)
    grad_check(lambda x: x.clamp(min=-0.5, max=0.7), array)
    grad_check(lambda x: x.clamp(max=0.2), array)
    grad_check(lambda x: x.clip(min=-0.1), array)
    with pytest.raises(ValueError, match="clip: give at least one of"):
        Tensor(array).clamp()


def test_clamp_to_a_nan_bound_gives_nan_as_torch():
    values = np.array([-2.0, 0.5, 3.0], dtype=np.float32)
    bound = np.array([0.0, np.nan, 1.0], dtype=np.float32)
    nan = float("nan")
    for ours, theirs in (
        (lambda t: t.clamp(nan, 1.0), lambda t: t.clamp(nan, 1.0)),
        (lambda t: t.clamp(max=nan), lambda t: t.clamp(max=nan)),
        (lambda t: t.clamp(Tensor(bound)), lambda t: t.clamp(torch.from_numpy(bound))),
        (lambda t: t.clamp(max=Tensor(bound)), lambda t: t.clamp(max=torch.from_numpy(bound))),
    ):
        np.testing.assert_array_equal(ours(Tensor(values)).numpy(), theirs(torch.from_numpy(values)).numpy())


def test_T_is_a_matrix_transpose_and_mT_transposes_each_matrix():
    """.T reverses NumPy's and torch's axes but swaps tinygrad's first two: past two axes it is refused."""
    matrices = data(2, 3, 4)
    np.testing.assert_array_equal(Tensor(matrices[0]).T.numpy(), matrices[0].T)
    np.testing.assert_array_equal(Tensor(matrices).mT.numpy(), torch.from_numpy(matrices).mT.numpy())
    assert Tensor(matrices[0, 0]).T.shape == (4,)
    with pytest.raises(ValueError, match=r"\.T: ambiguous on a 3-d tensor \(2, 3, 4\).*\.mT for the last two"):
        Tensor(matrices).T
    with pytest.raises(ValueError, match=r"\.mT: needs at least 2 axes"):
        Tensor(matrices[0, 0]).mT


# ---------------------------------------------------------------------------------------------------------------------
# indexing: take, index_add, index_copy, index_fill, index_put, nonzero

INDEX = np.array([2, 0, 2])  # a repeat, so index_add sums two sources into one place


def test_take_matches_torch():
    index = np.array([[-1, 0], [3, 5]])
    grad_check(lambda x: x.take(Tensor(index)), data(3, 4), torch_function=lambda x: x.take(torch.tensor(index)))
    with pytest.raises(IndexError, match=r"take: index 12 is out of range for axis 0 of size 12"):
        Tensor(data(3, 4)).take([12])
    with pytest.raises(TypeError, match="take: index must be an int"):
        Tensor(data(3, 4)).take(Tensor([True]))


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_index_add_matches_torch(dim):
    array = data(3, 3, 4, seed=2)
    source_shape = list(array.shape)
    source_shape[dim] = len(INDEX)
    index = INDEX if dim == 0 else np.array([3, 0, 3]) if array.shape[dim] == 4 else INDEX
    grad_check(
        lambda x, s: x.index_add(dim, Tensor(index), s, alpha=-2),
        array,
        data(*source_shape, seed=3),
        torch_function=lambda x, s: x.index_add(dim, torch.tensor(index), s, alpha=-2),
    )


def test_index_add_int_and_errors():
    x = np.arange(12, dtype=np.int32).reshape(3, 4)
    got = Tensor(x).index_add(0, Tensor([1, 1]), Tensor(np.ones((2, 4), np.int32)))
    expected = torch.tensor(x).index_add(0, torch.tensor([1, 1]), torch.ones(2, 4, dtype=torch.int32))
    assert got.dtype == Tensor(x).dtype
    np.testing.assert_array_equal(got.numpy(), expected.numpy())
    with pytest.raises(IndexError, match=r"index_add: index 4 is out of range for axis 1 of size 4 \(allowed: 0..3\)"):
        Tensor(x).index_add(1, Tensor([4]), Tensor(x[:, :1]))
    with pytest.raises(IndexError, match=r"index_add: index -1 is out of range"):  # as torch: no negative indices
        Tensor(x).index_add(1, Tensor([-1]), Tensor(x[:, :1]))
    with pytest.raises(ValueError, match=r"index_add: source \(3, 4\) must be .* \(3, 1\)"):
        Tensor(x).index_add(1, Tensor([1]), Tensor(x))
    with pytest.raises(TypeError, match="index_add: index must be a 0-d or 1-D integer Tensor"):
        Tensor(x).index_add(1, Tensor([1.0]), Tensor(x[:, :1]))


def test_index_copy_and_fill_match_torch():
    order = np.array([2, 0, 1])
    grad_check(
        lambda x, s: x.index_copy(1, Tensor(order), s),
        data(2, 4),
        data(2, 3, seed=5),
        torch_function=lambda x, s: x.index_copy(1, torch.tensor(order), s),
    )
    grad_check(
        lambda x: x.index_fill(0, Tensor([0, -1]), -3.0),
        data(3, 4),
        torch_function=lambda x: x.index_fill(0, torch.tensor([0, -1]), -3.0),
    )
    with pytest.raises(IndexError, match="index_fill: index 3 is out of range"):
        Tensor(data(3, 4)).index_fill(0, Tensor([3]), 0.0)


@pytest.mark.parametrize("accumulate", [False, True])
def test_index_put_matches_torch(accumulate):
    rows, columns = np.array([0, -1, 0]), np.array([1, 2, 1])
    if not accumulate:  # a repeated place is left undefined by torch without accumulate
        rows, columns = rows[:2], columns[:2]
    grad_check(
        lambda x, v: x.index_put((Tensor(rows), Tensor(columns)), v, accumulate=accumulate),
        data(3, 4, 2),
        data(len(rows), 2, seed=6),
        torch_function=lambda x, v: x.index_put((torch.tensor(rows), torch.tensor(columns)), v, accumulate=accumulate),
    )
    mask = data(3, 4, seed=7) > 0
    got = Tensor(data(3, 4)).index_put((Tensor(mask),), Tensor(5.0), accumulate=accumulate)
    expected = torch.tensor(data(3, 4)).index_put((torch.tensor(mask),), torch.tensor(5.0), accumulate=accumulate)
    np.testing.assert_allclose(got.numpy(), expected.numpy())


def test_index_put_errors():
    x = Tensor(data(3, 4))
    with pytest.raises(IndexError, match="index_put: index 3 is out of range for axis 0 of size 3"):
        x.index_put((Tensor([3]),), Tensor(1.0))
    with pytest.raises(ValueError, match=r"index_put: values \(2,\) do not broadcast to the indexed shape \(1, 4\)"):
        x.index_put((Tensor([0]),), Tensor([1.0, 2.0]))
    with pytest.raises(TypeError, match="index_put: indices must be a tuple"):
        x.index_put(Tensor([0]), Tensor(1.0))


@pytest.mark.parametrize("shape", [(3, 4), (5,), (), (0, 2)])
def test_nonzero_matches_torch(shape):
    array = np.asarray(data(*shape, dtype=np.int32, low=-1, high=2))
    got, expected = Tensor(array).nonzero(), torch.tensor(array).nonzero()
    assert got.dtype == dtypes.int64
    np.testing.assert_array_equal(got.numpy(), expected.numpy())
    np.testing.assert_array_equal(Tensor(array).argwhere().numpy(), torch.argwhere(torch.tensor(array)).numpy())
    for lazy_axis, torch_axis in zip(Tensor(array).nonzero(as_tuple=True), torch.tensor(array).nonzero(as_tuple=True)):
        np.testing.assert_array_equal(lazy_axis.numpy(), torch_axis.numpy())


# ---------------------------------------------------------------------------------------------------------------------
# layout: pixel_shuffle, pixel_unshuffle, movedim, swapaxes, fold


def test_pixel_shuffle_and_unshuffle_match_torch():
    grad_check(lambda x: x.pixel_shuffle(2), data(2, 8, 3, 2), torch_function=lambda x: F.pixel_shuffle(x, 2))
    grad_check(lambda x: x.pixel_shuffle(3), data(9, 2, 2), torch_function=lambda x: F.pixel_shuffle(x, 3))
    grad_check(lambda x: x.pixel_unshuffle(2), data(1, 3, 4, 6), torch_function=lambda x: F.pixel_unshuffle(x, 2))
    array = data(2, 3, 4, 6)
    np.testing.assert_array_equal(Tensor(array).pixel_unshuffle(2).pixel_shuffle(2).numpy(), array)
    with pytest.raises(
        ValueError, match=r"pixel_shuffle: input \(2, 6, 3, 2\) .* divisible by upscale_factor\*\*2 = 4"
    ):
        Tensor(data(2, 6, 3, 2)).pixel_shuffle(2)
    with pytest.raises(ValueError, match=r"pixel_unshuffle: input \(1, 3, 5, 6\) .* divisible by downscale_factor"):
        Tensor(data(1, 3, 5, 6)).pixel_unshuffle(2)


@pytest.mark.parametrize("source, destination", [(0, 2), (-1, 0), ((0, 3), (2, 0)), ((1,), (-1,))])
def test_movedim_matches_torch(source, destination):
    grad_check(lambda x: x.movedim(source, destination), data(2, 3, 4, 5))
    got = Tensor(data(2, 3, 4, 5)).moveaxis(source, destination).numpy()
    np.testing.assert_array_equal(got, np.moveaxis(data(2, 3, 4, 5), source, destination))


def test_movedim_and_swapaxes_errors_and_values():
    x = data(2, 3, 4)
    np.testing.assert_array_equal(Tensor(x).swapaxes(0, 2).numpy(), np.swapaxes(x, 0, 2))
    np.testing.assert_array_equal(Tensor(x).swapdims(-1, 1).numpy(), np.swapaxes(x, -1, 1))
    with pytest.raises(ValueError, match="movedim: 2 source axes"):
        Tensor(x).movedim((0, 1), 2)
    with pytest.raises(ValueError, match="movedim: repeated axes"):
        Tensor(x).movedim((0, -3), (1, 2))


@pytest.mark.parametrize(
    "channels, size, kernel, dilation, padding, stride",
    [(3, (5, 6), (2, 3), 1, 0, 1), (2, (7, 7), 3, 2, 1, 2), (1, (4, 5), 2, 1, 1, (2, 1))],
    ids=str,
)
def test_fold_matches_torch(channels, size, kernel, dilation, padding, stride):
    options = {"kernel_size": kernel, "dilation": dilation, "padding": padding, "stride": stride}
    columns = F.unfold(torch.tensor(data(2, channels, *size)), **options).numpy()
    grad_check(lambda x: x.fold(size, **options), columns, torch_function=lambda x: F.fold(x, size, **options))
    grad_check(lambda x: x.fold(size, **options), columns[0], torch_function=lambda x: F.fold(x, size, **options))


def test_fold_errors():
    with pytest.raises(ValueError, match=r"fold: input \(2, 12, 12\) does not match: .* 4 × 5 = 20 blocks"):
        Tensor(data(2, 12, 12)).fold((5, 6), (2, 2))
    with pytest.raises(ValueError, match=r"fold: input must be \(N, C\*kh\*kw, L\)"):
        Tensor(data(12)).fold((5, 6), 2)


# ---------------------------------------------------------------------------------------------------------------------
# math and comparisons by PyTorch's names

# small magnitudes, where log(1 + x) and exp(x) - 1 lose x's digits, next to ordinary ones
SMALL_AND_ORDINARY = np.array([-0.9, -0.4, -1e-3, -3e-6, -1e-9, 0.0, 1e-9, 2e-7, 4e-5, 1e-3, 0.3, 0.6, 2.0, 9.0])


@pytest.mark.parametrize("name", ["log1p", "expm1"])
def test_log1p_expm1_match_torch_at_small_values(name):
    array = SMALL_AND_ORDINARY.astype(np.float32)
    # relative tolerance only: at 1e-9 an absolute one would pass log(1 + x) = 0
    grad_check(lambda x: getattr(x, name)(), array, tolerance={"rtol": 2e-6, "atol": 0})
    grad_check(lambda x: getattr(x, name)(), data(3, 4), tolerance={"rtol": 2e-6, "atol": 1e-7})


def test_log1p_expm1_edges_match_torch():
    edges = np.array([-1.0, -2.0, np.inf, -np.inf, np.nan, 100.0, -100.0], np.float32)
    for name in ("log1p", "expm1"):
        np.testing.assert_allclose(
            getattr(Tensor(edges), name)().numpy(), getattr(torch.tensor(edges), name)().numpy(), rtol=1e-6
        )


def test_logaddexp_matches_torch():
    grad_check(lambda x, y: x.logaddexp(y), data(3, 4) * 30, data(3, 4, seed=1) * 30)
    grad_check(lambda x: x.logaddexp(0.5), data(3, 4), torch_function=lambda x: x.logaddexp(torch.tensor(0.5)))
    edges = np.array([-np.inf, np.inf, 80.0, -np.inf], np.float32), np.array([-np.inf, np.inf, 89.0, 1.0], np.float32)
    got = Tensor(edges[0]).logaddexp(Tensor(edges[1])).numpy()
    np.testing.assert_allclose(got, torch.logaddexp(*map(torch.tensor, edges)).numpy(), rtol=1e-6)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_approximate_matches_torch(approximate):
    grad_check(
        lambda x: x.gelu(approximate=approximate),
        data(3, 4, low=-4, high=4),
        torch_function=lambda x: F.gelu(x, approximate=approximate),
    )
    with pytest.raises(ValueError, match="gelu: approximate must be 'tanh' or 'none'"):
        Tensor(data(2)).gelu(approximate="erf")


@pytest.mark.parametrize("name", ["eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_xor"])
def test_comparisons_by_name_match_torch(name):
    x, y = data(3, 4, integral=True), data(3, 4, seed=1, integral=True)  # whole numbers: ties occur
    got = getattr(Tensor(x), name)(Tensor(y))
    expected = getattr(torch.tensor(x), name)(torch.tensor(y))
    np.testing.assert_array_equal(got.numpy(), expected.numpy())
    scalar = getattr(Tensor(x), name)(0.0).numpy()
    np.testing.assert_array_equal(scalar, getattr(torch.tensor(x), name)(torch.tensor(0.0)).numpy())


def test_add_sub_alpha_match_torch():
    grad_check(lambda x, y: x.add(y, alpha=-1.5), data(3, 4), data(3, 4, seed=1))
    grad_check(lambda x, y: x.sub(y, alpha=2), data(3, 4), data(4, seed=1))


# ---------------------------------------------------------------------------------------------------------------------
# PyTorch's small helpers


def test_size_dim_and_bytes_match_torch():
    array = data(2, 3, dtype=np.float16)
    x, reference = Tensor(array), torch.tensor(array)
    assert x.size() == tuple(reference.size()) and x.size(-1) == reference.size(-1) == 3
    assert x.dim() == reference.dim() == 2
    assert x.element_size() == reference.element_size() == 2 and x.nbytes() == reference.nbytes == 12
    assert x.is_floating_point() and not Tensor([1, 2]).is_floating_point()
    with pytest.raises(IndexError, match=r"size: dim 2 is out of range for a tensor of shape \(2, 3\)"):
        x.size(2)


def test_clone_is_a_copy_with_a_gradient():
    x = Tensor(data(3)).realize()
    copy = x.clone().realize()
    x[0] = 100.0
    np.testing.assert_array_equal(copy.numpy(), data(3))
    grad_check(lambda t: t.clone() * 3, data(3, 4))
    leaf = Tensor(data(3)).requires_grad_()
    assert leaf.requires_grad is True and leaf.requires_grad_(False).requires_grad is False


def test_rand_like_and_randn_like():
    Tensor.manual_seed(3)
    base = Tensor(data(64, 32, dtype=np.float16))
    uniform, normal = base.rand_like(), base.randn_like()
    assert uniform.shape == normal.shape == base.shape and uniform.dtype == normal.dtype == base.dtype
    values = uniform.numpy().astype(np.float64)
    assert values.min() >= 0 and values.max() < 1 and abs(values.mean() - 0.5) < 0.03
    assert abs(normal.numpy().astype(np.float64).std() - 1) < 0.05
    assert Tensor([1, 2]).rand_like().dtype.is_float  # an int tensor's random values are floats


def test_shape_helpers_match_torch():
    array, other = data(3, 1), data(2, 3, 4)
    grad_check(lambda x: x.expand_as(torch.empty(3, 5) if isinstance(x, torch.Tensor) else Tensor.empty(3, 5)), array)
    grad_check(lambda x: x.reshape_as(torch.empty(1, 3) if isinstance(x, torch.Tensor) else Tensor.empty(1, 3)), array)
    grad_check(lambda x: x.view_as(torch.empty(3) if isinstance(x, torch.Tensor) else Tensor.empty(3)), array)
    grad_check(lambda x: x.narrow(2, 1, 2), other)
    grad_check(lambda x: x.narrow(-1, -3, 3), other)
    grad_check(lambda x: x.tile((2,)), other)
    grad_check(lambda x: x.tile(2, 1, 1, 2), other)
    grad_check(lambda x, y: x.outer(y), data(3), data(4, seed=1))
    assert Tensor(data(2)).type_as(Tensor([1, 2])).dtype == Tensor([1, 2]).dtype
    with pytest.raises(IndexError, match=r"narrow: start 3 and length 2 do not fit dim 2 of size 4"):
        Tensor(other).narrow(2, 3, 2)
    with pytest.raises(ValueError, match="outer: needs two 1-D tensors"):
        Tensor(other).outer(Tensor(data(3)))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_rand_in_a_narrow_float_stays_below_one(dtype):
    # float32 values in [0, 1) that round to 1 in half or bfloat16 must not be drawn (torch.rand never gives 1)
    Tensor.manual_seed(0)
    values = Tensor.rand(4096, dtype=getattr(dtypes, dtype)).numpy().astype(np.float64)
    assert values.min() >= 0 and values.max() < 1 and abs(values.mean() - 0.5) < 0.03


def test_torch_forms_and_empty_edges_a_new_user_meets(tmp_path):
    # torch's list form of cat and stack, a scalar's flip, nothing selected by setitem, softmax of nothing
    torch = pytest.importorskip("torch")
    a, b = np.arange(4.0, dtype=np.float32).reshape(2, 2), np.ones((2, 2), np.float32)
    np.testing.assert_array_equal(Tensor.cat([Tensor(a), Tensor(b)], dim=1).numpy(), np.concatenate([a, b], 1))
    np.testing.assert_array_equal(Tensor.stack((Tensor(a), Tensor(b))).numpy(), np.stack([a, b]))
    with pytest.raises(TypeError, match=r"cat: expected a non-empty list of Tensors, got \['Tensor', 'int'\]"):
        Tensor.cat([Tensor(a), 3])
    assert Tensor(3.0).flip(0).item() == 3.0
    target = Tensor.zeros(4, 5).contiguous().realize()
    target[2:2] = Tensor.zeros(0, 5)
    np.testing.assert_array_equal(target.numpy(), np.zeros((4, 5), np.float32))
    for shape, axis in [((0, 3), 0), ((0, 3), 1), ((3, 0), 1)]:
        empty, reference = Tensor.zeros(*shape), torch.zeros(*shape)
        assert empty.softmax(axis).shape == empty.log_softmax(axis).shape == shape
        np.testing.assert_array_equal(empty.logsumexp(axis).numpy(), reference.logsumexp(axis).numpy())
    with pytest.raises(IndexError, match=r"bool mask of shape \(3,\) must have the shape \(2,\) of the axes"):
        Tensor.ones(2, 3)[Tensor([True, False, True])]
    from lazygrad.nn.state import safe_save

    with pytest.raises(TypeError, match=r"safe_save: x is a list, not a Tensor"):
        safe_save({"x": [1, 2]}, str(tmp_path / "model.safetensors"))


def test_torch_conventions_of_randint_hardsigmoid_and_binary_cross_entropy():
    torch = pytest.importorskip("torch")
    for drawn in (Tensor.randint(3, 7, (200,)), Tensor.randint(4, (2, 100)).flatten() + 3):
        values = drawn.numpy()
        assert drawn.dtype == dtypes.int32 and values.min() >= 3 and values.max() <= 6
    inputs = np.array([np.nan, -4.0, 0.0, 4.0], np.float32)
    expected = torch.nn.functional.hardsigmoid(torch.tensor(inputs)).numpy()
    np.testing.assert_array_equal(Tensor(inputs).hardsigmoid().numpy(), expected)
    # a certain wrong prediction costs 100 (torch clamps each log at -100), not inf
    predictions, targets = np.array([0.0, 1.0, 0.3], np.float32), np.array([1.0, 0.0, 1.0], np.float32)
    theirs = torch.nn.functional.binary_cross_entropy(torch.tensor(predictions), torch.tensor(targets)).item()
    np.testing.assert_allclose(Tensor(predictions).binary_crossentropy(Tensor(targets)).item(), theirs, rtol=1e-6)
    # hardtanh's slope is 0 on its bounds (clip's is 1 there)
    at_bounds = Tensor([-1.0, 0.0, 1.0, -2.0, 2.0], requires_grad=True)
    at_bounds.hardtanh().sum().backward()
    np.testing.assert_array_equal(at_bounds.grad.numpy(), [0.0, 1.0, 0.0, 0.0, 0.0])


def test_torch_spellings_of_squeeze_chunk_scans_round_and_one_hot():
    """squeeze of several dims, chunks of an empty axis, cumsum/cumprod's dtype=, round's decimals= and one_hot's
    inferred number of classes, as torch has them."""
    ones = np.ones((2, 1, 3, 1), np.float32)
    for dims in ((1, 3), (0, 1), [-1], 2):
        assert Tensor(ones).squeeze(dims).shape == torch.from_numpy(ones).squeeze(dims).shape
    for size, chunks in ((0, 2), (0, 3), (1, 3), (5, 2)):
        ours, theirs = Tensor.zeros(size, 2).chunk(chunks), torch.zeros(size, 2).chunk(chunks)
        assert [t.shape for t in ours] == [tuple(t.shape) for t in theirs]
    ints = np.array([1, 2, 3, 4], np.int32)
    for name in ("cumsum", "cumprod"):
        ours = getattr(Tensor(ints), name)(0, dtype=dtypes.float32)
        theirs = getattr(torch.from_numpy(ints), name)(0, dtype=torch.float32)
        assert ours.dtype == dtypes.float32
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy())
    values = np.array([1.26, 2.5, 0.125, 1234.5, -7.75], np.float32)
    for decimals in (2, 1, -2):
        np.testing.assert_allclose(
            Tensor(values).round(decimals=decimals).numpy(), torch.from_numpy(values).round(decimals=decimals).numpy()
        )
    with pytest.raises(TypeError, match="round: decimals needs a float tensor"):
        Tensor(ints).round(decimals=1)
    labels = np.array([0, 2, 1], np.int64)
    np.testing.assert_array_equal(
        Tensor(labels).one_hot().numpy(), torch.nn.functional.one_hot(torch.from_numpy(labels)).numpy()
    )


@pytest.mark.parametrize("name", ["triu", "tril"])
def test_triangles_keep_the_dtype_as_torch(name):
    torch = pytest.importorskip("torch")
    for values in (np.ones((3, 4), bool), np.arange(12, dtype=np.int32).reshape(3, 4), data(3, 4)):
        result = getattr(Tensor(values), name)(1).numpy()
        expected = getattr(torch.tensor(values), name)(1).numpy()
        assert result.dtype == expected.dtype
        np.testing.assert_array_equal(result, expected)


def test_a_torch_tensor_mixed_in_is_named_with_its_module():
    """("matmul: expected a Tensor, got Tensor" read as a contradiction.)"""
    with pytest.raises(TypeError, match=r"matmul: expected a Tensor, got torch\.Tensor \(convert it with Tensor"):
        Tensor([[1.0]]) @ torch.ones(1, 1)
    with pytest.raises(TypeError, match=r"mul: unsupported operand type torch\.Tensor \(convert it with Tensor"):
        Tensor([1.0]) * torch.tensor([2.0])
    with pytest.raises(TypeError, match=r"add: unsupported operand type str; use a Tensor or a Python number"):
        Tensor([1.0]) + "a"
