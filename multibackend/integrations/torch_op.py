"""``multibackend::matmul``: the matmul as a registered torch operator, for models.

Why it exists: :func:`multibackend.matmul` validates, dispatches and launches in Python, reading
pointers and strides, which neither torch.compile nor autograd can see through. This module
registers the same call as a torch custom operator (:func:`torch.library.custom_op`) so that

- torch.compile (``fullgraph=True``) traces a call as torch's own op where dispatch runs it
  on cuBLAS through one op (asked once per call site at trace time, see :func:`compiled`),
  so the compiler fuses and plans around it as around the caller's own ``torch.matmul``;
  any other call it traces as one node of the operator: its fake implementation gives the
  result's shape, dtype and strides from the operands' metadata alone; the dispatch choice is
  made by the real implementation at its first run, outside the traced region, and later runs
  replay the remembered plan (so a compiled model can be captured in a CUDA graph once it has
  run once);
- autograd records it: the backward of ``D = alpha * A @ B + beta * C`` is
  ``dA = alpha * dD @ B^T``, ``dB = alpha * A^T @ dD``, ``dC = beta * dD``, each product run
  by the same operator (so by :func:`multibackend.matmul`, with the forward's backend and
  options but not its config, which belongs to the forward's shape). Transposes are ``.mT``
  views, which the backends take as column-major operands without a copy, and a gradient
  whose operand is column-major (a ``weight.mT``) is made column-major, so it needs no copy
  to match its operand either. Operands broadcast over a batch get gradients summed over it.
  Gradients of A and B are computed in A's dtype: where D has another dtype (``out_dtype``)
  dD is cast to A's first.

:func:`multibackend.matmul` routes here by itself where it must (while torch.compile traces
it, and where autograd records a call that a backend other than torch's own op would run), so
callers keep calling :func:`multibackend.matmul`. The operator takes torch tensors and Python
scalars; ``out=`` is refused here (an operator writing into a caller's array cannot be
recorded), ``config`` is passed by name, and results stay on A's device.
"""
from __future__ import annotations

import numbers
from typing import Any, Optional

import torch

from multibackend import eager
from multibackend.backends.cublas.backend import row_broadcast
from multibackend.choose.dispatch import decide
from multibackend.choose.registry import REGISTRY
from multibackend.choose.store import mode_of
from multibackend.core import dtypes
from multibackend.core.config import Config
from multibackend.core.errors import InvalidArgument, InvalidType, MultibackendError
from multibackend.core.names import BASELINE
from multibackend.io.request import matmul_call

#: the input dtypes gradients are computed for
DIFFERENTIABLE = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
#: ``autotune`` as the operator carries it: a timing mode, "off" (False), or None (the
#: environment decides)
_AUTOTUNE_OFF = "off"


@torch.library.custom_op("multibackend::matmul", mutates_args=())
def _matmul(A: torch.Tensor, B: torch.Tensor, C: Optional[torch.Tensor], alpha: float,
            beta: Optional[float], out_dtype: Optional[str], acc_dtype: Optional[str],
            precision: Optional[str], saturate: bool, dtype: Optional[str], backend: str,
            config: Optional[str], autotune: Optional[str]) -> torch.Tensor:
    """The real implementation: :func:`multibackend.matmul` itself (planned at the first
    run, replayed after), its result on A's device."""
    d = eager.matmul(A, B, C, alpha=alpha, beta=beta, out_dtype=out_dtype, acc_dtype=acc_dtype,
                   precision=precision, saturate=saturate, dtype=dtype, backend=backend,
                   config=config, autotune=False if autotune == _AUTOTUNE_OFF else autotune)
    return d if d.device == A.device else d.to(A.device)


@_matmul.register_fake
def _matmul_fake(A: torch.Tensor, B: torch.Tensor, C: Optional[torch.Tensor], alpha: float,
                 beta: Optional[float], out_dtype: Optional[str], acc_dtype: Optional[str],
                 precision: Optional[str], saturate: bool, dtype: Optional[str],
                 backend: str, config: Optional[str], autotune: Optional[str]) -> torch.Tensor:
    """D's metadata from the operands': contiguous, in the result's shape and dtype."""
    return A.new_empty(_result_shape(A.shape, B.shape),
                       dtype=dtypes.torch_dtype(_result_dtype(A.dtype, out_dtype, dtype)))


def _result_shape(a: tuple, b: tuple) -> tuple:
    """D's shape for operands of shapes ``a`` and ``b`` (the rules of
    :func:`multibackend.matmul`): (M, N) for two matrices, else (batch, M, N)."""
    for name, shape in (("A", a), ("B", b)):
        if len(shape) not in (2, 3):
            raise InvalidArgument(f"matmul: {name} is {tuple(shape)}: rank {len(shape)}, but "
                                  "matmul takes 2-D or 3-D (batched) operands")
    if a[-1] != b[-2]:
        raise InvalidArgument(f"matmul: A is {tuple(a)} but B is {tuple(b)}: inner "
                              "dimensions differ")
    if len(a) == len(b) == 2:
        return (a[0], b[1])
    batches = {shape[0] for shape in (a, b) if len(shape) == 3}
    if len(batches - {1}) > 1:
        raise InvalidArgument(f"matmul: A is {tuple(a)} but B is {tuple(b)}: batch "
                              "dimensions differ")
    return (max(batches), a[-2], b[-1])


def _result_dtype(a: torch.dtype, out_dtype: str | None, packed: str | None) -> str:
    """D's dtype name: ``out_dtype``, else the default for A's dtype (or the packed type)."""
    if out_dtype is not None:
        return out_dtype
    name = packed or dtypes.of_array(a)
    if name is None:
        raise InvalidArgument(f"matmul: A is {a}: not a dtype multibackend serves (arrays "
                              f"hold {', '.join(dtypes.ARRAY)})")
    return dtypes.default_output(name, name)


def _setup_context(ctx: Any, inputs: tuple, output: torch.Tensor) -> None:
    (A, B, C, alpha, beta, _out_dtype, acc_dtype, precision, saturate, _dtype, backend,
     _config, autotune) = inputs
    ctx.save_for_backward(A, B)
    ctx.c_shape = None if C is None else tuple(C.shape)
    ctx.alpha = alpha
    ctx.beta = (1.0 if C is not None else 0.0) if beta is None else beta
    ctx.saturate = saturate
    ctx.options = (acc_dtype, precision, backend, autotune)


def _backward(ctx: Any, dD: torch.Tensor) -> tuple:
    A, B = ctx.saved_tensors
    need_a, need_b, need_c = ctx.needs_input_grad[:3]
    dA = dB = dC = None
    if need_a or need_b:
        if ctx.saturate:
            raise InvalidArgument("matmul: saturate is True: a saturated product has no "
                                  "gradient (compute without saturate to differentiate)")
        if A.dtype not in DIFFERENTIABLE:
            raise InvalidArgument(f"matmul: A is {A.dtype}: gradients are computed for "
                                  "float16, bfloat16, float32 and float64 operands")
        g = dD if dD.dtype == A.dtype else dD.to(A.dtype)
        if need_a:
            dA = _summed_to(_in_layout_of(A, g, B.mT, ctx.alpha, ctx.options), A.shape)
        if need_b:
            dB = _grad_b(A, B, g, ctx.alpha, ctx.options)
    if need_c:
        dC = _summed_to(dD, ctx.c_shape)
        if ctx.beta != 1:
            dC = dC * ctx.beta
    return (dA, dB, dC) + (None,) * 10


def _product(x: torch.Tensor, y: torch.Tensor, alpha: float, options: tuple) -> torch.Tensor:
    """``alpha * x @ y`` through the operator, with the forward's backend and options."""
    acc_dtype, precision, backend, autotune = options
    return OP(x, y, None, alpha, None, None, acc_dtype, precision, False, None, backend,
                   None, autotune)


def _in_layout_of(operand: torch.Tensor, x: torch.Tensor, y: torch.Tensor, alpha: float,
                  options: tuple) -> torch.Tensor:
    """``alpha * x @ y`` (operand's gradient) laid out as ``operand`` is: for a column-major
    operand, ``(alpha * y^T @ x^T)^T``, whose transposes are all views."""
    if operand.stride(-2) == 1 and operand.stride(-1) != 1:
        return _product(y.mT, x.mT, alpha, options).mT
    return _product(x, y, alpha, options)


def _grad_b(A: torch.Tensor, B: torch.Tensor, g: torch.Tensor, alpha: float,
            options: tuple) -> torch.Tensor:
    """``alpha * A^T @ dD`` in B's shape. A B shared by a batch of A's (2-D, or a batch of
    one) takes one product over the batch folded into M instead of a sum of products."""
    if g.dim() == 3 and g.shape[0] > 1 and (B.dim() == 2 or B.shape[0] == 1):
        k, n = B.shape[-2:]
        flat_a = A.reshape(-1, k)
        flat_g = g.reshape(-1, n)
        dB = _in_layout_of(B, flat_a.mT, flat_g, alpha, options)
        return dB if B.dim() == 2 else dB.unsqueeze(0)
    return _summed_to(_in_layout_of(B, A.mT, g, alpha, options), B.shape)


def _summed_to(grad: torch.Tensor, shape: tuple) -> torch.Tensor:
    """``grad`` in the shape of an operand of ``shape``: summed over the batch the operand
    was broadcast over, or as the batch of one a C may be around a matrix D."""
    if len(shape) > grad.dim():
        return grad.unsqueeze(0)
    if grad.dim() == len(shape) and grad.shape[0] == shape[0]:
        return grad
    return grad.sum(0) if len(shape) == 2 else grad.sum(0, keepdim=True)


_matmul.register_autograd(_backward, setup_context=_setup_context)

#: the operator, as torch.compile and autograd see it
OP = torch.ops.multibackend.matmul.default


def _scalar(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InvalidType(f"matmul: {name} is {value!r}: where the call is recorded "
                          "(torch.compile, autograd) alpha and beta are Python numbers")
    return float(value)


def matmul(A: torch.Tensor, B: torch.Tensor, C: torch.Tensor | None = None, *,
           alpha: Any = 1.0, beta: Any = None, out: Any = None, out_dtype: Any = None,
           acc_dtype: Any = None, precision: str | None = None, saturate: bool = False,
           dtype: str | None = None, backend: str | None = "auto", config: Any = None,
           autotune: Any = None) -> torch.Tensor:
    """:func:`multibackend.matmul` through the registered operator (same arguments and
    result; see the module docstring for what differs)."""
    for name, x in (("A", A), ("B", B), ("C", C)):
        if x is not None and not isinstance(x, torch.Tensor):
            raise InvalidType(f"matmul: {name} is a {type(x).__name__}: where the call is "
                              "recorded (torch.compile, autograd) operands are torch tensors")
    if out is not None:
        raise InvalidArgument(f"matmul: out is a {tuple(out.shape)} array: where the call is "
                              "recorded (torch.compile, autograd) the result is a new tensor; "
                              "leave out=None and use the returned tensor")
    if isinstance(config, Config):
        config = config.name
    elif config is not None and not isinstance(config, str):
        raise InvalidType(f"matmul: config is {config!r}: expected a Config or a config name")
    mode = None if autotune is None else (mode_of(autotune) or _AUTOTUNE_OFF)
    return OP(A, B, C, _scalar(alpha, "alpha"),
              None if beta is None else _scalar(beta, "beta"),
              None if out_dtype is None else dtypes.canonical(out_dtype,
                                                              what="matmul: out_dtype"),
              None if acc_dtype is None else dtypes.canonical(acc_dtype,
                                                              what="matmul: acc_dtype"),
              precision, bool(saturate), dtype, backend or "auto", config, mode)


def compiled(A: Any, B: Any, C: Any, plain: bool, **options: Any) -> Any:
    """What torch.compile traces for a :func:`multibackend.matmul` call: where dispatch runs
    a ``plain`` call (A, B, C and ``backend`` only) on cuBLAS through one torch op, that op
    itself, so the compiler plans, fuses and captures around it as it would around the
    caller's own ``torch.matmul``; else the registered operator."""
    if plain and _cublas_chosen(A, B, C, options["backend"]):
        if C is None:
            return torch.matmul(A, B)
        return torch.addmm(C[0] if row_broadcast(C.stride()) else C, A, B)
    return matmul(A, B, C, **options)


@torch._dynamo.assume_constant_result
def _cublas_chosen(A: Any, B: Any, C: Any, backend: str | None) -> bool:
    """Whether dispatch runs ``matmul(A, B, C, backend=backend)`` on cuBLAS through one torch
    op (what :meth:`~multibackend.backends.cublas.backend.CublasBackend.produce` makes).
    torch.compile calls it once per compilation, with the real tensors, and keeps the answer as a
    constant of the compiled graph: a graph compiled for dynamic shapes keeps the choice made for
    the
    first shape, which is correct for every shape, cuBLAS running any of them."""
    if not (isinstance(A, torch.Tensor) and isinstance(B, torch.Tensor)) or (
            C is not None and (not isinstance(C, torch.Tensor) or C.dim() != 2)):
        return False
    try:
        call = matmul_call(A, B, C)
        decision = decide(call.problem, backend)
    except MultibackendError:
        return False
    if decision.backend != BASELINE:
        return False
    return REGISTRY.get(BASELINE).produce(call.problem, decision.config, 1.0,
                                          call.operands.beta, "torch",
                                          call.squeeze) is not None
