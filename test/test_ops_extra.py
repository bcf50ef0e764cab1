"""PyTorch ops beyond the basics against torch: NaN-ignoring and fused elementwise ops, splitting and stacking,
whole-tensor comparisons, differences and statistics, and searching and counting; values, gradients, edge cases
(empty, 0-d, NaN, ties, negative dims, broadcasting) and errors.

The same file runs on every device; tensors stay tiny (the PYTHON device emulates kernels one scalar at a time)."""

import numpy as np
import pytest
from test_ops import data
from test_ops_backward import compare_backward

from lazygrad import Tensor, TinyJit, dtypes, nn
from lazygrad.engine.jit import JitError

torch = pytest.importorskip("torch")

TOLERANCE = {"rtol": 1e-4, "atol": 1e-5}
NAN, INF = float("nan"), float("inf")


def grad_check(function, *arrays, torch_function=None, tolerance=None):
    """Values and gradients of every float input against torch."""
    compare_backward(
        list(arrays), function, torch_function or function, tolerance or TOLERANCE, np.random.default_rng(1)
    )


def same(ours, theirs):
    """Values, shape and dtype of a lazygrad result against torch's."""
    theirs = theirs.detach().numpy() if hasattr(theirs, "detach") else np.asarray(theirs)
    got = ours.numpy()
    assert got.shape == theirs.shape, f"shape {got.shape} != torch {theirs.shape}"
    assert got.dtype == theirs.dtype, f"dtype {got.dtype} != torch {theirs.dtype}"
    np.testing.assert_allclose(got, theirs, **TOLERANCE)


# ---------------------------------------------------------------------------------------------------------------------
# elementwise


@pytest.mark.parametrize("name", ["fmax", "fmin"])
def test_fmax_fmin_ignore_nan_and_pass_ties_to_self_as_torch(name):
    x = np.array([[1.0, NAN, 3.0, NAN], [2.0, -1.0, NAN, 0.0]], dtype=np.float32)
    y = np.array([[NAN, NAN, 3.0, 1.0]], dtype=np.float32)  # (broadcast, with a tie and a NaN on both sides)
    grad_check(lambda a, b: getattr(a, name)(b), x, y)
    ints, other = data(3, 4, dtype=np.int32, low=-3, high=3), data(4, dtype=np.int8, low=-3, high=3, seed=1)
    same(getattr(Tensor(ints), name)(Tensor(other)), getattr(torch, name)(torch.tensor(ints), torch.tensor(other)))
    same(
        getattr(Tensor(ints), name)(Tensor(other).float()),
        getattr(torch, name)(torch.tensor(ints), torch.tensor(other).float()),
    )
    np.testing.assert_array_equal(getattr(Tensor(x), name)(0.5).numpy(), getattr(np, name)(x, np.float32(0.5)))
    assert getattr(Tensor.zeros(0, 2), name)(Tensor.ones(2)).shape == (0, 2)
    flags = (np.array([True, False, True]), np.array([False, False, True]))
    same(getattr(Tensor(flags[0]), name)(Tensor(flags[1])), getattr(torch, name)(*map(torch.tensor, flags)))


def test_frac_matches_torch():
    x = np.array([-2.5, -0.25, 0.0, 1.75, 3.0, 1e8], dtype=np.float32)
    grad_check(lambda t: t.frac(), x)
    edges = np.array([INF, -INF, NAN, -0.0], dtype=np.float32)
    same(Tensor(edges).frac(), torch.tensor(edges).frac())
    same(Tensor(np.float64(-1.5)).frac(), torch.tensor(-1.5, dtype=torch.float64).frac())
    with pytest.raises(TypeError, match=r"frac: needs a float tensor, got dtypes.int32.*\.float\(\)"):
        Tensor([1, 2]).frac()


def test_heaviside_matches_torch():
    x = np.array([[-1.5, 0.0, 2.0, NAN], [0.0, -0.0, 1.0, -INF]], dtype=np.float32)
    values = np.array([0.5, 7.0, 0.5, 0.5], dtype=np.float32)
    same(Tensor(x).heaviside(Tensor(values)), torch.tensor(x).heaviside(torch.tensor(values)))
    ints = np.array([-2, 0, 3], dtype=np.int32)
    same(
        Tensor(ints).heaviside(Tensor(np.array([5], np.int32))),
        torch.tensor(ints).heaviside(torch.tensor([5], dtype=torch.int32)),
    )
    same(Tensor(x).heaviside(Tensor(np.float32(2.0))), torch.tensor(x).heaviside(torch.tensor(2.0)))
    with pytest.raises(TypeError, match=r"heaviside: input is dtypes.float32 but values is dtypes.int32.*cast"):
        Tensor(x).heaviside(Tensor([1]))


def test_addcmul_addcdiv_match_torch_with_broadcasting_and_value():
    a, b, c = data(3, 1), data(4, seed=1), data(2, 3, 4, seed=2, nonzero=True)
    for value in (1, -0.5, 2):
        grad_check(lambda x, y, z: x.addcmul(y, z, value=value), a, b, c)
        grad_check(lambda x, y, z: x.addcdiv(y, z, value=value), a, b, c)
    ints = np.array([1, 2, 3], dtype=np.int32)
    same(
        Tensor(ints).addcmul(Tensor(ints), Tensor(ints), value=2),
        torch.tensor(ints).addcmul(torch.tensor(ints), torch.tensor(ints), value=2),
    )
    same(
        Tensor(ints).addcdiv(Tensor(ints).float(), Tensor(ints)),
        torch.tensor(ints).addcdiv(torch.tensor(ints).float(), torch.tensor(ints)),
    )
    assert Tensor(3.0).addcmul(Tensor(2.0), Tensor(4.0), value=0.5).shape == ()
    with pytest.raises(
        TypeError, match=r"addcdiv: tensor1 \(dtypes.int32\) and tensor2 \(dtypes.int32\) are both ints"
    ):
        Tensor(ints).addcdiv(Tensor(ints), Tensor(ints))
    with pytest.raises(TypeError, match=r"addcmul: value 0.5 is a float but the tensors are ints"):
        Tensor(ints).addcmul(Tensor(ints), Tensor(ints), value=0.5)
    with pytest.raises(TypeError, match="positional"):
        Tensor(ints).addcmul(Tensor(ints), Tensor(ints), 2)  # (value is keyword-only, as in torch)


def test_logaddexp2_matches_torch():
    x = np.array([[1.0, -3.0, 2.0], [100.0, -100.0, 0.5]], dtype=np.float32)
    y = np.array([[1.0, 4.0, -20.0]], dtype=np.float32)  # (a tie: half the gradient each way)
    grad_check(lambda a, b: a.logaddexp2(b), x, y)
    edges_x = np.array([INF, -INF, -INF, NAN, INF, 3.0], dtype=np.float32)
    edges_y = np.array([INF, -INF, 2.0, 1.0, -INF, 3.0], dtype=np.float32)
    same(Tensor(edges_x).logaddexp2(Tensor(edges_y)), torch.tensor(edges_x).logaddexp2(torch.tensor(edges_y)))
    same(Tensor([1, 2]).logaddexp2(Tensor([3, 0])), torch.tensor([1, 2]).float().logaddexp2(torch.tensor([3.0, 0.0])))


# ---------------------------------------------------------------------------------------------------------------------
# splitting and stacking


def test_ravel_matches_torch():
    grad_check(lambda t: t.ravel(), data(2, 3))
    grad_check(lambda t: t.transpose(0, 1).ravel(), data(2, 3))
    assert Tensor(5.0).ravel().shape == (1,) and Tensor.zeros(0, 3).ravel().shape == (0,)


@pytest.mark.parametrize(
    "split, dim",
    [(3, 0), (4, -1), (1, 1), (7, 0), ([1, 3], 1), ([1, 5, -1, 10, 2], 0), ([], 0), ((0, 0), -1)],
)
def test_tensor_split_matches_torch(split, dim):
    array = data(5, 4, seed=3)
    ours, theirs = Tensor(array).tensor_split(split, dim), torch.tensor(array).tensor_split(split, dim)
    assert len(ours) == len(theirs)
    for piece, expected in zip(ours, theirs):
        same(piece, expected)

    def weighted(*pieces):  # every piece in a gradient, each scaled differently
        return sum((p.sum() * (k + 1) for k, p in enumerate(pieces)), start=pieces[0].sum() * 0)

    grad_check(
        lambda t: weighted(*t.tensor_split(split, dim)),
        array,
        torch_function=lambda t: weighted(*t.tensor_split(split, dim)),
    )


def test_tensor_split_forms_and_errors():
    array = data(7, seed=4)
    for ours, theirs in (
        (Tensor(array).tensor_split(sections=3), torch.tensor(array).tensor_split(sections=3)),
        (Tensor(array).tensor_split(indices=[2, 4]), torch.tensor(array).tensor_split(indices=[2, 4])),
        (Tensor(array).tensor_split(Tensor([2, 4])), torch.tensor(array).tensor_split(torch.tensor([2, 4]))),
        (Tensor(array).tensor_split(Tensor(3)), torch.tensor(array).tensor_split(torch.tensor(3))),
        (Tensor.zeros(0, 2).tensor_split(3), torch.zeros(0, 2).tensor_split(3)),
        (
            Tensor(array.reshape(1, 7)).tensor_split(2, dim=-1),
            torch.tensor(array.reshape(1, 7)).tensor_split(2, dim=-1),
        ),
    ):
        assert [p.shape for p in ours] == [tuple(p.shape) for p in theirs]
        for piece, expected in zip(ours, theirs):
            same(piece, expected)
    with pytest.raises(ValueError, match="tensor_split: the number of sections must be positive, got 0"):
        Tensor(array).tensor_split(0)
    with pytest.raises(IndexError, match="tensor_split: needs a tensor with at least 1 dimension"):
        Tensor(1.0).tensor_split(2)
    with pytest.raises(IndexError, match="tensor_split: axis 1 is out of range"):
        Tensor(array).tensor_split(2, 1)
    with pytest.raises(TypeError, match="tensor_split: a tensor of indices_or_sections must be a 0-d or 1-D int"):
        Tensor(array).tensor_split(Tensor([1.0]))
    with pytest.raises(TypeError, match="tensor_split: indices_or_sections must be an int, a list of ints"):
        Tensor(array).tensor_split(2.5)


STACKS = {
    "hstack": [[(2, 3), (2, 1)], [(3,), (2,)], [(), (2,)], [(2, 3, 1), (2, 1, 1)]],
    "vstack": [[(2, 3), (1, 3)], [(3,), (3,)], [(), ()], [(3,), (2, 3)], [(1, 2, 2), (2, 2, 2)]],
    "dstack": [[(2, 3), (2, 3)], [(3,), (3,)], [(), ()], [(2, 3, 1), (2, 3, 2)], [(3,), (1, 3)]],
    "column_stack": [[(3,), (3,)], [(), ()], [(3, 2), (3,)], [(2, 1, 2), (2, 2, 2)]],
}


@pytest.mark.parametrize("name, shapes", [(name, shapes) for name, cases in STACKS.items() for shapes in cases])
def test_stacks_match_torch(name, shapes):
    arrays = [data(*shape, seed=k) for k, shape in enumerate(shapes)]
    grad_check(
        lambda *ts: getattr(Tensor, name)(list(ts)), *arrays, torch_function=lambda *ts: getattr(torch, name)(list(ts))
    )
    ours = getattr(Tensor(arrays[0]), name)(*(Tensor(a) for a in arrays[1:]))
    same(ours, getattr(torch, name)([torch.tensor(a) for a in arrays]))


def test_stacks_promote_and_refuse_as_torch():
    same(
        Tensor.hstack([Tensor([1, 2]), Tensor([0.5])]), torch.hstack([torch.tensor([1, 2]).int(), torch.tensor([0.5])])
    )
    for name in STACKS:
        with pytest.raises(TypeError, match=f"{name}: expected a non-empty list of Tensors"):
            getattr(Tensor, name)([])
    with pytest.raises(ValueError, match="cat: shapes"):
        Tensor.vstack([Tensor.zeros(2, 3), Tensor.zeros(2, 2)])


# ---------------------------------------------------------------------------------------------------------------------
# whole-tensor comparisons, differences and statistics


def test_allclose_and_equal_return_python_bools_as_torch():
    a = data(2, 3)
    cases = [
        (a, a + 1e-9, {}),
        (a, a + 1e-3, {}),
        (a, a + 1e-3, {"atol": 1e-2}),
        (a, a * (1 + 1e-3), {"rtol": 1e-2}),
        (np.array([1.0, NAN], np.float32), np.array([1.0, NAN], np.float32), {}),
        (np.array([1.0, NAN], np.float32), np.array([1.0, NAN], np.float32), {"equal_nan": True}),
        (np.array([INF, 1.0], np.float32), np.array([INF, 1.0], np.float32), {}),
        (a, a[:1], {}),  # (allclose broadcasts)
        (np.zeros((0, 2), np.float32), np.zeros((0, 2), np.float32), {}),
    ]
    for x, y, keywords in cases:
        got = Tensor(x).allclose(Tensor(y), **keywords)
        assert type(got) is bool and got == torch.allclose(torch.tensor(x), torch.tensor(y), **keywords)
    for x, y in [
        (a, a),
        (a, a + 1e-6),
        (a, a[:1]),  # (equal does not broadcast: another shape is not equal)
        (np.array([1.0, NAN], np.float32),) * 2,  # (NaN equals nothing, itself included)
        (np.zeros((0, 2), np.float32), np.zeros((0, 2), np.float32)),
        (np.zeros((0, 2), np.float32), np.zeros((2, 0), np.float32)),
        (np.float32(3.0), np.float32(3.0)),
        (np.array([1, 2], np.int64), np.array([1.0, 2.0], np.float32)),
    ]:
        got = Tensor(x).equal(Tensor(y))
        assert type(got) is bool and got == torch.equal(torch.tensor(x), torch.tensor(y)), (x, y)
    with pytest.raises(TypeError, match="equal: expected a Tensor, got"):
        Tensor(a).equal(a)


def test_trace_matches_torch():
    grad_check(lambda t: t.trace(), data(3, 4))
    grad_check(lambda t: t.trace(), data(4, 2))
    same(
        Tensor(data(3, 3, dtype=np.int8, low=-9, high=9)).trace(),
        torch.tensor(data(3, 3, dtype=np.int8, low=-9, high=9)).trace(),
    )
    same(Tensor.zeros(0, 3).trace(), torch.zeros(0, 3).trace())
    with pytest.raises(ValueError, match=r"trace: expected a matrix, got shape \(2, 2, 2\)"):
        Tensor.zeros(2, 2, 2).trace()


@pytest.mark.parametrize("n, dim", [(0, -1), (1, -1), (2, 1), (1, 0), (3, -2), (9, 1)])
def test_diff_matches_torch(n, dim):
    grad_check(lambda t: t.diff(n, dim), data(3, 4))


def test_diff_prepend_append_dtypes_and_errors():
    array, before, after = data(3, 4), data(3, 1, seed=1), data(3, 2, seed=2)
    grad_check(lambda t, p, a: t.diff(1, -1, p, a), array, before, after)
    grad_check(lambda t, a: t.diff(n=2, dim=1, append=a), array, after)
    grad_check(lambda t, p: t.diff(dim=0, prepend=p), array, data(2, 4, seed=3))
    flags = np.array([True, False, False, True])
    same(Tensor(flags).diff(), torch.tensor(flags).diff())
    same(Tensor(flags).diff(2), torch.tensor(flags).diff(2))
    small = np.array([1, 5, 2], np.uint8)  # (wraps, as torch)
    same(Tensor(small).diff(), torch.tensor(small).diff())
    same(Tensor([1, 2]).diff(prepend=Tensor([0.5])), torch.tensor([1, 2]).int().diff(prepend=torch.tensor([0.5])))
    same(Tensor.zeros(2, 0).diff(), torch.zeros(2, 0).diff())
    with pytest.raises(ValueError, match="diff: needs a tensor with at least 1 dimension"):
        Tensor(1.0).diff()
    with pytest.raises(ValueError, match="diff: the order n must be a non-negative int, got -1"):
        Tensor(array).diff(-1)
    with pytest.raises(ValueError, match=r"diff: prepend \(4,\) needs the input's 2 dimensions"):
        Tensor(array).diff(prepend=Tensor.zeros(4))
    with pytest.raises(TypeError, match="diff: append must be a Tensor, got float"):
        Tensor(array).diff(append=1.0)


@pytest.mark.filterwarnings("ignore:.*degrees of freedom")
@pytest.mark.parametrize("shape", [(3, 5), (1, 4), (5,), (2, 1)])
@pytest.mark.parametrize("correction", [0, 1, 2])
def test_cov_and_corrcoef_match_torch(shape, correction):
    grad_check(lambda t: t.cov(correction=correction), data(*shape))
    if shape[-1] > 1:
        grad_check(lambda t: t.corrcoef(), data(*shape, seed=2), tolerance={"rtol": 1e-3, "atol": 1e-4})


@pytest.mark.filterwarnings("ignore:.*degrees of freedom")
def test_cov_weights_edges_and_errors():
    array, fweights, aweights = data(2, 4), np.array([1, 3, 0, 2]), np.array([0.5, 1.0, 2.0, 0.25], np.float32)
    for keywords in ({"fweights": fweights}, {"aweights": aweights}, {"fweights": fweights, "aweights": aweights}):
        for correction in (0, 1):
            ours = Tensor(array).cov(correction=correction, **{k: Tensor(v) for k, v in keywords.items()})
            theirs = torch.tensor(array).cov(correction=correction, **{k: torch.tensor(v) for k, v in keywords.items()})
            same(ours, theirs)
    grad_check(
        lambda t, w: t.cov(aweights=w),
        array,
        aweights,
        torch_function=lambda t, w: t.cov(aweights=w),
    )
    ints = np.array([[1, 2, 4], [0, 5, 1]])
    same(Tensor(ints).cov(), torch.tensor(ints).cov())
    with pytest.warns(UserWarning):  # (torch warns; both divide by 0)
        expected = torch.tensor([1.0, 2.0]).cov(correction=5)
    same(Tensor([1.0, 2.0]).cov(correction=5), expected)
    same(Tensor(3.0).cov(), torch.tensor(3.0).cov())
    same(
        Tensor(np.array([[1.0, 1.0], [1.0, 2.0]], np.float32)).corrcoef(),
        torch.tensor([[1.0, 1.0], [1.0, 2.0]]).corrcoef(),
    )
    same(Tensor([1.0, 2.0, 4.0]).corrcoef(), torch.tensor([1.0, 2.0, 4.0]).corrcoef())
    with pytest.raises(ValueError, match=r"cov: expected a tensor of at most 2 dimensions .* got \(1, 2, 2\)"):
        Tensor.zeros(1, 2, 2).cov()
    with pytest.raises(ValueError, match=r"cov: fweights must be 1-D with one weight per observation \(4\)"):
        Tensor(array).cov(fweights=Tensor([1, 2]))
    with pytest.raises(TypeError, match="cov: fweights must be integers, got dtypes.float32; use aweights"):
        Tensor(array).cov(fweights=Tensor(aweights))
    with pytest.raises(TypeError, match=r"cov: aweights must be floats, got dtypes.int64; cast with \.float\(\)"):
        Tensor(array).cov(aweights=Tensor(fweights))
    with pytest.raises(ValueError, match="corrcoef: expected a tensor of at most 2 dimensions"):
        Tensor.zeros(1, 2, 2).corrcoef()


# ---------------------------------------------------------------------------------------------------------------------
# searching and counting

SEQUENCE = np.array([-1.0, 0.5, 0.5, 2.0, INF], np.float32)  # (ties and an infinity)
PROBES = np.array([[-2.0, -1.0, 0.5, 1.0], [2.0, 3.0, INF, NAN]], np.float32)


@pytest.mark.parametrize("keywords", [{}, {"right": True}, {"side": "right"}, {"side": "left"}, {"out_int32": True}])
def test_searchsorted_matches_torch(keywords):
    same(
        Tensor(SEQUENCE).searchsorted(Tensor(PROBES), **keywords),
        torch.searchsorted(torch.tensor(SEQUENCE), torch.tensor(PROBES), **keywords),
    )
    rows = np.sort(data(2, 5, integral=True), axis=-1)  # (one sorted sequence a row of values)
    values = data(2, 3, seed=1, integral=True)
    same(
        Tensor(rows).searchsorted(Tensor(values), **keywords),
        torch.searchsorted(torch.tensor(rows), torch.tensor(values), **keywords),
    )
    same(Tensor(SEQUENCE).searchsorted(0.5, **keywords), torch.searchsorted(torch.tensor(SEQUENCE), 0.5, **keywords))
    ints = np.array([1, 3, 3, 7])
    same(
        Tensor(ints).searchsorted(Tensor([3, 0, 8]), **keywords),
        torch.searchsorted(torch.tensor(ints), torch.tensor([3, 0, 8]), **keywords),
    )
    same(  # (int values in a float sequence: compared as floats)
        Tensor(SEQUENCE).searchsorted(Tensor([0, 2]), **keywords),
        torch.searchsorted(torch.tensor(SEQUENCE), torch.tensor([0, 2]), **keywords),
    )


def test_searchsorted_sorter_empty_and_errors():
    unsorted, sorter = np.array([3.0, 1.0, 2.0], np.float32), np.array([1, 2, 0])
    values = np.array([0.0, 1.5, 2.0, 9.0], np.float32)
    for right in (False, True):
        same(
            Tensor(unsorted).searchsorted(Tensor(values), right=right, sorter=Tensor(sorter)),
            torch.searchsorted(torch.tensor(unsorted), torch.tensor(values), right=right, sorter=torch.tensor(sorter)),
        )
    same(Tensor.zeros(0).searchsorted(Tensor(values)), torch.searchsorted(torch.zeros(0), torch.tensor(values)))
    same(
        Tensor(unsorted).searchsorted(Tensor.zeros(0, 2)), torch.searchsorted(torch.tensor(unsorted), torch.zeros(0, 2))
    )
    same(Tensor(SEQUENCE).searchsorted(Tensor(1.0)), torch.searchsorted(torch.tensor(SEQUENCE), torch.tensor(1.0)))
    with pytest.raises(ValueError, match="searchsorted: side='left' and right=True ask for opposite sides"):
        Tensor(SEQUENCE).searchsorted(Tensor(values), right=True, side="left")
    with pytest.raises(ValueError, match="searchsorted: side must be 'left' or 'right'"):
        Tensor(SEQUENCE).searchsorted(Tensor(values), side="middle")
    with pytest.raises(ValueError, match=r"searchsorted: an N-D sequence \(2, 3\) needs values of the same leading"):
        Tensor.zeros(2, 3).searchsorted(Tensor.zeros(3, 3))
    with pytest.raises(ValueError, match="searchsorted: the sorted sequence needs at least 1 dimension"):
        Tensor(1.0).searchsorted(Tensor(values))
    with pytest.raises(ValueError, match="searchsorted: sorter must be int indices of the sequence's shape"):
        Tensor(unsorted).searchsorted(Tensor(values), sorter=Tensor([0, 1]))


def test_bucketize_matches_torch():
    boundaries = np.array([-1.0, 0.0, 0.0, 2.0], np.float32)
    for right in (False, True):
        same(
            Tensor(PROBES).bucketize(Tensor(boundaries), right=right),
            torch.bucketize(torch.tensor(PROBES), torch.tensor(boundaries), right=right),
        )
        same(
            Tensor(0.0).bucketize(Tensor(boundaries), right=right),
            torch.bucketize(torch.tensor(0.0), torch.tensor(boundaries), right=right),
        )
    same(
        Tensor([1, 5]).bucketize(Tensor([2, 4]), out_int32=True),
        torch.bucketize(torch.tensor([1, 5]), torch.tensor([2, 4]), out_int32=True),
    )
    with pytest.raises(ValueError, match=r"bucketize: boundaries must be 1-D, got shape \(2, 2\)"):
        Tensor(PROBES).bucketize(Tensor.zeros(2, 2))


def test_bincount_matches_torch():
    counts = np.array([2, 0, 5, 2, 2, 1])
    same(Tensor(counts).bincount(), torch.tensor(counts).bincount())
    same(Tensor(counts).bincount(minlength=9), torch.tensor(counts).bincount(minlength=9))
    same(
        Tensor(counts.astype(np.uint8)).bincount(minlength=2),
        torch.tensor(counts.astype(np.uint8)).bincount(minlength=2),
    )
    for weights in (data(6), data(6, dtype=np.float64), np.arange(6, dtype=np.int32), data(6).astype(np.float16)):
        same(Tensor(counts).bincount(Tensor(weights)), torch.tensor(counts).bincount(torch.tensor(weights)))
    same(Tensor.zeros(0, dtype=dtypes.int64).bincount(), torch.zeros(0, dtype=torch.int64).bincount())
    same(
        Tensor.zeros(0, dtype=dtypes.int64).bincount(minlength=3),
        torch.zeros(0, dtype=torch.int64).bincount(minlength=3),
    )
    with pytest.raises(ValueError, match="bincount: the input holds -1; it counts non-negative ints only"):
        Tensor([1, -1]).bincount()
    with pytest.raises(
        TypeError, match=r"bincount: needs a 1-D tensor of non-negative ints, got dtypes.float32 of shape \(2,\)"
    ):
        Tensor([1.0, 2.0]).bincount()
    with pytest.raises(TypeError, match=r"bincount: needs a 1-D tensor .* got dtypes.int32 of shape \(1, 2\)"):
        Tensor([[1, 2]]).bincount()
    with pytest.raises(ValueError, match="bincount: minlength must be a non-negative int, got -1"):
        Tensor([1]).bincount(minlength=-1)
    with pytest.raises(ValueError, match=r"bincount: weights must be 1-D of the input's length \(2,\), got \(3,\)"):
        Tensor([1, 2]).bincount(Tensor([1.0, 2.0, 3.0]))


@pytest.mark.parametrize(
    "op", [lambda x: x.bincount(), lambda x: x.float().histc(4), lambda x: Tensor.arange(4).tensor_split(x)[1]]
)
def test_ops_that_read_the_data_are_refused_in_a_capture(op):
    """Their graphs are built from the values (a length, a range, cut points): a replay would keep the capture's."""

    @TinyJit
    def step(x):
        return op(x + 0).realize()

    with pytest.raises(
        JitError, match=r"(bincount|histc without a range|tensor_split).*computed from the function's inputs"
    ):
        for k in range(3):
            step(Tensor([k, 1, 2]))


def test_histc_matches_torch():
    values = np.array([1.0, 2.0, 1.0, 3.0, 5.0, 2.5, NAN, -1.0, INF], np.float32)
    for bins, low, high in ((4, 1, 3), (3, 0, 6), (1, -1, 5), (5, -1, 5), (7, 1.0, 1.1)):
        same(Tensor(values).histc(bins, low, high), torch.histc(torch.tensor(values), bins, low, high))
    finite = data(3, 4, seed=5)
    same(Tensor(finite).histc(5), torch.histc(torch.tensor(finite), 5))  # (the data's range)
    same(Tensor(finite).histc(bins=6, min=-1, max=1), torch.histc(torch.tensor(finite), bins=6, min=-1, max=1))
    same(Tensor(finite.astype(np.float64)).histc(3), torch.histc(torch.tensor(finite.astype(np.float64)), 3))
    same(Tensor([2.0, 2.0]).histc(4), torch.histc(torch.tensor([2.0, 2.0]), 4))  # (one value: widened by 1 each way)
    same(Tensor.zeros(0).histc(3), torch.histc(torch.zeros(0), 3))
    same(Tensor(7.0).histc(2), torch.histc(torch.tensor(7.0), 2))
    with pytest.raises(TypeError, match=r"histc: needs a float tensor, got dtypes.int32; cast with \.float\(\)"):
        Tensor([1, 2]).histc()
    with pytest.raises(ValueError, match="histc: bins must be a positive int, got 0"):
        Tensor([1.0]).histc(0)
    with pytest.raises(ValueError, match="histc: max must be larger than min, got min=2.0, max=1.0"):
        Tensor([1.0]).histc(3, 2, 1)
    with pytest.raises(ValueError, match=r"histc: the range \[nan, nan\] is not finite"):
        Tensor([1.0, NAN]).histc(3)  # (the data's range, as torch's)
    with pytest.raises(ValueError, match=r"histc: the range \[1.0, inf\] is not finite"):
        Tensor([1.0, INF]).histc(3, 2, 2)


@pytest.mark.parametrize("row, col, offset", [(3, 3, 0), (3, 5, 1), (4, 2, -1), (0, 3, 0), (3, 4, 7), (2, 3, -5)])
def test_triu_tril_indices_match_torch(row, col, offset):
    same(Tensor.triu_indices(row, col, offset), torch.triu_indices(row, col, offset))
    same(Tensor.tril_indices(row, col, offset), torch.tril_indices(row, col, offset))


def test_triu_tril_indices_dtype_and_errors():
    same(Tensor.triu_indices(3, 3, dtype=dtypes.int32), torch.triu_indices(3, 3, dtype=torch.int32))
    same(Tensor.tril_indices(3, 2, offset=1), torch.tril_indices(3, 2, offset=1))
    with pytest.raises(ValueError, match="triu_indices: row and col must be non-negative, got row=-1, col=3"):
        Tensor.triu_indices(-1, 3)
    with pytest.raises(TypeError, match="tril_indices: dtype must be an int dtype"):
        Tensor.tril_indices(3, 3, dtype=dtypes.float32)
    with pytest.raises(TypeError, match="tril_indices: col must be an int, got 2.5"):
        Tensor.tril_indices(3, 2.5)


def test_constant_pad_of_an_int_tensor_keeps_its_dtype_as_torch():
    ints = np.array([1, 2], np.int32)
    ours = Tensor(ints).pad((1, 1), value=1.5)
    theirs = torch.nn.functional.pad(torch.tensor(ints), (1, 1), value=1.5)
    assert ours.dtype == dtypes.int32 and ours.tolist() == theirs.tolist()
    assert Tensor([True]).pad((1, 1), value=2.5).tolist() == [True, True, True]
    with pytest.raises(ValueError, match="pad: value inf does not fit a dtypes.int32 tensor"):
        Tensor(ints).pad((1, 1), value=float("inf"))


def test_unique_matches_torch():
    values = np.array([2.0, np.nan, 1.0, 2.0, np.nan, -0.0, 0.0], np.float32)
    for options in ({}, {"return_inverse": True, "return_counts": True}, {"return_counts": True}):
        ours, theirs = Tensor(values).unique(**options), torch.unique(torch.tensor(values), **options)
        ours, theirs = (ours, theirs) if isinstance(ours, tuple) else ((ours,), (theirs,))
        for mine, their in zip(ours, theirs):
            np.testing.assert_array_equal(mine.numpy(), their.numpy())
    rows = np.array([[1, 2], [1, 2], [3, 4]], np.int32)
    ours = Tensor(rows).unique(dim=0, return_inverse=True, return_counts=True)
    theirs = torch.unique(torch.tensor(rows), dim=0, return_inverse=True, return_counts=True)
    for mine, their in zip(ours, theirs):
        np.testing.assert_array_equal(mine.numpy(), their.numpy())
    square = np.array([[3, 1], [2, 1]], np.int32)
    inverse = Tensor(square).unique(return_inverse=True)[1]
    np.testing.assert_array_equal(inverse.numpy(), torch.unique(torch.tensor(square), return_inverse=True)[1].numpy())
    assert Tensor([1.5, 1.5, 2.0], dtype=dtypes.bfloat16).unique().dtype == dtypes.bfloat16
    assert Tensor.zeros(0).unique().shape == (0,)

    @TinyJit
    def distinct(x):
        return (x * 2).unique()

    with pytest.raises(JitError, match="unique reads the values"):
        for _ in range(3):
            distinct(Tensor([1.0, 1.0, 2.0]))


def test_norms_products_and_membership_match_torch():
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal((3, 4)).astype(np.float32), rng.standard_normal((3, 4)).astype(np.float32)
    a[0, 0] = 0.0
    for p in ("fro", 2, 1, 3, 0.5, float("inf"), float("-inf"), 0):
        np.testing.assert_allclose(Tensor(a).norm(p).numpy(), torch.norm(torch.tensor(a), p).numpy(), rtol=1e-5)
        np.testing.assert_allclose(
            Tensor(a).norm(p, dim=1).numpy(), torch.norm(torch.tensor(a), p, dim=1).numpy(), rtol=1e-5
        )
    tolerance = {"rtol": 1e-5, "atol": 1e-6}
    compare_backward([a], lambda x: x.norm(3, dim=1), lambda x: torch.norm(x, 3, dim=1), tolerance, rng)
    compare_backward(
        [a, b],
        lambda x, y: x.cosine_similarity(y),
        lambda x, y: torch.nn.functional.cosine_similarity(x, y),
        tolerance,
        rng,
    )
    c, d = rng.standard_normal((2, 3)).astype(np.float32), rng.standard_normal((2, 3)).astype(np.float32)
    np.testing.assert_allclose(
        Tensor(c).cross(Tensor(d)).numpy(), torch.cross(torch.tensor(c), torch.tensor(d), dim=1).numpy(), rtol=1e-6
    )
    with pytest.raises(ValueError, match=r"cross: no axis of size 3 in \(2, 4\)"):
        Tensor(a[:2]).cross(Tensor(b[:2]))
    x = np.array([3.0, 1e30, 1e-30, 0.0, np.inf, np.nan, -4.0], np.float32)
    y = np.array([4.0, 1e30, 1e-30, 0.0, np.nan, np.inf, 3.0], np.float32)
    np.testing.assert_allclose(Tensor(x).hypot(Tensor(y)).numpy(), torch.hypot(torch.tensor(x), torch.tensor(y)))
    p = np.array([0.1, 0.5, 0.99, 0.0, 1.0], np.float32)
    np.testing.assert_allclose(Tensor(p).logit().numpy(), torch.logit(torch.tensor(p)).numpy(), rtol=1e-6)
    np.testing.assert_allclose(Tensor(p).logit(1e-3).numpy(), torch.logit(torch.tensor(p), 1e-3).numpy(), rtol=1e-6)
    ours, theirs = Tensor(p, requires_grad=True), torch.tensor(p, requires_grad=True)
    ours.logit().sum().backward()
    torch.logit(theirs).sum().backward()
    np.testing.assert_allclose(ours.grad.numpy(), theirs.grad.numpy(), rtol=1e-5)  # (inf at 0 and 1, as torch's)
    e, t = np.array([1, 2, 3, 4, 2]), np.array([2, 4])
    assert Tensor(e).isin(Tensor(t)).tolist() == torch.isin(torch.tensor(e), torch.tensor(t)).tolist()
    assert Tensor(e).isin(2, invert=True).tolist() == torch.isin(torch.tensor(e), 2, invert=True).tolist()


def test_torchs_in_place_forms_write_into_the_tensor():
    rng = np.random.default_rng(6)
    a, b = np.abs(rng.standard_normal((3, 4))).astype(np.float32), rng.standard_normal((3, 4)).astype(np.float32)
    cases = [("add_", (b,)), ("sub_", (2.0,)), ("mul_", (b,)), ("div_", (2.0,)), ("pow_", (2,)), ("clamp_", (0.2, 0.5))]
    cases += [(name, ()) for name in ("neg_", "abs_", "exp_", "log_", "sqrt_", "relu_", "sigmoid_", "tanh_", "zero_")]
    cases += [("fill_", (3.0,)), ("copy_", (b,)), ("masked_fill_", (a > 1, 0.0))]
    for name, arguments in cases:
        ours, theirs = Tensor(a).contiguous().realize(), torch.tensor(a)
        alias = ours
        result = getattr(ours, name)(*(Tensor(v) if isinstance(v, np.ndarray) else v for v in arguments))
        getattr(theirs, name)(*(torch.tensor(v) if isinstance(v, np.ndarray) else v for v in arguments))
        assert result is ours
        np.testing.assert_allclose(alias.numpy(), theirs.numpy(), rtol=1e-6, err_msg=name)
    ours, theirs = Tensor(a).contiguous().realize(), torch.tensor(a)
    ours.add_(Tensor(b), alpha=2)
    theirs.add_(torch.tensor(b), alpha=2)
    np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=1e-6)
    drawn = Tensor.zeros(2000).contiguous().realize()
    drawn.uniform_(-2, 2)
    assert drawn.numpy().min() >= -2 and drawn.numpy().max() < 2
    drawn.normal_(5.0, 0.1)
    assert abs(drawn.numpy().mean() - 5.0) < 0.05
    weight = Tensor(a, requires_grad=True)
    with pytest.raises(RuntimeError, match="add_: this .* requires grad .* write `x = x.add\\(...\\)`"):
        weight.add_(1)
    with Tensor.test():
        weight.zero_()
    assert weight.numpy().sum() == 0
    with pytest.raises(TypeError, match="add_: the result is dtypes.float32, which this dtypes.int32 tensor"):
        Tensor([1, 2]).contiguous().realize().add_(0.5)


def test_rearrange_splits_merges_and_moves_axes():
    values = np.arange(2 * 6 * 5, dtype=np.float32).reshape(2, 6, 5)
    x = Tensor(values)
    cases = [
        (x.rearrange("b (h w) c -> b h w c", h=2), values.reshape(2, 2, 3, 5)),
        (x.rearrange("b s c -> b (s c)"), values.reshape(2, 30)),
        (x.rearrange("b s c -> c b s"), values.transpose(2, 0, 1)),
        (x.rearrange("... s c -> ... c s"), values.transpose(0, 2, 1)),
        (x.rearrange("b (h w) c -> (b w) h c", w=3), values.reshape(2, 2, 3, 5).transpose(0, 2, 1, 3).reshape(6, 2, 5)),
        (x.rearrange("b s c -> b 1 s c"), values.reshape(2, 1, 6, 5)),
        (Tensor(values[:, :1]).rearrange("b 1 c -> b c"), values[:, 0]),
    ]
    for ours, expected in cases:
        np.testing.assert_array_equal(ours.numpy(), expected)
    compare_backward(
        [values],
        lambda t: t.rearrange("b (h w) c -> c h (b w)", h=3),
        lambda t: t.reshape(2, 3, 2, 5).permute(3, 1, 0, 2).reshape(5, 3, 4),
        {"rtol": 0, "atol": 0},
        np.random.default_rng(0),
    )
    for formula, message in (
        ("b s -> s b", "names 2 axes, but the tensor"),
        ("b s c -> b s", "must name the same axes on both sides"),
        ("b (h w) c -> b h w c", r"cannot be split as \(h w\)"),
        ("b s c -> b (s (c))", "nested parentheses"),
        ("b b c -> b c", "names an axis twice"),
    ):
        with pytest.raises(ValueError, match=f"rearrange: .*{message}"):
            x.rearrange(formula)


def test_adaptive_pooling_matches_torch():
    import torch.nn.functional as F

    rng = np.random.default_rng(7)
    images = rng.standard_normal((2, 3, 7, 10)).astype(np.float32)
    for size in (1, (3, 5), (None, 4), (4, 6), (7, 10)):
        for kind in ("avg", "max"):
            ours = getattr(Tensor(images), f"adaptive_{kind}_pool2d")(size)
            theirs = getattr(F, f"adaptive_{kind}_pool2d")(torch.tensor(images), size)
            np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=1e-5, atol=1e-6, err_msg=f"{kind} {size}")
    rows = rng.standard_normal((2, 3, 11)).astype(np.float32)
    np.testing.assert_allclose(
        Tensor(rows).adaptive_avg_pool1d(4).numpy(), F.adaptive_avg_pool1d(torch.tensor(rows), 4).numpy(), atol=1e-6
    )
    tolerance = {"rtol": 1e-5, "atol": 1e-6}
    for kind in ("avg", "max"):
        compare_backward(
            [images],
            lambda x, kind=kind: getattr(x, f"adaptive_{kind}_pool2d")((4, 6)),
            lambda x, kind=kind: getattr(F, f"adaptive_{kind}_pool2d")(x, (4, 6)),
            tolerance,
            rng,
        )
    with pytest.raises(ValueError, match="adaptive_avg_pool2d: output_size needs 2 sizes"):
        Tensor(images).adaptive_avg_pool2d((1, 2, 3))


def test_norms_pools_and_similarity_at_the_hard_points_as_torch():
    import torch.nn.functional as F

    # an inf or NaN reaches only the bins it is in (a product with the bins' weights made 0 * inf NaN elsewhere)
    values = np.array([[[1.0, 2.0, np.inf, 4.0, 5.0]]], np.float32)
    np.testing.assert_array_equal(
        Tensor(values).adaptive_avg_pool1d(3).numpy(), F.adaptive_avg_pool1d(torch.tensor(values), 3).numpy()
    )
    # the norm's gradient at a zero vector is 0, for every p (the root's slope is infinite there)
    zeros = np.array([[0.0, 0.0, 0.0], [0.0, 3.0, -4.0]], np.float32)
    for p in (2, 0.5, 3):
        ours, theirs = Tensor(zeros, requires_grad=True), torch.tensor(zeros, requires_grad=True)
        ours.norm(p, dim=1).sum().backward()
        torch.norm(theirs, p, dim=1).sum().backward()
        np.testing.assert_allclose(ours.grad.numpy(), theirs.grad.numpy(), rtol=1e-5, err_msg=str(p))
    assert Tensor([300.0] * 8, dtype=dtypes.float16).norm().item() == pytest.approx(848.5, rel=1e-3)
    tiny = np.array([[1e-5, 0.0]], np.float32)
    np.testing.assert_allclose(
        Tensor(tiny).cosine_similarity(Tensor(tiny)).numpy(),
        F.cosine_similarity(torch.tensor(tiny), torch.tensor(tiny)).numpy(),
        rtol=1e-6,
    )
    # a NaN maximum's gradient goes to the NaN (it was NaN everywhere)
    x, reference = Tensor([1.0, np.nan, 3.0], requires_grad=True), torch.tensor([1.0, np.nan, 3.0], requires_grad=True)
    x.max().backward()
    reference.max().backward()
    np.testing.assert_array_equal(x.grad.numpy(), reference.grad.numpy())


def test_numpy_ints_as_counts_factors_and_strides():
    i = np.int64(2)
    x = Tensor.ones(2, 3, 4)
    assert x.movedim(np.int64(0), 2).shape == (3, 4, 2)
    assert x.repeat_interleave(i, dim=1).shape == (2, 6, 4)
    assert x.reshape(6, 4).multinomial(i).shape == (6, 2)
    assert x.reshape(1, 2, 3, 4).max_pool2d(kernel_size=2, stride=i).shape == (1, 2, 1, 2)
    assert Tensor.ones(1, 4, 2, 2).pixel_shuffle(i).shape == (1, 1, 4, 4)
    assert nn.LayerNorm(np.int64(4))(Tensor.ones(2, 4)).shape == (2, 4)
    assert x.norm(p=np.int64(3)).item() == pytest.approx(24 ** (1 / 3), rel=1e-6)


def test_copy_refuses_a_source_that_does_not_broadcast():
    """torch's rule: the source broadcasts to the tensor (it read past the source's end, or broke the tensor)."""
    target = Tensor.zeros(3, 4).contiguous().realize()
    for shape in [(1, 3, 4), (5,), (2, 4)]:
        with pytest.raises(ValueError, match=r"copy_: the source .* does not broadcast to this tensor's \(3, 4\)"):
            target.copy_(Tensor.ones(*shape))
    target.copy_(Tensor.arange(4).float())
    np.testing.assert_array_equal(target.numpy(), np.tile(np.arange(4, dtype=np.float32), (3, 1)))


@pytest.mark.parametrize("p", [-1, -2, -0.5])
def test_a_negative_norm_with_a_zero_element_is_zero(p):
    for values in ([0.0, 3.0, 4.0], [1.0, 3.0, 4.0]):
        expected = torch.tensor(values).norm(p).item()
        np.testing.assert_allclose(Tensor(values).norm(p).item(), expected, rtol=1e-6)
