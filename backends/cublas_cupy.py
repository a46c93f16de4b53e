"""cupy.matmul's own cuBLAS call for two matrices of a CuPy caller, without its per-call steps.

For a 2-D product ``cupy.matmul`` ends in one ``cublasGemmEx`` on CuPy's cuBLAS handle for the
current device (its stream set to CuPy's current stream by CuPy's binding), with CuPy's
compute type (float32 accumulation for f16 and f32, float64 for f64) and algorithm (the
tensor-op default from sm_80, and for f16 from sm_70), writing a new C-contiguous D. Around
that call it spends most of its 25-35 µs of host time on steps a repeated call does not need
(dtype promotion, contiguity checks and copies, the batched path's bookkeeping). The
``cublas`` backend's producing call for a CuPy caller (:meth:`CublasBackend.produce`) makes
that same cuBLAS call directly: the same library, handle, heuristic and kernels, so the same
results, at the host cost of the call itself.

Arrays cupy.matmul refuses (inner dimensions that differ: it words the error), operands cuBLAS
cannot take as they are (neither row- nor column-major with a unit stride, a
negative or non-element stride, a size past 32 bits), an empty side, arrays on another device
than the current one, or a compute type other than CuPy's default
(``cupy._core.set_compute_type``) go to ``cupy.matmul`` itself.
"""
from __future__ import annotations

from typing import Any, Callable

#: (cuBLAS data type name in CuPy's runtime module, its compute type name, the scalars' dtype)
_TYPES = {"float16": ("CUDA_R_16F", "CUBLAS_COMPUTE_32F", "float32"),
          "float32": ("CUDA_R_32F", "CUBLAS_COMPUTE_32F", "float32"),
          "float64": ("CUDA_R_64F", "CUBLAS_COMPUTE_64F", "float64")}
#: sizes and leading dimensions cuBLAS's 32-bit interface takes are below this
_INT32 = 2 ** 31


def layout(shape: tuple[int, int], strides: tuple[int, int],
           itemsize: int) -> tuple[bool, int] | None:
    """How cuBLAS (column-major) reads a row-major-indexed matrix of ``shape`` with byte
    ``strides``: (transposed, leading dimension) — (False, row stride) for rows of unit
    stride, which cuBLAS reads as the transpose, (True, column stride) for columns of unit
    stride — or None where neither holds. A side of one element has no stride to respect:
    its leading dimension is the other side's length."""
    rows, cols = shape
    row_stride, col_stride = strides
    if row_stride % itemsize or col_stride % itemsize:
        return None
    row_step, col_step = row_stride // itemsize, col_stride // itemsize
    if cols == 1 or col_step == 1:  # row-major: cuBLAS sees the (cols x rows) transpose
        lead = cols if rows == 1 else row_step
        if lead >= max(1, cols):
            return False, lead
    if rows == 1 or row_step == 1:  # column-major
        lead = rows if cols == 1 else col_step
        if lead >= max(1, rows):
            return True, lead
    return None


def matrices(dtype: str, cc: tuple[int, int]) -> Callable[[Any, Any], Any] | None:
    """The producing call ``(A, B) -> D`` for CuPy matrices of ``dtype`` on a device of
    compute capability ``cc``, or None where CuPy does not serve the dtype this way."""
    if dtype not in _TYPES:
        return None
    import cupy
    import numpy
    from cupy._core import _routines_linalg
    from cupy.cuda import device as cuda_device
    from cupy_backends.cuda.api import runtime
    from cupy_backends.cuda.libs import cublas

    type_name, compute_name, scalar = _TYPES[dtype]
    data_type, compute = getattr(runtime, type_name), getattr(cublas, compute_name)
    tensor_op = cc >= (8, 0) or (dtype == "float16" and cc >= (7, 0))
    algo = cublas.CUBLAS_GEMM_DEFAULT_TENSOR_OP if tensor_op else cublas.CUBLAS_GEMM_DEFAULT
    scalars = numpy.array([1, 0], dtype=scalar)  # alpha, beta: host memory cuBLAS reads
    one, zero = scalars.ctypes.data, scalars.ctypes.data + scalars.itemsize
    np_dtype = numpy.dtype(dtype)
    itemsize = np_dtype.itemsize
    matmul, empty, gemm = cupy.matmul, cupy.empty, cublas.gemmEx
    handle_of, device_of = cuda_device.get_cublas_handle, runtime.getDevice
    default = _routines_linalg.COMPUTE_TYPE_DEFAULT
    compute_type_of = _routines_linalg.get_compute_type

    def produce(a: Any, b: Any) -> Any:
        (m, k), (k_b, n) = a.shape, b.shape
        a_data, b_data = a.data, b.data
        read_a = layout((m, k), a.strides, itemsize)
        read_b = layout((k, n), b.strides, itemsize)
        if (k_b != k or read_a is None or read_b is None or not (m and n and k)
                or max(m, n, k, read_a[1], read_b[1]) >= _INT32
                or a_data.device_id != device_of() or b_data.device_id != a_data.device_id
                or compute_type_of(np_dtype) != default):
            return matmul(a, b)
        d = empty((m, n), np_dtype)
        # row-major D (m x n) is column-major D^T (n x m) = B^T A^T
        gemm(handle_of(), int(read_b[0]), int(read_a[0]), n, m, k, one, b_data.ptr, data_type,
             read_b[1], a_data.ptr, data_type, read_a[1], zero, d.data.ptr, data_type, n,
             compute, algo)
        return d

    produce.scalars = scalars  # what ``one`` and ``zero`` point into, kept with the call
    return produce
