"""The raw WMMA launches' arguments: grids, strides, the epilogue's scalars, TMA tensor maps
and the dot's two passes, computed from a problem and its operands."""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

from multibackend.backends.raw_wmma.kernels import (
    DOT_CONFIGS,
    DOT_THREADS,
    DOT_UNROLL,
    ELEM_CODES,
    MAX_GRID_Y,
    REDUCE_THREADS,
    Kernel,
    kbytes_of,
)
from multibackend.core.config import Config, Operands
from multibackend.core.problem import Problem
from multibackend.gpu import driver, tensormap

# ---- launch arguments ---------------------------------------------------------------------

def _strides3(t: Any) -> tuple[int, int, int]:
    """A 2-D or 3-D operand's (batch, row, column) strides; 0 as the batch stride of 2-D."""
    s = t.stride()
    return s if len(s) == 3 else (0, *s)


def gemm_c(problem: Problem, ops: Operands) -> Any:
    """The C operand the kernel reads, or None (no C, or beta = 0)."""
    return ops.c if (ops.c is not None and problem.has_c and ops.beta != 0) else None


def gemm_grid(problem: Problem, kernel: Kernel) -> tuple[int, int, int]:
    """The grid of a GEMM kernel: x over the output tiles (for a TMA kernel whose clusters
    share B, whole clusters along M), y over the batch (each block loops over the batch
    entries beyond MAX_GRID_Y), z over the splits of K."""
    bm, bn = kernel.tile
    rows = -(-problem.m // bm)
    rows = -(-rows // kernel.cluster) * kernel.cluster
    return rows * -(-problem.n // bn), min(problem.batch, MAX_GRID_Y), kernel.splits


def gemm_arguments(problem: Problem, ops: Operands, kernel: Kernel) -> dict[str, int | float]:
    """The value of each parameter of ``kernel`` (named as in :data:`GEMM_PARAMS`) for the
    operands ``ops``, which may be 2-D (batch 1) or 3-D."""
    a, b, d = ops.a, ops.b, ops.d
    c = gemm_c(problem, ops)
    sa, sb = _strides3(a), _strides3(b)
    sc = _strides3(c) if c is not None else (0, 0, 0)
    code = ELEM_CODES[problem.d_dtype]  # C has D's dtype
    values: dict[str, int | float] = {
        "a": a.data_ptr(), "b": b.data_ptr(), "c": c.data_ptr() if c is not None else 0,
        "d": d.data_ptr(), "M": problem.m, "N": problem.n,
        "scm": sc[1], "scn": sc[2], "sba": sa[0], "sbb": sb[0], "sbc": sc[0],
        "batch": problem.batch, "alpha": float(ops.alpha), "beta": float(ops.beta),
        "c_code": code, "d_code": code}
    if kernel.tma_boxes:
        del values["a"], values["b"], values["sba"], values["sbb"]
        values.update(kbytes=kbytes_of(problem), ws=0, splits=kernel.splits)
    elif kernel.source == "wmma_fast.cu":
        values.update(
            K=problem.k, lda=sa[1] if problem.a.layout == "row" else sa[2],
            ldb=sb[1] if problem.b.layout == "row" else sb[2],
            vec_ok=int(problem.d_dtype == problem.in_dtype and problem.n % 8 == 0
                       and d.data_ptr() % 16 == 0))
    else:
        values.update(sam=sa[1], sak=sa[2], sbk=sb[1], sbn=sb[2], satf=int(problem.saturate))
        if kernel.source in ("wmma_subbyte.cu", "mma_kmajor.cu"):
            values["kbytes"] = kbytes_of(problem)
        else:
            values["K"] = problem.k
    return values


def workspace_bytes(problem: Problem, kernel: Kernel) -> int:
    """The bytes of split-K's partials: one (batch, M, N) array of 4-byte accumulators per
    split."""
    return kernel.splits * problem.batch * problem.m * problem.n * 4


def reduce_launch(problem: Problem, ops: Operands,
                  kernel: Kernel) -> tuple[dict[str, int | float], tuple[int, int, int]]:
    """The values of split-K's second pass's parameters (:data:`REDUCE_PARAMS`; ``ws``
    written per call) and its grid: a block per REDUCE_THREADS outputs."""
    values = gemm_arguments(problem, ops, kernel)
    kept = ("splits", "M", "N", "batch", "c", "d", "scm", "scn", "sbc", "alpha", "beta",
            "c_code", "d_code")
    total = problem.batch * problem.m * problem.n
    return ({"ws": 0, **{key: values[key] for key in kept}},
            (min(-(-total // REDUCE_THREADS), 2**31 - 1), 1, 1))


def tensor_maps(problem: Problem, ops: Operands,
                kernel: Kernel) -> tuple[tensormap.TensorMap, tensormap.TensorMap]:
    """The tensor maps of A and B a TMA kernel reads, with its boxes' rows: a K-major
    operand (A row-, B column-major) as M rows or N columns of K bytes, an MN-major one as K
    rows of M or N elements' bytes."""
    a, b = ops.a, ops.b
    kbytes = kbytes_of(problem)
    box_a, box_b = kernel.tma_boxes
    sa, sb = _strides3(a), _strides3(b)
    # each operand's (M or N, its stride, K's stride): A is M x K, B is K x N
    return (_operand_map(problem, "A", a, (problem.m, sa[1], sa[2]), problem.a.layout == "row",
                         kbytes, box_a),
            _operand_map(problem, "B", b, (problem.n, sb[2], sb[1]), problem.b.layout == "col",
                         kbytes, box_b))


def _operand_map(problem: Problem, name: str, t: Any, sides: tuple[int, int, int],
                 kmajor: bool, kbytes: int, box: int) -> tensormap.TensorMap:
    """One operand's tensor map: ``sides`` its rows along M or N, their stride and K's stride
    (elements); K-major, those rows of ``kbytes``; else K rows of the M or N elements."""
    rows, row_stride, k_stride = sides
    size, batch_stride = t.element_size(), _strides3(t)[0] * t.element_size()
    if kmajor:
        return tensormap.TensorMap(name, t.data_ptr(), kbytes, rows, row_stride * size,
                                   problem.batch, batch_stride, box)
    return tensormap.TensorMap(name, t.data_ptr(), rows * size, problem.k, k_stride * size,
                               problem.batch, batch_stride, box)


def dot_plan(problem: Problem, ops: Operands, config: Config, sms: int) -> tuple[bool, int]:
    """(whether pass 1 reads 16-byte vectors, its number of blocks) for ``ops`` on a device
    of ``sms`` multiprocessors."""
    x, y = ops.a, ops.b
    vec = (x.stride(0) == 1 and y.stride(0) == 1 and x.data_ptr() % 16 == 0
           and y.data_ptr() % 16 == 0)
    per_step = 16 // x.element_size() if vec else 1
    wanted = -(-problem.k // (DOT_THREADS * per_step * DOT_UNROLL))
    return vec, max(1, min(DOT_CONFIGS[config.name].blocks_per_sm * sms, wanted))


def dot_arguments(problem: Problem, ops: Operands, partial: int,
                  blocks: int) -> tuple[dict[str, int], dict[str, int]]:
    """The values of the parameters of dot's pass 1 (:data:`DOT_PARAMS`) and pass 2
    (:data:`DOT_FINAL_PARAMS`), ``partial`` the address of the block partials."""
    x, y = ops.a, ops.b
    first = {"x": x.data_ptr(), "sx": x.stride(0), "y": y.data_ptr(), "sy": y.stride(0),
             "n": problem.k, "partial": partial}
    final = {"partial": partial, "count": blocks, "out": ops.d.data_ptr(),
             "d_code": ELEM_CODES[problem.d_dtype]}
    return first, final


# ---- the backend ------------------------------------------------------------------------

#: a prepared launch: (a, b, c, d, stream) -> None (see Backend.bind)
BoundLaunch = Callable[[Any, Any, Any, Any, int], None]


class DotLaunch(NamedTuple):
    """The dot's two passes as :meth:`RawWmmaBackend.bind` prepared them, and ``partial``:
    the address of the block partials' buffer for a raw stream handle."""

    first: driver.Launch
    final: driver.Launch
    partial: Callable[[int], int]
