"""What a backend can run, written as data, and the reason when it cannot.

Each backend declares one frozen :class:`Capability`: per input dtype a :class:`DtypeRule`
(accumulators, outputs, minimum compute capability, layouts, precisions). ``check`` walks the
rules in a fixed order and returns the first :class:`Reason` that fails, or None. A reason
always names the rule, so ``explain()`` can say exactly why a backend was passed over.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from multibackend.core.problem import Problem

ANY_LAYOUT = ("row", "col", "strided")


def layout_words(layout: str) -> str:
    """An operand's layout in words, for reasons and errors."""
    return "strided (neither row- nor column-major)" if layout == "strided" else f"{layout}-major"


@dataclass(frozen=True)
class Reason:
    """Why a backend cannot serve a request: which backend, which rule, and in words."""

    backend: str
    rule: str
    message: str

    def __str__(self) -> str:
        return f"{self.backend}: {self.message} (rule: {self.rule})"


@dataclass(frozen=True)
class DtypeRule:
    """What one backend does for one input dtype.

    ``accs``/``outs``: accumulator and output dtypes it offers. ``min_cc``: the oldest compute
    capability. ``a_layouts``/``b_layouts``: layouts taken without a copy. ``precisions``: for
    float32, the modes offered. ``note``: a fact ``explain()`` shows when the rule accepts
    (e.g. "emulated on sm_90, correct but not fast").
    """

    dtype: str
    accs: tuple[str, ...]
    outs: tuple[str, ...]
    min_cc: tuple[int, int] = (7, 0)
    a_layouts: tuple[str, ...] = ANY_LAYOUT
    b_layouts: tuple[str, ...] = ANY_LAYOUT
    precisions: tuple[str | None, ...] = (None,)
    ops: tuple[str, ...] = ("matmul",)
    note: str | None = None
    note_cc: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True)
class Capability:
    """A backend's whole support table; ``check`` returns the first failing rule's reason."""

    backend: str
    rules: tuple[DtypeRule, ...]
    batched: bool = True
    saturate: bool = False
    max_dim: int = 2**31 - 1
    min_align: int = 1
    extra_checks: tuple = field(default=())
    #: the (A's, B's) scale granularities of scaled fp8 products offered (none by default)
    scales: tuple[tuple[str, str], ...] = ()

    def rule_for(self, problem: Problem) -> DtypeRule | None:
        for rule in self.rules:
            if rule.dtype == problem.in_dtype and problem.op in rule.ops:
                return rule
        return None

    def check(self, problem: Problem) -> Reason | None:
        def no(rule: str, message: str) -> Reason:
            return Reason(self.backend, rule, message)

        rule = self.rule_for(problem)
        if rule is None:
            offered = sorted({r.dtype for r in self.rules if problem.op in r.ops})
            return no("dtype", f"{problem.op} of {problem.in_dtype} is not offered "
                               f"(offered: {', '.join(offered) or 'none'})")
        if problem.a.dtype != problem.b.dtype:
            return no("dtype", f"A is {problem.a.dtype} but B is {problem.b.dtype}: "
                               "mixed input dtypes are not offered")
        if problem.acc not in rule.accs:
            return no("accumulator", f"{rule.dtype} accumulates in {', '.join(rule.accs)}, "
                                     f"not {problem.acc}")
        if problem.d_dtype not in rule.outs:
            return no("output", f"{rule.dtype} writes {', '.join(rule.outs)}, "
                                f"not {problem.d_dtype}")
        if problem.cc is not None and problem.cc < rule.min_cc:
            return no("compute-capability",
                      f"{rule.dtype} needs sm_{rule.min_cc[0]}{rule.min_cc[1]}+, the device "
                      f"is sm_{problem.cc[0]}{problem.cc[1]}")
        if problem.precision not in rule.precisions:
            offered = ", ".join(str(p) for p in rule.precisions)
            return no("precision", f"precision {problem.precision} is not offered for "
                                   f"{rule.dtype} (offered: {offered})")
        if problem.op == "matmul":
            if problem.a.layout not in rule.a_layouts:
                return no("layout", f"A is {layout_words(problem.a.layout)}; {rule.dtype} "
                                    f"takes A {' or '.join(rule.a_layouts)}-major")
            if problem.b.layout not in rule.b_layouts:
                return no("layout", f"B is {layout_words(problem.b.layout)}; {rule.dtype} "
                                    f"takes B {' or '.join(rule.b_layouts)}-major")
            if problem.batch > 1 and not self.batched:
                return no("batch", "batched operands are not offered")
            if problem.saturate and not self.saturate:
                return no("saturate", "saturating output (satf) is not offered")
            if problem.scales is not None and problem.scales not in self.scales:
                offered = ", ".join(f"A {a}-wise with B {b}-wise" for a, b in self.scales)
                return no("scales", f"fp8 scales A {problem.scales[0]}-wise with B "
                                    f"{problem.scales[1]}-wise are not offered (offered: "
                                    f"{offered or 'none'})")
        if max(problem.m, problem.n, problem.k) > self.max_dim:
            return no("size", f"a dimension exceeds {self.max_dim}")
        for extra in self.extra_checks:
            reason = extra(problem)
            if reason is not None:
                return Reason(self.backend, reason[0], reason[1])
        return None

    def note(self, problem: Problem) -> str | None:
        """The accepting rule's note, when it applies to this device."""
        rule = self.rule_for(problem)
        if rule is None or rule.note is None:
            return None
        if rule.note_cc and problem.cc not in rule.note_cc:
            return None
        return rule.note

    def dtypes(self) -> list[str]:
        return [r.dtype for r in self.rules]
