"""fp8 inference layers: ``patch(model, fp8=...)`` on host arrays against the model in float64,
the quantized weight kept until the weight changes, and the calls refused with the reason."""
from __future__ import annotations

import pytest

import multibackend as mb
from multibackend.core.errors import InvalidArgument

torch = pytest.importorskip("torch")


def _model(seed: int = 0):
    """A small MLP in bfloat16 with biases; K of the second layer (200) ragged against 128."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(256, 200), torch.nn.GELU(),
                               torch.nn.Linear(200, 64)).to(torch.bfloat16)


def _relative_error(got, model, x) -> float:
    with torch.no_grad():
        reference = model.double()(x.double())
    model.to(torch.bfloat16)
    return float((got.double() - reference).norm() / reference.norm())


@pytest.mark.parametrize("fp8", ["row", "block"])
def test_a_patched_model_runs_in_fp8_within_its_quantization_error(fp8):
    """The logits' relative error against float64 is that of e4m3's 3-bit mantissa spread
    over the sums (a few percent), and not zero: the layers did quantize."""
    model = _model()
    x = torch.randn(3, 5, 256).to(torch.bfloat16)
    mb.patch(model, fp8=fp8)
    assert type(model[0]) is mb.nn.Fp8Linear and model[0].fp8 == fp8
    with torch.no_grad():
        got = model(x)
    assert got.dtype == torch.bfloat16 and got.shape == (3, 5, 64)
    mb.unpatch(model)
    assert type(model[0]) is torch.nn.Linear and "fp8" not in model[0].__dict__
    error = _relative_error(got, model, x)
    assert 1e-3 < error < 0.08, error


def test_the_quantized_weight_is_kept_until_the_weight_changes(monkeypatch):
    from multibackend import nn

    model = mb.patch(_model(1), fp8="row")
    x = torch.randn(4, 256).to(torch.bfloat16)
    made = []
    real = nn.quantize
    monkeypatch.setattr(nn, "quantize", lambda t, kind, **k: made.append(k["operand"]) or
                        real(t, kind, **k))
    with torch.no_grad():
        first = model(x)
        again = model(x)
        assert torch.equal(first, again) and made.count("B") == 2  # once per layer
        model[2].weight.mul_(2)  # in place: the weight's version changes
        doubled = model(x)
    assert made.count("B") == 3
    expected = (first.float() - model[2].bias.float()) * 2 + model[2].bias.float()
    assert bool(((doubled.float() - expected).abs() <= 0.02 * expected.abs() + 0.05).all())


def test_a_call_autograd_would_record_is_refused_naming_the_fix():
    model = mb.patch(_model(2), fp8="row")
    with pytest.raises(InvalidArgument, match=r"run the model under torch.no_grad\(\)"):
        model(torch.randn(2, 256).to(torch.bfloat16))


def test_an_unknown_fp8_mode_is_named():
    with pytest.raises(InvalidArgument, match="fp8 is 'tensor': expected None, 'row' or "
                                              "'block'"):
        mb.patch(_model(3), fp8="tensor")


def test_patching_again_without_fp8_makes_plain_layers():
    model = mb.patch(_model(4), fp8="block")
    mb.patch(model)
    assert type(model[0]) is mb.nn.Linear and "fp8" not in model[0].__dict__


def test_an_fp8_layer_built_directly_names_its_mode():
    layer = mb.nn.Fp8Linear(256, 64, fp8="block").to(torch.bfloat16)
    assert "fp8='block'" in repr(layer)
    with torch.no_grad():
        assert layer(torch.randn(3, 256).to(torch.bfloat16)).shape == (3, 64)
    with pytest.raises(InvalidArgument, match="fp8 is 'tensor'"):
        mb.nn.Fp8Linear(4, 4, fp8="tensor")
