"""Lookups by index (codegen/lookup.py): a sum of a one-hot selection (embedding, gather, indexing by tensors, the
label pick of a cross-entropy) becomes one load at the index, on every device, with the values NumPy and torch give.
"""

import numpy as np
import pytest
import torch
from support import available

from lazygrad import Device, Tensor, dtypes, nn
from lazygrad.codegen.lower import lower_kernel
from lazygrad.uop.ops import Ops

DEVICES = ["LLVM", "CPU", "GPU", "CUDA", "PYTHON"]
rng = np.random.default_rng(0)


@pytest.fixture(params=DEVICES)
def device(request) -> str:
    return available(request.param)


def reduce_loops(tensor: Tensor) -> int:
    """The sums left in the kernel computing `tensor` (its last one), after lowering."""
    kernel = lower_kernel(tensor.schedule()[-1].ast)
    return sum(node.op is Ops.RANGE_REDUCE for node in kernel.toposort)


def table(rows: int, columns: int, device: str | None = None) -> tuple[Tensor, np.ndarray]:
    values = rng.standard_normal((rows, columns)).astype(np.float32)
    return Tensor(values, device=device).realize(), values


def indices(high: int, *shape: int, device: str | None = None) -> tuple[Tensor, np.ndarray]:
    values = rng.integers(0, high, size=shape).astype(np.int32)
    return Tensor(values, device=device).realize(), values


# ---- the kernels read one element per lookup ---------------------------------------------------------------------


def test_embedding_is_one_kernel_without_a_loop_over_the_vocabulary():
    embedding = nn.Embedding(5000, 16)
    embedding.weight.realize()
    idx, _ = indices(5000, 4, 33)
    out = embedding(idx)
    # the one-hot mask is computed where it is read (a mask of its own would be 4*33*5000 floats), and its sum
    # over the vocabulary is a load
    assert len(out.schedule()) == 1
    assert reduce_loops(out) == 0


def test_gather_indexing_and_cross_entropy_have_no_loop_over_the_axis():
    x, _ = table(300, 40)
    rows, _ = indices(300, 7)
    columns, _ = indices(40, 7)
    assert reduce_loops(x[rows]) == 0
    assert reduce_loops(x[rows, columns]) == 0
    assert reduce_loops(x[:, columns]) == 0
    assert reduce_loops(x.gather(1, indices(40, 300, 3)[0])) == 0
    labels, _ = indices(40, 300)
    picked = x.sparse_categorical_crossentropy(labels, reduction="none")
    # the log-softmax's max and sum over each row stay; the pick of the label's column is a load
    assert reduce_loops(picked) == 2


def test_a_sum_over_the_other_axis_stays_a_sum():
    """The gradient of a lookup sums over the lookups that chose each row: no single element, so no load."""
    idx, values = indices(50, 64)
    one_hot = idx.one_hot(50).float()
    g, g_values = table(64, 8)
    result = one_hot.T @ g
    assert reduce_loops(result) == 1
    expected = np.zeros((50, 8), np.float32)
    np.add.at(expected, values, g_values)
    np.testing.assert_allclose(result.numpy(), expected, rtol=1e-5, atol=1e-5)


def test_a_one_hot_product_stays_a_sum():
    """one_hot @ W multiplies every row: 0 * inf is NaN, as in torch, whether or not the one-hot was realized first
    (a select of the row named would give finite values)."""
    table = Tensor([[1.0, 2.0], [float("inf"), float("nan")]])
    expected = (torch.nn.functional.one_hot(torch.tensor([0, 0]), 2).float() @ torch.tensor(table.numpy())).numpy()
    fused = Tensor([0, 0]).one_hot(2).float() @ table
    assert reduce_loops(fused) == 1
    np.testing.assert_array_equal(fused.numpy(), expected)
    np.testing.assert_array_equal((Tensor([0, 0]).one_hot(2).float().realize() @ table).numpy(), expected)


def test_float_comparisons_are_not_lookups():
    """x == arange with float x selects only where x holds an integer: a cast of 2.5 to an index would pick 2."""
    x = Tensor([0.0, 2.5, 3.0, -1.0])
    selected = (x.unsqueeze(-1) == Tensor.arange(5).float()).float() @ Tensor.arange(5).float()
    np.testing.assert_array_equal(selected.numpy(), [0.0, 0.0, 3.0, 0.0])


# ---- the values, on every device ---------------------------------------------------------------------------------


def test_embedding(device):
    embedding = nn.Embedding(1000, 24)
    weights = embedding.weight.numpy()
    embedding.weight = Tensor(weights, device=device).realize()
    idx, values = indices(1000, 3, 17, device=device)
    np.testing.assert_array_equal(embedding(idx).numpy(), weights[values])


def test_half_embedding(device):
    embedding = nn.Embedding(300, 8)
    weights = embedding.weight.numpy().astype(np.float16)
    embedding.weight = Tensor(weights, device=device).realize()
    idx, values = indices(300, 40, device=device)
    out = embedding(idx)
    assert out.dtype == dtypes.float16
    np.testing.assert_array_equal(out.numpy(), weights[values])


def test_gather_and_indexing(device):
    x, values = table(30, 20, device)
    rows, row_values = indices(30, 5, 2, device=device)
    columns, column_values = indices(20, 5, 2, device=device)
    np.testing.assert_array_equal(x[rows].numpy(), values[row_values])
    np.testing.assert_array_equal(x[rows, columns].numpy(), values[row_values, column_values])
    np.testing.assert_array_equal(x[1:, columns].numpy(), values[1:, column_values])
    np.testing.assert_array_equal(x[[-1, 0, -30]].numpy(), values[[-1, 0, -30]])  # (negative ones count from the end)
    index, index_values = indices(20, 30, 4, device=device)
    np.testing.assert_array_equal(x.gather(1, index).numpy(), np.take_along_axis(values, index_values, 1))


@pytest.mark.parametrize("dtype", [dtypes.float16, dtypes.bfloat16])
def test_narrow_lookups(device, dtype):
    """A half or bfloat16 lookup sums in float32 (a cast between the select and the sum): a load all the same."""
    values = rng.standard_normal((300, 8)).astype(np.float32)
    values[7] = np.inf
    table = Tensor(values, device=device).cast(dtype).realize()
    idx, picked = indices(300, 40, device=device)
    picked[picked == 7] = 8
    idx = Tensor(picked, device=device)
    assert reduce_loops(table[idx]) == 0
    expected = torch.tensor(values).to(getattr(torch, dtype.name))[torch.tensor(picked).long()].float().numpy()
    np.testing.assert_array_equal(table[idx].float().numpy(), expected)
    embedding = nn.Embedding(300, 8)
    embedding.weight = table
    np.testing.assert_array_equal(embedding(idx).float().numpy(), expected)


def test_padded_and_joined_lookups(device):
    """A lookup padded or joined to more rows: the index is read only inside the rows it has (the pad's gate on its
    load stays, though the table's load is gated by the pad too)."""
    x, values = table(6, 2, device)
    idx = Tensor(np.array([1, 5, 0, 2], np.int32), device=device)
    expected = np.pad(values[[1, 5, 0, 2]], ((3, 40), (0, 0)))
    np.testing.assert_array_equal(x[idx].pad(((3, 40), (0, 0))).numpy(), expected)
    embedding = nn.Embedding(6, 2)
    embedding.weight = x
    rest = Tensor.ones(50, 2, device=device).contiguous()
    np.testing.assert_array_equal(
        Tensor.cat(embedding(idx), rest).numpy(), np.concatenate([expected[3:7], np.ones((50, 2))])
    )


def test_int_lookups(device):
    x = Tensor(np.arange(-60, 60, dtype=np.int32).reshape(12, 10), device=device)
    idx, values = indices(12, 9, device=device)
    np.testing.assert_array_equal(x[idx].numpy(), np.arange(-60, 60, dtype=np.int32).reshape(12, 10)[values])
    bools = Tensor(np.arange(12) % 3 == 0, device=device)
    np.testing.assert_array_equal(bools[idx].numpy(), (np.arange(12) % 3 == 0)[values])


def test_cross_entropy(device):
    logits, values = table(64, 10, device)
    labels, label_values = indices(10, 64, device=device)
    expected = torch.nn.functional.cross_entropy(torch.tensor(values), torch.tensor(label_values).long())
    np.testing.assert_allclose(logits.sparse_categorical_crossentropy(labels).numpy(), expected.numpy(), rtol=1e-5)


def test_rows_not_looked_up_do_not_matter(device):
    """A NaN or inf in a row no lookup chose leaves the lookups alone, as torch's embedding and gather: only the
    rows read are read (a one-hot product gave 0 * NaN = NaN in every lookup)."""
    values = rng.standard_normal((6, 3)).astype(np.float32)
    values[4] = np.nan
    values[5] = np.inf
    weights = Tensor(values, device=device).realize()
    idx = Tensor(np.array([0, 3, 1, 3], np.int32), device=device)
    embedding = nn.Embedding(6, 3)
    embedding.weight = weights
    np.testing.assert_array_equal(embedding(idx).numpy(), values[[0, 3, 1, 3]])
    np.testing.assert_array_equal(weights[idx].numpy(), values[[0, 3, 1, 3]])
    looked = torch.nn.functional.embedding(torch.tensor([4, 5, 2]), torch.tensor(values)).numpy()
    np.testing.assert_array_equal(embedding(Tensor(np.array([4, 5, 2], np.int32), device=device)).numpy(), looked)


def test_embedding_gradient(device):
    embedding = nn.Embedding(40, 5, padding_idx=2)
    embedding.weight = Tensor(embedding.weight.numpy(), device=device).realize()
    embedding.weight.requires_grad = True
    idx = np.array([[3, 2, 3], [39, 0, 3]], np.int32)
    upstream = rng.standard_normal((2, 3, 5)).astype(np.float32)
    (embedding(Tensor(idx, device=device)) * Tensor(upstream, device=device)).sum().backward()
    expected = np.zeros((40, 5), np.float32)
    np.add.at(expected, idx, upstream)
    expected[2] = 0  # (the padding row gets no gradient)
    np.testing.assert_allclose(embedding.weight.grad.numpy(), expected, rtol=1e-6, atol=1e-6)


def test_uint64_indices_and_labels():
    """uint64 indices compare with the int32 arange of a one-hot as int64 (no int dtype holds both): they were an
    error naming `!=`, though getitem took them."""
    x, values = table(10, 2)
    picked = np.array([0, 3, 9], np.uint64)
    idx = Tensor(picked)
    np.testing.assert_array_equal(x.gather(0, idx.reshape(3, 1).expand(3, 2)).numpy(), values[picked.astype(np.int64)])
    embedding = nn.Embedding(10, 2)
    embedding.weight = x
    np.testing.assert_array_equal(embedding(idx).numpy(), values[picked.astype(np.int64)])
    np.testing.assert_array_equal(idx.one_hot(10).numpy(), np.eye(10, dtype=np.int32)[picked.astype(np.int64)])
    labels = picked % 2
    expected = torch.nn.functional.cross_entropy(torch.tensor(values[:3]), torch.tensor(labels.astype(np.int64)))
    np.testing.assert_allclose(x[:3].cross_entropy(Tensor(labels)).numpy(), expected.numpy(), rtol=1e-6)


def test_lookups_along_an_axis_long_enough_to_split_stay_loads():
    """A float sum over 2**18 values or more is split into parts (see Target.reduce_parts); a lookup is not, or it
    stayed a sum over every position (`x[x > 0]` of a million floats: 12 s, sorting 2**18 floats: 11 s)."""
    values = rng.standard_normal(1 << 18).astype(np.float32)
    x = Tensor(values).realize()
    picks = rng.integers(0, 1 << 18, 1000)
    assert len(x[Tensor(picks)].schedule()) == 1 and reduce_loops(x[Tensor(picks)]) == 0
    np.testing.assert_array_equal(x[Tensor(picks)].numpy(), values[picks])
    np.testing.assert_array_equal(x.sort()[0].numpy(), np.sort(values))
    # a sum of as many values is still split: its parts share the cores, and round less
    assert len(x.sum().schedule()) == 2


def test_sorted_values_are_looked_up(device):
    """sort's values are each position's element looked up at its index: -0.0 stays -0.0 and NaN NaN, as torch's
    (a sum of the element with zeros gave +0.0)."""
    values = np.array([0.5, -0.0, 1.0, np.nan, -2.0, 0.0], np.float32)
    expected = torch.tensor(values).sort(stable=True)
    got, order = Tensor(values, device=device).sort()
    np.testing.assert_array_equal(order.numpy(), expected.indices.numpy())
    np.testing.assert_array_equal(np.signbit(got.numpy()), np.signbit(expected.values.numpy()))
    np.testing.assert_array_equal(got.numpy(), expected.values.numpy())
    smallest = Tensor(values, device=device).topk(2, largest=False)[0]
    np.testing.assert_array_equal(np.signbit(smallest.numpy()), [True, True])


def test_sort_topk_and_running_extremes_name_their_results():
    x = Tensor([3.0, 1.0, 2.0])
    expected = torch.tensor([3.0, 1.0, 2.0])
    np.testing.assert_array_equal(x.sort().values.numpy(), expected.sort().values.numpy())
    np.testing.assert_array_equal(x.topk(2).indices.numpy(), expected.topk(2).indices.numpy())
    np.testing.assert_array_equal(x.cummax(0).values.numpy(), expected.cummax(0).values.numpy())
    np.testing.assert_array_equal(x.cummin(0).indices.numpy(), expected.cummin(0).indices.numpy())
    values, indices = x.sort(descending=True)  # (still a pair)
    assert values.tolist() == [3.0, 2.0, 1.0] and indices.tolist() == [0, 2, 1]


def test_a_lookup_gradient_and_index_add_are_scatters(device):
    """The gradient of a lookup in a large table, and index_add into zeros, add each row where it belongs (codegen's
    SCATTER on a CPU: no loop over the table for each token), with the values np.add.at gives."""
    weight = Tensor(rng.standard_normal((3000, 8)).astype(np.float32), device=device, requires_grad=True)
    tokens = rng.integers(0, 3000, (4, 16)).astype(np.int32)
    tokens[0, :4] = 7  # (a row chosen again and again)
    upstream = rng.standard_normal((4, 16, 8)).astype(np.float32)
    (weight[Tensor(tokens, device=device)] * Tensor(upstream, device=device)).sum().backward()
    expected = np.zeros((3000, 8), np.float32)
    np.add.at(expected, tokens, upstream)
    np.testing.assert_allclose(weight.grad.numpy(), expected, rtol=1e-6, atol=1e-6)
    added = Tensor.zeros(3000, 8, device=device).index_add(
        0, Tensor(tokens.reshape(-1), device=device), Tensor(upstream.reshape(-1, 8), device=device)
    )
    np.testing.assert_allclose(added.numpy(), expected, rtol=1e-6, atol=1e-6)
    unchosen = np.setdiff1d(np.arange(3000), tokens)
    assert not np.signbit(added.numpy()[unchosen]).any()  # (+0.0, as torch's)


def test_scatter_add_into_values_is_a_scatter_in_torchs_order(device):
    """scatter_add and index_add into a tensor of values (not zeros) store those values, then add each source
    value where its index says, in order, as torch does: no compare of every index with every position (N = K =
    30,000: 70-90 ms, torch 0.1), and -0.0 where nothing lands stays -0.0."""
    size = 3000
    start = rng.standard_normal(size).astype(np.float32)
    start[:3] = -0.0
    positions = rng.integers(3, size, size)
    values = rng.standard_normal(size).astype(np.float32)
    expected = start.copy()
    np.add.at(expected, positions, values)
    base = Tensor(start, device=device).realize()
    index, source = Tensor(positions, device=device).realize(), Tensor(values, device=device).realize()
    host = device in ("LLVM", "CPU")  # (devices with threads sum first, where -0.0 + 0.0 is +0.0)
    if host:
        from lazygrad.codegen.heuristic import heuristic_opts
        from lazygrad.codegen.opt import OptOp, prepare

        kernel = prepare(lower_kernel(base.scatter_add(0, index, source).schedule()[-1].ast))
        assert OptOp.SCATTER in {opt.op for opt in heuristic_opts(kernel, Device[device].renderer.target)}
    for result in (base.scatter_add(0, index, source), base.index_add(0, index, source)):
        np.testing.assert_allclose(result.numpy(), expected, rtol=1e-6, atol=1e-6)
        assert np.signbit(result.numpy()[:3]).all() or not host
