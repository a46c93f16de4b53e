"""The host backend: host arrays answered by torch's own CPU product where no GPU is there.

On a machine without a GPU no kernel of the other backends can run (Triton's interpreter
aside, which ``TRITON_INTERPRET=1`` turns on and dispatch then prefers), so ``auto`` on host
arrays answers with the product a user of those arrays would have called: torch's on the CPU
(NumPy arrays are read through torch without a copy). It keeps the library's semantics rather
than torch's CPU ones: products of 16-bit and 8-bit floats accumulate in float32 and are
rounded once, int8 accumulates exactly and wraps to int32, alpha = 0 reads neither A nor B and
beta = 0 does not read C (as BLAS says); a scaled fp8 product multiplies each fp8 value by its
scale in float32 before the product, at every granularity. It refuses problems on a GPU (the GPU backends run
those) and float32's reduced precisions (a CPU computes IEEE float32 only: a "tf32" result here
would be more accurate than asked, not what the GPU gives).
"""
from __future__ import annotations

from multibackend.backends.base import Backend
from multibackend.core import scales
from multibackend.core.capability import Capability, DtypeRule, Reason
from multibackend.core.config import Config, Operands
from multibackend.core.problem import Problem

_FLOAT_OUTS = ("float16", "bfloat16", "float32")


def _on_host(problem: Problem) -> tuple[str, str] | None:
    if not problem.device.startswith("cpu"):
        return ("device", f"the operands are on {problem.device}: the host backend runs host "
                          "arrays only, where no GPU is there to run them")
    return None


def _capability() -> Capability:
    rules = (
        DtypeRule("float16", accs=("float32",), outs=_FLOAT_OUTS),
        DtypeRule("bfloat16", accs=("float32",), outs=_FLOAT_OUTS),
        DtypeRule("float32", accs=("float32",), outs=("float32",), precisions=("ieee",)),
        DtypeRule("float64", accs=("float64",), outs=("float64",)),
        DtypeRule("int8", accs=("int32",), outs=("int32",)),
        DtypeRule("float8_e4m3fn", accs=("float32",), outs=_FLOAT_OUTS),
        DtypeRule("float8_e5m2", accs=("float32",), outs=_FLOAT_OUTS),
        DtypeRule("float16", accs=("float32",), outs=("float32",), ops=("dot",)),
        DtypeRule("bfloat16", accs=("float32",), outs=("float32",), ops=("dot",)),
        DtypeRule("float32", accs=("float32",), outs=("float32",), ops=("dot",)),
        DtypeRule("float64", accs=("float64",), outs=("float64",), ops=("dot",)),
    )
    every = ("tensor", "row", "block")
    return Capability("host", rules, extra_checks=(_on_host,),
                      scales=tuple((a, b) for a in every for b in every))


class HostBackend(Backend):
    name = "host"
    capability: Capability = _capability()

    def available(self) -> Reason | None:
        return self.torch_missing()

    def note(self, problem: Problem) -> str | None:
        return "no GPU runs these host arrays: torch's own CPU product answers them"

    def versions(self) -> dict[str, str]:
        import torch

        return {"torch": torch.__version__}

    def configs(self, problem: Problem) -> list[Config]:
        return [Config.of("default")]

    def run(self, problem: Problem, operands: Operands, config: Config) -> None:
        import torch

        ops = operands
        wide = torch.int64 if problem.acc == "int32" else getattr(torch, problem.acc)
        if problem.op == "dot":
            ops.d.view(()).copy_(torch.dot(ops.a.to(wide), ops.b.to(wide)))
            return
        if ops.alpha == 0:  # A and B are not read
            acc = torch.zeros(ops.d.shape, dtype=wide)
        else:
            acc = torch.matmul(*_read(problem, ops, wide))
            if ops.alpha != 1:
                acc = acc * ops.alpha
        if problem.has_c and ops.c is not None and ops.beta != 0:  # beta = 0: C is not read
            acc = acc + ops.c.to(wide) * ops.beta
        ops.d.copy_(acc.expand(ops.d.shape))


def _read(problem: Problem, ops: Operands, wide) -> tuple:
    """A and B in the accumulator's type, each multiplied by its scales where the product is
    scaled (every element by the scale that covers it, in float32, as a GPU kernel applies
    them to its fp8 values)."""
    a, b = ops.a.to(wide), ops.b.to(wide)
    if problem.scales is None:
        return a, b
    rows_a, rows_b = (problem.m, problem.k), (problem.k, problem.n)
    factor_a = scales.expanded(ops.scale_a, problem.scales[0], "A", *rows_a)
    factor_b = scales.expanded(ops.scale_b, problem.scales[1], "B", *rows_b)
    return a * factor_a.to(wide), b * factor_b.to(wide)


def create() -> Backend:
    return HostBackend()
