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

import ctypes
import functools
import os
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


class Gemm:
    """The producing call ``gemm(A, B) -> D`` for CuPy matrices of one dtype on devices of
    one compute capability (see the module's docstring), and :meth:`native`, the same call
    described for the compiled front."""

    def __init__(self, dtype: str, cc: tuple[int, int]):
        import cupy
        import numpy
        from cupy._core import _routines_linalg
        from cupy.cuda import device as cuda_device
        from cupy_backends.cuda.api import runtime
        from cupy_backends.cuda.libs import cublas

        # what each call uses, bound once (a call with no plan in the front comes here)
        self._matmul, self._empty, self._gemm = cupy.matmul, cupy.empty, cublas.gemmEx
        self._handle, self._device = cuda_device.get_cublas_handle, runtime.getDevice
        self._compute_type = _routines_linalg.get_compute_type
        self._default = _routines_linalg.COMPUTE_TYPE_DEFAULT

        type_name, compute_name, scalar = _TYPES[dtype]
        self.data_type = getattr(runtime, type_name)
        self.compute = getattr(cublas, compute_name)
        tensor_op = cc >= (8, 0) or (dtype == "float16" and cc >= (7, 0))
        self.algo = (cublas.CUBLAS_GEMM_DEFAULT_TENSOR_OP if tensor_op
                     else cublas.CUBLAS_GEMM_DEFAULT)
        self.scalars = numpy.array([1, 0], dtype=scalar)  # alpha, beta as cuBLAS reads them
        self.dtype = numpy.dtype(dtype)
        self.torch_dtype = dtype

    def operands(self, a: Any, b: Any) -> tuple | None:
        """(m, n, k, how cuBLAS reads A, how it reads B) for the arrays (see :func:`layout`),
        or None where this call leaves them to ``cupy.matmul``."""
        (m, k), (k_b, n) = a.shape, b.shape
        read_a = layout((m, k), a.strides, self.dtype.itemsize)
        read_b = layout((k, n), b.strides, self.dtype.itemsize)
        if (k_b != k or read_a is None or read_b is None or not (m and n and k)
                or max(m, n, k, read_a[1], read_b[1]) >= _INT32
                or a.data.device_id != self._device()
                or b.data.device_id != a.data.device_id
                or self._compute_type(self.dtype) != self._default):
            return None
        return m, n, k, read_a, read_b

    def __call__(self, a: Any, b: Any) -> Any:
        found = self.operands(a, b)
        if found is None:
            return self._matmul(a, b)
        m, n, k, read_a, read_b = found
        d = self._empty((m, n), self.dtype)
        one = self.scalars.ctypes.data
        # row-major D (m x n) is column-major D^T (n x m) = B^T A^T
        self._gemm(self._handle(), int(read_b[0]), int(read_a[0]), n, m, k, one, b.data.ptr,
                   self.data_type, read_b[1], a.data.ptr, self.data_type, read_a[1],
                   one + self.scalars.itemsize, d.data.ptr, self.data_type, n, self.compute,
                   self.algo)
        return d

    def native(self, a: Any, b: Any) -> Any:
        """The call on arrays exactly like ``a`` and ``b`` as a native plan of one
        :class:`~multibackend.gpu.native.BlasStep` (our own cuBLAS handle of the device, from the
        library CuPy loaded), or None where it is not described (see :meth:`operands`; no
        such library found)."""
        from multibackend.core import dtypes
        from multibackend.gpu import driver, native

        found = self.operands(a, b)
        device = a.data.device_id
        library = _library()
        if found is None or library is None:
            return None
        m, n, k, read_a, read_b = found
        step = native.BlasStep(
            library.gemm, library.set_stream, library.handle(device),
            (int(read_b[0]), int(read_a[0]), n, m, k, self.data_type, read_b[1],
             self.data_type, read_a[1], self.data_type, n, self.compute, self.algo),
            (native.B, native.A, native.D), self.scalars.tobytes())
        return native.Native(dtypes.torch_dtype(self.torch_dtype), (m, n),
                             driver.primary_context(device), (step,), keep=(library,))


class Library:
    """The cuBLAS library CuPy loaded: the addresses of ``cublasGemmEx`` and
    ``cublasSetStream_v2``, and one handle per device, made here (so the handle, the entry
    points and their library are one), kept for the process's life."""

    def __init__(self, lib: Any):
        self._lib = lib
        self.gemm = ctypes.cast(lib.cublasGemmEx, ctypes.c_void_p).value
        self.set_stream = ctypes.cast(lib.cublasSetStream_v2, ctypes.c_void_p).value
        self._handles: dict[int, int] = {}

    def handle(self, device: int) -> int:
        found = self._handles.get(device)
        if found is None:
            from cupy.cuda import Device

            handle = ctypes.c_void_p()
            with Device(device):
                status = self._lib.cublasCreate_v2(ctypes.byref(handle))
            if status:
                raise RuntimeError(f"cublasCreate_v2 on device {device} failed: status {status}")
            found = self._handles[device] = handle.value
        return found


@functools.lru_cache(maxsize=None)
def _library() -> Library | None:
    """The cuBLAS CuPy loaded (found by its soname, libcublas.so.<CUDA major>, among the
    libraries already loaded), or None."""
    from cupy_backends.cuda.api import runtime

    name = f"libcublas.so.{runtime.runtimeGetVersion() // 1000}"
    try:
        return Library(ctypes.CDLL(name, mode=os.RTLD_NOLOAD))
    except (OSError, AttributeError):
        return None


def matrices(dtype: str, cc: tuple[int, int]) -> Callable[[Any, Any], Any] | None:
    """The producing call ``(A, B) -> D`` for CuPy matrices of ``dtype`` on a device of
    compute capability ``cc`` (a :class:`Gemm`), or None where CuPy does not serve the
    dtype this way."""
    return Gemm(dtype, cc) if dtype in _TYPES else None
