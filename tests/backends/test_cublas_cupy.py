"""CPU tier for the CuPy caller's direct cuBLAS call (backends/cublas_cupy.py): how cuBLAS,
column-major, is told to read a row-major-indexed matrix of any shape and strides. Each case is
a NumPy view; the layout found must read back exactly that matrix from its memory as cuBLAS
would (column-major with the leading dimension, transposed or not)."""
from __future__ import annotations

import numpy as np
import pytest

from multibackend.backends.cublas.cupy_gemm import layout


def cublas_reads(base: np.ndarray, offset: int, rows: int, cols: int, transposed: bool,
                 lead: int) -> np.ndarray:
    """The (rows x cols) matrix cuBLAS reads from ``base`` (flat elements) at ``offset``: a
    column-major (rows x cols) matrix when transposed (op T of its stored form is ours), else
    the transpose of a stored column-major (cols x rows) one."""
    out = np.empty((rows, cols), base.dtype)
    for i in range(rows):
        for j in range(cols):
            out[i, j] = base[offset + (i + j * lead if transposed else j + i * lead)]
    return out


def views():
    base = np.arange(1, 1 + 40 * 40, dtype=np.float16)
    grid = base.reshape(40, 40)
    yield "row-major", grid[:5, :7]
    yield "column-major", grid[:7, :5].T
    yield "offset rows", grid[3:9, 2:6]
    yield "one row", grid[4:5, :9]
    yield "one column", grid[:9, 4:5]
    yield "one row of a transpose", grid[:9, 4:5].T
    yield "one column of a transpose", grid[4:5, :9].T
    yield "one element", grid[2:3, 3:4]
    yield "contiguous", np.ascontiguousarray(grid[:6, :3])
    yield "every other column", grid[:5, ::2]
    yield "every other row and column", grid[::2, ::2]
    yield "reversed rows", grid[5:0:-1, :4]
    yield "broadcast row", np.broadcast_to(grid[0, :6], (4, 6))


@pytest.mark.parametrize("name, view", list(views()), ids=[n for n, _ in views()])
def test_a_layout_reads_back_exactly_the_matrix_or_is_refused(name, view):
    found = layout(view.shape, view.strides, view.itemsize)
    takes = name not in ("every other column", "every other row and column", "reversed rows",
                         "broadcast row")
    assert (found is not None) == takes, (name, found)
    if found is None:
        return
    transposed, lead = found
    rows, cols = view.shape
    assert lead >= max(1, cols if not transposed else rows)  # cuBLAS's rule for its ld
    base = view.base if view.base is not None else view
    while base.base is not None:
        base = base.base
    flat = base.reshape(-1)
    offset = (view.__array_interface__["data"][0] - flat.__array_interface__["data"][0]) \
        // view.itemsize
    assert np.array_equal(cublas_reads(flat, offset, rows, cols, transposed, lead), view)


def test_a_stride_that_is_not_whole_elements_is_refused():
    assert layout((2, 2), (6, 3), 2) is None
