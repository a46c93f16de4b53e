"""The request model: one immutable ``Problem`` per call, built once, read by every backend.

Backends decide whether they can run a request from the ``Problem`` alone, on the CPU, with no
GPU and no operands in hand. Everything a kernel choice depends on is here: the operation,
the sizes, the dtypes of A, B, C, D and the accumulator, the float32 precision mode, each
operand's layout, leading dimension and pointer alignment, and the device with its compute
capability.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

from multibackend.core import dtypes
from multibackend.core.packing import PER_BYTE

PRECISIONS = ("ieee", "tf32", "tf32x3")


@dataclass(frozen=True)
class Operand:
    """How one 2-D (or batched 2-D) operand lies in memory.

    ``rows`` x ``cols`` is its logical matrix shape. ``layout`` is "row" (row-major: unit
    stride along columns), "col" (column-major: unit stride along rows) or "strided" (neither).
    ``ld`` is the leading dimension in elements (the stride that is not 1), ``batch_stride``
    the stride between batch entries in elements (0 when one matrix is broadcast over the
    batch). ``align`` is the largest power of two, up to 256, dividing the data pointer in
    bytes.
    """

    dtype: str
    rows: int
    cols: int
    layout: str
    ld: int
    strides: tuple[int, int]
    batch_stride: int = 0
    align: int = 256

    @property
    def ld_bytes(self) -> float:
        return self.ld * dtypes.get(self.dtype).itemsize

    @property
    def rows_aligned(self) -> bool:
        """Whether every line along the contiguous direction (each row of a row-major operand,
        each column of a column-major one, in every batch entry) starts on a 16-byte boundary:
        what TMA, vectorized loads and cuBLAS's fast kernels need."""
        if self.layout == "strided":
            return False
        size = dtypes.get(self.dtype).itemsize
        lines = self.rows if self.layout == "row" else self.cols
        return (self.align >= 16 and (lines <= 1 or (self.ld * size) % 16 == 0)
                and (self.batch_stride * size) % 16 == 0)


@dataclass(frozen=True, eq=False)
class Problem:
    """One matmul ``D = alpha * A @ B + beta * C`` (op "matmul") or ``x . y`` (op "dot").

    For matmul, A is M x K, B is K x N, C and D are M x N, each repeated ``batch`` times. For
    dot, ``k`` is the vector length and M = N = batch = 1. ``acc`` is the accumulator dtype,
    ``precision`` the float32 mode ("ieee", "tf32", "tf32x3"; None for other dtypes), ``has_c``
    whether C takes part (beta != 0), ``saturate`` whether float results saturate to the
    finite range (WMMA's satf). ``cc`` is (major, minor) of the device, None on a host-only run.
    D is row-major and contiguous; ``d_align`` is its pointer's alignment up to 16 bytes (what
    a kernel's stores may need; below 16 only for an ``out`` that starts off that grid).
    """

    op: str
    m: int
    n: int
    k: int
    batch: int
    a: Operand
    b: Operand
    c: Operand | None
    d_dtype: str
    acc: str
    precision: str | None = None
    has_c: bool = False
    saturate: bool = False
    device: str = "cuda:0"
    cc: tuple[int, int] | None = None
    packed: str | None = None  # "int4", "uint4" or "bit" for sub-byte packed operands
    bitop: str | None = None  # "xor" or "and" for binary (b1) matmul
    d_align: int = 16  # the largest power of two, up to 16, dividing D's pointer in bytes
    #: fp8 scales' granularities (A's, B's): see :mod:`multibackend.core.scales`
    scales: tuple[str, str] | None = None
    extra: tuple = field(default=())

    @property
    def in_dtype(self) -> str:
        return self.packed or self.a.dtype

    @property
    def misaligned(self) -> bool:
        """A matmul whose A or B has a line off the 16-byte grid (see
        :attr:`Operand.rows_aligned`): cuBLAS leaves its fast kernels for it."""
        return self.op == "matmul" and not (self.a.rows_aligned and self.b.rows_aligned)

    @property
    def device_index(self) -> int:
        """The ordinal of :attr:`device` ("cuda:1" -> 1; "cuda" -> 0)."""
        _, _, index = self.device.partition(":")
        return int(index or 0)

    @property
    def trivial(self) -> bool:
        """Whether D takes no product: M, N or the batch is 0 (D is empty) or K is 0."""
        return not (self.m and self.n and self.k and self.batch)

    @property
    def flops(self) -> int:
        """Arithmetic operations counted the usual way (2 per multiply-add)."""
        return 2 * self.m * self.n * self.k * self.batch

    @property
    def bytes_moved(self) -> int:
        """The fewest bytes the problem must move through device memory."""
        a = dtypes.get(self.a.dtype).itemsize * self.a.rows * self.a.cols
        b = dtypes.get(self.b.dtype).itemsize * self.b.rows * self.b.cols
        if self.op == "dot":
            return int(a + b)
        d = dtypes.get(self.d_dtype).itemsize * self.m * self.n
        c = d if self.has_c else 0
        return int(self.batch * (a + b + c + d))

    @property
    def variant(self) -> str:
        """Saturation and the binary op where the call asks for them (empty for a plain
        call): they change which kernels may run it."""
        return f"{':satf' if self.saturate else ''}{f':{self.bitop}' if self.bitop else ''}"

    @property
    def key(self) -> str:
        """A short text naming what a tuned choice depends on (used by tuning tables and
        first-call autotuning's store). A choice made without C serves a call with C: C
        changes the epilogue, not the kernel a config names."""
        lay = self.a.layout[0] + self.b.layout[0]
        prec = f":{self.precision}" if self.precision and self.precision != "ieee" else ""
        grid = ":unaligned" if self.misaligned else ""
        acc = "" if self.acc == dtypes.default_accumulator(self.in_dtype) else f":acc-{self.acc}"
        return (f"{self.op}:{self.in_dtype}->{self.d_dtype}{prec}{acc}{self.variant}:{lay}{grid}:"
                f"b{self.batch}:m{self.m}:n{self.n}:k{self.k}")

    def describe(self) -> str:
        if self.op == "dot":
            return f"dot n={self.k} {self.a.dtype} -> {self.d_dtype} (acc {self.acc})"
        batch = f"{self.batch}x " if self.batch > 1 else ""
        prec = f" precision={self.precision}" if self.precision else ""
        return (f"matmul {batch}{self.m}x{self.n}x{self.k} {self.in_dtype} A:{self.a.layout} "
                f"B:{self.b.layout} -> {self.d_dtype} (acc {self.acc}){prec}"
                f"{' +C' if self.has_c else ''}{self._scales_words()}")

    def _scales_words(self) -> str:
        if self.scales is None:
            return ""
        return f" scaled (A {self.scales[0]}-wise, B {self.scales[1]}-wise)"

    def with_(self, **changes) -> "Problem":
        return replace(self, **changes)

    def __hash__(self) -> int:
        # computed once: a Problem keys the backends' per-problem caches on every call
        cached = self.__dict__.get("_hash")
        if cached is None:
            cached = hash(tuple(getattr(self, f.name) for f in fields(self)))
            object.__setattr__(self, "_hash", cached)
        return cached

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if type(other) is not Problem:
            return NotImplemented
        return hash(self) == hash(other) and all(
            getattr(self, f.name) == getattr(other, f.name) for f in fields(self))

    def __getstate__(self) -> dict:
        # string hashes differ between processes: a pickled Problem leaves its hash behind
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}


_INTERNED: dict[Problem, Problem] = {}
INTERN_LIMIT = 4096


def interned(problem: Problem) -> Problem:
    """The one Problem object for ``problem``'s value: calls with the same metadata share it,
    so the backends' per-problem caches find it by identity instead of comparing fields."""
    found = _INTERNED.get(problem)
    if found is None:
        if len(_INTERNED) >= INTERN_LIMIT:
            _INTERNED.clear()
        _INTERNED[problem] = found = problem
    return found


def folded_batch(problem: Problem) -> Problem | None:
    """The plain product that a batched matmul whose B is broadcast (batch stride 0) is, where
    A is row-major with each entry's rows right after the last entry's (batch stride M rows)
    and C, where it takes part, the same (D is contiguous): (batch x M) x N x K in a batch of
    one. None for any other problem. TMA cannot broadcast an operand along the batch, and
    Triton's TMA tiles take one matrix, so a backend runs such a batch as this product: one
    launch over every entry's rows (:func:`multibackend.backends.base.folded_operands`)."""
    if problem.op != "matmul" or problem.batch <= 1 or problem.b.batch_stride != 0:
        return None
    c = problem.c if problem.has_c else None
    if not all(op.layout == "row" and op.batch_stride == problem.m * op.ld
               for op in (problem.a, c) if op is not None):
        return None
    rows = problem.m * problem.batch
    return interned(replace(
        problem, m=rows, batch=1, a=replace(problem.a, rows=rows, batch_stride=0),
        c=replace(c, rows=rows, batch_stride=0) if c is not None else problem.c))


def classify_layout(rows: int, cols: int, strides: tuple[int, int]) -> tuple[str, int]:
    """("row" | "col" | "strided", leading dimension in elements) for a rows x cols view.

    A single column whose elements are contiguous (row stride 1) is column-major, so a K x 1
    right-hand side reads as the K-contiguous vector it is; a single element is column-major
    only when its row stride is 1 and its column stride is not; every other single row or
    column is row-major."""
    s0, s1 = strides
    if cols == 1 and s0 == 1 and (rows > 1 or s1 != 1):
        return "col", max(rows, 1)
    if (s1 == 1 or cols == 1) and (s0 >= max(cols, 1) or rows == 1):
        return "row", max(s0 if rows > 1 else cols, cols, 1)
    if (s0 == 1 or rows == 1) and (s1 >= max(rows, 1) or cols == 1):
        return "col", max(s1 if cols > 1 else rows, rows, 1)
    return "strided", max(abs(s0), abs(s1))


def pointer_alignment(ptr: int) -> int:
    """The largest power of two, at most 256, that divides ``ptr`` (bytes)."""
    if ptr == 0:
        return 256
    return min(256, ptr & -ptr)


def make_operand(dtype: str, rows: int, cols: int, strides: tuple[int, int],
                 batch_stride: int, ptr: int) -> Operand:
    layout, ld = classify_layout(rows, cols, strides)
    return Operand(dtype=dtype, rows=rows, cols=cols, layout=layout, ld=ld,
                   strides=(int(strides[0]), int(strides[1])), batch_stride=int(batch_stride),
                   align=pointer_alignment(ptr))


def synthetic(m: int, n: int, k: int, dtype: str = "float16", *, batch: int = 1,
              a_layout: str = "row", b_layout: str = "row", out_dtype: str | None = None,
              acc: str | None = None, precision: str | None = None, has_c: bool = False,
              cc: tuple[int, int] | None = (9, 0), device: str = "cuda:0",
              packed: str | None = None, bitop: str | None = None,
              saturate: bool = False) -> Problem:
    """A Problem described by numbers alone (no arrays): for capability tables, tuning
    plans, benchmarks and tests that reason about support without a GPU."""
    dtype = dtypes.canonical(dtype)
    per_byte = PER_BYTE.get(dtype, 1)
    store = "uint8" if per_byte > 1 else dtype
    packed = dtype if per_byte > 1 else None

    def operand(rows: int, cols: int, layout: str, packed_dim: int) -> Operand:
        if packed:
            if packed_dim == 1:
                cols = -(-cols // per_byte)
            else:
                rows = -(-rows // per_byte)
        strides = (cols, 1) if layout == "row" else (1, rows)
        return make_operand(store, rows, cols, strides, rows * cols if batch > 1 else 0, 0)

    a = operand(m, k, a_layout, 1)  # sub-byte operands are packed along K
    b = operand(k, n, b_layout, 0)
    out = dtypes.canonical(out_dtype) if out_dtype else dtypes.default_output(dtype, dtype)
    c = make_operand(out, m, n, (n, 1), m * n if batch > 1 else 0, 0) if has_c else None
    acc = dtypes.canonical(acc) if acc else dtypes.default_accumulator(dtype)
    if dtype == "float32" and precision is None:
        precision = "ieee"
    return Problem(op="matmul", m=m, n=n, k=k, batch=batch, a=a, b=b, c=c, d_dtype=out, acc=acc,
                   precision=precision, has_c=has_c, saturate=saturate, device=device, cc=cc,
                   packed=packed, bitop=bitop)


def synthetic_dot(n: int, dtype: str = "float16", *, acc: str | None = None,
                  cc: tuple[int, int] | None = (9, 0), device: str = "cuda:0") -> Problem:
    """A dot Problem of length ``n`` described by numbers alone."""
    dtype = dtypes.canonical(dtype)
    vec = make_operand(dtype, 1, n, (n, 1), 0, 0)
    acc = dtypes.canonical(acc) if acc else dtypes.default_accumulator(dtype)
    return Problem(op="dot", m=1, n=1, k=n, batch=1, a=vec, b=vec, c=None, d_dtype=acc,
                   acc=acc, device=device, cc=cc)
