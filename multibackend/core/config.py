"""The records a call and a backend pass around: :class:`Config`, one candidate kernel
configuration, and :class:`Operands`, the arrays of one call. They sit in the core, below the
backends, so that choosing, running and tuning name them without importing a backend."""
from __future__ import annotations

import functools
from dataclasses import dataclass, field, replace
from typing import Any

from multibackend.core.problem import Problem


@dataclass(frozen=True)
class Config:
    """One candidate kernel configuration: a readable name and its parameters."""

    name: str
    params: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def of(cls, name: str, **params: Any) -> "Config":
        return cls(name, tuple(sorted(params.items())))

    def get(self, key: str, default: Any = None) -> Any:
        return self._lookup.get(key, default)

    @functools.cached_property
    def _lookup(self) -> dict[str, Any]:
        return dict(self.params)

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, **dict(self.params)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Config":
        """The Config :meth:`as_dict` gave, also after a JSON round trip (which turns tuple
        parameters into lists: they become tuples again, so the Config stays hashable)."""
        data = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items()}
        return cls.of(data.pop("name"), **data)

    def __str__(self) -> str:
        return self.name


@dataclass
class Operands:
    """The arrays of one call, as torch tensors on the problem's device.

    For matmul ``a``, ``b``, ``c`` (or None) and ``d`` are 3-D (batch, rows, cols) views with the
    strides the caller gave (batch stride 0 where one matrix is broadcast); ``d`` is row-major and
    contiguous. A backend whose ``takes_matrices`` is set may also be given the caller's 2-D arrays
    as they are (each one 2-D or 3-D) for a matmul of batch 1. For dot, ``a`` and ``b`` are 1-D and
    ``d`` holds one element. ``stream`` is the CUDA stream handle the caller's work is ordered on
    (0 on the host). ``scale_a`` and ``scale_b`` hold a scaled fp8 product's scales (None
    otherwise; their shapes in the fields' comments).
    """

    a: Any
    b: Any
    c: Any
    d: Any
    alpha: float | int = 1
    beta: float | int = 0
    stream: int = 0
    extra: dict = field(default_factory=dict)
    #: a scaled fp8 product's float32 scales (:mod:`multibackend.core.scales`), A's as a 0-d
    #: tensor, (M, 1) or (M, K/128 blocks), B's as a 0-d tensor, (1, N) or (K/128, N/128)
    scale_a: Any = None
    scale_b: Any = None


def folded_operands(operands: Operands, folded: Problem) -> Operands:
    """``operands`` of a batch that :func:`multibackend.core.problem.folded_batch` makes the plain
    product ``folded``: A, C and D as one matrix of every entry's rows (views, no copy), B's
    one matrix."""
    rows = folded.m

    def stacked(t: Any, ld: int) -> Any:
        return t.as_strided((1, rows, t.shape[2]), (rows * ld, ld, 1))

    c = operands.c
    return replace(operands, a=stacked(operands.a, folded.a.ld), b=operands.b[:1],
                   c=stacked(c, folded.c.ld) if c is not None and folded.c is not None else c,
                   d=stacked(operands.d, folded.n))
