"""Linear layers whose products run through :func:`multibackend.matmul`.

Why it exists: a model's matmuls sit in its ``torch.nn.Linear`` layers, which call torch's own
GEMM. :class:`Linear` is a drop-in for ``torch.nn.Linear`` (same constructor, parameters,
state_dict and results) whose forward is ``D = x @ W^T + b`` through :func:`multibackend.matmul`:
``x`` folded to a matrix (a view for contiguous inputs), ``W^T`` passed as the ``.mT`` view (a
column-major operand, no copy) and the bias as C with beta = 1, broadcast over the rows (row stride
0), so the backend adds it in its epilogue. Under torch.compile and autograd the product goes
through the registered operator (:mod:`multibackend.integrations.torch_op`) like any other call.
Once a layer's product has been planned and dispatch gives it to cuBLAS (a family plan,
:func:`multibackend.run.layers.linear`), later calls are ``torch.nn.functional.linear`` itself,
views and all: the same cuBLAS call, one op. A layer keeps a memo of the plan that served it
(:class:`multibackend.run.layers.LayerPlan`), checked by identity on each call, so that its
repeated calls cost no more host time than torch's own layer.

:func:`patch` turns every ``torch.nn.Linear`` of a model into :class:`Linear` in place (the same
module objects, parameters, buffers and hooks: only their class changes, as
``torch.nn.utils.parametrize`` does), and :func:`unpatch` turns them back. Subclasses of
``torch.nn.Linear`` are left alone: their forward may do more than the product.

``patch(model, fp8="row" | "block")`` makes them :class:`Fp8Linear` instead, for inference: the
weight quantized to e4m3 once (per output channel, or per 128 x 128 block; again after it
changes), the input per token (or per 1 x 128 block) on every call (on a GPU by one Triton
kernel, :func:`multibackend.backends.triton.quantize.quantize_rows`, where Triton is
available), and the scaled product
through :func:`multibackend.matmul` (``scale_a``, ``scale_b``) with the bias added in its
epilogue on Triton (added after the product on cuBLAS), in the input's dtype.
"""
from __future__ import annotations

import functools
import os
from typing import Any

import torch

from multibackend.api import matmul
from multibackend.choose.registry import REGISTRY
from multibackend.core.errors import InvalidArgument, InvalidType
from multibackend.core.scales import quantize
from multibackend.run import layers

_F_LINEAR = torch.nn.functional.linear
_compiling = torch.compiler.is_dynamo_compiling


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
           backend: str | None = "auto") -> torch.Tensor:
    """``torch.nn.functional.linear`` through :func:`multibackend.matmul`: x is (*, in),
    weight (out, in), bias (out,) or None; the result is (*, out).

    Once a layer's product has been planned and dispatch runs it on cuBLAS for every size
    below bounds these sizes are under (:func:`multibackend.run.layers.linear`), later calls are
    ``torch.nn.functional.linear`` itself: the same cuBLAS call the planned product makes,
    without building its views."""
    traced = _compiling()
    if not traced and (layers.linear(x, weight, bias, backend) or _host_auto(x, backend)):
        try:
            return _F_LINEAR(x, weight, bias)
        except RuntimeError:  # refused (shapes, dtypes, devices): matmul words the error
            pass
    return _planned_linear(x, weight, bias, backend, traced)


def _host_auto(x: torch.Tensor, backend: str | None) -> bool:
    """Whether a layer's input is a host tensor under ``auto`` with no GPU kernel to run it
    (Triton's interpreter off): torch's own layer answers it, as the unpatched model would (a
    backend named explicitly still runs it)."""
    return (backend in (None, "auto") and x.device.type == "cpu"
            and os.environ.get("TRITON_INTERPRET") != "1")


def _planned_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                    backend: str | None, traced: bool) -> torch.Tensor:
    """The layer's product through :func:`multibackend.matmul`, remembered for
    :func:`multibackend.run.layers.linear` (unless torch.compile is tracing it)."""
    rows = x.reshape(-1, x.shape[-1])
    c = None if bias is None else bias.expand(rows.shape[0], weight.shape[0])
    d = matmul(rows, weight.mT, c, backend=backend)
    if not traced:
        layers.remember_linear(x, weight, bias, backend, rows, c)
    return d.view(*x.shape[:-1], weight.shape[0])


class Linear(torch.nn.Linear):
    """``torch.nn.Linear`` whose product runs through :func:`multibackend.matmul` on
    ``backend`` ("auto" by default; see the module docstring)."""

    backend: str | None
    #: the memo of the family plan that served the last call (layers.LayerPlan), or None
    _served: Any

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 device: Any = None, dtype: Any = None, *, backend: str | None = "auto") -> None:
        super().__init__(in_features, out_features, bias, device, dtype)
        self.backend = backend
        self._served: layers.LayerPlan | None = None

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        params = self._parameters
        try:  # read from the registry: ``self.weight`` is a Module.__getattr__ call
            weight, bias = params["weight"], params["bias"]
        except KeyError:  # parametrized, or replaced by a non-parameter attribute
            weight, bias = self.weight, self.bias
        backend = self.backend
        if _compiling():
            return _planned_linear(input, weight, bias, backend, True)
        served = self._served
        if served is None or not served.holds(input, weight, bias, backend):
            served = self._served = layers.layer_plan(input, weight, bias, backend)
        if served is not None or _host_auto(input, backend):
            try:
                return _F_LINEAR(input, weight, bias)
            except RuntimeError:  # refused (shapes, dtypes, devices): matmul words the error
                pass
        return _planned_linear(input, weight, bias, backend, False)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, backend={self.backend!r}"


#: fp8 granularities of :class:`Fp8Linear`: (the input's, the weight's)
FP8_MODES = {"row": ("row", "row"), "block": ("block", "block")}


class Fp8Linear(Linear):
    """:class:`Linear` for inference in fp8 (``fp8`` "row" or "block"; see the module
    docstring). The quantized weight is kept, and made again when the weight's memory,
    version, device or dtype changes (a change torch does not count, such as a copy into
    ``weight.data``, is not seen: assign ``layer._fp8_weight = None`` after one); autograd
    cannot record the product, so a call that it would record is refused."""

    fp8: str
    _fp8_weight: Any

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 device: Any = None, dtype: Any = None, *, backend: str | None = "auto",
                 fp8: str = "row") -> None:
        super().__init__(in_features, out_features, bias, device, dtype, backend=backend)
        if fp8 not in FP8_MODES:
            raise InvalidArgument(f"Fp8Linear: fp8 is {fp8!r}: expected "
                                  f"{' or '.join(map(repr, FP8_MODES))}")
        self.fp8 = fp8
        self._fp8_weight = None

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        weight, bias = self.weight, self.bias
        if torch.is_grad_enabled() and (input.requires_grad or weight.requires_grad):
            raise InvalidArgument("Fp8Linear: autograd would record this call, but an fp8 "
                                  "product has no gradient here: run the model under "
                                  "torch.no_grad() or torch.inference_mode() (fp8 layers are "
                                  "for inference)")
        kind_x, kind_w = FP8_MODES[self.fp8]
        held = (weight.data_ptr(), weight._version, weight.device, weight.dtype, self.fp8)
        if self._fp8_weight is None or self._fp8_weight[0] != held:
            values, scales = quantize(weight.detach().mT, kind_w, operand="B")
            self._fp8_weight = (held, values, scales)
        _, values, scales = self._fp8_weight
        rows = input.reshape(-1, input.shape[-1])
        q, s = _quantized_input(rows, kind_x)
        c = None if bias is None else bias.detach().expand(rows.shape[0], weight.shape[0])
        d = matmul(q, values, c, scale_a=s, scale_b=scales, out_dtype=input.dtype,
                   backend=self.backend)
        return d.view(*input.shape[:-1], weight.shape[0])

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, fp8={self.fp8!r}"


def _quantized_input(rows: torch.Tensor, kind: str) -> tuple[torch.Tensor, torch.Tensor]:
    """An fp8 layer's input rows as e4m3 values and their scales of granularity ``kind``: by
    one Triton kernel on a GPU where Triton is available (the same bits as
    :func:`~multibackend.core.scales.quantize`, in one pass over the rows instead of one per
    torch operation), else by ``quantize``."""
    if rows.is_cuda and _one_kernel(rows.device.index):
        from multibackend.backends.triton.quantize import quantize_rows

        return quantize_rows(rows, kind)
    return quantize(rows, kind, operand="A")


@functools.lru_cache(maxsize=None)
def _one_kernel(index: int | None) -> bool:
    """Whether GPU ``index`` quantizes by the Triton kernel: Triton available, and fp8
    conversions in hardware (sm_89 or later). Asked once per GPU."""
    return (torch.cuda.get_device_capability(index) >= (8, 9)
            and REGISTRY.availability("triton") is None)


def _check_module(model: Any, call: str) -> None:
    if not isinstance(model, torch.nn.Module):
        raise InvalidType(f"{call}: model is a {type(model).__name__}: expected a "
                          "torch.nn.Module")


def patch(model: torch.nn.Module, *, backend: str | None = "auto",
          fp8: str | None = None) -> torch.nn.Module:
    """Make every ``torch.nn.Linear`` of ``model`` (``model`` itself and nested modules) a
    :class:`Linear` running on ``backend``, in place; layers already patched take the new
    backend. With ``fp8`` ("row" or "block") they become :class:`Fp8Linear`, for inference.
    Parameters, buffers, hooks and state_dict keys stay as they are. Returns ``model``."""
    _check_module(model, "patch")
    if backend not in (None, "auto"):
        REGISTRY.check_name(backend, "patch")
    if fp8 is not None and fp8 not in FP8_MODES:
        raise InvalidArgument(f"patch: fp8 is {fp8!r}: expected None, "
                              f"{' or '.join(map(repr, FP8_MODES))}")
    for module in model.modules():
        if type(module) in (torch.nn.Linear, Linear, Fp8Linear):
            module.__class__ = Linear if fp8 is None else Fp8Linear
            module.backend = backend
            module._served = None
            if fp8 is not None:
                module.fp8 = fp8
                module._fp8_weight = None
            elif "fp8" in module.__dict__:
                del module.fp8, module._fp8_weight
    return model


def unpatch(model: torch.nn.Module) -> torch.nn.Module:
    """Turn every :class:`Linear` (and :class:`Fp8Linear`) of ``model`` back into
    ``torch.nn.Linear``, in place (a :class:`Linear` constructed directly too). Returns
    ``model``."""
    _check_module(model, "unpatch")
    for module in model.modules():
        if type(module) in (Linear, Fp8Linear):
            module.__class__ = torch.nn.Linear
            del module.backend, module._served
            if "fp8" in module.__dict__:
                del module.fp8, module._fp8_weight
    return model
