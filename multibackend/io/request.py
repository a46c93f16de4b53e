"""Turning a call's arguments into one :class:`~multibackend.core.problem.Problem` and its operands.

Every public entry point (matmul, binary_matmul, dot, explain, crosscheck, tune) goes through
:func:`matmul_call` or :func:`dot_call`, so a rule about arguments is checked in one place and
its error message is the same everywhere: it names the argument, the value and the rule.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from multibackend.core import dtypes, scales
from multibackend.core.config import Operands
from multibackend.core.errors import InvalidArgument
from multibackend.core.packing import PER_BYTE
from multibackend.core.problem import (
    PRECISIONS,
    Problem,
    interned,
    make_operand,
    pointer_alignment,
)
from multibackend.io.arrays import (
    Adapted,
    adapt,
    caller_stream,
    check_same_place,
    on_stream,
    scalar,
)

MATMUL_INPUTS = tuple(d for d in dtypes.ARRAY if d != "int32")
DOT_INPUTS = ("float16", "bfloat16", "float32", "float64")


@dataclass
class Call:
    """A validated call: the Problem, the operands as torch tensors, and how to return."""

    problem: Problem
    operands: Operands
    kind: str  # the array kind of A, which the result takes
    squeeze: bool  # return D as 2-D (neither A nor B was 3-D)
    device: Any
    user_out: Any = None  # a NumPy ``out`` the result is copied back into
    out: Any = None  # the caller's ``out`` (on the GPU), returned as the result
    #: the caller's own ``out`` where ``out`` is a stand-in for it, returned instead: an
    #: array of another library (CuPy, DLPack) that ``out`` views, or a host array staged on
    #: the GPU
    own_out: Any = None
    #: a torch view of the caller's host ``out`` (NumPy's aside) where ``out`` is its copy on
    #: the GPU: D is copied back into it
    staged_out: Any = None
    #: the operands are host tensors computed on the GPU: D comes back to the host, where
    #: ``torch.matmul`` would have answered
    to_host: bool = False


def _shape(t) -> str:
    return str(tuple(t.shape))


def _desc(name: str, a: Adapted) -> str:
    return f"{name} is {_shape(a.tensor)} {a.dtype}"


def _device_and_cc(tensors: list) -> tuple[Any, tuple[int, int] | None]:
    import torch

    dev = tensors[0].device
    if dev.type == "cuda":
        return dev, tuple(torch.cuda.get_device_capability(dev))
    return dev, None


def _to_gpu_if_host(adapted: dict[str, Adapted]) -> dict[str, Adapted]:
    """NumPy (host) operands go to the GPU when there is one; stay on the host otherwise."""
    import torch

    if not torch.cuda.is_available():
        return adapted
    return {name: Adapted(a.tensor.cuda() if a.tensor.device.type == "cpu" else a.tensor,
                          a.kind, a.dtype) for name, a in adapted.items()}


def batched(t, batch: int) -> Any:
    """``t`` as a 3-D (batch, rows, cols) view: a 2-D operand, or a 3-D one with a batch of
    1, is broadcast over the batch (batch stride 0)."""
    if t.dim() == 2:
        t = t.unsqueeze(0)
    if t.shape[0] != batch:
        t = t.expand(batch, *t.shape[1:])
    return t


def byte_extent(t) -> int:
    """The bytes from a tensor's first element to just past its last (0 for an empty one)."""
    extent = 1
    for size, stride in zip(t.shape, t.stride()):
        if not size:
            return 0
        extent += (size - 1) * abs(stride)
    return extent * t.element_size()


def shared_with(out_start: int, out_bytes: int, operands: Any) -> str | None:
    """The name of the first of ``operands`` ((name, first byte, byte extent) each) whose
    bytes meet the ``out_bytes`` from ``out_start``, else None."""
    out_end = out_start + out_bytes
    for name, start, extent in operands:
        if extent and out_bytes and start < out_end and out_start < start + extent:
            return name
    return None


def out_shared(op: str, name: str) -> InvalidArgument:
    """The error for an ``out`` that shares memory with operand ``name``."""
    return InvalidArgument(f"{op}: out shares memory with {name}: out must be a separate "
                           "array (D is written while A, B and C are read)")


def check_out_separate(op: str, out: Any, operands: dict[str, Any]) -> None:
    """``out`` (a contiguous torch tensor) must not share memory with the torch tensors
    ``operands`` (A, B and C by name) on its device: kernels read those while writing D."""
    if out is None:
        return
    name = shared_with(out.data_ptr(), out.numel() * out.element_size(),
                       [(n, t.data_ptr(), byte_extent(t)) for n, t in operands.items()
                        if t is not None and t.device == out.device])
    if name is not None:
        raise out_shared(op, name)


def matmul_call(A: Any, B: Any, C: Any = None, *, alpha: Any = 1.0, beta: Any = None,
                out: Any = None, out_dtype: Any = None, acc_dtype: Any = None,
                precision: str | None = None, saturate: bool = False,
                packed: str | None = None, bitop: str | None = None,
                op: str = "matmul", scale_a: Any = None, scale_b: Any = None) -> Call:
    """Validate a matmul's arguments and build its Call (see the module docstring)."""
    named = {"A": adapt(A, "A", op), "B": adapt(B, "B", op)}
    if C is not None:
        named["C"] = adapt(C, "C", op)
    if out is not None:
        named["out"] = adapt(out, "out", op)
    for name, given in (("scale_a", scale_a), ("scale_b", scale_b)):
        if type(given) in (int, float):  # a tensor-wise scale given as a number
            import torch

            given = torch.tensor(float(given), dtype=torch.float32,
                                 device=named["A"].tensor.device)
        if given is not None:
            named[name] = adapt(given, name, op)
    check_same_place(op, named)
    a, b = named["A"], named["B"]
    for name in ("A", "B"):
        t = named[name].tensor
        if t.dim() not in (2, 3):
            raise InvalidArgument(f"{op}: {name} is {_shape(t)}: rank {t.dim()}, but matmul "
                                  "takes 2-D or 3-D (batched) operands (use dot for 1-D)")
    if packed is not None:
        for name in ("A", "B"):
            if named[name].dtype != "uint8":
                raise InvalidArgument(f"{op}: {_desc(name, named[name])}: packed {packed} "
                                      "operands are uint8 arrays (see multibackend.core.packing)")
    elif a.dtype not in MATMUL_INPUTS:
        raise InvalidArgument(f"{op}: {_desc('A', a)}: not an input dtype of matmul (inputs: "
                              f"{', '.join(MATMUL_INPUTS)}; int32 is an output dtype)")
    elif a.dtype != b.dtype:
        raise InvalidArgument(f"{op}: {_desc('A', a)} but {_desc('B', b)}: A and B must have "
                              "the same dtype")
    in_dtype = packed or a.dtype
    per = PER_BYTE.get(packed, 1)
    m, ka = a.tensor.shape[-2:]
    kb, n = b.tensor.shape[-2:]
    if ka != kb:
        raise InvalidArgument(f"{op}: {_desc('A', a)} but {_desc('B', b)}: inner dimensions "
                              "differ")
    k = int(ka) * per
    ba = a.tensor.shape[0] if a.tensor.dim() == 3 else 1
    bb = b.tensor.shape[0] if b.tensor.dim() == 3 else 1
    if a.tensor.dim() == 3 and b.tensor.dim() == 3 and ba != bb and 1 not in (ba, bb):
        raise InvalidArgument(f"{op}: {_desc('A', a)} but {_desc('B', b)}: batch dimensions "
                              "differ")
    batch = bb if ba == 1 else ba  # a batch of one is broadcast, also over a batch of 0
    squeeze = a.tensor.dim() == 2 and b.tensor.dim() == 2
    out_shape = (int(m), int(n)) if squeeze else (batch, int(m), int(n))

    d_dtype = (dtypes.canonical(out_dtype, what=f"{op}: out_dtype") if out_dtype is not None
               else dtypes.default_output(in_dtype, in_dtype))
    if saturate is not True and saturate is not False:  # 1 and 0 equal True and False
        raise InvalidArgument(f"{op}: saturate is {saturate!r}: expected True or False")
    if d_dtype not in dtypes.ARRAY:
        raise InvalidArgument(f"{op}: out_dtype is {out_dtype!r}: D must be an array dtype "
                              f"({', '.join(dtypes.ARRAY)}); {d_dtype} exists only packed")
    acc = (dtypes.canonical(acc_dtype, what=f"{op}: acc_dtype") if acc_dtype is not None
           else dtypes.default_accumulator(in_dtype))
    if precision is not None and precision not in PRECISIONS:
        raise InvalidArgument(f"{op}: precision is {precision!r}: expected one of "
                              f"{', '.join(PRECISIONS)}")
    if in_dtype == "float32":
        precision = precision or "ieee"
    elif precision is not None:
        raise InvalidArgument(f"{op}: precision is {precision!r} but A is {in_dtype}: "
                              "precision modes apply to float32 operands only")

    scale_kinds = _scale_kinds(op, named, in_dtype, squeeze, int(m), int(n), k)
    integer_out = dtypes.get(d_dtype).is_integer
    alpha_v = scalar(alpha, "alpha", op, integer=integer_out)
    if beta is None:
        beta = 1 if C is not None else 0
    beta_v = scalar(beta, "beta", op, integer=integer_out)
    if C is None and beta_v != 0:
        raise InvalidArgument(f"{op}: beta is {beta_v!r} but C is None: beta scales C, "
                              "so give C or leave beta at 0")

    if "C" in named:
        c = named["C"]
        if c.dtype != d_dtype:
            raise InvalidArgument(f"{op}: {_desc('C', c)} but the output is {d_dtype}: C must "
                                  "have the output's dtype")
        if tuple(c.tensor.shape[-2:]) != (m, n) or c.tensor.dim() not in (2, 3) or (
                c.tensor.dim() == 3 and c.tensor.shape[0] not in (1, batch)):
            raise InvalidArgument(f"{op}: {_desc('C', c)} but D is {out_shape}: C must be "
                                  f"{(int(m), int(n))} or {(batch, int(m), int(n))}")
    if "out" in named:
        o = named["out"]
        if tuple(o.tensor.shape) != out_shape:
            raise InvalidArgument(f"{op}: out is {_shape(o.tensor)} but the result is "
                                  f"{out_shape}: shapes differ")
        if o.dtype != d_dtype:
            raise InvalidArgument(f"{op}: out is {o.dtype} but the result is {d_dtype}: "
                                  "dtypes differ (pass out_dtype to choose the result's dtype)")
        if not o.tensor.is_contiguous():
            raise InvalidArgument(f"{op}: out has strides {tuple(o.tensor.stride())}: out "
                                  "must be row-major contiguous")

    check_out_separate(op, named["out"].tensor if "out" in named else None,
                       {name: named[name].tensor for name in ("A", "B", "C", "scale_a",
                                                              "scale_b") if name in named})
    user_out = out if named.get("out") is not None and named["out"].kind == "numpy" else None
    given = named["out"] if "out" in named else None
    on_host = named["A"].tensor.device.type == "cpu"
    named = _to_gpu_if_host(named)
    own_out = staged_out = None
    if given is not None and given.kind != "numpy":
        if named["out"].tensor is not given.tensor:  # on the host: copied to the GPU
            staged_out = given.tensor
        if given.kind != "torch" or staged_out is not None:
            own_out = out
    device, cc = _device_and_cc([x.tensor for x in named.values()])
    ta = batched(named["A"].tensor, batch)
    tb = batched(named["B"].tensor, batch)
    tc = batched(named["C"].tensor, batch) if "C" in named else None
    stream = caller_stream(a.kind, device)
    if "out" in named:
        td = named["out"].tensor.view(batch, int(m), int(n))
    else:
        import torch

        with on_stream(stream, device):
            td = torch.empty((batch, int(m), int(n)), dtype=dtypes.torch_dtype(d_dtype),
                             device=device)

    def describe(t, dtype: str, rows: int, cols: int):
        return make_operand(dtype, rows, cols, (t.stride(1), t.stride(2)),
                            t.stride(0) if batch > 1 else 0, t.data_ptr())

    problem = interned(Problem(
        op="matmul", m=int(m), n=int(n), k=k, batch=batch,
        a=describe(ta, a.dtype, int(m), int(ka)), b=describe(tb, b.dtype, int(kb), int(n)),
        c=describe(tc, d_dtype, int(m), int(n)) if tc is not None and beta_v != 0 else None,
        d_dtype=d_dtype, acc=acc, precision=precision, has_c=tc is not None and beta_v != 0,
        saturate=bool(saturate), device=str(device), cc=cc, packed=packed, bitop=bitop,
        d_align=min(16, pointer_alignment(td.data_ptr())), scales=scale_kinds))
    operands = Operands(a=ta, b=tb, c=tc if problem.has_c else None, d=td, alpha=alpha_v,
                        beta=beta_v, stream=stream)
    if scale_kinds is not None:
        operands.scale_a, operands.scale_b = _scale_tensors(named, scale_kinds, int(m), int(n),
                                                            k, device)
    return Call(problem, operands, a.kind, squeeze, device, user_out,
                named["out"].tensor if "out" in named else None, own_out, staged_out,
                to_host=on_host and device.type == "cuda" and given is None)


def _scale_kinds(op: str, named: dict[str, Adapted], in_dtype: str, matrices: bool, m: int,
                 n: int, k: int) -> tuple[str, str] | None:
    """The (A's, B's) granularities of the scales given (an absent one is tensor-wise: 1), or
    None without scales; InvalidArgument naming the rule a scale breaks."""
    given = [name for name in ("scale_a", "scale_b") if name in named]
    if not given:
        return None
    if in_dtype not in scales.FP8:
        raise InvalidArgument(f"{op}: {given[0]} is given but A is {in_dtype}: scales apply to "
                              f"fp8 operands ({', '.join(scales.FP8)})")
    if not matrices:
        raise InvalidArgument(f"{op}: {given[0]} is given but A or B is 3-D: scaled fp8 "
                              "products take 2-D A and B")
    kinds = []
    for name, operand, rows, cols in (("scale_a", "A", m, k), ("scale_b", "B", k, n)):
        scale = named.get(name)
        if scale is None:
            kinds.append("tensor")
            continue
        if scale.dtype != "float32":
            raise InvalidArgument(f"{op}: {_desc(name, scale)}: scales are float32")
        kinds.append(scales.granularity(op, name, scale.tensor, operand, rows, cols))
    return kinds[0], kinds[1]


def _scale_tensors(named: dict[str, Adapted], kinds: tuple[str, str], m: int, n: int, k: int,
                   device: Any) -> tuple[Any, Any]:
    """The scales as backends take them (:func:`multibackend.core.scales.canonical`); an
    absent one a 0-d 1."""
    import torch

    shaped = []
    for name, kind, operand, rows, cols in (("scale_a", kinds[0], "A", m, k),
                                            ("scale_b", kinds[1], "B", k, n)):
        if name not in named:
            shaped.append(torch.ones((), dtype=torch.float32, device=device))
        else:
            shaped.append(scales.canonical(named[name].tensor, kind, operand, rows, cols))
    return shaped[0], shaped[1]


def dot_call(x: Any, y: Any, *, acc_dtype: Any = None) -> Call:
    """Validate a dot's arguments and build its Call."""
    op = "dot"
    named = {"x": adapt(x, "x", op), "y": adapt(y, "y", op)}
    check_same_place(op, named)
    for name, v in named.items():
        if v.tensor.dim() != 1:
            raise InvalidArgument(f"{op}: {name} is {_shape(v.tensor)}: rank {v.tensor.dim()}, "
                                  "but dot takes 1-D vectors")
    vx, vy = named["x"], named["y"]
    if vx.dtype not in DOT_INPUTS:
        raise InvalidArgument(f"{op}: {_desc('x', vx)}: not an input dtype of dot (inputs: "
                              f"{', '.join(DOT_INPUTS)})")
    if vx.tensor.shape != vy.tensor.shape:
        raise InvalidArgument(f"{op}: {_desc('x', vx)} but {_desc('y', vy)}: lengths differ")
    if vx.dtype != vy.dtype:
        raise InvalidArgument(f"{op}: {_desc('x', vx)} but {_desc('y', vy)}: x and y must have "
                              "the same dtype")
    acc = (dtypes.canonical(acc_dtype, what="dot: acc_dtype") if acc_dtype is not None
           else dtypes.default_accumulator(vx.dtype))
    if acc not in dtypes.ARRAY:
        raise InvalidArgument(f"{op}: acc_dtype is {acc_dtype!r}: dot returns its accumulator, "
                              f"so it must be an array dtype ({', '.join(dtypes.ARRAY)})")
    on_host = vx.tensor.device.type == "cpu"
    named = _to_gpu_if_host(named)
    device, cc = _device_and_cc([v.tensor for v in named.values()])
    import torch

    tx, ty = named["x"].tensor, named["y"].tensor
    n = int(tx.shape[0])
    stream = caller_stream(vx.kind, device)
    with on_stream(stream, device):
        td = torch.empty((1,), dtype=dtypes.torch_dtype(acc), device=device)
    vec = [make_operand(vx.dtype, 1, n, (n, t.stride(0)), 0, t.data_ptr()) for t in (tx, ty)]
    problem = interned(Problem(op="dot", m=1, n=1, k=n, batch=1, a=vec[0], b=vec[1], c=None,
                               d_dtype=acc, acc=acc, device=str(device), cc=cc))
    operands = Operands(a=tx, b=ty, c=None, d=td, stream=stream)
    return Call(problem, operands, vx.kind, False, device,
                to_host=on_host and device.type == "cuda")


def call_for(A: Any, B: Any, C: Any = None, **kwargs: Any) -> Call:
    """dot's Call for 1-D A (and B), matmul's otherwise."""
    if getattr(A, "ndim", None) == 1:
        if C is not None:
            raise InvalidArgument("dot: C is given but x is 1-D, so this is a dot, which takes "
                                  "no C")
        return dot_call(A, B, **kwargs)
    return matmul_call(A, B, C, **kwargs)
