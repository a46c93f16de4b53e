"""CPU tier for multibackend/nn.py: ``mb.nn.Linear`` as a drop-in for ``torch.nn.Linear``
(results, gradients, state_dict) and ``mb.patch`` / ``mb.unpatch`` on nested models (every
``torch.nn.Linear`` swapped in place and back, parameters, hooks and keys kept). Products run
in Triton's interpreter (``TRITON_INTERPRET=1``, set by conftest.py)."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import multibackend as mb
from multibackend import eager
from multibackend.core.errors import InvalidType
from multibackend.integrations import torch_op
from tests.helpers import record_torchs_linear

pytestmark = pytest.mark.skipif(torch.cuda.is_available(),
                                reason="CPU tier: runs the interpreter on host tensors")

BOUND = {torch.float32: 1e-5, torch.float64: 1e-12}


def rel_err(x, ref) -> float:
    return ((x.double() - ref.double()).norm() / ref.double().norm()).item()


class Tied(torch.nn.Linear):
    """A subclass of torch.nn.Linear with a forward of its own: patch leaves it alone."""

    def forward(self, x):
        return super().forward(x) * 2


class Block(torch.nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm = torch.nn.LayerNorm(d)
        self.up = torch.nn.Linear(d, 2 * d)
        self.down = torch.nn.Linear(2 * d, d, bias=False)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(self.norm(x))))


class Net(torch.nn.Module):
    """Linear layers at every depth: top level, in a ModuleList of blocks, in a Sequential,
    one tied to another's weight, and a subclass that must stay as it is."""

    def __init__(self, d=6, vocab=11):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, d)
        self.blocks = torch.nn.ModuleList(Block(d) for _ in range(2))
        self.head = torch.nn.Sequential(torch.nn.Linear(d, d), torch.nn.GELU(),
                                        torch.nn.Linear(d, vocab, bias=False))
        self.head[2].weight = self.embed.weight
        self.special = Tied(d, d)

    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(x + self.special(x))


def net(dtype=torch.float32):
    torch.manual_seed(0)
    return Net().to(dtype)


def tokens():
    return torch.randint(0, 11, (3, 5), generator=torch.Generator().manual_seed(1))


def exact_linears(model):
    return [m for m in model.modules() if type(m) is torch.nn.Linear]


# -- Linear -------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [(7,), (4, 7), (2, 3, 7)])
@pytest.mark.parametrize("bias", [True, False])
def test_linear_is_torchs_linear(shape, bias, dtype):
    torch.manual_seed(0)
    ref = torch.nn.Linear(7, 5, bias=bias, dtype=dtype)
    mine = mb.nn.Linear(7, 5, bias=bias, dtype=dtype)
    assert set(mine.state_dict()) == set(ref.state_dict())
    mine.load_state_dict(ref.state_dict())
    x = torch.rand(shape, dtype=dtype) * 2 - 1
    y = mine(x)
    assert (y.shape, y.dtype) == (ref(x).shape, dtype)
    assert rel_err(y, ref(x)) <= BOUND[dtype]


def test_linear_gradients_match_torchs_and_pass_gradcheck():
    torch.manual_seed(0)
    ref = torch.nn.Linear(4, 3, dtype=torch.float64)
    mine = mb.nn.Linear(4, 3, dtype=torch.float64)
    mine.load_state_dict(ref.state_dict())
    x = torch.rand((2, 3, 4), dtype=torch.float64, requires_grad=True)
    mine(x).square().sum().backward()
    got = [x.grad] + [p.grad for p in mine.parameters()]
    x.grad = None
    ref(x).square().sum().backward()
    for g, expected in zip(got, [x.grad] + [p.grad for p in ref.parameters()]):
        assert g.shape == expected.shape and g.stride() == expected.stride()
        assert rel_err(g, expected) <= BOUND[torch.float64]
    assert torch.autograd.gradcheck(lambda x, w, b: mb.nn.linear(x, w, b),
                                    (x, mine.weight, mine.bias))


def test_linear_bias_is_c_with_beta_one(monkeypatch):
    """The bias goes to matmul as C (broadcast over the rows, no copy) with beta left at 1."""
    seen = {}
    matmul = eager.matmul

    def spy(A, B, C=None, **options):
        seen.update(c=C, options=options, b_strides=B.stride())
        return matmul(A, B, C, **options)

    monkeypatch.setattr("multibackend.nn.matmul", spy)
    layer = mb.nn.Linear(7, 5)
    layer(torch.rand(4, 7))
    assert seen["c"].shape == (4, 5) and seen["c"].stride() == (0, 1)
    assert seen["c"].data_ptr() == layer.bias.data_ptr()
    assert seen["b_strides"] == (1, 7)  # weight.mT: column-major, a view
    assert seen["options"] == {"backend": "auto"}


def test_linear_names_its_backend():
    layer = mb.nn.Linear(7, 5, backend="triton")
    assert "backend='triton'" in repr(layer)
    x = torch.rand(4, 7)
    assert rel_err(layer(x), torch.nn.functional.linear(x, layer.weight, layer.bias)) <= 1e-5


def test_linear_reads_a_parametrized_or_replaced_weight_as_torchs_layer_does(monkeypatch):
    """The layer reads its parameters from the module's registry; a weight that lives
    elsewhere (a parametrization, a plain tensor set after the parameter was deleted) is the
    one it multiplies by, as torch's layer would."""
    seen = []
    matmul = eager.matmul

    def spy(A, B, C=None, **options):
        seen.append(B.mT)
        return matmul(A, B, C, **options)

    monkeypatch.setattr("multibackend.nn.matmul", spy)
    x = torch.rand(4, 7)

    class Doubled(torch.nn.Module):
        def forward(self, w):
            return 2 * w

    layer = mb.nn.Linear(7, 5)
    torch.nn.utils.parametrize.register_parametrization(layer, "weight", Doubled())
    want = torch.nn.functional.linear(x, layer.weight, layer.bias)
    assert rel_err(layer(x), want) <= 1e-5
    assert torch.equal(seen[-1], 2 * layer.parametrizations.weight.original)

    bare = mb.nn.Linear(7, 5, bias=False)
    replacement = torch.rand(5, 7)
    del bare.weight
    bare.weight = replacement
    assert rel_err(bare(x), x @ replacement.T) <= 1e-5
    assert seen[-1].data_ptr() == replacement.data_ptr()


# -- patch and unpatch ----------------------------------------------------------------------

def test_patch_swaps_every_linear_in_place_and_unpatch_restores_them():
    model = net()
    x = tokens()
    expected = model(x)
    linears = exact_linears(model)
    assert len(linears) == 6
    modules = list(model.modules())
    params = [(name, p) for name, p in model.named_parameters()]
    state = {k: v.clone() for k, v in model.state_dict().items()}
    hooked = []
    linears[0].register_forward_hook(lambda *args: hooked.append(1))

    assert mb.patch(model) is model
    assert all(type(m) is mb.nn.Linear and m.backend == "auto" for m in linears)
    assert type(model.special) is Tied
    assert exact_linears(model) == []
    assert list(model.modules()) == modules  # the same objects, in place
    assert all(a is b for (_, a), (_, b) in zip(model.named_parameters(), params))
    assert model.head[2].weight is model.embed.weight
    assert list(model.state_dict()) == list(state)
    assert rel_err(model(x), expected) <= BOUND[torch.float32]
    assert hooked == [1]

    assert mb.unpatch(model) is model
    assert all(type(m) is torch.nn.Linear and not hasattr(m, "backend") for m in linears)
    assert type(model.special) is Tied
    assert list(model.modules()) == modules
    assert all(a is b for (_, a), (_, b) in zip(model.named_parameters(), params))
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    assert torch.equal(model(x), expected)


def test_state_dicts_move_between_torch_and_patched_models():
    torch_model, patched = net(), mb.patch(Net())
    patched.load_state_dict(torch_model.state_dict())
    x = tokens()
    assert rel_err(patched(x), torch_model(x)) <= BOUND[torch.float32]
    restored = Net()
    restored.load_state_dict(patched.state_dict())
    assert torch.equal(restored(x), torch_model(x))


def test_patch_again_takes_the_new_backend_and_patches_a_bare_linear():
    model = mb.patch(net(), backend="triton")
    mb.patch(model)
    assert {m.backend for m in model.modules() if isinstance(m, mb.nn.Linear)} == {"auto"}
    layer = mb.patch(torch.nn.Linear(3, 2))
    assert type(layer) is mb.nn.Linear


def test_patched_model_trains_like_torchs():
    model, patched = net(torch.float64), mb.patch(net(torch.float64))
    x = tokens()
    for m in (model, patched):
        m(x).square().mean().backward()
    for (name, p), q in zip(model.named_parameters(), patched.parameters()):
        assert rel_err(q.grad, p.grad) <= BOUND[torch.float64], name


def test_patched_model_compiles_without_graph_breaks():
    model = mb.patch(net())
    x = tokens()
    explained = torch._dynamo.explain(model)(x)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0)
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    compiled(x).square().mean().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    reference = mb.unpatch(net())
    reference(x).square().mean().backward()
    for mine, ref in zip(grads, (p.grad for p in reference.parameters())):
        assert rel_err(mine, ref) <= 1e-5
    ops = [n.target for g in explained.graphs for n in g.graph.nodes]
    assert ops.count(torch_op.OP) == 6


def test_patch_refuses_what_is_not_a_module():
    with pytest.raises(InvalidType, match="patch: model is a list: expected a torch.nn.Module"):
        mb.patch([torch.nn.Linear(2, 2)])
    with pytest.raises(InvalidType, match="unpatch: model is a dict"):
        mb.unpatch({})


def test_importing_multibackend_does_not_import_torch():
    code = ("import sys, multibackend as mb; assert 'torch' not in sys.modules; "
            "mb.patch; assert 'torch' in sys.modules and mb.nn.Linear")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_layers_family_plan_holds_only_where_its_products_does(monkeypatch):
    """The linear layer's shortest path (:func:`multibackend.run.layers.linear`) answers yes only
    under the family plan its product made, within that plan's bounds; a bias other than a
    vector, or a weight of another dtype than the input's, is never served by it. (Host
    tensors make no family plans: the product's key here counts them as on a GPU.)"""
    from multibackend.run import layers, plans

    monkeypatch.setattr(plans, "torch_key", lambda options, a, b, c=None: (
        options, a.dtype, b.dtype, a.ndim, b.ndim,
        None if c is None else (c.dtype, c.stride())))
    plans.forget()
    x, weight, bias = torch.ones(2, 5, 16), torch.ones(8, 16), torch.ones(8)
    rows = x.reshape(-1, 16)
    c = bias.expand(10, 8)
    assert not layers.linear(x, weight, bias, "auto")
    layers.remember_linear(x, weight, bias, "auto", rows, c)
    assert not layers.linear(x, weight, bias, "auto"), "no family plan of the product"
    inf = float("inf")
    plans.remember_family(plans.torch_key("auto", rows, weight.mT, c), torch.addmm,
                          (inf, inf, inf, inf, inf))
    layers.remember_linear(x, weight, bias, "auto", rows, c)
    assert layers.linear(x, weight, bias, "auto")
    assert layers.linear(torch.ones(3, 7, 16), weight, bias, "auto")
    assert not layers.linear(x, weight, bias, "cublas"), "another backend's name"
    assert layers.linear(x[0], weight, bias, "auto"), "another rank: the same product"
    assert not layers.linear(x, weight, None, "auto"), "no bias: another family"
    # bounded: (elements of A, of B, M, N, K) as the product sees them
    plans.remember_family(plans.torch_key("auto", rows, weight.mT, c), torch.addmm,
                          (40, 100, 10, 8, 16))
    layers.remember_linear(x, weight, bias, "auto", rows, c)
    assert not layers.linear(x, weight, bias, "auto"), "160 and 128 elements, M 10 N 8 K 16"
    assert layers.linear(torch.ones(1, 2, 16), weight, bias, "auto"), "32 elements of A"
    plans.remember_family(plans.torch_key("auto", rows, weight.mT, c), torch.addmm,
                          (0, 0, 11, 0, 0))
    layers.remember_linear(x, weight, bias, "auto", rows, c)
    assert layers.linear(x, weight, bias, "auto"), "M = 10 < 11"
    assert not layers.linear(torch.ones(3, 5, 16), weight, bias, "auto"), "M = 15"
    plans.forget()
    wide = torch.ones(1, 8)
    plans.remember_family(plans.torch_key("auto", rows, weight.mT, wide.expand(10, 8)),
                          torch.addmm, (inf,) * 5)
    layers.remember_linear(x, weight, wide, "auto", rows, wide.expand(10, 8))
    assert not layers.linear(x, weight, wide, "auto"), "a 2-D bias"
    plans.remember_family(plans.torch_key("auto", rows, weight.double().mT, c),
                          torch.addmm, (inf,) * 5)
    layers.remember_linear(x, weight.double(), bias, "auto", rows, c)
    assert not layers.linear(x, weight.double(), bias, "auto"), "a float64 weight"
    plans.forget()


def test_a_layer_serves_repeated_calls_by_its_memo_while_nothing_it_was_made_under_changes(
        monkeypatch):
    """A layer whose product has a family plan keeps a memo of it (layers.LayerPlan) and calls
    torch's own linear while x's dtype, the weight and bias objects, the backend, the watched
    environment and the tables' generation are those it was made under and x is within the
    plan's bounds; any change plans again. A copied or pickled layer starts without one."""
    import copy
    import pickle

    from multibackend.run import layers, plans

    plans.forget()
    served = record_torchs_linear(monkeypatch)
    monkeypatch.delenv("MULTIBACKEND_BACKEND", raising=False)
    layer = mb.nn.Linear(16, 8)
    x = torch.rand(2, 5, 16)
    want = torch.nn.functional.linear(x, layer.weight, layer.bias)
    assert rel_err(layer(x), want) <= 1e-5 and not served and layer._served is None
    plans.remember_family(layers._linear_key("auto", x, layer.bias), torch.addmm,
                          (0, 0, 12, 0, 0))  # M below 12
    assert rel_err(layer(x), want) <= 1e-5 and served == [(2, 5, 16)]
    memo = layer._served
    assert isinstance(memo, layers.LayerPlan) and memo.holds(x, layer.weight, layer.bias, "auto")
    layer(x[0])
    assert len(served) == 2 and layer._served is memo, "the memo served it"
    assert not memo.holds(torch.rand(3, 5, 16), layer.weight, layer.bias, "auto"), "M = 15"
    assert not memo.holds(x.double(), layer.weight, layer.bias, "auto")
    assert not memo.holds(x, layer.weight.clone(), layer.bias, "auto")
    assert not memo.holds(x, layer.weight, None, "auto")
    assert not memo.holds(x, layer.weight, layer.bias, "triton")
    monkeypatch.setenv("MULTIBACKEND_BACKEND", "auto")
    assert not memo.holds(x, layer.weight, layer.bias, "auto"), "an environment variable set"
    monkeypatch.delenv("MULTIBACKEND_BACKEND")
    assert memo.holds(x, layer.weight, layer.bias, "auto")
    plans.GENERATION[0] += 1
    try:
        assert not memo.holds(x, layer.weight, layer.bias, "auto"), "the tables changed"
        layer(x)  # another family key now: matmul's path, and no memo
        assert len(served) == 2 and layer._served is None
    finally:
        plans.GENERATION[0] -= 1
    layer(x)
    memo = layer._served
    assert memo is not None and memo.holds(x, layer.weight, layer.bias, "auto")
    plans.forget()
    assert not memo.holds(x, layer.weight, layer.bias, "auto"), "plans forgotten"
    for other in (copy.deepcopy(layer), pickle.loads(pickle.dumps(layer))):
        assert other._served is None
    plans.forget()
