"""What every measurement checks before it times anything: an output poisoned so an unwritten
element fails, the float64 reference of a call's operands, and a candidate's result held to
it (:mod:`multibackend.verify.reference` holds the bounds)."""
from __future__ import annotations

from typing import Any, Callable

from multibackend.io.arrays import on_stream, to_kind
from multibackend.io.request import Call
from multibackend.verify import reference


def poison(tensor) -> None:
    """Fill an output so any element a kernel fails to write shows up in the comparison."""
    if tensor.dtype.is_floating_point:
        tensor.fill_(float("nan"))
    else:
        tensor.fill_(-0x5A5A5A5 if tensor.dtype.itemsize >= 4 else -0x5A)


def reference_for(call: Call):
    """The float64 reference of a call's operands (packed operands unpacked first, scaled
    fp8 ones multiplied by their scales)."""
    p, ops = call.problem, call.operands
    if p.op == "dot":
        return reference.reference_dot(ops.a, ops.b)
    if p.packed:
        from multibackend.core import packing

        return packing.reference_packed(p, ops.a, ops.b)
    if p.scales is not None:
        return reference.reference_matmul(*reference.dequantized(p, ops), ops.c, ops.alpha,
                                          ops.beta)
    return reference.reference_matmul(ops.a, ops.b, ops.c, ops.alpha, ops.beta)


def poisoned_out(call: Call) -> Any:
    """A poisoned ``out`` of the call's result shape, in the caller's array kind."""
    d = call.operands.d
    with on_stream(call.operands.stream, call.device):
        out = d.new_empty(d.shape[1:] if call.squeeze else d.shape)
        poison(out)
    return to_kind(out, call.kind)


def wrong(run: Callable[..., Any], call: Call, ref: Any, *, fresh: bool = True) -> str | None:
    """Why the public call ``run`` (``run(out=...)`` writes ``out``, ``run()`` makes D) gives
    a wrong answer for ``call``'s operands, or None where it is right: into a poisoned ``out``
    first, so an unwritten element fails, then (``fresh``) making D itself, as it is timed.
    A call that raises is wrong, with what it raised."""
    from multibackend.io.arrays import adapt

    try:
        results = [run(out=poisoned_out(call))] + ([run()] if fresh else [])
        for result in results:
            got = adapt(result, "D", call.problem.op).tensor
            cmp = reference.compare(call.problem, got.reshape(call.operands.d.shape), ref)
            if not cmp.ok:
                return f"wrong: {cmp.detail}"
    except Exception as exc:  # a candidate that raises is left out, never chosen
        return f"raised: {type(exc).__name__}: {exc}"
    return None
